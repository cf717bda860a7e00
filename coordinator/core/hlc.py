"""A hybrid logical clock over microseconds: never goes backwards and never repeats a timestamp."""
from __future__ import annotations


class HybridClock:
    """Timestamps are max(wall clock, last issued + 1); the wall clock reading is passed in by the caller."""

    def __init__(self) -> None:
        self._last = 0

    def now(self, wall_micros: int) -> int:
        self._last = max(wall_micros, self._last + 1)
        return self._last

    def observe(self, remote_micros: int) -> None:
        """Move past a timestamp seen from another node so later local timestamps sort after it."""
        self._last = max(self._last, remote_micros)
