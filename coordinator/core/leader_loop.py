"""The view building leader loop as a pure state machine: events in, instructions out (no I/O, clock or threads)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BatchReply:
    """A worker's answer to one batch: the ids it finished and, parallel to them, the base rows each one's batch
    scanned (empty: unknown, counted as 0)."""

    finished: tuple[str, ...]
    rows_scanned: tuple[int, ...] = ()

    def rows_of(self) -> dict[str, int]:
        return dict(zip(self.finished, self.rows_scanned))
