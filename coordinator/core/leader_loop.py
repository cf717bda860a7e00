"""The view building leader loop as a pure state machine: events in, instructions out (no I/O, clock or threads).

In the style of dask's `WorkerState`: the shell (`coordinator/view_building.py`) owns the thread, the clock,
random jitter, command ids, gRPC futures, metrics and logging. It feeds events to `LeaderLoop.handle(state,
*events)` (under group0's read lock, `state` applied at least up to the last `Applied` index) and carries out the
instructions returned, in order:

- `SendBatch(epoch, term, applied_index, batch)`: call `WorkOnViewBuildingTasks`; report `BatchAnswered` or
  `BatchFailed` with the same epoch.
- `ProposeCommand(epoch, command)`: propose `command` (with a fresh `cmd_id`); report `ProposalDone` with the
  typed refusal, if any (a timeout is an `Unavailable` refusal: the command may or may not have been applied).
- `WakeAt(time)`: feed a `Tick` at that time at the latest.
- `Log(level, message)`: log it (warnings already rate limited).
- `DispatchPaused()`: the pause point held dispatch back this round (the shell counts the hit).

Events: `LeadershipChanged(leader, term)` (read as one consistent pair; a repeat of the current pair changes
nothing), `Applied(index)`, `BatchAnswered`/`BatchFailed` (late ones, of an older epoch, are ignored),
`ProposalDone`, `Tick(now, dispatch_paused)`.

A new term, or losing leadership, forgets every call in flight (a new epoch), the finished ids not yet flushed and
the retry schedule: the loop of the next term starts from the replicated state alone. A command refused for
another reason (or not known to be committed) holds every proposal back for `leader_recheck` seconds. A `StaleTerm` refusal, or a
state whose loop term is newer than ours, means a newer leader's loop took over: this loop stops dispatching and
flushing until the term changes. Batches are not sent while a processing-base command is outstanding (a new term's
first command claims the term), and a command is never proposed twice at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import planner
from .commands import Command, FinishViewBuildingTasks, SetProcessingBase
from .errors import CoreError, StaleTerm
from .planner import Backoff, LogLimiter, RetrySchedule
from .schema import Replica

if TYPE_CHECKING:
    from .state import Group0State


@dataclass(frozen=True)
class BatchReply:
    """A worker's answer to one batch: the ids it finished and, parallel to them, the base rows each one's batch
    scanned (empty: unknown, counted as 0)."""

    finished: tuple[str, ...]
    rows_scanned: tuple[int, ...] = ()

    def rows_of(self) -> dict[str, int]:
        return dict(zip(self.finished, self.rows_scanned))


# -------------------------------------------------------------------- events


@dataclass(frozen=True)
class LeadershipChanged:
    leader: bool
    term: int


@dataclass(frozen=True)
class Applied:
    index: int


@dataclass(frozen=True)
class BatchAnswered:
    epoch: int
    batch: planner.SendBatch
    reply: BatchReply


@dataclass(frozen=True)
class BatchFailed:
    epoch: int
    batch: planner.SendBatch
    error: str
    jitter: float = 0.0  # in [0, 1), drawn by the shell: spreads the retries of many replicas


@dataclass(frozen=True)
class ProposalDone:
    epoch: int
    command: Command
    refusal: CoreError | None = None


@dataclass(frozen=True)
class Tick:
    now: float
    dispatch_paused: bool = False


Event = LeadershipChanged | Applied | BatchAnswered | BatchFailed | ProposalDone | Tick


# -------------------------------------------------------------------- instructions


@dataclass(frozen=True)
class SendBatch:
    epoch: int
    term: int
    applied_index: int
    batch: planner.SendBatch


@dataclass(frozen=True)
class ProposeCommand:
    epoch: int
    command: Command


@dataclass(frozen=True)
class WakeAt:
    time: float


@dataclass(frozen=True)
class Log:
    level: str  # "info" or "warning"
    message: str


@dataclass(frozen=True)
class DispatchPaused:
    pass


Instruction = SendBatch | ProposeCommand | WakeAt | Log | DispatchPaused


# -------------------------------------------------------------------- the state machine


@dataclass(frozen=True)
class LoopConfig:
    backoff: Backoff = field(default_factory=Backoff)
    flush_interval: float = 0.2  # while calls are out, finished ids wait at most this long to go in one command
    leader_recheck: float = 0.5  # how often a loop that does not lead looks again
    pause_recheck: float = 0.1  # how often a paused dispatch looks again


@dataclass
class LoopCounters:
    """Monotonic counts the shell publishes as metrics."""

    batches_sent: int = 0
    batch_failures: int = 0
    tasks_finished: int = 0
    flushes: int = 0


class LeaderLoop:
    """The view building loop of one node: dispatches batches and flushes finished tasks while it leads."""

    def __init__(self, config: LoopConfig | None = None):
        self.config = config or LoopConfig()
        self.counters = LoopCounters()
        self.epoch = 0
        self.term: int | None = None  # the term this loop leads (None: not leading)
        self.deposed = False
        self.in_flight: dict[Replica, planner.SendBatch] = {}
        self.pending: dict[str, int] = {}  # finished ids not yet removed from group0 -> base rows their batch scanned
        self.proposing: set[Command] = set()
        self._now = 0.0
        self._paused = False
        self._index = 0
        self._next_flush: float | None = None
        self._retry = RetrySchedule(self.config.backoff)
        self._warnings = LogLimiter()
        self._queues: tuple[tuple, planner.ReplicaQueues] | None = None  # ((index, bases), replica queues then)
        self._last_base: dict[Replica, str] = {}  # the base of the batch last sent to each replica
        self._settled_at: int | None = None  # the applied index at which a flush last found nothing to settle
        self._proposals_held_until = 0.0  # after a refusal (not StaleTerm), no command is proposed before then
        self._out: list[Instruction] = []

    @property
    def active(self) -> bool:
        """Leading and not deposed: this loop dispatches and flushes."""
        return self.term is not None and not self.deposed

    # ----------------------------------------------------------------- events

    def handle(self, state: Group0State, *events: Event) -> list[Instruction]:
        """Take `events` in order, then act on `state`; the instructions to carry out, in order."""
        self._out = []
        for event in events:
            self._HANDLERS[type(event)](self, event)
        if self.active:
            self._act(state)
        self._out.append(WakeAt(self._next_wakeup()))
        out, self._out = self._out, []
        return out

    def _handle_leadership_changed(self, event: LeadershipChanged) -> None:
        term = event.term if event.leader else None
        if term == self.term:
            return
        if term is None:
            self._log("info", f"view building loop: not the group0 leader any more (term {self.term})")
        else:
            self._log("info", f"view building loop: leading in term {term}")
        self._reset(term)

    def _handle_applied(self, event: Applied) -> None:
        self._index = max(self._index, event.index)

    def _handle_tick(self, event: Tick) -> None:
        self._now = max(self._now, event.now)
        self._paused = event.dispatch_paused

    def _handle_batch_answered(self, event: BatchAnswered) -> None:
        if event.epoch != self.epoch:
            return  # a call of an older term or leadership: ignored
        if self._end_call(event.batch):
            self._retry.succeeded(event.batch.replica)
        rows = event.reply.rows_of()
        new = [i for i in dict.fromkeys(event.reply.finished) if i in event.batch.task_ids and i not in self.pending]
        if new and not self.pending:
            self._next_flush = self._now + self.config.flush_interval
        for task_id in new:
            self.pending[task_id] = rows.get(task_id, 0)
        self.counters.tasks_finished += len(new)

    def _handle_batch_failed(self, event: BatchFailed) -> None:
        if event.epoch != self.epoch or not self._end_call(event.batch):
            return  # an older call's failure (the replica's current call, if any, goes on)
        replica = event.batch.replica
        self.counters.batch_failures += 1
        delay = self._retry.failed(replica, self._now, event.jitter)
        self._warn(f"view building batch {','.join(event.batch.task_ids)} on {replica.node}/{replica.shard} failed "
                   f"(attempt {self._retry.attempts(replica)}, retry in {delay:.2f}s): {event.error}")

    def _handle_proposal_done(self, event: ProposalDone) -> None:
        if event.epoch != self.epoch:
            return
        self.proposing.discard(event.command)
        refusal = event.refusal
        if isinstance(event.command, FinishViewBuildingTasks):
            self.counters.flushes += refusal is None
            self._next_flush = self._now + self.config.flush_interval  # a refused flush waits as long
        if refusal is None:
            return
        if isinstance(refusal, StaleTerm):
            self._depose()
        else:
            self._proposals_held_until = self._now + self.config.leader_recheck
            self._warn(f"view building command {type(event.command).__name__} refused: {refusal.code} "
                       f"{refusal.message}")

    def _end_call(self, batch: planner.SendBatch) -> bool:
        """End the replica's call in flight if `batch` is its batch; whether it was."""
        if self.in_flight.get(batch.replica) != batch:
            return False
        del self.in_flight[batch.replica]
        return True

    # ----------------------------------------------------------------- acting on the state

    def _act(self, state: Group0State) -> None:
        if planner.is_deposed(state, self.term):
            self._depose()
            return
        self._forget_removed(state)
        self._flush(state)
        if self._paused:
            self._out.append(DispatchPaused())
        elif not any(isinstance(c, SetProcessingBase) for c in self.proposing):
            self._dispatch(state)

    def _forget_removed(self, state: Group0State) -> None:
        """Finished ids group0 no longer holds (flushed, aborted, dropped) need no flush."""
        live = planner.pending_finished(state, self.pending)
        if len(live) != len(self.pending):
            self.pending = {i: n for i, n in self.pending.items() if i in live}
        if not self.pending:
            self._next_flush = None

    def _flush(self, state: Group0State) -> None:
        if any(isinstance(c, FinishViewBuildingTasks) for c in self.proposing):
            return
        if self.pending and self.in_flight and self._next_flush is not None and self._now < self._next_flush:
            return  # more answers are coming: they go in the same command (with no call out, nothing is to wait for)
        if not self.pending and self._settled_at == self._index:
            return
        command = planner.plan_flush(state, self.term, self.pending.keys(), self.pending)
        self._settled_at = self._index if command is None and not self.pending else None
        if command is not None:
            self._propose(command)

    def _dispatch(self, state: Group0State) -> None:
        busy = frozenset(self.in_flight) | self._retry.waiting(self._now)
        plan = planner.plan_dispatch(state, self.term, busy, state.nodes.keys(), self.pending.keys(),
                                     self._replica_queues(state), self._last_base)
        for command in plan.commands:
            self._propose(command)
        if plan.commands:
            return  # the batches follow once the processing-bases command is applied
        for batch in plan.batches:
            self._last_base[batch.replica] = state.tasks[batch.task_ids[0]].base_id
            self.in_flight[batch.replica] = batch
            self.counters.batches_sent += 1
            self._out.append(SendBatch(self.epoch, self.term, self._index, batch))

    def _replica_queues(self, state: Group0State) -> planner.ReplicaQueues:
        """`replica_queues` of the processing bases, once per applied index (the state may be newer than the
        index, never older: then the next one misses the cache)."""
        key = (self._index, state.processing_bases)
        if self._queues is None or self._queues[0] != key:
            self._queues = (key, planner.replica_queues(state, state.processing_bases))
        return self._queues[1]

    def _propose(self, command: Command) -> None:
        if command not in self.proposing and self._now >= self._proposals_held_until:
            self.proposing.add(command)
            self._out.append(ProposeCommand(self.epoch, command))

    # ----------------------------------------------------------------- bookkeeping

    def _reset(self, term: int | None) -> None:
        """Forget the previous term's bookkeeping: late answers to its calls are ignored from now on."""
        self.epoch += 1
        self.term = term
        self.deposed = False
        self._forget_calls()
        self._retry = RetrySchedule(self.config.backoff)
        self._queues = None
        self._last_base = {}
        self._settled_at = None
        self._proposals_held_until = 0.0

    def _depose(self) -> None:
        if not self.deposed:
            self._log("info", f"view building loop of term {self.term}: a newer leader's loop took over; stopping")
        self.deposed = True
        self.epoch += 1
        self._forget_calls()

    def _forget_calls(self) -> None:
        self.in_flight.clear()
        self.pending.clear()
        self.proposing.clear()
        self._next_flush = None

    def _next_wakeup(self) -> float:
        if not self.active:
            return self._now + self.config.leader_recheck
        deadlines = [self._retry.next_wakeup(self._now), self._next_flush if self.pending else None,
                     self._now + self.config.pause_recheck if self._paused else None,
                     self._proposals_held_until if self._proposals_held_until > self._now else None]
        return min((d for d in deadlines if d is not None), default=self._now + self.config.leader_recheck)

    def _warn(self, message: str) -> None:
        decision = self._warnings.decide(self._now)
        if decision.emit:
            suffix = f" ({decision.suppressed} similar warnings suppressed)" if decision.suppressed else ""
            self._log("warning", message + suffix)

    def _log(self, level: str, message: str) -> None:
        self._out.append(Log(level, message))

    # ----------------------------------------------------------------- invariants

    def validate(self) -> None:
        """Raise AssertionError when the loop's bookkeeping contradicts itself (tests and simulations call it)."""
        if not self.active:
            assert not self.in_flight and not self.pending and not self.proposing, "bookkeeping of an inactive loop"
        for replica, batch in self.in_flight.items():
            assert batch.replica == replica and batch.task_ids, f"in-flight entry {replica} holds {batch}"
        assert not set(self.in_flight) & self._retry.waiting(self._now), "a call to a replica waiting out a backoff"
        assert all(n >= 0 for n in self.pending.values()), "a negative row count"
        assert self._next_flush is not None or not self.pending or self.proposing, "finished ids with no flush due"

    _HANDLERS = {LeadershipChanged: _handle_leadership_changed, Applied: _handle_applied, Tick: _handle_tick,
                 BatchAnswered: _handle_batch_answered, BatchFailed: _handle_batch_failed,
                 ProposalDone: _handle_proposal_done}


