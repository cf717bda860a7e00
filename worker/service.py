"""The worker's gRPC endpoint: catches up with the caller's group0 index, hands the call to the executor."""
from __future__ import annotations

from collections.abc import Callable

from common.injection import Injections
from common.status import unary
from coordinator.core.errors import Unavailable
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc
from worker.executor import WorkerExecutor


CatchUp = Callable[[int], None]  # returns once this node applied the given group0 index (or raises Unavailable)
ANSWER_MARGIN = 2.0  # seconds kept from the caller's deadline to send the answer back
DEFAULT_ANSWER_WAIT = 60.0  # when the caller set no deadline


class WorkerService(rpc.WorkerServicer):
    """Answers WorkOnViewBuildingTasks: catch up with the caller's group0 index, then let the executor fence the
    call by term and answer it from the ledger, attach it to the running batch or start one, and wait for its end."""

    def __init__(self, executor: WorkerExecutor, catch_up: CatchUp, injections: Injections):
        self._executor = executor
        self._catch_up = catch_up
        self._injections = injections

    @unary
    def WorkOnViewBuildingTasks(self, request, context):
        self._injections.hit("worker.work_on_tasks")
        self._catch_up(request.applied_index)
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
