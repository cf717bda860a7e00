"""The leader's tablet migration driver as a pure state machine: events in, instructions out (no I/O, clock or threads).

In the style of `leader_loop.LeaderLoop`: the shell (`coordinator/tablet_migration.py`) owns the threads, the gRPC
calls, the clock, command ids, logging and metrics. It feeds events to `MigrationLoop.handle(state, *events)` (under
group0's read lock) and carries out the instructions returned, in order:

- `HitPausePoint`, `RunBarrier`, `RunStream`, `RunCleanup` (the steps): one action of one migration (the fault point
  between stages, a barrier, a stream, a cleanup), on a thread of its own; report `StepDone(step)` or
  `StepFailed(step, failure)`, the failure typed (`BarrierFailure`, `StreamFailure`, `CleanupFailure`, `InjectedFault`,
  `Fenced`, `CallError`).
- `Propose(epoch, command)`: propose `command` with a fresh `cmd_id`; report `ProposalDone` with the typed refusal, if
  any (a proposal not known to be committed is an `Unavailable` refusal).
- `RemoveMember(epoch, node_id, raft_addr)`: take the node out of the Raft group; report `MemberRemoved`.
- `Leave()`: this node is drained yet leads, and a leader cannot remove itself: stop, the next leader removes it.
- `WakeAt(time)`: feed a `Tick` at that time at the latest. `Log(level, message)`: log it.

Events: `LeadershipChanged(leader, term)` (one consistent pair; a repeat changes nothing), `Applied(index)`,
`Tick(now)`, `StepDone`/`StepFailed` (answers to an older epoch's steps are ignored), `ProposalDone`, `MemberRemoved`.

Migration ids and id seeds come from the `new_id` source the shell passes (by default derived from the node, the term
and a count: one leader per term makes them unique). While it leads, the loop starts what the state asks for (merge
preparation, RF changes, drains, then the balancer's moves when nothing else moves), removes drained nodes, and
carries each migration through its stages, one action at a time: a stage hits the pause point, runs its actions
(`stage_actions`; nothing is cleaned up on a node being removed), then proposes the next stage. At `cleanup_target` a
barrier comes before the pending replica's cleanup, so that no write routed the old way still lands there after it.
A failed step is retried after `retry_delay`. A migration rolls back (`cleanup_target`, the reason in the command)
only when its pending node was declared dead, its stream failed, the pause point failed it, or a node it involves
(leaving, pending, stream source) is down: its barriers went unconfirmed (or its cleanups failed) for longer than
`down_after`, with no success from it in between (a silence longer than `down_after` starts the count again). From
`use_new` on, writes reach only the pending replica: the migration goes forward whatever happens.

Every command carries the loop's term. A new term, or losing leadership, forgets every step and proposal under way
(a new epoch: their late answers are ignored). A `StaleTerm` refusal, a fenced call, or a state whose migration term
is newer means a newer leader drives: the loop does nothing until its term changes.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

from . import balancer, migrations, resize
from .commands import AdvanceTabletMigration, Command, MergeTablets, RemoveNode, StartTabletMigration
from .errors import CoreError, StaleTerm
from .ids import derived_id
from .migrations import (
    CAN_ROLL_BACK,
    CLEANUP,
    CLEANUP_TARGET,
    NEXT_STAGE,
    STREAMING,
    TabletTransition,
    can_roll_back,
)
from .schema import NODE_REMOVING
from .tokens import tablet_range

if TYPE_CHECKING:
    from .state import Group0State

PAUSE = "pause"  # the fault point between stages (`pause_tablet_migration_stage`)
BARRIER = "barrier"  # every node applied the stage and finished the writes begun before it
STREAM = "stream"  # the pending replica pulls the tablet's rows from the source
CLEANUP_LEAVING = "cleanup_leaving"  # the leaving replica drops the tablet's rows
CLEANUP_PENDING = "cleanup_pending"  # the pending replica drops what it received
ACTIONS = (PAUSE, BARRIER, STREAM, CLEANUP_LEAVING, CLEANUP_PENDING)
ID_SEED = "7d0a1c4e9b3f4a5e8c2d6b1f0e9a8d7c"  # the default id source derives ids from it


# -------------------------------------------------------------------- instructions


@dataclass(frozen=True, kw_only=True)
class HitPausePoint:
    epoch: int
    migration_id: str
    stage: str
    action: str = PAUSE


@dataclass(frozen=True, kw_only=True)
class RunBarrier:
    epoch: int
    migration_id: str
    stage: str
    nodes: tuple[str, ...]
    version: int
    action: str = BARRIER


@dataclass(frozen=True, kw_only=True)
class RunStream:
    epoch: int
    term: int
    migration_id: str
    stage: str
    table_id: str
    tablet_id: int
    first_token: int
    last_token: int
    pending_node: str
    source_node: str
    version: int
    action: str = STREAM


@dataclass(frozen=True, kw_only=True)
class RunCleanup:
    epoch: int
    term: int
    migration_id: str
    stage: str
    node: str
    table_id: str
    tablet_id: int
    first_token: int
    last_token: int
    version: int
    action: str  # CLEANUP_LEAVING or CLEANUP_PENDING


Step = HitPausePoint | RunBarrier | RunStream | RunCleanup


@dataclass(frozen=True)
class Propose:
    epoch: int
    command: Command


@dataclass(frozen=True)
class RemoveMember:
    epoch: int
    node_id: str
    raft_addr: str


@dataclass(frozen=True)
class Leave:
    pass


@dataclass(frozen=True)
class WakeAt:
    time: float


@dataclass(frozen=True)
class Log:
    level: str  # "info" or "warning"
    message: str


Instruction = Step | Propose | RemoveMember | Leave | WakeAt | Log


# -------------------------------------------------------------------- failures of a step


@dataclass(frozen=True)
class BarrierFailure:
    unconfirmed: Mapping[str, str]  # node id -> why it did not confirm


@dataclass(frozen=True)
class StreamFailure:
    reason: str


@dataclass(frozen=True)
class CleanupFailure:
    node: str
    reason: str


@dataclass(frozen=True)
class InjectedFault:
    """The fault point between stages, enabled in fail mode."""

    reason: str


@dataclass(frozen=True)
class Fenced:
    """A node refused the call's term (`StaleTerm`): a newer leader drives the migrations."""

    node: str
    reason: str


@dataclass(frozen=True)
class CallError:
    """Anything else (a bug, this node stopping): retried."""

    reason: str


Failure = BarrierFailure | StreamFailure | CleanupFailure | InjectedFault | Fenced | CallError


# -------------------------------------------------------------------- events


@dataclass(frozen=True)
class LeadershipChanged:
    leader: bool
    term: int


@dataclass(frozen=True)
class Applied:
    index: int


@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class StepDone:
    step: Step

    @property
    def migration_id(self) -> str:
        return self.step.migration_id


@dataclass(frozen=True)
class StepFailed:
    step: Step
    failure: Failure

    @property
    def migration_id(self) -> str:
        return self.step.migration_id


@dataclass(frozen=True)
class ProposalDone:
    epoch: int
    command: Command
    refusal: CoreError | None = None


@dataclass(frozen=True)
class MemberRemoved:
    epoch: int
    node_id: str
    error: str | None = None


Event = LeadershipChanged | Applied | Tick | StepDone | StepFailed | ProposalDone | MemberRemoved


# -------------------------------------------------------------------- pure decisions


def stage_actions(transition: TabletTransition, gone: Callable[[str], bool]) -> tuple[str, ...]:
    """The actions of the transition's stage, in order, before its next stage is proposed (nothing is cleaned up on
    a node that is `gone`: dead and being removed, or removed)."""
    stage, moves = transition.stage, transition.moves_data
    if stage == STREAMING:
        return (PAUSE, STREAM) if moves else (PAUSE,)
    if stage == CLEANUP:
        leaves = transition.kind == migrations.REMOVE or (transition.kind == migrations.MOVE and moves)
        return (PAUSE, CLEANUP_LEAVING) if leaves and not gone(transition.leaving.node) else (PAUSE,)
    if stage == CLEANUP_TARGET:
        cleans = moves and not gone(transition.pending.node)
        return (PAUSE, BARRIER, CLEANUP_PENDING) if cleans else (PAUSE, BARRIER)
    return (PAUSE, BARRIER)


def involved_nodes(transition: TabletTransition) -> tuple[str, ...]:
    """The nodes whose replicas a migration needs: leaving, pending and stream source."""
    return tuple(dict.fromkeys((transition.leaving.node, transition.pending.node, transition.stream_source.node)))


@dataclass(frozen=True)
class FailureStreak:
    """A node's failures since its last success: the first and the last one seen."""

    since: float
    last: float

    def lasted(self) -> float:
        return self.last - self.since


# -------------------------------------------------------------------- the state machine


@dataclass(frozen=True)
class MigrationConfig:
    down_after: float = 30.0  # a node failing for longer than this, with no success in between, is down
    max_parallel: int = 4  # migrations with a step or a stage change under way at once
    retry_delay: float = 1.0  # after a failed step, a refused proposal or a refused start
    idle_recheck: float = 1.0  # how often the loop looks again when nothing is due


class MigrationLoop:
    """The tablet migration driver of one node: starts and drives migrations while it leads."""

    def __init__(self, config: MigrationConfig | None = None, *, node_id: str = "",
                 new_id: Callable[[], str] | None = None, **settings: float):
        self.config = replace(config or MigrationConfig(), **settings)  # settings: down_after=5.0, say
        self.node_id = node_id  # a drained leader leaves instead of removing itself
        self.new_id = new_id or self._derived_id  # migration ids and id seeds (32 hex characters)
        self.epoch = 0
        self.applied_index = 0
        self._ids_made = 0
        self.term: int | None = None  # the term this loop leads (None: not leading)
        self.deposed = False
        self.in_flight: dict[str, Step] = {}  # migration id -> its step under way
        self.advancing: dict[str, AdvanceTabletMigration] = {}  # migration id -> its stage change being proposed
        self.planning: set[Command] = set()  # starts, merges and node removals being proposed
        self.member_removals: set[str] = set()  # nodes being taken out of the Raft group
        self.progress: dict[str, tuple[str, frozenset[str]]] = {}  # migration id -> (stage, actions done in it)
        self.rollbacks: dict[str, tuple[str, str]] = {}  # migration id -> (stage it rolls back from, reason)
        self.retry_at: dict[str, float] = {}
        self.failures: dict[str, FailureStreak] = {}  # node id -> its failures since its last success
        self._now = 0.0
        self._planning_held_until = 0.0
        self._left = False
        self._migrations: frozenset[str] = frozenset()  # the migrations of the last state seen
        self._out: list[Instruction] = []

    @property
    def active(self) -> bool:
        """Leading and not deposed: this loop starts and drives migrations."""
        return self.term is not None and not self.deposed

    def is_down(self, node: str) -> bool:
        """Whether `node`'s failures have lasted longer than `down_after`, with no success in between."""
        streak = self.failures.get(node)
        return streak is not None and streak.lasted() > self.config.down_after

    # ----------------------------------------------------------------- events

    def handle(self, state: Group0State, *events: Event) -> list[Instruction]:
        """Take `events` in order, then act on `state`; the instructions to carry out, in order."""
        self._out = []
        for event in events:
            self._HANDLERS[type(event)](self, state, event)
        if self.active:
            self._act(state)
        self._out.append(WakeAt(self._next_wakeup()))
        out, self._out = self._out, []
        return out

    def _handle_leadership_changed(self, _state: Group0State, event: LeadershipChanged) -> None:
        term = event.term if event.leader and event.term >= 1 else None
        if term == self.term:
            return
        if term is None:
            self._log("info", f"tablet migrations: not the group0 leader any more (term {self.term})")
        else:
            self._log("info", f"tablet migrations: driven by this node in term {term}")
        self._reset(term)

    def _handle_applied(self, _state: Group0State, event: Applied) -> None:
        self.applied_index = max(self.applied_index, event.index)

    def _handle_tick(self, _state: Group0State, event: Tick) -> None:
        self._now = max(self._now, event.now)

    def _handle_step_done(self, _state: Group0State, event: StepDone) -> None:
        step = event.step
        if not self._end_step(step):
            return
        self._succeeded(_nodes_answering(step))
        stage, done = self.progress.get(step.migration_id, (step.stage, frozenset()))
        if stage == step.stage:
            self.progress[step.migration_id] = (stage, done | {step.action})

    def _handle_step_failed(self, state: Group0State, event: StepFailed) -> None:
        step, failure = event.step, event.failure
        if not self._end_step(step):
            return
        self._record_failure(step, failure)
        if isinstance(failure, Fenced):
            self._depose(f"{failure.node} refused term {self.term}: {failure.reason}")
            return
        transition = _transition_by_id(state, step.migration_id)
        if transition is None or transition.stage != step.stage:
            return  # ended or moved on meanwhile
        reason = self._rollback_reason(transition, step, failure)
        if reason is not None and can_roll_back(transition):
            self.rollbacks[step.migration_id] = (transition.stage, reason)
            self._log("warning", f"migration {step.migration_id} of tablet {transition.tablet_id} rolls back: {reason}")
            return
        self.retry_at[step.migration_id] = self._now + self.config.retry_delay
        self._log("info", f"migration {step.migration_id} at {step.stage}: {_describe(step, failure)}; retrying in "
                          f"{self.config.retry_delay:g}s")

    def _handle_proposal_done(self, _state: Group0State, event: ProposalDone) -> None:
        if event.epoch != self.epoch:
            return  # a proposal of an older term or leadership
        command, refusal = event.command, event.refusal
        if isinstance(refusal, StaleTerm):
            self._depose(f"{type(command).__name__} refused: {refusal.message}")
            return
        if isinstance(command, AdvanceTabletMigration):
            self._advance_done(command, refusal)
        else:
            self._planning_done(command, refusal)

    def _handle_member_removed(self, _state: Group0State, event: MemberRemoved) -> None:
        if event.epoch != self.epoch or event.node_id not in self.member_removals:
            return
        self.member_removals.discard(event.node_id)
        if event.error is not None:
            self._hold_planning()
            self._log("warning", f"taking node {event.node_id} out of the Raft group failed: {event.error}")
            return
        self._propose_planned(RemoveNode(cmd_id=None, term=self.term, node_id=event.node_id))

    def _end_step(self, step: Step) -> bool:
        """End the migration's step under way if `step` is it; whether it was (late and stale answers are not)."""
        if self.in_flight.get(step.migration_id) != step:
            return False
        del self.in_flight[step.migration_id]
        return True

    def _advance_done(self, command: AdvanceTabletMigration, refusal: CoreError | None) -> None:
        if self.advancing.get(command.migration_id) == command:
            del self.advancing[command.migration_id]
        if refusal is not None:
            self.retry_at[command.migration_id] = self._now + self.config.retry_delay
            self._log("info", f"migration {command.migration_id}: proposing {command.to_stage} refused: "
                              f"{refusal.code} {refusal.message}; retrying")
            return
        for record in (self.progress, self.rollbacks, self.retry_at):
            record.pop(command.migration_id, None)
        because = f" ({command.reason})" if command.reason else ""
        self._log("info", f"migration {command.migration_id} of tablet {command.tablet_id}: {command.from_stage} -> "
                          f"{command.to_stage}{because}")

    def _planning_done(self, command: Command, refusal: CoreError | None) -> None:
        self.planning.discard(command)
        if refusal is not None:
            self._hold_planning()
        if isinstance(command, StartTabletMigration):
            if refusal is not None:
                self._log("info", f"{command.kind} of replica {command.leaving_node}:{command.leaving_shard} of "
                                  f"tablet {command.tablet_id} of {command.table_id} refused: {refusal.message}")
        elif isinstance(command, MergeTablets):
            self._log("info", f"merge of table {command.table_id}: {_done_or(refusal)}")
        elif isinstance(command, RemoveNode):
            self._log("info", f"node {command.node_id} removed from the cluster: {_done_or(refusal)}")

    # ----------------------------------------------------------------- failures and rollbacks

    def _succeeded(self, nodes: tuple[str, ...]) -> None:
        for node in nodes:
            self.failures.pop(node, None)

    def _record_failure(self, step: Step, failure: Failure) -> None:
        """Count the failure against the nodes it names; the nodes of a barrier that confirmed succeeded."""
        if isinstance(failure, BarrierFailure):
            self._succeeded(tuple(n for n in _nodes_answering(step) if n not in failure.unconfirmed))
            failed: tuple[str, ...] = tuple(failure.unconfirmed)
        elif isinstance(failure, CleanupFailure):
            failed = (failure.node,)
        else:
            failed = ()
        for node in failed:
            streak = self.failures.get(node)
            if streak is None or self._now - streak.last > self.config.down_after:
                streak = FailureStreak(self._now, self._now)  # a long silence: no evidence it was down meanwhile
            self.failures[node] = FailureStreak(streak.since, self._now)

    def _rollback_reason(self, transition: TabletTransition, step: Step, failure: Failure) -> str | None:
        """Why the migration rolls back after `failure`, or None when it retries."""
        if isinstance(failure, StreamFailure):
            return f"streaming to {transition.pending} failed: {failure.reason}"
        if isinstance(failure, InjectedFault):
            return failure.reason
        if isinstance(failure, BarrierFailure):
            down = [n for n in involved_nodes(transition) if n in failure.unconfirmed and self.is_down(n)]
            if down:
                node = down[0]
                return (f"node {node} is down: no barrier confirmed for {self.failures[node].lasted():.0f}s (the "
                        f"last, at schema version {step.version}: {failure.unconfirmed[node]})")
        return None

    # ----------------------------------------------------------------- acting on the state

    def _act(self, state: Group0State) -> None:
        try:
            migrations.check_term(state, self.term)
        except StaleTerm as error:
            self._depose(error.message)
            return
        self._forget_ended(state)
        if self._now >= self._planning_held_until and not self.planning:
            self._plan(state)
        self._drive(state)

    def _forget_ended(self, state: Group0State) -> None:
        """Migrations group0 no longer has need nothing more (a late answer to their step is ignored)."""
        live = frozenset(t.migration_id for t in state.transitions.values())
        self._migrations = live
        for record in (self.in_flight, self.advancing, self.progress, self.rollbacks, self.retry_at):
            for migration_id in [m for m in record if m not in live]:
                del record[migration_id]

    def _plan(self, state: Group0State) -> None:
        """Start what group0 asks for: merges, RF changes, drains, node removals, then the balancer's moves."""
        claimed = set(state.transitions)
        for table_id in sorted(state.merge_requests):
            self._prepare_merge(state, table_id, claimed)
        for planner in (migrations.replication_moves, migrations.drain_moves):
            for move in planner(state, self._room(state)):
                self._start(move, claimed)
        self._remove_drained_nodes(state)
        if not state.merge_requests and not self.planning:
            for move in balancer.balance_moves(state, self.config.max_parallel):
                self._start(move, claimed)

    def _room(self, state: Group0State) -> int:
        starting = sum(isinstance(c, StartTabletMigration) for c in self.planning)
        return max(self.config.max_parallel * 2 - len(state.transitions) - starting, 0)

    def _prepare_merge(self, state: Group0State, table_id: str, claimed: set[tuple[str, int]]) -> None:
        """Start the moves a requested merge still needs (one per tablet at a time), or merge once none is left; not
        while an RF change is under way (the pairs would not have as many replicas)."""
        replicas = state.tablets[table_id].replicas
        if any(len(rs) != state.keyspaces[state.tables[table_id].keyspace].rf for rs in replicas):
            return
        moves = resize.merge_moves(state, table_id)
        if resize.can_merge(state, table_id):
            self._propose_planned(MergeTablets(cmd_id=None, term=self.term, table_id=table_id, id_seed=self.new_id()))
            claimed.update((table_id, tablet) for tablet in range(len(replicas)))  # their numbers change
            return
        for tablet, leaving, pending in moves:
            self._start(migrations.PlannedMove(table_id, tablet, migrations.MOVE, leaving, pending), claimed)

    def _start(self, move: migrations.PlannedMove, claimed: set[tuple[str, int]]) -> None:
        if (move.table_id, move.tablet_id) in claimed:
            return
        claimed.add((move.table_id, move.tablet_id))
        source = move.source
        self._propose_planned(StartTabletMigration(
            cmd_id=None, migration_id=self.new_id(), table_id=move.table_id, tablet_id=move.tablet_id,
            leaving_node=move.leaving.node, leaving_shard=move.leaving.shard, pending_node=move.pending.node,
            pending_shard=move.pending.shard, kind=move.kind, source_node=source.node if source else "",
            source_shard=source.shard if source else 0))

    def _remove_drained_nodes(self, state: Group0State) -> None:
        """Take the departing nodes that hold nothing any more out of the Raft group (then out of group0)."""
        for node_id in migrations.removable_nodes(state):
            if node_id == self.node_id:
                self._leave(node_id)
                return
            node = state.nodes.get(node_id)
            if node is not None and node_id not in self.member_removals:
                self.member_removals.add(node_id)
                self._out.append(RemoveMember(self.epoch, node_id, node.raft))

    def _leave(self, node_id: str) -> None:
        if not self._left:
            self._left = True
            self._log("warning", f"this node ({node_id}) is decommissioned and holds no replica: it stops, so that "
                                 "the next leader takes it out of the Raft group")
            self._out.append(Leave())

    def _drive(self, state: Group0State) -> None:
        """The next step or stage change of each migration that has none under way (at most `max_parallel`)."""
        busy = len(self.in_flight) + len(self.advancing)
        for transition in sorted(state.transitions.values(), key=lambda t: t.migration_id):
            if busy >= self.config.max_parallel:
                return
            migration_id = transition.migration_id
            if migration_id in self.in_flight or migration_id in self.advancing:
                continue
            if self.retry_at.get(migration_id, self._now) > self._now:
                continue
            self.retry_at.pop(migration_id, None)
            self._next(state, transition)
            busy += 1

    def _next(self, state: Group0State, transition: TabletTransition) -> None:
        reason = self._rollback_due(state, transition)
        if reason is not None:
            self._advance(transition, CLEANUP_TARGET, reason)
            return
        done = self._done_in_stage(transition)
        actions = stage_actions(transition, partial(_is_gone, state))
        action = next((a for a in actions if a not in done), None)
        if action is None:
            self._advance(transition, NEXT_STAGE[transition.stage])
            return
        step = self._step(state, transition, action)
        self.in_flight[transition.migration_id] = step
        self._out.append(step)

    def _rollback_due(self, state: Group0State, transition: TabletTransition) -> str | None:
        if transition.pending.node != transition.leaving.node and _is_gone(state, transition.pending.node) \
                and can_roll_back(transition):
            return f"node {transition.pending.node}, its pending replica, was declared dead"
        decided = self.rollbacks.get(transition.migration_id)
        if decided is None:
            return None
        stage, reason = decided
        if stage != transition.stage:
            del self.rollbacks[transition.migration_id]
            return None
        return reason

    def _done_in_stage(self, transition: TabletTransition) -> frozenset[str]:
        stage, done = self.progress.get(transition.migration_id, (None, frozenset()))
        if stage != transition.stage:
            self.progress[transition.migration_id] = (transition.stage, frozenset())
            return frozenset()
        return done

    def _step(self, state: Group0State, transition: TabletTransition, action: str) -> Step:
        mid, stage, version = transition.migration_id, transition.stage, state.schema_version
        if action == PAUSE:
            return HitPausePoint(epoch=self.epoch, migration_id=mid, stage=stage)
        if action == BARRIER:
            nodes = tuple(migrations.barrier_nodes(state))
            return RunBarrier(epoch=self.epoch, migration_id=mid, stage=stage, nodes=nodes, version=version)
        first, last = tablet_range(transition.tablet_id, state.tablets[transition.table_id].tablet_count)
        if action == STREAM:
            return RunStream(epoch=self.epoch, term=self.term, migration_id=mid, stage=stage,
                             table_id=transition.table_id, tablet_id=transition.tablet_id, first_token=first,
                             last_token=last, pending_node=transition.pending.node,
                             source_node=transition.stream_source.node, version=version)
        node = transition.leaving.node if action == CLEANUP_LEAVING else transition.pending.node
        return RunCleanup(epoch=self.epoch, term=self.term, migration_id=mid, stage=stage, node=node,
                          table_id=transition.table_id, tablet_id=transition.tablet_id, first_token=first,
                          last_token=last, version=version, action=action)

    def _advance(self, transition: TabletTransition, to_stage: str, reason: str = "") -> None:
        command = AdvanceTabletMigration(cmd_id=None, term=self.term, migration_id=transition.migration_id,
                                         table_id=transition.table_id, tablet_id=transition.tablet_id,
                                         from_stage=transition.stage, to_stage=to_stage, reason=reason)
        self.advancing[transition.migration_id] = command
        self._out.append(Propose(self.epoch, command))

    def _propose_planned(self, command: Command) -> None:
        self.planning.add(command)
        self._out.append(Propose(self.epoch, command))

    # ----------------------------------------------------------------- bookkeeping

    def _derived_id(self) -> str:
        self._ids_made += 1
        return derived_id(ID_SEED, self.node_id, self.term, self._ids_made)

    @staticmethod
    def proposal_done(proposal: Propose, refusal: CoreError | None) -> ProposalDone:
        """The event answering `proposal` (a convenience for shells and simulations)."""
        return ProposalDone(proposal.epoch, proposal.command, refusal)

    def _hold_planning(self) -> None:
        self._planning_held_until = self._now + self.config.retry_delay

    def _reset(self, term: int | None) -> None:
        """Forget the previous term's bookkeeping: late answers to its steps and proposals are ignored from now on."""
        self.epoch += 1
        self.term = term
        self.deposed = False
        self._forget_all()

    def _depose(self, why: str) -> None:
        if not self.deposed:
            self._log("info", f"tablet migrations of term {self.term}: a newer leader took over ({why}); stopping")
        self.deposed = True
        self.epoch += 1
        self._forget_all()

    def _forget_all(self) -> None:
        for record in (self.in_flight, self.advancing, self.planning, self.member_removals, self.progress,
                       self.rollbacks, self.retry_at, self.failures):
            record.clear()
        self._planning_held_until = 0.0

    def _next_wakeup(self) -> float:
        idle = self._now + self.config.idle_recheck
        if not self.active:
            return idle
        due = [t for t in (*self.retry_at.values(), self._planning_held_until) if t > self._now]
        return min(due, default=idle)

    def _log(self, level: str, message: str) -> None:
        self._out.append(Log(level, message))

    # ----------------------------------------------------------------- invariants

    def validate(self) -> None:
        """Raise AssertionError when the loop's bookkeeping contradicts itself (tests call it after every event)."""
        if not self.active:
            assert not (self.in_flight or self.advancing or self.planning or self.member_removals or self.progress
                        or self.rollbacks or self.retry_at or self.failures), "bookkeeping of an inactive loop"
            return
        assert not set(self.in_flight) & set(self.advancing), "a migration with a step and a stage change under way"
        assert len(self.in_flight) + len(self.advancing) <= self.config.max_parallel, "more than max_parallel at once"
        for migration_id, step in self.in_flight.items():
            assert step.migration_id == migration_id and step.epoch == self.epoch, f"step {step} under {migration_id}"
            assert migration_id in self._migrations, f"a step of migration {migration_id}, which group0 no longer has"
            assert self.retry_at.get(migration_id, self._now) <= self._now, f"{migration_id} stepped before its retry"
            assert getattr(step, "term", self.term) == self.term, f"a step of another term: {step}"
        for migration_id, command in self.advancing.items():
            assert command.migration_id == migration_id and command.term == self.term, f"stage change {command}"
            _check_stage_change(command)
        for command in self.planning:
            assert getattr(command, "term", self.term) == self.term, f"a command of another term: {command}"
        for stage, reason in self.rollbacks.values():
            assert stage in CAN_ROLL_BACK and reason, f"a rollback decided at {stage} ({reason!r})"
        for stage, done in self.progress.values():
            assert done <= set(ACTIONS), f"unknown actions done at {stage}: {done}"

    _HANDLERS = {LeadershipChanged: _handle_leadership_changed, Applied: _handle_applied, Tick: _handle_tick,
                 StepDone: _handle_step_done, StepFailed: _handle_step_failed, ProposalDone: _handle_proposal_done,
                 MemberRemoved: _handle_member_removed}


def _check_stage_change(command: AdvanceTabletMigration) -> None:
    if command.to_stage == CLEANUP_TARGET:
        assert command.from_stage in CAN_ROLL_BACK and command.reason, f"a rollback from {command.from_stage}"
    else:
        assert command.to_stage == NEXT_STAGE.get(command.from_stage) and not command.reason, f"{command}"


def _nodes_answering(step: Step) -> tuple[str, ...]:
    """The nodes a step's success shows alive."""
    if isinstance(step, RunBarrier):
        return step.nodes
    if isinstance(step, RunStream):
        return tuple(dict.fromkeys((step.pending_node, step.source_node)))
    if isinstance(step, RunCleanup):
        return (step.node,)
    return ()


def _transition_by_id(state: Group0State, migration_id: str) -> TabletTransition | None:
    return next((t for t in state.transitions.values() if t.migration_id == migration_id), None)


def _is_gone(state: Group0State, node_id: str) -> bool:
    """A node removed from the cluster, or dead and being removed: nothing is cleaned up there."""
    node = state.nodes.get(node_id)
    return node is None or node.state == NODE_REMOVING


def _describe(step: Step, failure: Failure) -> str:
    if isinstance(failure, BarrierFailure):
        unconfirmed = "; ".join(f"{node}: {why}" for node, why in failure.unconfirmed.items())
        return f"barrier at schema version {step.version} not confirmed by {unconfirmed}"
    if isinstance(failure, CleanupFailure):
        return f"cleanup on {failure.node} failed: {failure.reason}"
    if isinstance(failure, StreamFailure):
        return f"streaming failed: {failure.reason}"
    return f"{step.action} failed: {failure.reason}"


def _done_or(refusal: CoreError | None) -> str:
    return "done" if refusal is None else f"refused: {refusal.message}"
