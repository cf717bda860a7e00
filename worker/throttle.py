"""Waits out a node's build rate limit (`worker.rate_limit`) between chunks, re-reading the limit as it waits."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from worker.rate_limit import RateLimit

RECHECK_S = 0.25  # a lifted or changed limit takes effect within this much of a wait


class Throttle:
    """One per node, shared by its batches; `rate()` reads the cluster's limit (rows per second, 0: none)."""

    def __init__(self, rate: Callable[[], int], clock: Callable[[], float] = time.monotonic):
        self._rate = rate
        self._clock = clock
        self._limit = RateLimit()
        self._lock = threading.Lock()

    def wait(self, stop: threading.Event) -> float:
        """Wait until the next chunk may be read, or `stop` is set; the seconds waited."""
        started = self._clock()
        while True:
            with self._lock:
                delay = self._limit.delay(self._clock(), self._rate())
            if delay <= 0 or stop.wait(min(delay, RECHECK_S)):
                return self._clock() - started

    def charge(self, started: float, rows: int) -> None:
        """Count a chunk of `rows` whose reading began at `started` (a `clock()` reading)."""
        with self._lock:
            self._limit.charge(started, rows, self._rate())

    def now(self) -> float:
        return self._clock()
