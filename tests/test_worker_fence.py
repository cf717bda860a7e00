"""The worker's term fence (worker/tasks.py, checked once per call): older terms refused, newer ones admitted only
once the node's own Raft term has caught up."""
from __future__ import annotations

import pytest

from coordinator.core.errors import FailedPrecondition, StaleTerm, Unavailable
from coordinator.core.schema import TASK_BUILD_RANGE, Replica, Task
from worker.tasks import StartBatch, WorkerTasks

TASKS = {"a": Task("a", TASK_BUILD_RANGE, "b" * 32, "v1", Replica("n1", 0), 0)}


def call(worker: WorkerTasks, term: int, raft_term: int) -> list:
    return worker.work(f"call of term {term}", term, 0, ["a"], TASKS, raft_term=raft_term)


def test_a_term_older_than_the_nodes_own_is_refused_as_stale():
    worker = WorkerTasks("n1")
    with pytest.raises(StaleTerm, match="stale coordinator term 2: this worker has seen term 3"):
        call(worker, 2, raft_term=3)
    assert worker.newest_term == 0 and worker.batches() == ()


def test_a_stale_term_is_a_failed_precondition():
    assert issubclass(StaleTerm, FailedPrecondition) and StaleTerm("x").code == "FAILED_PRECONDITION"


def test_a_term_ahead_of_the_nodes_own_is_unavailable_until_the_node_caught_up_and_then_raises_the_fence():
    worker = WorkerTasks("n1")
    with pytest.raises(Unavailable, match="term 7 is ahead of this node's group0 term 5"):
        call(worker, 7, raft_term=5)  # a stray client's bogus term cannot raise the fence
    assert worker.newest_term == 0
    assert isinstance(call(worker, 7, raft_term=7)[0], StartBatch)  # after the read barrier the node knows it
    assert worker.newest_term == 7
    with pytest.raises(StaleTerm, match="stale coordinator term 5: this worker has seen term 7"):
        call(worker, 5, raft_term=5)  # the deposed leader is refused, even by a node whose term lags


def test_the_same_term_is_admitted_again_and_the_fence_never_goes_back():
    worker = WorkerTasks("n1")
    call(worker, 4, raft_term=4)
    assert call(worker, 4, raft_term=4) == []  # attached to the running batch
    with pytest.raises(StaleTerm):
        call(worker, 3, raft_term=3)
    assert worker.newest_term == 4


def test_a_restarted_worker_still_refuses_terms_older_than_its_nodes_raft_term():
    worker = WorkerTasks("n1", {"a": 5})  # a fresh process: nothing admitted yet, the Raft term survived the restart
    with pytest.raises(StaleTerm):
        call(worker, 6, raft_term=8)
