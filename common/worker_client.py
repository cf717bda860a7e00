"""The coordinator's side of the worker RPC: WorkOnViewBuildingTasks requests and replies as domain types."""
from __future__ import annotations

from coordinator.core.leader_loop import BatchReply


def batch_reply_from_response(response) -> BatchReply:
    """From a `WorkResponse`; a worker of an older version sends one row count for its whole batch."""
    finished = tuple(response.finished_task_ids)
    rows = tuple(response.finished_rows_scanned)
    if len(rows) != len(finished):
        rows = (response.rows_scanned,) * len(finished)
    return BatchReply(finished, rows)
