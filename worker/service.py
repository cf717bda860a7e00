"""The worker's gRPC endpoint: fences calls by Raft term and checks the batch against the replicated task table."""
from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from common.injection import Injections
from common.status import status_for
from coordinator.core.errors import InvalidArgument, NotFound, Unavailable
from vbcpb import vbc_pb2_grpc as rpc
from worker.tasks import refuse_stale_term


class TermFence:
    """The newest coordinator term seen — of admitted calls and of this node's own Raft term; older calls are refused.

    The servicer first catches up to the coordinator's applied index (a read barrier), so this node has heard of
    the caller's term if the caller really leads it; a term still ahead of the node's own is then refused as
    UNAVAILABLE (retry), so a bogus term from a stray client cannot raise the fence and lock out the real leader.
    Admitting a valid call raises the fence: from then on a deposed leader's calls are refused.
    """

    def __init__(self) -> None:
        self._highest = 0
        self._lock = threading.Lock()

    @property
    def highest(self) -> int:
        """The newest term admitted so far (0 before the first call)."""
        with self._lock:
            return self._highest

    def check(self, term: int, current_term: int) -> None:
        """Refuse a term older than any admitted or than this node's Raft term (FAILED_PRECONDITION), or ahead of
        this node's Raft term (UNAVAILABLE: not known to be a real leader's yet)."""
        with self._lock:
            refuse_stale_term(term, max(self._highest, current_term))
        if term > current_term:
            raise Unavailable(f"term {term} is ahead of this node's group0 term {current_term}; retry once it caught up")

    def admit(self, term: int, current_term: int = 0) -> None:
        """Check again and raise the fence to `term`, atomically (a newer call admitted meanwhile wins)."""
        with self._lock:
            refuse_stale_term(term, max(self._highest, current_term))
            self._highest = term


def check_batch(state, node_id: str, shard: int, task_ids: list[str]) -> list:
    """The tasks of a batch; they must exist, target this node's `shard`, and share type, base and tablet."""
    if not task_ids:
        raise InvalidArgument("an empty batch of view building tasks")
    missing = [i for i in task_ids if i not in state.tasks]
    if missing:
        raise NotFound(f"unknown or already finished view building task(s): {', '.join(missing)}")
    tasks = [state.tasks[i] for i in task_ids]
    foreign = [t.id for t in tasks if t.replica.node != node_id or t.replica.shard != shard]
    if foreign:
        raise InvalidArgument(f"task(s) {', '.join(foreign)} do not belong to {node_id} shard {shard}")
    if len({(t.type, t.base_id, t.tablet_id) for t in tasks}) > 1:
        raise InvalidArgument("a batch must share task type, base table and tablet")
    return tasks


class WorkerService(rpc.WorkerServicer):
    """Answers WorkOnViewBuildingTasks; executing the tasks is the view building milestone's work."""

    def __init__(self, node_id: str, read_state: Callable, current_term: Callable[[], int], injections: Injections):
        self._node_id = node_id
        self._read_state = read_state
        self._current_term = current_term
        self._fence = TermFence()
        self._injections = injections

    def WorkOnViewBuildingTasks(self, request, context):
        try:
            self._injections.hit("worker.work_on_tasks")
            self._fence.check(request.term, self._current_term())
            self._read_state(lambda s: check_batch(s, self._node_id, request.shard, list(request.task_ids)))
            self._fence.admit(request.term, self._current_term())
        except Exception as error:  # noqa: BLE001 - mapped to a status, the node keeps serving
            code, message = status_for(error)
            context.abort(code, message)
        context.abort(grpc.StatusCode.UNIMPLEMENTED,
                      "this node does not execute view building tasks yet (the view building coordinator "
                      "milestone adds it); views stay BUILDING and can be read with ALLOW STALE")
