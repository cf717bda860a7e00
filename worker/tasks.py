"""The worker's pure batch bookkeeping: answer from the finished-task ledger, attach to a running batch, or start one.

No I/O, clock or threads: an adapter (the worker servicer) loads the durable ledger, calls these methods under
one lock, and carries out the instructions they return, in order:

- `StartBatch`: run the batch's job (the Spark scan) for its tasks; report `batch_succeeded` once the view rows
  are durably applied at every destination, or `batch_failed`.
- `TasksLeftBatch`: tasks deleted or aborted in group0 left a running batch (its job may skip their views).
- `CancelBatch`: no task is left in the batch: stop its job.
- `RecordFinished`: write the ids, each with the base rows its batch scanned, to the durable ledger — *before*
  delivering the answers that follow it.
- `Answer`: reply to one caller: the ids of its call that are finished with the rows each one's batch scanned
  (also for ids finished before, from the ledger), or an error.
- `PruneLedger`: delete ids from the durable ledger.

Rules:
- The term fence, checked once per call: a call from a term older than the newest this worker admitted or than
  its node's own Raft term is refused (`StaleTerm`, FAILED_PRECONDITION: the caller no longer leads); one from a
  term ahead of the node's Raft term is refused as UNAVAILABLE (the adapter first caught up with the caller's
  group0 index, so a real leader's term is known by then: a stray client's bogus term cannot raise the fence and
  lock out the real leader). Admitting a call raises the fence to its term.
- Ids group0 no longer holds (deleted after the coordinator read them) or holds aborted are not worked on;
  an answer lists only the call's finished ids, so the coordinator never removes a task nobody finished.
- One batch per shard. A call arriving while its shard runs a batch attaches to that batch and is answered when
  it ends, with the call's ids finished by then: a repeated or duplicated call, or a new leader resending the
  same batch, gets them all; a new leader's differently composed batch gets the overlap, and the coordinator
  sends the rest again once the shard is free. The running batch is never stopped for it (its work stays
  valid), and the caller waits instead of retrying against a busy shard.
- A failed batch answers every attached caller with the error and records nothing.
- Pruning removes ledger ids group0 no longer holds; call it only once the node has caught up with group0
  (not while it replays its journal after a restart, when the state is still behind).
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from coordinator.core.errors import InvalidArgument, StaleTerm, Unavailable
from coordinator.core.schema import Replica, Task

# -------------------------------------------------------------------- instructions


@dataclass(frozen=True)
class StartBatch:
    batch_id: int
    shard: int
    term: int
    tasks: tuple[Task, ...]

    @property
    def task_ids(self) -> tuple[str, ...]:
        return tuple(t.id for t in self.tasks)


@dataclass(frozen=True)
class BatchRows:
    """What a batch's job scanned: `scanned` base rows in this run, and per task the rows of its whole batch (a
    resumed batch's checkpointed chunks included)."""

    scanned: int
    per_task: Mapping[str, int]


@dataclass(frozen=True)
class TasksLeftBatch:
    batch_id: int
    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class CancelBatch:
    batch_id: int


@dataclass(frozen=True)
class RecordFinished:
    task_ids: tuple[str, ...]
    rows_scanned: tuple[int, ...] = ()  # parallel to task_ids: the base rows the batch of each id scanned


@dataclass(frozen=True)
class Answer:
    caller: Hashable
    finished: tuple[str, ...] = ()
    error: str | None = None
    rows_scanned: tuple[int, ...] = ()  # parallel to finished


@dataclass(frozen=True)
class PruneLedger:
    task_ids: tuple[str, ...]


Instruction = StartBatch | TasksLeftBatch | CancelBatch | RecordFinished | Answer | PruneLedger


# -------------------------------------------------------------------- the state machine


@dataclass
class RunningBatch:
    """A batch being executed: its live tasks and the callers waiting for it, each with the ids it named."""

    batch_id: int
    shard: int
    term: int
    tasks: dict[str, Task]
    callers: dict[Hashable, tuple[str, ...]] = field(default_factory=dict)


class WorkerTasks:
    """The finished-task ledger's content and the running batches of one node's worker."""

    def __init__(self, node_id: str, finished: Mapping[str, int] | Iterable[str] = ()):
        """`finished`: the ledger's ids, with the base rows each one's batch scanned (plain ids: 0 rows)."""
        self.node_id = node_id
        rows = finished if isinstance(finished, Mapping) else dict.fromkeys(finished, 0)
        self._finished: dict[str, int] = dict(rows)
        self._batches: dict[int, RunningBatch] = {}
        self._next_batch_id = 1
        self._newest_term = 0

    # ----------------------------------------------------------------- queries

    @property
    def finished(self) -> frozenset[str]:
        return frozenset(self._finished)

    @property
    def ledger(self) -> dict[str, int]:
        """The finished ids with the base rows each one's batch scanned (what the durable ledger holds)."""
        return dict(self._finished)

    @property
    def newest_term(self) -> int:
        return self._newest_term

    def batches(self) -> tuple[RunningBatch, ...]:
        return tuple(self._batches.values())

    def batch_on(self, shard: int) -> RunningBatch | None:
        return next((b for b in self._batches.values() if b.shard == shard), None)

    # ----------------------------------------------------------------- events

    def work(self, caller: Hashable, term: int, shard: int, task_ids: Sequence[str], tasks: Mapping[str, Task], *,
             raft_term: int) -> list[Instruction]:
        """A call `WorkOnViewBuildingTasks(term, shard, task_ids)`; `tasks` is group0's task table, caught up
        to the caller's applied index, and `raft_term` this node's Raft term. Refusals raise a CoreError (the
        adapter maps it to a status)."""
        if not task_ids:
            raise InvalidArgument("an empty batch of view building tasks")
        self._check_term(term, raft_term)
        named = tuple(dict.fromkeys(task_ids))
        known = [tasks[i] for i in named if i in tasks]
        self._check_batch(shard, known)
        self._newest_term = term
        todo = [t for t in known if not t.aborted and t.id not in self._finished]
        if not todo:
            return [self._answer(caller, named)]
        running = self.batch_on(shard)
        if running is None:
            return [self._start(caller, term, shard, named, todo)]
        running.callers[caller] = named
        return []

    def tasks_changed(self, tasks: Mapping[str, Task]) -> list[Instruction]:
        """group0 changed: tasks deleted or aborted leave their batch; a batch left empty is cancelled."""
        instructions: list[Instruction] = []
        for batch in list(self._batches.values()):
            gone = tuple(i for i in batch.tasks if i not in tasks or tasks[i].aborted)
            if not gone:
                continue
            for task_id in gone:
                del batch.tasks[task_id]
            if batch.tasks:
                instructions.append(TasksLeftBatch(batch.batch_id, gone))
                continue
            del self._batches[batch.batch_id]
            instructions.append(CancelBatch(batch.batch_id))
            instructions += [self._answer(c, ids) for c, ids in batch.callers.items()]
        return instructions

    def batch_succeeded(self, batch_id: int, tasks: Mapping[str, Task],
                        rows_scanned: int | Mapping[str, int] = 0) -> list[Instruction]:
        """A batch's view rows are durably applied: record its tasks still live in group0 with the rows their batch
        scanned (one count for all, or per task id), answer its callers."""
        batch = self._batches.pop(batch_id, None)
        if batch is None:
            return []
        done = tuple(i for i in batch.tasks if i in tasks and not tasks[i].aborted)
        rows = tuple(rows_scanned.get(i, 0) if isinstance(rows_scanned, Mapping) else rows_scanned for i in done)
        self._finished.update(zip(done, rows))
        recorded: list[Instruction] = [RecordFinished(done, rows)] if done else []
        return recorded + [self._answer(c, ids) for c, ids in batch.callers.items()]

    def batch_failed(self, batch_id: int, error: str) -> list[Instruction]:
        """A batch failed: every caller gets the error; nothing is recorded."""
        batch = self._batches.pop(batch_id, None)
        if batch is None:
            return []
        return [Answer(c, (), error=error) for c in batch.callers]

    def not_finished(self, task_ids: Iterable[str]) -> None:
        """Recording these ids in the durable ledger failed: they are not finished after all."""
        for task_id in task_ids:
            self._finished.pop(task_id, None)

    def prune(self, tasks: Mapping[str, Task]) -> list[Instruction]:
        """Forget ledger ids group0 no longer holds (only once caught up with group0)."""
        stale = tuple(sorted(i for i in self._finished if i not in tasks))
        if not stale:
            return []
        for task_id in stale:
            del self._finished[task_id]
        return [PruneLedger(stale)]

    # ----------------------------------------------------------------- helpers

    def _check_term(self, term: int, raft_term: int) -> None:
        newest = max(self._newest_term, raft_term)
        if term < newest:
            raise StaleTerm(f"stale coordinator term {term}: this worker has seen term {newest}; "
                            "the caller is no longer the group0 leader")
        if term > raft_term:
            raise Unavailable(f"term {term} is ahead of this node's group0 term {raft_term}; retry once it caught up")

    def _check_batch(self, shard: int, known: list[Task]) -> None:
        foreign = [t.id for t in known if t.replica != Replica(self.node_id, shard)]
        if foreign:
            raise InvalidArgument(f"task(s) {', '.join(foreign)} do not belong to {self.node_id} shard {shard}")
        if len({(t.type, t.base_id, t.tablet_id) for t in known}) > 1:
            raise InvalidArgument("a batch must share task type, base table and tablet")

    def _start(self, caller: Hashable, term: int, shard: int, named: tuple[str, ...],
               todo: list[Task]) -> StartBatch:
        batch = RunningBatch(self._next_batch_id, shard, term, {t.id: t for t in todo}, {caller: named})
        self._next_batch_id += 1
        self._batches[batch.batch_id] = batch
        return StartBatch(batch.batch_id, shard, term, tuple(todo))

    def _answer(self, caller: Hashable, named: tuple[str, ...]) -> Answer:
        finished = tuple(i for i in named if i in self._finished)
        return Answer(caller, finished, rows_scanned=tuple(self._finished[i] for i in finished))
