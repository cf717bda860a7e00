"""The worker executor on real threads: jobs per batch, durable ledger before answers, attach, cancel, failure."""
from __future__ import annotations

import threading
from unittest.mock import ANY

import pytest

from coordinator.core.errors import StaleTerm, Unavailable
from coordinator.core.schema import TASK_BUILD_RANGE, Replica, Task
from worker.executor import BatchCancelled, BatchFailure, BatchStopped, WorkerExecutor
from worker.tasks import Answer

BASE = "b" * 32
WAIT = 10


class MemoryLedger:
    """The ledger's contract in memory; `events` (shared with the answers' callbacks) shows when ids became durable
    relative to the answers."""

    def __init__(self, ids=(), events=None):
        self.ids = dict(ids) if isinstance(ids, dict) else dict.fromkeys(ids, 0)
        self.events = [] if events is None else events

    def all(self):
        return dict(self.ids)

    def record(self, task_ids, rows_scanned=()):
        self.ids.update(zip(task_ids, rows_scanned or [0] * len(task_ids)))
        self.events.append(("record", tuple(task_ids)))

    def forget(self, task_ids):
        for task_id in task_ids:
            self.ids.pop(task_id, None)


class Jobs:
    """A run_batch that blocks each job until the test releases (or fails) it."""

    def __init__(self):
        self.started = []
        self.release = {}
        self.cond = threading.Condition()

    def __call__(self, start, control):
        gate = threading.Event()
        with self.cond:
            self.started.append((start, control))
            self.release[start.batch_id] = gate
            self.cond.notify_all()
        gate.wait(WAIT)
        if control.cancelled.is_set():
            raise BatchCancelled()
        if getattr(gate, "error", None):
            raise gate.error
        return 100 * len(control.tasks)

    def wait_started(self, count):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.started) >= count, WAIT)

    def finish(self, batch_id, error=None):
        gate = self.release[batch_id]
        gate.error = error
        gate.set()


def task(task_id, view="v1", shard=0):
    return Task(task_id, TASK_BUILD_RANGE, BASE, view, Replica("n1", shard), 0)


@pytest.fixture
def worker():
    tasks = {t.id: t for t in (task("a", "v1"), task("b", "v2"), task("c", "v1", shard=1))}
    ledger, jobs = MemoryLedger(), Jobs()
    executor = WorkerExecutor("n1", ledger, lambda: dict(tasks), jobs, raft_term=lambda: 1)
    yield executor, tasks, ledger, jobs
    for gate in jobs.release.values():
        gate.set()
    executor.close()


def call(executor, *args):
    """executor.work(*args) on a thread of its own: its answer, or the error it raised (a call still waiting
    when the test ends gets Unavailable from the closing executor), lands in `result`."""
    result = {}

    def work():
        try:
            result["answer"] = executor.work(*args, timeout=WAIT)
        except Exception as error:  # noqa: BLE001 - kept for the test to look at
            result["error"] = error

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread, result


def test_a_batch_runs_once_for_repeated_calls_and_is_recorded_before_the_answer(worker):
    executor, _, ledger, jobs = worker
    first = executor.submit(1, 0, ["a", "b"])
    jobs.wait_started(1)
    second = executor.submit(1, 0, ["b", "a"])  # a repeated call attaches
    for name, future in (("first", first), ("second", second)):
        # runs on the thread that delivers the answer, at that moment: one event log with the ledger's writes
        future.add_done_callback(lambda f, name=name: ledger.events.append(("answer", name, f.result().finished)))
    jobs.finish(jobs.started[0][0].batch_id)
    assert set(first.result(WAIT).finished) == {"a", "b"} == set(second.result(WAIT).finished)
    assert len(jobs.started) == 1
    assert first.result().rows_scanned == (200, 200) and ledger.ids == {"a": 200, "b": 200}
    assert ledger.events == [("record", ("a", "b")), ("answer", "first", ("a", "b")),
                             ("answer", "second", ("b", "a"))], "the ids are durable before any answer leaves"
    assert executor.counters.tasks_finished == 2


def test_the_executor_fences_each_call_by_the_nodes_raft_term_read_at_the_call(worker):
    executor, tasks, _, jobs = worker
    terms = iter([3, 3])
    fenced = WorkerExecutor("n1", MemoryLedger(), lambda: dict(tasks), jobs, raft_term=lambda: next(terms))
    try:
        with pytest.raises(StaleTerm, match="stale coordinator term 2: this worker has seen term 3"):
            fenced.submit(2, 0, ["a"])
        with pytest.raises(Unavailable, match="term 4 is ahead"):
            fenced.submit(4, 0, ["a"])
        assert jobs.started == []
    finally:
        fenced.close()


def test_finished_ids_are_answered_from_the_ledger_after_a_restart(worker):
    _, tasks, _, jobs = worker
    restarted = WorkerExecutor("n1", MemoryLedger({"a": 120}), lambda: dict(tasks), jobs, raft_term=lambda: 1)
    try:
        assert restarted.work(1, 0, ["a"], timeout=WAIT) == Answer(ANY, ("a",), rows_scanned=(120,))
        assert jobs.started == [] and restarted.counters.tasks_answered_from_ledger == 1
    finally:
        restarted.close()


def test_shards_run_in_parallel_and_a_call_to_a_busy_shard_waits_for_its_batch(worker):
    executor, _, _, jobs = worker
    call(executor, 1, 0, ["a"])
    call(executor, 1, 1, ["c"])
    jobs.wait_started(2)
    with pytest.raises(Unavailable, match="still running"):
        executor.work(1, 0, ["b"], timeout=0.2)  # attached to a's batch: nothing of it finished in time
    assert executor.running_batches() == 2 and len(jobs.started) == 2


def test_a_batch_stopped_on_purpose_tells_its_callers_why_and_counts_as_no_failure(worker):
    executor, _, ledger, jobs = worker
    thread, result = call(executor, 1, 0, ["a"])
    jobs.wait_started(1)
    jobs.finish(jobs.started[0][0].batch_id, error=BatchStopped("the build of view(s) v1 is paused"))
    thread.join(WAIT)
    assert result["answer"].error == "the build of view(s) v1 is paused" and result["answer"].finished == ()
    assert ledger.ids == {} and executor.counters.batches_failed == 0 and executor.failures() == []


def test_a_failed_batch_reports_the_error_and_records_nothing(worker):
    executor, _, ledger, jobs = worker
    thread, result = call(executor, 1, 0, ["a"])
    jobs.wait_started(1)
    jobs.finish(jobs.started[0][0].batch_id, error=Unavailable("view replica n2 is down"))
    thread.join(WAIT)
    assert result["answer"].error == "view replica n2 is down" and result["answer"].finished == ()
    assert ledger.ids == {} and executor.counters.batches_failed == 1


def test_a_dropped_view_leaves_the_batch_and_the_last_one_cancels_it(worker):
    executor, tasks, ledger, jobs = worker
    thread, result = call(executor, 1, 0, ["a", "b"])
    jobs.wait_started(1)
    start, control = jobs.started[0]
    del tasks["b"]
    executor.tasks_changed()
    assert set(control.tasks) == {"a"} and not control.cancelled.is_set()
    del tasks["a"]
    executor.tasks_changed()
    assert control.cancelled.is_set()
    thread.join(WAIT)
    assert result["answer"].finished == () and ledger.ids == {}


def test_a_caller_that_stops_waiting_gets_unavailable_and_the_batch_goes_on(worker):
    executor, _, ledger, jobs = worker
    with pytest.raises(Unavailable, match="still running"):
        executor.work(1, 0, ["a"], timeout=0.05)
    jobs.finish(jobs.started[0][0].batch_id)
    assert executor.work(1, 0, ["a"], timeout=WAIT).finished == ("a",)
    assert set(ledger.ids) == {"a"}


def test_a_ledger_that_cannot_be_written_fails_the_batch_and_frees_the_shard(worker):
    executor, _, ledger, jobs = worker
    ledger.record = lambda ids, rows=(): (_ for _ in ()).throw(OSError("disk full"))
    thread, result = call(executor, 1, 0, ["a"])
    jobs.wait_started(1)
    jobs.finish(jobs.started[0][0].batch_id)
    thread.join(WAIT)
    assert "disk full" in (result.get("answer").error or "")
    assert executor.running_batches() == 0 and executor.counters.batches_failed == 1


def run_failing(executor, jobs, task_ids, error):
    """One call whose batch fails with `error`; returns once it is answered."""
    started = len(jobs.started) + 1
    thread, result = call(executor, 1, 0, task_ids)
    jobs.wait_started(started)
    jobs.finish(jobs.started[-1][0].batch_id, error=error)
    thread.join(WAIT)
    return result["answer"]


def test_failed_batches_are_counted_per_view_until_one_of_the_view_succeeds(worker):
    executor, _, _, jobs = worker
    assert executor.failures() == []
    run_failing(executor, jobs, ["a", "b"], Unavailable("view replica n2 is down"))
    run_failing(executor, jobs, ["a"], OSError("disk full"))
    assert executor.failures() == [BatchFailure("v1", "OSError: disk full", 2),
                                   BatchFailure("v2", "view replica n2 is down", 1)]
    thread, result = call(executor, 1, 0, ["a"])
    jobs.wait_started(3)
    jobs.finish(jobs.started[-1][0].batch_id)
    thread.join(WAIT)
    assert result["answer"].finished == ("a",)
    assert executor.failures() == [BatchFailure("v2", "view replica n2 is down", 1)]


def test_a_batch_the_ledger_refused_counts_as_a_failure_of_its_views(worker):
    executor, _, ledger, jobs = worker
    ledger.record = lambda ids, rows=(): (_ for _ in ()).throw(OSError("disk full"))
    thread, _ = call(executor, 1, 0, ["a"])
    jobs.wait_started(1)
    jobs.finish(jobs.started[0][0].batch_id)
    thread.join(WAIT)
    assert executor.failures() == [BatchFailure("v1", "the finished-task ledger failed: disk full", 1)]


def test_pruning_forgets_the_failures_of_views_without_tasks(worker):
    executor, tasks, _, jobs = worker
    run_failing(executor, jobs, ["a", "b"], Unavailable("view replica n2 is down"))
    del tasks["b"]
    executor.prune()
    assert [failure.view_id for failure in executor.failures()] == ["v1"]
