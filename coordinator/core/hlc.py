"""A hybrid logical clock over microseconds: never goes backwards and never repeats a timestamp."""
from __future__ import annotations


class HybridClock:
    """Timestamps are max(wall clock, last issued + 1); the wall clock reading is passed in by the caller."""

    def __init__(self) -> None:
        self._last = 0

    def now(self, wall_micros: int) -> int:
        self._last = max(wall_micros, self._last + 1)
        return self._last

    def observe(self, remote_micros: int, wall_micros: int, max_skew_micros: int) -> None:
        """Move past a timestamp seen from another node so later local timestamps sort after it.

        Timestamps further than `max_skew_micros` ahead of the wall clock (a client's USING TIMESTAMP,
        a badly skewed node) are ignored, so they cannot drag this clock into the future.
        """
        if remote_micros <= wall_micros + max_skew_micros:
            self._last = max(self._last, remote_micros)
