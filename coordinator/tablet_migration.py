"""The tablet migration driver on the group0 leader: carries each migration through its stages (the shell around
`coordinator.core.migrations.next_step`: barriers, streaming and cleanup calls, stage proposals, retries), and
co-locates then merges the tablets of tables whose merge was requested (`coordinator.core.resize`).

Every migration in group0's `transitions` gets a thread of its own (a few at a time); each step runs the I/O the core
names, then proposes the next stage with the leader's Raft term, compare-and-set on the stage it started from. A
new leader finds the transitions in group0 and resumes them at their stage: every step is safe to run again.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from common.injection import InjectedFailure, Injections
from coordinator.core import migrations as core
from coordinator.core import balancer, resize
from coordinator.core.commands import AdvanceTabletMigration, Command, MergeTablets, RemoveNode, StartTabletMigration
from coordinator.core.schema import NODE_REMOVING
from coordinator.core.errors import CoreError
from coordinator.core.state import Group0State
from coordinator.core.tokens import tablet_range

T = TypeVar("T")

PAUSE_POINT = "pause_tablet_migration_stage"
RETRY_DELAY = 1.0  # after a step that failed and may succeed later (a barrier a node did not confirm, say)
BARRIER_TIMEOUT = 10.0
PROPOSE_TIMEOUT = 10.0
IDLE_WAKE = 1.0

log = logging.getLogger(__name__)


class Group0Client(Protocol):
    def read(self, fn: Callable[[Group0State], T]) -> T: ...

    def propose(self, command: Command, timeout: float = ...) -> Any: ...

    def remove_member(self, raft_addr: str, timeout: float = ...) -> None: ...


@dataclass(frozen=True)
class MigrationCalls:
    """The node-to-node calls the driver makes (`common.internode.InternodeTransport` in a node)."""

    # barrier(nodes, schema_version, timeout) -> "node: why" for every node that did not confirm
    barrier: Callable[[list[str], int, float], list[str]]
    # stream(pending_node, term, migration_id, table_id, first_token, last_token, source_node, schema_version) -> rows
    stream: Callable[..., int]
    # cleanup(node, term, migration_id, table_id, first_token, last_token, schema_version) -> rows
    cleanup: Callable[..., int]


class StepFailed(Exception):
    """A step that did not succeed; `roll_back` when the migration should be rolled back because of it."""

    def __init__(self, message: str, roll_back: bool):
        super().__init__(message)
        self.roll_back = roll_back


class MigrationDriver:
    """Drives group0's tablet migrations while this node leads; `start()`, `stop()`, `wake()`."""

    def __init__(self, *, group0: Group0Client, leadership: Callable[[], tuple[bool, int]], calls: MigrationCalls,
                 injections: Injections | None = None, max_parallel: int = 4, metrics=None, node_id: str = "",
                 leave: Callable[[], None] = lambda: None):
        self._group0, self._leadership, self._calls = group0, leadership, calls
        # a Raft leader cannot take itself out of the group: a drained leader calls `leave` (the node stops), and
        # the next leader removes it
        self._node_id, self._leave = node_id, leave
        self._injections = injections if injections is not None else Injections()
        self._max_parallel, self._metrics = max_parallel, metrics
        self._cond = threading.Condition()
        self._active: dict[str, threading.Thread] = {}  # by migration id
        self._retry_after: dict[str, float] = {}
        self._stopping = self._woken = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tablet-migrations", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self, _applied_index: int | None = None) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    notify_applied = wake

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._woken:
                    if not self._cond.wait(IDLE_WAKE):
                        break
                if self._stopping:
                    return
                self._woken = False
            try:
                self._round()
            except Exception as error:  # noqa: BLE001 - a round must not kill the driver
                log.warning("tablet migration round failed: %s", error)

    def _round(self) -> None:
        leader, term = self._leadership()
        if not leader:
            return
        for table_id in self._group0.read(lambda s: sorted(s.merge_requests)):
            self._prepare_merge(table_id, term)
        self._start_replication_moves()
        self._start_planned(self._group0.read(lambda s: core.drain_moves(s, max(self._max_parallel * 2
                                                                                 - len(s.transitions), 0))))
        self._remove_drained_nodes(term)
        self._start_planned(self._group0.read(
            lambda s: [] if s.merge_requests else balancer.balance_moves(s, self._max_parallel)))
        transitions = self._group0.read(lambda s: sorted(s.transitions.values(), key=lambda t: t.migration_id))
        now = time.monotonic()
        with self._cond:
            for transition in transitions:
                busy = transition.migration_id in self._active or len(self._active) >= self._max_parallel
                if busy or self._retry_after.get(transition.migration_id, 0.0) > now:
                    continue
                thread = threading.Thread(target=self._drive, args=(transition, term), daemon=True,
                                          name=f"migration-{transition.migration_id[:8]}")
                self._active[transition.migration_id] = thread
                thread.start()

    def _start_replication_moves(self) -> None:
        """Start the replica additions and removals that bring tablets to their keyspace's RF (a few at a time)."""
        limit = self._max_parallel * 2
        self._start_planned(self._group0.read(lambda s: core.replication_moves(s, max(limit - len(s.transitions), 0))))

    def _start_planned(self, planned: list[core.PlannedMove]) -> None:
        for move in planned:
            source = move.source
            outcome = self._group0.propose(StartTabletMigration(
                cmd_id=uuid.uuid4().hex, migration_id=uuid.uuid4().hex, table_id=move.table_id,
                tablet_id=move.tablet_id, leaving_node=move.leaving.node, leaving_shard=move.leaving.shard,
                pending_node=move.pending.node, pending_shard=move.pending.shard, kind=move.kind,
                source_node=source.node if source else "", source_shard=source.shard if source else 0),
                timeout=PROPOSE_TIMEOUT)
            if not outcome.ok:
                log.info("replica %s of tablet %d of %s refused: %s", move.kind, move.tablet_id, move.table_id,
                         outcome.error_message)

    def _remove_drained_nodes(self, term: int) -> None:
        """Take the departing nodes that hold nothing any more out of the Raft group, then out of group0."""
        for node_id in self._group0.read(core.removable_nodes):
            if node_id == self._node_id:
                log.warning("this node (%s) is decommissioned and holds no replica: it stops, so that the next "
                            "leader takes it out of the Raft group", node_id)
                self._leave()
                return
            raft_addr = self._group0.read(lambda s: s.nodes[node_id].raft if node_id in s.nodes else None)
            if raft_addr is None:
                continue
            self._group0.remove_member(raft_addr, timeout=PROPOSE_TIMEOUT)
            outcome = self._group0.propose(RemoveNode(cmd_id=uuid.uuid4().hex, term=term, node_id=node_id),
                                           timeout=PROPOSE_TIMEOUT)
            log.info("node %s removed from the cluster: %s", node_id, "done" if outcome.ok else outcome.error_message)

    def _prepare_merge(self, table_id: str, term: int) -> None:
        """Start the migrations a requested merge still needs (one per tablet at a time), or merge once none is."""
        moves, moving = self._group0.read(lambda s: (resize.merge_moves(s, table_id),
                                                     set(core.transitions_of_table(s, table_id))))
        if not moves and not moving:
            outcome = self._group0.propose(MergeTablets(cmd_id=uuid.uuid4().hex, term=term, table_id=table_id,
                                                        id_seed=uuid.uuid4().hex), timeout=PROPOSE_TIMEOUT)
            log.info("merge of table %s: %s", table_id, "done" if outcome.ok else outcome.error_message)
            return
        for tablet, leaving, pending in moves:
            if tablet in moving:
                continue
            moving.add(tablet)
            outcome = self._group0.propose(StartTabletMigration(
                cmd_id=uuid.uuid4().hex, migration_id=uuid.uuid4().hex, table_id=table_id, tablet_id=tablet,
                leaving_node=leaving.node, leaving_shard=leaving.shard, pending_node=pending.node,
                pending_shard=pending.shard), timeout=PROPOSE_TIMEOUT)
            if not outcome.ok:
                log.info("merge of table %s: moving tablet %d refused: %s", table_id, tablet, outcome.error_message)

    def _drive(self, transition: core.TabletTransition, term: int) -> None:
        """One step of one migration, then its next stage proposed; the thread ends (the next round goes on)."""
        try:
            self._step(transition, term)
            self._retry_after.pop(transition.migration_id, None)
        except StepFailed as failure:
            if failure.roll_back and transition.stage in core.CAN_ROLL_BACK:
                log.warning("migration %s rolls back: %s", transition.migration_id, failure)
                self._propose(transition, core.CLEANUP_TARGET, term, reason=str(failure))
            else:
                log.info("migration %s at %s: %s; retrying", transition.migration_id, transition.stage, failure)
                self._retry_after[transition.migration_id] = time.monotonic() + RETRY_DELAY
        except Exception as error:  # noqa: BLE001 - a step must not kill the driver
            log.warning("migration %s at %s failed: %s", transition.migration_id, transition.stage, error)
            self._retry_after[transition.migration_id] = time.monotonic() + RETRY_DELAY
        finally:
            with self._cond:
                self._active.pop(transition.migration_id, None)
                self._woken = True
                self._cond.notify_all()

    def _step(self, transition: core.TabletTransition, term: int) -> None:
        self._hit_pause_point()
        if self._leadership() != (True, term):
            return  # deposed meanwhile: the next leader resumes
        step = core.next_step(transition)
        nodes, version, token_count, dead = self._group0.read(lambda s: (
            core.barrier_nodes(s), s.schema_version, s.tablets[transition.table_id].tablet_count,
            s.nodes.get(transition.leaving.node) is None or s.nodes[transition.leaving.node].state == NODE_REMOVING))
        first, last = tablet_range(transition.tablet_id, token_count)
        if step.action == core.BARRIER:
            self._barrier(transition, nodes, version)
        elif step.action == core.STREAM:
            self._stream(transition, term, first, last, version)
        elif step.action == core.CLEANUP_PENDING or (step.action == core.CLEANUP_LEAVING and not dead):
            node = transition.leaving.node if step.action == core.CLEANUP_LEAVING else transition.pending.node
            self._cleanup(transition, node, term, first, last, version)
        self._propose(transition, step.to_stage, term)

    def _barrier(self, transition: core.TabletTransition, nodes: list[str], version: int) -> None:
        problems = self._calls.barrier(nodes, version, BARRIER_TIMEOUT)
        if problems:
            pending_lost = any(p.startswith(f"{transition.pending.node}:") for p in problems)
            raise StepFailed(f"barrier at schema version {version} not confirmed by {'; '.join(problems)}",
                             roll_back=pending_lost)

    def _stream(self, transition: core.TabletTransition, term: int, first: int, last: int, version: int) -> None:
        started = time.monotonic()
        try:
            rows = self._calls.stream(transition.pending.node, term, transition.migration_id, transition.table_id,
                                      first, last, transition.stream_source.node, version)
        except CoreError as error:
            raise StepFailed(f"streaming to {transition.pending.node} failed: {error.message}", roll_back=True) from None
        log.info("migration %s: streamed %d rows of tablet %d from %s to %s in %.2fs", transition.migration_id, rows,
                 transition.tablet_id, transition.leaving, transition.pending, time.monotonic() - started)

    def _cleanup(self, transition: core.TabletTransition, node: str, term: int, first: int, last: int,
                 version: int) -> None:
        try:
            self._calls.cleanup(node, term, transition.migration_id, transition.table_id, first, last, version)
        except CoreError as error:
            raise StepFailed(f"cleanup on {node} failed: {error.message}", roll_back=False) from None

    def _propose(self, transition: core.TabletTransition, to_stage: str, term: int, reason: str = "") -> None:
        command = AdvanceTabletMigration(cmd_id=uuid.uuid4().hex, term=term, migration_id=transition.migration_id,
                                         table_id=transition.table_id, tablet_id=transition.tablet_id,
                                         from_stage=transition.stage, to_stage=to_stage, reason=reason)
        outcome = self._group0.propose(command, timeout=PROPOSE_TIMEOUT)
        if not outcome.ok:
            raise StepFailed(f"proposing {to_stage} refused: {outcome.error_message}", roll_back=False)
        if self._metrics is not None:
            self._metrics.migration_stages.labels(to_stage).inc()
            if to_stage in core.FINAL:
                self._metrics.migrations_ended.labels(core.DONE if to_stage == core.END_MIGRATION
                                                      else core.REVERTED).inc()
        log.info("migration %s of tablet %d: %s -> %s", transition.migration_id, transition.tablet_id,
                 transition.stage, to_stage)

    def _hit_pause_point(self) -> None:
        try:
            self._injections.hit(PAUSE_POINT)
        except InjectedFailure as failure:
            raise StepFailed(f"injected failure at {PAUSE_POINT}: {failure}", roll_back=True) from None
