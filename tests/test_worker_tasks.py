"""The worker's pure batch bookkeeping (worker/tasks.py): ledger answers, attaching, group0 changes, failures."""
from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

import pytest

from coordinator.core.errors import FailedPrecondition, InvalidArgument
from coordinator.core.schema import TASK_BUILD_RANGE, Replica, Task
from worker.tasks import (
    Answer,
    CancelBatch,
    PruneLedger,
    RecordFinished,
    StartBatch,
    TasksLeftBatch,
    WorkerTasks,
)

BASE = "b" * 32


def task(task_id: str, view: str = "v1", tablet: int = 0, node: str = "n1", shard: int = 0) -> Task:
    return Task(task_id, TASK_BUILD_RANGE, BASE, view, Replica(node, shard), tablet)


def table(*tasks: Task) -> dict[str, Task]:
    return {t.id: t for t in tasks}


A, B, C = task("a", "v1"), task("b", "v2"), task("c", "v3")
GROUP0 = table(A, B, C, task("x", "v1", tablet=1), task("s1", "v1", shard=1))


def work(worker: WorkerTasks, caller: str, term: int, shard: int, ids, tasks, raft_term: int | None = None):
    """A call of `term` to a node whose Raft term is `raft_term` (by default the caller's: the node caught up)."""
    return worker.work(caller, term, shard, ids, tasks, raft_term=term if raft_term is None else raft_term)


def started(instructions) -> StartBatch:
    (start,) = instructions
    assert isinstance(start, StartBatch)
    return start


def answer(caller: str, finished: tuple[str, ...], rows: int = 0) -> Answer:
    """The answer naming `finished`, each id with `rows` base rows scanned."""
    return Answer(caller, finished, rows_scanned=(rows,) * len(finished))


def record(task_ids: tuple[str, ...], rows: int = 0) -> RecordFinished:
    return RecordFinished(task_ids, (rows,) * len(task_ids))


# ----------------------------------------------------------------- calls


def test_a_call_naming_only_finished_tasks_is_answered_from_the_ledger_also_after_a_restart():
    worker = WorkerTasks("n1")
    batch = started(work(worker, "call1", 1, 0, ["a", "b"], GROUP0))
    assert batch.task_ids == ("a", "b") and batch.term == 1 and batch.shard == 0
    done = worker.batch_succeeded(batch.batch_id, GROUP0, rows_scanned=7)
    assert done == [RecordFinished(("a", "b"), (7, 7)), Answer("call1", ("a", "b"), rows_scanned=(7, 7))]
    assert work(worker, "call2", 1, 0, ["a", "b"], GROUP0) == [answer("call2", ("a", "b"), rows=7)]
    restarted = WorkerTasks("n1", finished=worker.ledger)
    assert work(restarted, "call3", 2, 0, ["b", "a"], GROUP0) == [answer("call3", ("b", "a"), rows=7)]


def test_a_repeated_call_attaches_to_the_running_batch_and_both_callers_are_answered():
    worker = WorkerTasks("n1")
    batch = started(work(worker, "first", 1, 0, ["a", "b"], GROUP0))
    assert work(worker, "again", 1, 0, ["a", "b"], GROUP0) == []
    assert work(worker, "subset", 2, 0, ["b"], GROUP0) == [], "a newer leader resending part of it attaches too"
    answers = worker.batch_succeeded(batch.batch_id, GROUP0)[1:]
    assert answers == [answer("first", ("a", "b")), answer("again", ("a", "b")), answer("subset", ("b",))]


def test_only_the_unfinished_tasks_of_a_call_are_run_and_the_answer_names_all_finished():
    worker = WorkerTasks("n1", finished={"a"})
    batch = started(work(worker, "call", 1, 0, ["a", "b"], GROUP0))
    assert batch.task_ids == ("b",)
    assert worker.batch_succeeded(batch.batch_id, GROUP0)[-1] == answer("call", ("a", "b"))


def test_a_call_for_other_tasks_of_a_busy_shard_waits_for_the_running_batch_and_gets_the_overlap():
    worker = WorkerTasks("n1")
    batch = started(work(worker, "one", 1, 0, ["a", "b"], GROUP0))
    assert work(worker, "two", 2, 0, ["a", "b", "c"], GROUP0) == [], "attached, not refused"
    assert started(work(worker, "other shard", 2, 1, ["s1"], GROUP0)).shard == 1
    assert [b.batch_id for b in worker.batches()] == [batch.batch_id, batch.batch_id + 1]
    answers = worker.batch_succeeded(batch.batch_id, GROUP0)[1:]
    assert answers == [answer("one", ("a", "b")), answer("two", ("a", "b"))], "c was not run: sent again later"
    assert started(work(worker, "three", 2, 0, ["c"], GROUP0)).task_ids == ("c",)


def test_a_call_from_an_older_term_than_the_newest_accepted_is_refused():
    worker = WorkerTasks("n1")
    started(work(worker, "new", 5, 0, ["a"], GROUP0))
    with pytest.raises(FailedPrecondition, match="stale coordinator term 4: this worker has seen term 5"):
        work(worker, "old", 4, 0, ["a"], GROUP0)
    assert worker.newest_term == 5 and worker.batch_on(0).callers == {"new": ("a",)}


@pytest.mark.parametrize("ids, problem", [
    ([], "an empty batch"),
    (["s1"], "do not belong to n1 shard 0"),
    (["a", "x"], "share task type, base table and tablet"),
])
def test_malformed_calls_are_refused(ids, problem):
    worker = WorkerTasks("n1")
    with pytest.raises(InvalidArgument, match=problem):
        work(worker, "call", 1, 0, ids, GROUP0)
    assert worker.batches() == () and worker.newest_term == 0


def test_ids_group0_no_longer_holds_or_aborted_are_not_run():
    aborted = dataclasses.replace(B, aborted=True)
    worker = WorkerTasks("n1")
    assert work(worker, "call", 1, 0, ["gone", "b"], table(A, aborted)) == [answer("call", ())]
    assert started(work(worker, "call", 1, 0, ["gone", "a", "b"], table(A, aborted))).task_ids == ("a",)


# ----------------------------------------------------------------- group0 changes


def test_a_deleted_task_leaves_its_batch_and_is_not_recorded():
    worker = WorkerTasks("n1")
    batch = started(work(worker, "call", 1, 0, ["a", "b"], GROUP0))
    without_a = table(B, C)
    assert worker.tasks_changed(without_a) == [TasksLeftBatch(batch.batch_id, ("a",))]
    assert worker.tasks_changed(without_a) == []
    assert worker.batch_succeeded(batch.batch_id, without_a) == [record(("b",)), answer("call", ("b",))]


def test_the_batch_is_cancelled_only_when_no_task_is_left():
    worker = WorkerTasks("n1")
    batch = started(work(worker, "call", 1, 0, ["a", "b"], GROUP0))
    a_aborted = dataclasses.replace(A, aborted=True)
    assert worker.tasks_changed(table(a_aborted, B)) == [TasksLeftBatch(batch.batch_id, ("a",))]
    assert worker.tasks_changed({}) == [CancelBatch(batch.batch_id), answer("call", ())]
    assert worker.batches() == () and worker.batch_succeeded(batch.batch_id, GROUP0) == []


def test_a_task_deleted_before_the_worker_noticed_is_still_not_recorded():
    worker = WorkerTasks("n1")
    batch = started(work(worker, "call", 1, 0, ["a", "b"], GROUP0))
    assert worker.batch_succeeded(batch.batch_id, table(B)) == [record(("b",)), answer("call", ("b",))]
    assert worker.finished == {"b"}


def test_a_failed_batch_is_reported_to_every_caller_and_records_nothing():
    worker = WorkerTasks("n1")
    batch = started(work(worker, "one", 1, 0, ["a"], GROUP0))
    work(worker, "two", 1, 0, ["a"], GROUP0)
    assert worker.batch_failed(batch.batch_id, "scan failed") == [Answer("one", (), error="scan failed"),
                                                                 Answer("two", (), error="scan failed")]
    assert worker.finished == frozenset() and worker.batch_failed(batch.batch_id, "again") == []
    assert started(work(worker, "retry", 1, 0, ["a"], GROUP0)).task_ids == ("a",)


def test_the_ledger_is_pruned_of_ids_group0_no_longer_holds():
    worker = WorkerTasks("n1", finished={"a", "gone", "old"})
    assert worker.prune(GROUP0) == [PruneLedger(("gone", "old"))]
    assert worker.finished == {"a"} and worker.prune(GROUP0) == []


# ----------------------------------------------------------------- layering


def test_worker_tasks_imports_only_the_standard_library_and_the_pure_core():
    path = Path(__file__).resolve().parent.parent / "worker" / "tasks.py"
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "worker/tasks.py imports absolutely"
            names.append(node.module)
    outside = [n for n in names if n.split(".")[0] not in sys.stdlib_module_names | {"__future__"}
               and not n.startswith("coordinator.core")]
    assert outside == []
