"""A node's build rate limit: when its next chunk may be read, given what its batches read before. Pure (the caller
passes the clock; `worker.throttle` waits)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RateLimit:
    """The rows a node's batches read, paid for at the limit's rate: a chunk begins once the rows before it are paid
    for, so over time the batches read at most `rate` rows per second together. Not thread-safe: one lock around."""

    paid_until: float = 0.0  # when the rows read so far are paid for

    def delay(self, now: float, rate: int) -> float:
        """Seconds to wait before the next chunk (0 with no limit: rate 0)."""
        if rate <= 0:
            self.paid_until = min(self.paid_until, now)
            return 0.0
        return max(0.0, self.paid_until - now)

    def charge(self, started: float, rows: int, rate: int) -> None:
        """Count a chunk of `rows` read from `started`."""
        if rate > 0:
            self.paid_until = max(self.paid_until, started) + rows / rate
