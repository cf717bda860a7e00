"""Build rates and ETAs of building views, estimated from samples of their replicated progress over time."""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

WINDOW_SECONDS = 30.0  # rates are measured over about this much recent time
MIN_SPAN_SECONDS = 0.5  # two samples closer than this tell nothing yet
MAX_SAMPLES = 64


@dataclass(frozen=True)
class Rate:
    rows_per_s: float  # 0 when unknown
    eta_s: float  # -1 when unknown, 0 when built


UNKNOWN = Rate(0.0, -1.0)


class BuildRates:
    """Per view, the (time, rows_done, progress) samples of the last WINDOW_SECONDS; thread-safe.

    The caller passes the time (a monotonic clock reading): this class reads no clock itself.
    """

    def __init__(self) -> None:
        self._samples: dict[str, deque[tuple[float, int, float]]] = {}
        self._lock = threading.Lock()

    def observe(self, view_id: str, now: float, rows_done: int, progress: float, built: bool) -> Rate:
        """Record a sample and return the view's recent rate and the time left at that rate."""
        if built:
            with self._lock:
                self._samples.pop(view_id, None)
            return Rate(0.0, 0.0)
        with self._lock:
            samples = self._samples.setdefault(view_id, deque(maxlen=MAX_SAMPLES))
            if samples and (progress < samples[-1][2] or rows_done < samples[-1][1]):
                samples.clear()  # the build restarted (view recreated under the same id, or tasks recreated)
            samples.append((now, rows_done, progress))
            while len(samples) > 2 and now - samples[1][0] >= WINDOW_SECONDS:
                samples.popleft()
            first = samples[0]
        return _rate(first, (now, rows_done, progress))

    def forget_except(self, view_ids: set[str]) -> None:
        """Drop the samples of views that no longer exist."""
        with self._lock:
            for view_id in set(self._samples) - view_ids:
                del self._samples[view_id]


def _rate(first: tuple[float, int, float], last: tuple[float, int, float]) -> Rate:
    span = last[0] - first[0]
    if span < MIN_SPAN_SECONDS:
        return UNKNOWN
    rows_per_s = max(last[1] - first[1], 0) / span
    progress_per_s = (last[2] - first[2]) / span
    if progress_per_s <= 0:
        return Rate(rows_per_s, -1.0)
    return Rate(rows_per_s, max(1.0 - last[2], 0.0) / progress_per_s)
