"""The worker's gRPC endpoint: catches up with group0, fences calls by Raft term, hands them to the executor."""
from __future__ import annotations

import threading
from collections.abc import Callable

from common.injection import Injections
from common.status import unary
from coordinator.core.errors import InvalidArgument, Unavailable
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc
from worker.executor import WorkerExecutor
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


CatchUp = Callable[[int], None]  # returns once this node applied the given group0 index (or raises Unavailable)
ANSWER_MARGIN = 2.0  # seconds kept from the caller's deadline to send the answer back
DEFAULT_ANSWER_WAIT = 60.0  # when the caller set no deadline


class WorkerService(rpc.WorkerServicer):
    """Answers WorkOnViewBuildingTasks: catch up with the caller's group0 index, fence by term, then let the
    executor answer from the ledger, attach to the running batch or start one, and wait for its end."""

    def __init__(self, executor: WorkerExecutor, current_term: Callable[[], int], catch_up: CatchUp,
                 injections: Injections):
        self._executor = executor
        self._current_term = current_term
        self._catch_up = catch_up
        self._fence = TermFence()
        self._injections = injections

    @property
    def fence(self) -> TermFence:
        return self._fence

    @unary
    def WorkOnViewBuildingTasks(self, request, context):
        self._injections.hit("worker.work_on_tasks")
        if not request.task_ids:
            raise InvalidArgument("an empty batch of view building tasks")
        refuse_stale_term(request.term, max(self._fence.highest, self._current_term()))
        self._catch_up(request.applied_index)
        self._fence.check(request.term, self._current_term())
        self._fence.admit(request.term, self._current_term())
        answer = self._executor.work(request.term, request.shard, list(request.task_ids), _answer_wait(context))
        if answer.error is not None:
            raise Unavailable(f"view building batch {', '.join(request.task_ids)} failed: {answer.error}")
        return pb.WorkResponse(finished_task_ids=list(answer.finished), finished_rows_scanned=list(answer.rows_scanned),
                               rows_scanned=max(answer.rows_scanned, default=0))


def _answer_wait(context) -> float:
    remaining = context.time_remaining() if context is not None else None
    if remaining is None or remaining > 1e9:
        return DEFAULT_ANSWER_WAIT
    return max(remaining - ANSWER_MARGIN, 0.5)
