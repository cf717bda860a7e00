"""A chunked batch's bookkeeping: where it resumes from its tasks' checkpoints, and their checkpoints after a chunk.

Pure. A batch reads its base tablet replica in token order, chunk by chunk; once a chunk's view rows are applied at
every destination, each task of the batch that had not done the chunk's tokens moves its checkpoint past them and
counts the chunk's rows. A batch starts at the earliest token one of its tasks has not done (a task without a
checkpoint: the tablet's first token), so redoing a chunk another task had done changes nothing (the merges are
idempotent) and counts nothing twice.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from storage.ledger import TaskCheckpoint


def resume_token(first_token: int, checkpoints: Mapping[str, TaskCheckpoint], task_ids: Iterable[str]) -> int:
    """The first token the batch of `task_ids` reads (never before the tablet's `first_token`)."""
    return max(first_token, min(checkpoint_of(checkpoints, task, first_token).next_token for task in task_ids))


def checkpoint_of(checkpoints: Mapping[str, TaskCheckpoint], task_id: str, first_token: int) -> TaskCheckpoint:
    return checkpoints.get(task_id) or TaskCheckpoint(first_token, 0)


def after_chunk(checkpoints: Mapping[str, TaskCheckpoint], task_ids: Iterable[str], first_token: int, chunk_last: int,
                rows: int) -> dict[str, TaskCheckpoint]:
    """The tasks' checkpoints once the chunk ending at `chunk_last`, of `rows` rows, is delivered (a task already
    past it keeps its own)."""
    moved = {}
    for task in task_ids:
        before = checkpoint_of(checkpoints, task, first_token)
        moved[task] = before if chunk_last < before.next_token else TaskCheckpoint(chunk_last + 1,
                                                                                before.rows_scanned + rows)
    return moved
