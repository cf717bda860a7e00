"""Carries out the worker's batch bookkeeping (worker/tasks.py): runs batch jobs on threads, keeps the ledger durable."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from coordinator.core.errors import CoreError, Unavailable
from coordinator.core.schema import Task

from worker.tasks import (
    Answer,
    BatchRows,
    CancelBatch,
    Instruction,
    PruneLedger,
    RecordFinished,
    StartBatch,
    TasksLeftBatch,
    WorkerTasks,
)

log = logging.getLogger(__name__)


class Ledger(Protocol):
    """The durable set of finished task ids, with the base rows each one's batch scanned (storage/ledger.py)."""

    def all(self) -> Mapping[str, int]: ...

    def record(self, task_ids: Iterable[str], rows_scanned: Iterable[int] = ()) -> None: ...

    def forget(self, task_ids: Iterable[str]) -> None: ...


@dataclass
class BatchControl:
    """What a running job sees of its batch: the tasks still in it, and whether it was cancelled."""

    tasks: dict[str, Task]
    cancelled: threading.Event = field(default_factory=threading.Event)

    def live_tasks(self) -> list[Task]:
        return list(self.tasks.values())


class BatchCancelled(Exception):
    """Raised by a job that noticed its batch was cancelled (every task left it)."""


class BatchStopped(Exception):
    """Raised by a job that stopped on purpose before its end (its views paused, say): its callers get the message,
    and it counts as no failure."""


@dataclass
class WorkerCounters:
    batches_started: int = 0
    batches_failed: int = 0
    tasks_finished: int = 0
    tasks_answered_from_ledger: int = 0
    rows_scanned: int = 0


@dataclass(frozen=True)
class BatchFailure:
    """A view whose batches failed on this worker since the last one that succeeded: its last error, how many."""

    view_id: str
    error: str
    attempts: int


RunBatch = Callable[[StartBatch, BatchControl], int | BatchRows]  # the rows scanned


class WorkerExecutor:
    """One node's worker: answers calls (blocking until their batch ends), runs one job per started batch."""

    def __init__(self, node_id: str, ledger: Ledger, read_tasks: Callable[[], Mapping[str, Task]],
                 run_batch: RunBatch, raft_term: Callable[[], int], max_parallel: int = 4):
        self._ledger = ledger
        self._read_tasks = read_tasks
        self._raft_term = raft_term
        self._run_batch = run_batch
        self._book = WorkerTasks(node_id, ledger.all())
        self._lock = threading.Lock()
        self._answers: set[Future] = set()  # the calls waiting for an answer
        self._controls: dict[int, BatchControl] = {}
        self._pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="view-build")
        self._failures: dict[str, BatchFailure] = {}  # view id -> its batches' failures in a row
        self.counters = WorkerCounters()

    def work(self, term: int, shard: int, task_ids: list[str], timeout: float | None = None) -> Answer:
        """Handle one WorkOnViewBuildingTasks call; returns when its ids are finished or its batch failed."""
        answer = self.submit(term, shard, task_ids)
        try:
            return answer.result(timeout)
        except TimeoutError:
            raise Unavailable(f"the batch of {', '.join(task_ids)} is still running; call again to wait for it") from None
        finally:
            with self._lock:
                self._answers.discard(answer)

    def submit(self, term: int, shard: int, task_ids: list[str]) -> Future:
        """Take one call under the lock (the term fence, then answer, attach or start): a future of its Answer.
        Refusals raise a CoreError."""
        answer = Future()
        with self._lock:
            self._answers.add(answer)
            try:
                instructions = self._book.work(answer, term, shard, task_ids, self._read_tasks(),
                                               raft_term=self._raft_term())
                if instructions and all(isinstance(i, Answer) for i in instructions):
                    self.counters.tasks_answered_from_ledger += sum(len(i.finished) for i in instructions)
                self._carry_out(instructions)
            except BaseException:
                self._answers.discard(answer)
                raise
        return answer

    def tasks_changed(self) -> None:
        """group0 applied something: tasks deleted or aborted leave their batches."""
        with self._lock:
            self._carry_out(self._book.tasks_changed(self._read_tasks()))

    def prune(self) -> None:
        """Forget ledger ids group0 no longer holds, and the failures of views without a task left; only once
        this node caught up with group0."""
        with self._lock:
            tasks = self._read_tasks()
            self._carry_out(self._book.prune(tasks))
            building = {task.view_id for task in tasks.values()}
            for view_id in set(self._failures) - building:
                del self._failures[view_id]

    def running_batches(self) -> int:
        with self._lock:
            return len(self._book.batches())

    def failures(self) -> list[BatchFailure]:
        """The views whose batches failed here since their last success, by view id."""
        with self._lock:
            return [self._failures[view_id] for view_id in sorted(self._failures)]

    def close(self, wait: bool = True) -> None:
        """Cancel every batch and answer every waiting caller UNAVAILABLE (the node is stopping); `wait` for
        the running jobs to notice."""
        with self._lock:
            for control in self._controls.values():
                control.cancelled.set()
            for answer in self._answers:
                if not answer.done():
                    answer.set_exception(Unavailable("this node is stopping; the coordinator will send the batch "
                                                     "again once it is back"))
        self._pool.shutdown(wait=wait, cancel_futures=True)

    # ------------------------------------------------------------ instructions

    def _carry_out(self, instructions: list[Instruction]) -> None:
        for instruction in instructions:
            self._HANDLERS[type(instruction)](self, instruction)

    def _start(self, start: StartBatch) -> None:
        control = BatchControl({t.id: t for t in start.tasks})
        self._controls[start.batch_id] = control
        self.counters.batches_started += 1
        self._pool.submit(self._run, start, control)

    def _tasks_left(self, left: TasksLeftBatch) -> None:
        control = self._controls.get(left.batch_id)
        for task_id in left.task_ids if control else ():
            control.tasks.pop(task_id, None)

    def _cancel(self, cancel: CancelBatch) -> None:
        control = self._controls.pop(cancel.batch_id, None)
        if control is not None:
            control.cancelled.set()

    def _record(self, record: RecordFinished) -> None:
        self._ledger.record(record.task_ids, record.rows_scanned)
        self.counters.tasks_finished += len(record.task_ids)

    def _answer(self, answer: Answer) -> None:
        future = answer.caller
        if future in self._answers and not future.done():
            self._answers.discard(future)
            future.set_result(answer)

    def _prune(self, prune: PruneLedger) -> None:
        self._ledger.forget(prune.task_ids)

    _HANDLERS = {StartBatch: _start, TasksLeftBatch: _tasks_left, CancelBatch: _cancel,
                 RecordFinished: _record, Answer: _answer, PruneLedger: _prune}

    # ------------------------------------------------------------ the job

    def _run(self, start: StartBatch, control: BatchControl) -> None:
        try:
            rows = self._run_batch(start, control)
        except BatchCancelled:
            return
        except BatchStopped as stop:
            self._stopped(start, str(stop))
            return
        except Exception as error:  # noqa: BLE001 - a failed batch is reported to its callers, who retry
            self._failed(start, error)
            return
        try:
            tasks = self._read_tasks()
        except Exception as error:  # noqa: BLE001 - a failed batch, retried by the coordinator
            self._failed(start, error)
            return
        scanned, per_task = (rows.scanned, rows.per_task) if isinstance(rows, BatchRows) else (rows, rows)
        with self._lock:
            self._controls.pop(start.batch_id, None)
            self.counters.rows_scanned += scanned
            instructions = self._book.batch_succeeded(start.batch_id, tasks, rows_scanned=per_task)
            try:
                self._carry_out(instructions)  # the ledger first, then the answers
            except Exception as error:  # noqa: BLE001 - e.g. the ledger could not be written
                self._not_recorded(start, instructions, error)
            else:
                for view_id in views_of(start):
                    self._failures.pop(view_id, None)

    def _not_recorded(self, start: StartBatch, instructions: list[Instruction], error: Exception) -> None:
        """The ledger refused a succeeded batch's ids: they are not finished; every caller gets the error."""
        log.error("recording view building batch %s (%s) as finished failed: %s", start.batch_id,
                  ", ".join(start.task_ids), error)
        self.counters.batches_failed += 1
        self._note_failure(start, f"the finished-task ledger failed: {error}")
        for instruction in instructions:
            if isinstance(instruction, RecordFinished):
                self._book.not_finished(instruction.task_ids)
            elif isinstance(instruction, Answer):
                self._answer(Answer(instruction.caller, (), error=f"the finished-task ledger failed: {error}"))

    def _failed(self, start: StartBatch, error: Exception) -> None:
        message = error.message if isinstance(error, CoreError) else f"{type(error).__name__}: {error}"
        if not isinstance(error, CoreError):
            log.exception("view building batch %s (%s) failed", start.batch_id, ", ".join(start.task_ids))
        with self._lock:
            self._controls.pop(start.batch_id, None)
            self.counters.batches_failed += 1
            self._note_failure(start, message)
            self._carry_out(self._book.batch_failed(start.batch_id, message))

    def _stopped(self, start: StartBatch, message: str) -> None:
        log.info("view building batch %s (%s) stopped: %s", start.batch_id, ", ".join(start.task_ids), message)
        with self._lock:
            self._controls.pop(start.batch_id, None)
            self._carry_out(self._book.batch_failed(start.batch_id, message))

    def _note_failure(self, start: StartBatch, message: str) -> None:
        """One more failure in a row for each view of the batch (under the lock)."""
        for view_id in views_of(start):
            previous = self._failures.get(view_id)
            self._failures[view_id] = BatchFailure(view_id, message, previous.attempts + 1 if previous else 1)


def views_of(start: StartBatch) -> set[str]:
    return {task.view_id for task in start.tasks if task.view_id is not None}
