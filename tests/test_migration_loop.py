"""Tests of the pure tablet migration loop: stages and their actions, retries, rollbacks, planning, term fences, and
seeded random schedules; then the shell against a fake group0 and fake calls. `validate()` after every event."""
from __future__ import annotations

import itertools
import random
import threading
import uuid
from dataclasses import dataclass, field, replace

import pytest

from common.injection import Injections
from coordinator.core import migrations as m
from coordinator.core.commands import (
    AdvanceTabletMigration,
    AlterKeyspace,
    DecommissionNode,
    MergeTablets,
    RegisterNode,
    RemoveNode,
    RequestTabletMerge,
    SetBalancer,
    StartTabletMigration,
)
from coordinator.core.errors import StaleTerm, Unavailable
from coordinator.core.migration_loop import (
    BARRIER,
    CLEANUP_LEAVING,
    CLEANUP_PENDING,
    STREAM,
    BarrierFailure,
    CallError,
    CleanupFailure,
    Fenced,
    HitPausePoint,
    InjectedFault,
    LeadershipChanged,
    Leave,
    MemberRemoved,
    MigrationConfig,
    MigrationLoop,
    Propose,
    ProposalDone,
    RemoveMember,
    RunBarrier,
    RunCleanup,
    RunStream,
    StepDone,
    StepFailed,
    StreamFailure,
    Tick,
    WakeAt,
)
from coordinator.core.schema import Replica
from coordinator.core.state import Group0State
from coordinator.tablet_migration import MigrationCalls, MigrationDriver, unconfirmed_by_node
from tests.cluster_harness import wait_until
from tests.fakes import FakeGroup0
from tests.test_core_state import cluster, make_table
from tests.test_tablet_migrations import advance

TERM = 3
STEPS = (HitPausePoint, RunBarrier, RunStream, RunCleanup)


def counting_ids():
    counter = itertools.count(1)
    return lambda: f"{next(counter):032x}"


def new_loop(down_after: float = 5.0, max_parallel: int = 4, node_id: str = "n1") -> MigrationLoop:
    config = MigrationConfig(down_after=down_after, max_parallel=max_parallel, retry_delay=1.0)
    return MigrationLoop(config, node_id=node_id, new_id=counting_ids())


def quiet(state: Group0State) -> Group0State:
    assert state.apply(SetBalancer(cmd_id=None, enabled=False)).ok
    return state


def start(state: Group0State, table_id: str, tablet: int, leaving: Replica, pending: Replica, **fields) -> str:
    migration_id = uuid.uuid4().hex
    outcome = state.apply(StartTabletMigration(
        cmd_id=None, migration_id=migration_id, table_id=table_id, tablet_id=tablet, leaving_node=leaving.node,
        leaving_shard=leaving.shard, pending_node=pending.node, pending_shard=pending.shard, **fields))
    assert outcome.ok, outcome
    return migration_id


def alter_rf(state: Group0State, rf: int) -> None:
    assert state.apply(AlterKeyspace(cmd_id=None, name="ks", rf=rf, id_seed=uuid.uuid4().hex)).ok


def moved_tablet(state: Group0State, tablets: int = 2) -> tuple[str, Replica, Replica, str]:
    """A quiet 2-node table whose tablet 0 starts moving to the other node: (table id, leaving, pending, migration)."""
    table_id = make_table(state, rf=1, tablets=tablets)
    leaving = state.tablets[table_id].replicas[0][0]
    pending = Replica(next(n for n in sorted(state.nodes) if n != leaving.node), 0)
    return table_id, leaving, pending, start(state, table_id, 0, leaving, pending)


class Driver:
    """Plays the shell for one loop against a real Group0State: proposals apply at once, every step is answered at
    once as `answer(step, driver)` says (None: done), time moves `tick` seconds a round."""

    def __init__(self, state: Group0State, loop: MigrationLoop | None = None, term: int = TERM):
        self.state, self.loop = state, loop or new_loop()
        self.now, self.term = 0.0, term
        self.events: list = [LeadershipChanged(True, term)]
        self.history: list = []  # (time, instruction) of everything the loop said
        self.refusals: list = []

    def handle(self, *events) -> list:
        out = self.loop.handle(self.state, Tick(self.now), *events)
        self.loop.validate()
        self.history += [(self.now, i) for i in out]
        return out

    def round(self, answer=lambda step, driver: None) -> list:
        out = self.handle(*self.events)
        self.events = []
        for instruction in out:
            if isinstance(instruction, Propose):
                self.events.append(self.propose(instruction))
            elif isinstance(instruction, STEPS):
                failure = answer(instruction, self)
                self.events.append(StepDone(instruction) if failure is None else StepFailed(instruction, failure))
            elif isinstance(instruction, RemoveMember):
                self.events.append(MemberRemoved(instruction.epoch, instruction.node_id))
        return out

    def propose(self, instruction: Propose) -> ProposalDone:
        outcome = self.state.apply(replace(instruction.command, cmd_id=uuid.uuid4().hex))
        if not outcome.ok:
            self.refusals.append((instruction.command, outcome.error_code, outcome.error_message))
        return ProposalDone(instruction.epoch, instruction.command, outcome.error)

    def run(self, answer=lambda step, driver: None, until=None, rounds: int = 300, tick: float = 0.25) -> None:
        until = until or (lambda: not self.state.transitions and not self.events)
        for _ in range(rounds):
            if until():
                return
            self.round(answer)
            self.now += tick
        raise AssertionError(f"not done after {rounds} rounds: {self.state.transitions}")

    def trace(self, migration_id: str | None = None) -> list[str]:
        """'stage:action' of every step and '-> stage' of every stage change (of one migration, when given)."""
        lines = []
        for _, i in self.history:
            if isinstance(i, STEPS) and migration_id in (None, i.migration_id):
                lines.append(f"{i.stage}:{i.action}")
            elif (isinstance(i, Propose) and isinstance(i.command, AdvanceTabletMigration)
                  and migration_id in (None, i.command.migration_id)):
                lines.append(f"-> {i.command.to_stage}")
        return lines

    def proposed(self, kind: type) -> list:
        return [i.command for _, i in self.history if isinstance(i, Propose) and isinstance(i.command, kind)]


FORWARD_MOVE = [
    "allow_write_both_read_old:pause", "allow_write_both_read_old:barrier", "-> write_both_read_old",
    "write_both_read_old:pause", "write_both_read_old:barrier", "-> streaming",
    "streaming:pause", "streaming:stream", "-> write_both_read_new",
    "write_both_read_new:pause", "write_both_read_new:barrier", "-> use_new",
    "use_new:pause", "use_new:barrier", "-> cleanup",
    "cleanup:pause", "cleanup:cleanup_leaving", "-> end_migration",
]


# ------------------------------------------------------------------ stages and their actions


def test_a_move_runs_every_stage_with_its_actions_and_ends_on_the_pending_replica():
    state = quiet(cluster(nodes=2, shards=1))
    table_id, leaving, pending, migration_id = moved_tablet(state)
    driver = Driver(state)
    driver.run()
    assert driver.trace(migration_id) == FORWARD_MOVE
    assert state.tablets[table_id].replicas[0] == (pending,)
    assert state.migration_results[migration_id] == m.MigrationResult(m.DONE)
    [stream] = [i for _, i in driver.history if isinstance(i, RunStream)]
    assert (stream.pending_node, stream.source_node, stream.term) == (pending.node, leaving.node, TERM)
    assert (stream.first_token, stream.last_token) == (-2 ** 63, -1)
    [cleanup] = [i for _, i in driver.history if isinstance(i, RunCleanup)]
    assert (cleanup.node, cleanup.action, cleanup.term) == (leaving.node, CLEANUP_LEAVING, TERM)
    assert all(c.term == TERM and c.reason == "" for c in driver.proposed(AdvanceTabletMigration))
    assert not driver.refusals


def test_a_barrier_asks_every_node_at_the_schema_version_of_its_stage():
    state = quiet(cluster(nodes=3, shards=1))
    moved_tablet(state)
    driver = Driver(state)
    seen = []

    def answer(step, d):
        if isinstance(step, RunBarrier):
            seen.append((step.nodes, step.version == d.state.schema_version))
        return None

    driver.run(answer)
    assert seen and all(nodes == ("n1", "n2", "n3") and current for nodes, current in seen)


def test_a_move_between_shards_of_one_node_streams_and_cleans_nothing():
    state = quiet(cluster(nodes=1, shards=2))
    table_id = make_table(state, rf=1, tablets=1)
    leaving = state.tablets[table_id].replicas[0][0]
    migration_id = start(state, table_id, 0, leaving, Replica(leaving.node, 1 - leaving.shard))
    driver = Driver(state)
    driver.run()
    assert "streaming:stream" not in driver.trace(migration_id)
    assert not any(line.endswith(CLEANUP_LEAVING) for line in driver.trace(migration_id))
    assert state.tablets[table_id].replicas[0] == (Replica(leaving.node, 1 - leaving.shard),)


def test_an_rf_increase_adds_a_streamed_replica_and_cleans_nothing_up():
    state = quiet(cluster(nodes=2, shards=1))
    table_id = make_table(state, rf=1, tablets=1)
    source = state.tablets[table_id].replicas[0][0]
    alter_rf(state, 2)
    driver = Driver(state)
    driver.run(until=lambda: len(state.tablets[table_id].replicas[0]) == 2 and not state.transitions)
    [start_command] = driver.proposed(StartTabletMigration)
    assert start_command.kind == m.ADD and start_command.migration_id == f"{1:032x}"
    trace = driver.trace(start_command.migration_id)
    assert "streaming:stream" in trace
    assert trace[-3:] == ["-> cleanup", "cleanup:pause", "-> end_migration"]  # the source stays
    assert state.tablets[table_id].replicas[0][0] == source


def test_an_rf_decrease_starts_at_write_both_read_new_and_cleans_up_the_removed_replica():
    state = quiet(cluster(nodes=2, shards=1))
    table_id = make_table(state, rf=2, tablets=1)
    removed = state.tablets[table_id].replicas[0][-1]
    alter_rf(state, 1)
    driver = Driver(state)
    driver.run(until=lambda: len(state.tablets[table_id].replicas[0]) == 1 and not state.transitions)
    [start_command] = driver.proposed(StartTabletMigration)
    assert driver.trace(start_command.migration_id) == [
        "write_both_read_new:pause", "write_both_read_new:barrier", "-> use_new", "use_new:pause",
        "use_new:barrier", "-> cleanup", "cleanup:pause", "cleanup:cleanup_leaving",
        "-> end_migration"]
    [cleanup] = [i for _, i in driver.history if isinstance(i, RunCleanup)]
    assert cleanup.node == removed.node


# ------------------------------------------------------------------ retries and rollbacks


def pending_unconfirmed_until(node: str, until: float, at_stage: str | None = None):
    """An answer: barriers are not confirmed by `node` before time `until` (only at `at_stage`, when given)."""
    def answer(step, driver):
        if isinstance(step, RunBarrier) and driver.now < until and at_stage in (None, step.stage):
            return BarrierFailure({node: "unreachable"})
        return None
    return answer


def test_a_barrier_the_pending_node_misses_for_less_than_down_after_is_retried_not_rolled_back():
    state = quiet(cluster(nodes=2, shards=1))
    table_id, _, pending, migration_id = moved_tablet(state)
    driver = Driver(state, new_loop(down_after=5.0))
    driver.run(pending_unconfirmed_until(pending.node, until=4.0))
    assert state.migration_results[migration_id] == m.MigrationResult(m.DONE)
    assert all(c.to_stage != m.CLEANUP_TARGET for c in driver.proposed(AdvanceTabletMigration))
    retries = [t for t, i in driver.history if isinstance(i, RunBarrier) and i.stage == m.ALLOW_WRITE_BOTH_READ_OLD]
    assert len(retries) >= 4 and all(b - a >= 1.0 for a, b in zip(retries, retries[1:]))  # the retry delay
    assert state.tablets[table_id].replicas[0] == (pending,)


def test_a_pending_node_down_longer_than_down_after_rolls_back_with_the_reason_then_cleans_up_behind_a_barrier():
    state = quiet(cluster(nodes=2, shards=1))
    table_id, leaving, pending, migration_id = moved_tablet(state)
    driver = Driver(state, new_loop(down_after=5.0))
    driver.run(pending_unconfirmed_until(pending.node, until=9.0))
    [rollback] = [(t, c) for t, i in driver.history if isinstance(i, Propose)
                  for c in [i.command] if isinstance(c, AdvanceTabletMigration) and c.to_stage == m.CLEANUP_TARGET]
    at, command = rollback
    assert 5.0 < at < 7.0 and command.from_stage == m.ALLOW_WRITE_BOTH_READ_OLD and command.term == TERM
    assert command.reason.startswith(f"node {pending.node} is down") and "unreachable" in command.reason
    trace = driver.trace(migration_id)
    tail = trace[trace.index("-> cleanup_target"):]
    assert list(dict.fromkeys(tail)) == [
        "-> cleanup_target", "cleanup_target:pause", "cleanup_target:barrier", "cleanup_target:cleanup_pending",
        "-> revert_migration"]
    result = state.migration_results[migration_id]
    assert result.outcome == m.REVERTED and result.reason == command.reason
    assert state.tablets[table_id].replicas[0] == (leaving,)


def test_a_node_that_comes_back_between_failures_starts_a_new_streak():
    state = quiet(cluster(nodes=2, shards=1))
    _, _, pending, migration_id = moved_tablet(state)
    loop = new_loop(down_after=5.0)
    driver = Driver(state, loop)

    barriers = itertools.count()

    def answer(step, d):  # two barriers of three not confirmed: failing for long, yet never 5 s without a success
        if isinstance(step, RunBarrier) and next(barriers) % 3 != 2:
            return BarrierFailure({pending.node: "unreachable"})
        return None

    driver.run(answer, rounds=600)
    assert state.migration_results[migration_id] == m.MigrationResult(m.DONE)
    assert driver.now > 10 and not driver.loop.failures


def test_an_uninvolved_node_down_for_long_holds_the_migration_back_without_rolling_it_back():
    state = quiet(cluster(nodes=3, shards=1))
    table_id = make_table(state, rf=1, tablets=1)
    leaving = state.tablets[table_id].replicas[0][0]
    others = [n for n in sorted(state.nodes) if n != leaving.node]
    migration_id = start(state, table_id, 0, leaving, Replica(others[0], 0))
    driver = Driver(state, new_loop(down_after=2.0))
    driver.run(pending_unconfirmed_until(others[1], until=12.0), rounds=400)
    assert state.migration_results[migration_id] == m.MigrationResult(m.DONE)


def test_a_failed_stream_rolls_back_at_once_and_the_pending_replica_is_cleaned_after_a_barrier():
    state = quiet(cluster(nodes=2, shards=1))
    table_id, leaving, pending, migration_id = moved_tablet(state)
    driver = Driver(state)
    versions = {}

    def answer(step, d):
        transition = m.transition_of(d.state, table_id, 0)
        versions.setdefault((step.stage, step.action), (getattr(step, "version", None), d.state.schema_version))
        if isinstance(step, RunStream):
            return StreamFailure("injected failure at 'stream_tablet_fail'")
        assert transition.stage == step.stage
        return None

    driver.run(answer)
    trace = driver.trace(migration_id)
    assert trace[trace.index("streaming:stream"):] == [
        "streaming:stream", "-> cleanup_target", "cleanup_target:pause", "cleanup_target:barrier",
        "cleanup_target:cleanup_pending", "-> revert_migration"]
    barrier_version, current = versions[(m.CLEANUP_TARGET, BARRIER)]
    assert barrier_version == current > versions[(m.STREAMING, STREAM)][0]  # after cleanup_target was applied
    [cleanup] = [i for _, i in driver.history if isinstance(i, RunCleanup)]
    assert (cleanup.node, cleanup.action) == (pending.node, CLEANUP_PENDING)
    result = state.migration_results[migration_id]
    assert result.outcome == m.REVERTED and result.reason.startswith(f"streaming to {pending} failed: injected")
    assert state.tablets[table_id].replicas[0] == (leaving,)


def test_a_failed_cleanup_of_the_pending_replica_is_retried_without_a_second_barrier():
    state = quiet(cluster(nodes=2, shards=1))
    _, _, pending, migration_id = moved_tablet(state)
    driver = Driver(state)
    failures = iter([StreamFailure("broken"), CleanupFailure(pending.node, "disk full")])

    def answer(step, d):
        return next(failures, None) if isinstance(step, (RunStream, RunCleanup)) else None

    driver.run(answer)
    trace = driver.trace(migration_id)
    assert trace[trace.index("-> cleanup_target"):] == [
        "-> cleanup_target", "cleanup_target:pause", "cleanup_target:barrier", "cleanup_target:cleanup_pending",
        "cleanup_target:cleanup_pending", "-> revert_migration"]


def test_the_pause_point_in_fail_mode_rolls_back_where_it_can_and_retries_where_it_cannot():
    state = quiet(cluster(nodes=2, shards=1))
    _, _, _, migration_id = moved_tablet(state)
    driver = Driver(state)
    fault = InjectedFault("injected failure at 'pause_tablet_migration_stage'")
    driver.run(lambda step, d: fault if isinstance(step, HitPausePoint) and step.stage == m.WRITE_BOTH_READ_OLD
               else None)
    assert state.migration_results[migration_id] == m.MigrationResult(m.REVERTED, fault.reason)

    state = quiet(cluster(nodes=2, shards=1))
    _, _, _, migration_id = moved_tablet(state)
    driver = Driver(state)
    failed = set()

    def once_after_reads_switched(step, d):
        if isinstance(step, HitPausePoint) and step.stage == m.USE_NEW and not failed:
            failed.add(step)
            return fault
        return None

    driver.run(once_after_reads_switched)
    assert state.migration_results[migration_id] == m.MigrationResult(m.DONE)
    assert driver.trace(migration_id).count("use_new:pause") == 2


def test_nothing_is_cleaned_up_on_a_dead_node_being_removed_and_the_node_is_then_removed():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=2, tablets=1)
    dead = state.tablets[table_id].replicas[0][0].node
    assert state.apply(DecommissionNode(cmd_id=None, node_id=dead, dead=True)).ok
    driver = Driver(state, new_loop(node_id=next(n for n in sorted(state.nodes) if n != dead)))
    driver.run(until=lambda: dead not in state.nodes)
    [move] = driver.proposed(StartTabletMigration)
    assert move.leaving_node == dead and move.source_node not in ("", dead)
    trace = driver.trace(move.migration_id)
    assert trace[-3:] == ["-> cleanup", "cleanup:pause", "-> end_migration"]  # nothing cleaned up on the dead node
    assert all(dead not in i.nodes for _, i in driver.history if isinstance(i, RunBarrier))
    assert [i.node_id for _, i in driver.history if isinstance(i, RemoveMember)] == [dead]
    assert [(c.node_id, c.term) for c in driver.proposed(RemoveNode)] == [(dead, TERM)]
    assert dead in state.removed_nodes


def test_a_move_whose_pending_node_is_declared_dead_after_reads_switched_rolls_back_to_the_live_replica():
    state = quiet(cluster(nodes=3, shards=1))
    table_id, leaving, pending, migration_id = moved_tablet(state, tablets=1)
    for stage in ("write_both_read_old", "streaming", "write_both_read_new"):
        assert advance(state, m.transition_of(state, table_id, 0), stage).ok
    assert state.apply(DecommissionNode(cmd_id=None, node_id=pending.node, dead=True)).ok  # the rows stay on leaving
    driver = Driver(state, new_loop(node_id=next(n for n in sorted(state.nodes) if n not in (leaving.node,
                                                                                              pending.node))))
    driver.run(until=lambda: m.transition_of(state, table_id, 0) is None)
    assert state.migration_results[migration_id] == m.MigrationResult(
        m.REVERTED, f"node {pending.node}, its pending replica, was declared dead")
    assert state.tablets[table_id].replicas[0] == (leaving,)


def test_a_node_cannot_be_declared_dead_while_a_move_past_rollback_makes_it_a_tablets_only_replica():
    state = quiet(cluster(nodes=3, shards=1))
    table_id, leaving, pending, _ = moved_tablet(state, tablets=1)
    for stage in ("write_both_read_old", "streaming", "write_both_read_new", "use_new"):
        assert advance(state, m.transition_of(state, table_id, 0), stage).ok
    refused = state.apply(DecommissionNode(cmd_id=None, node_id=pending.node, dead=True))
    assert refused.error_code == "FAILED_PRECONDITION" and "tablet 0" in refused.error_message


def test_a_drained_leader_leaves_once_instead_of_removing_itself():
    state = cluster(nodes=3, shards=1)
    make_table(state, rf=2, tablets=2)
    assert state.apply(DecommissionNode(cmd_id=None, node_id="n2")).ok
    driver = Driver(state, new_loop(node_id="n2"))
    driver.run(until=lambda: any(isinstance(i, Leave) for _, i in driver.history))
    for _ in range(5):
        driver.round()
    assert sum(isinstance(i, Leave) for _, i in driver.history) == 1
    assert not any(isinstance(i, RemoveMember) for _, i in driver.history)
    assert "n2" in state.nodes and not any(r.node == "n2" for t in state.tablets.values() for rs in t.replicas
                                           for r in rs)


def test_a_failed_membership_change_holds_the_removal_back():
    state = cluster(nodes=3, shards=1)
    assert state.apply(DecommissionNode(cmd_id=None, node_id="n3")).ok  # holds nothing: removable at once
    driver = Driver(state)
    [remove] = [i for i in driver.handle(LeadershipChanged(True, TERM)) if isinstance(i, RemoveMember)]
    out = driver.handle(MemberRemoved(remove.epoch, "n3", "no quorum"))
    assert not any(isinstance(i, (Propose, RemoveMember)) for i in out)
    assert WakeAt(driver.now + 1.0) in out
    driver.now += 1.0
    assert any(isinstance(i, RemoveMember) for i in driver.handle())


# ------------------------------------------------------------------ planning


def test_a_requested_merge_co_locates_the_pairs_then_merges_with_the_term():
    state = quiet(cluster(nodes=2, shards=1))
    table_id = make_table(state, rf=1, tablets=4)
    assert state.apply(RequestTabletMerge(cmd_id=None, table_id=table_id)).ok
    driver = Driver(state)
    driver.run(until=lambda: state.tablets[table_id].tablet_count == 2)
    [merge] = driver.proposed(MergeTablets)
    assert merge.term == TERM and len(merge.id_seed) == 32
    assert not state.merge_requests and not driver.refusals


def test_the_balancer_moves_replicas_to_a_new_node_only_when_nothing_else_moves():
    state = cluster(nodes=2, shards=1)
    table_id = make_table(state, rf=1, tablets=4)
    assert state.apply(RegisterNode(cmd_id=None, node_id="n3", grpc="h:3", raft="h:103", shards=1)).ok
    driver = Driver(state)
    driver.run(until=lambda: not state.transitions and "n3" in {r.node for rs in state.tablets[table_id].replicas
                                                                  for r in rs} and not driver.events)
    loads = [sum(r.node == n for rs in state.tablets[table_id].replicas for r in rs) for n in ("n1", "n2", "n3")]
    assert max(loads) - min(loads) <= 1 and not driver.refusals


def test_at_most_max_parallel_migrations_have_a_step_under_way():
    state = quiet(cluster(nodes=2, shards=1))
    table_id = make_table(state, rf=1, tablets=8)
    for tablet, replicas in enumerate(state.tablets[table_id].replicas):
        leaving = replicas[0]
        start(state, table_id, tablet, leaving, Replica("n2" if leaving.node == "n1" else "n1", 0))
    driver = Driver(state, new_loop(max_parallel=3))
    widest = 0

    def answer(step, d):
        nonlocal widest
        widest = max(widest, len(d.loop.in_flight) + len(d.loop.advancing))
        return None

    driver.run(answer)
    assert widest == 3 and len(state.migration_results) == 8


# ------------------------------------------------------------------ leadership and terms


def test_a_follower_and_a_deposed_leader_propose_nothing():
    state = quiet(cluster(nodes=2, shards=1))
    table_id, _, _, _ = moved_tablet(state)
    loop = new_loop()
    assert not any(isinstance(i, (Propose, *STEPS)) for i in loop.handle(state, LeadershipChanged(False, TERM)))
    loop.validate()
    driver = Driver(state, loop)
    driver.round()  # leads: its pause step is answered
    transition = m.transition_of(state, table_id, 0)
    assert state.apply(AdvanceTabletMigration(
        cmd_id=None, term=TERM + 1, migration_id=transition.migration_id, table_id=table_id, tablet_id=0,
        from_stage=transition.stage, to_stage=m.WRITE_BOTH_READ_OLD)).ok  # a newer leader's command
    out = driver.round()
    assert loop.deposed and not loop.active
    assert not any(isinstance(i, (Propose, *STEPS)) for i in out)
    assert not any(isinstance(i, (Propose, *STEPS)) for i in driver.round())
    out = driver.handle(LeadershipChanged(True, TERM + 2))
    assert loop.active and any(isinstance(i, HitPausePoint) for i in out)


def test_a_stale_term_refusal_deposes_the_loop_until_the_term_changes():
    state = quiet(cluster(nodes=2, shards=1))
    moved_tablet(state)
    driver = Driver(state)
    driver.round()
    driver.round()  # the barrier answered: the stage change comes next
    out = driver.handle(*driver.events)
    [propose] = [i for i in out if isinstance(i, Propose)]
    out = driver.handle(ProposalDone(propose.epoch, propose.command, StaleTerm("stale term 3")))
    assert driver.loop.deposed and not any(isinstance(i, (Propose, *STEPS)) for i in out)
    out = driver.handle(LeadershipChanged(True, TERM))  # a repeat of the pair changes nothing
    assert driver.loop.deposed and not any(isinstance(i, (Propose, *STEPS)) for i in out)


def test_a_fenced_call_deposes_the_loop():
    state = quiet(cluster(nodes=2, shards=1))
    moved_tablet(state)
    driver = Driver(state)
    driver.run(lambda step, d: Fenced("n2", "stale term 3") if isinstance(step, RunStream) else None,
               until=lambda: driver.loop.deposed)
    assert not driver.loop.in_flight
    assert all(c.to_stage != m.CLEANUP_TARGET for c in driver.proposed(AdvanceTabletMigration))


def test_late_answers_and_proposals_of_an_older_term_are_ignored():
    state = quiet(cluster(nodes=2, shards=1))
    moved_tablet(state)
    driver = Driver(state)
    [old_step] = [i for i in driver.handle(LeadershipChanged(True, TERM)) if isinstance(i, HitPausePoint)]
    out = driver.handle(LeadershipChanged(True, TERM + 1))
    [new_step] = [i for i in out if isinstance(i, HitPausePoint)]
    assert new_step != old_step and new_step.epoch > old_step.epoch
    driver.handle(StepDone(old_step), StepFailed(old_step, StreamFailure("old")))
    assert driver.loop.in_flight == {new_step.migration_id: new_step} and not driver.loop.rollbacks
    stale = AdvanceTabletMigration(cmd_id=None, term=TERM, migration_id=new_step.migration_id, table_id="t",
                                   tablet_id=0, from_stage=m.ALLOW_WRITE_BOTH_READ_OLD,
                                   to_stage=m.WRITE_BOTH_READ_OLD)
    driver.handle(ProposalDone(old_step.epoch, stale, StaleTerm("stale")))
    assert driver.loop.active
    out = driver.handle(StepDone(new_step))
    assert any(isinstance(i, RunBarrier) and i.epoch == new_step.epoch for i in out)


def test_a_proposal_not_known_to_be_committed_is_retried_after_the_delay():
    state = quiet(cluster(nodes=2, shards=1))
    _, _, _, migration_id = moved_tablet(state)
    driver = Driver(state)
    driver.round()
    driver.round()
    [propose] = [i for i in driver.handle(*driver.events) if isinstance(i, Propose)]
    out = driver.handle(ProposalDone(propose.epoch, propose.command, Unavailable("no quorum")))
    assert not any(isinstance(i, Propose) for i in out) and WakeAt(driver.now + 1.0) in out
    driver.now += 1.0
    driver.events = []
    assert Propose(propose.epoch, propose.command) in driver.round()
    driver.run()
    assert state.migration_results[migration_id] == m.MigrationResult(m.DONE)


def test_the_shell_maps_barrier_answers_to_nodes():
    assert unconfirmed_by_node(("n1", "n10"), ["n10: no answer within 10s", "n1: unreachable: a: b"]) == {
        "n10": "no answer within 10s", "n1": "unreachable: a: b"}


# ------------------------------------------------------------------ seeded random schedules


@dataclass
class Sim:
    """Random schedules of one node's loop: answers delayed, lost-looking and late proposals, nodes down for a while,
    term changes with the old term's answers still arriving; then a calm phase in which every migration must end."""

    seed: int
    rng: random.Random = field(init=False)
    state: Group0State = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.state = cluster(nodes=4, shards=2)
        self.table_id = make_table(self.state, rf=2, tablets=4)
        self.down_after = 3.0
        self.loop = new_loop(down_after=self.down_after, max_parallel=self.rng.choice([1, 2, 4]))
        self.now, self.term, self.leader = 0.0, 1, True
        self.arriving: list[tuple[float, object]] = []  # (time, event)
        self.late: list[tuple[float, object, int]] = []  # (time, command, epoch): applied later, answer lost
        self.down: dict[str, list[tuple[float, float]]] = {}  # node -> its (from, until) spans
        self.barriers_done: set[tuple[int, str]] = set()  # (epoch, migration) with a cleanup_target barrier done
        self.cleaned: set[tuple[int, str]] = set()
        self._setup()

    def _setup(self) -> None:
        rng, state = self.rng, self.state
        if rng.random() < 0.5:
            alter_rf(state, rng.choice([1, 3]))
        if rng.random() < 0.4:
            assert state.apply(RequestTabletMerge(cmd_id=None, table_id=self.table_id)).ok
        if rng.random() < 0.5:
            assert state.apply(RegisterNode(cmd_id=None, node_id="n5", grpc="h:5", raft="h:105", shards=2)).ok

    def is_down(self, node: str) -> bool:
        return any(start <= self.now < end for start, end in self.down.get(node, ()))

    def step(self, calm: bool) -> list:
        self.now += self.rng.uniform(0.05, 0.6)
        if not calm:
            self._chaos()
        ready = [e for t, e in self.arriving if t <= self.now]
        self.arriving = [(t, e) for t, e in self.arriving if t > self.now]
        self.rng.shuffle(ready)
        for event in ready:
            self.record(event)
        self._apply_late(calm)
        out = self.loop.handle(self.state, Tick(self.now), LeadershipChanged(self.leader, self.term), *ready)
        self.loop.validate()
        for instruction in out:
            self._carry_out(instruction, calm)
        return out

    def _chaos(self) -> None:
        rng = self.rng
        if rng.random() < 0.02:
            self.term += 1
            self.leader = rng.random() < 0.8
        elif not self.leader and rng.random() < 0.2:
            self.term += 1
            self.leader = True
        if rng.random() < 0.03:
            node = rng.choice(sorted(self.state.nodes))
            self.down.setdefault(node, []).append((self.now, self.now + rng.uniform(0.5, 8.0)))

    def _apply_late(self, calm: bool) -> None:
        due = [(t, c, e) for t, c, e in self.late if t <= self.now or calm]
        self.late = [item for item in self.late if item not in due]
        for _, command, _ in due:
            outcome = self.state.apply(command)  # a start or a merge may no longer fit: harmless
            if isinstance(command, AdvanceTabletMigration):
                self._check_outcome(command, outcome)

    def _carry_out(self, instruction, calm: bool) -> None:
        if isinstance(instruction, Propose):
            self._propose(instruction, calm)
        elif isinstance(instruction, STEPS):
            self._check_order(instruction)
            failure = self._failure(instruction, calm)
            delay = 0.0 if calm else self.rng.uniform(0.0, 2.0)
            event = StepDone(instruction) if failure is None else StepFailed(instruction, failure)
            self.arriving.append((self.now + delay, event))
        elif isinstance(instruction, RemoveMember):
            self.arriving.append((self.now, MemberRemoved(instruction.epoch, instruction.node_id)))

    def _propose(self, instruction: Propose, calm: bool) -> None:
        command = replace(instruction.command, cmd_id=uuid.uuid4().hex)
        self._check_stage_change(command, instruction.epoch)
        fate = 1.0 if calm else self.rng.random()
        if fate < 0.05:  # not committed yet: applied later, after its proposer gave up
            self.late.append((self.now + self.rng.uniform(0.0, 3.0), command, instruction.epoch))
            self.arriving.append((self.now, ProposalDone(instruction.epoch, instruction.command,
                                                         Unavailable("timed out"))))
            return
        outcome = self.state.apply(command)
        self._check_outcome(command, outcome)
        refusal = Unavailable("answer lost") if fate < 0.1 and outcome.ok else outcome.error
        self.arriving.append((self.now, ProposalDone(instruction.epoch, instruction.command, refusal)))

    def _failure(self, step, calm: bool):
        if not calm and self.rng.random() < 0.05:
            return CallError("transient")

        if isinstance(step, RunBarrier):
            unconfirmed = {n: "unreachable" for n in step.nodes if self.is_down(n)}
            return BarrierFailure(unconfirmed) if unconfirmed else None
        if isinstance(step, RunStream):
            if self.is_down(step.pending_node) or self.is_down(step.source_node):
                return StreamFailure("a node is unreachable")
            if step.term < self.term and self.rng.random() < 0.5:
                return Fenced(step.pending_node, "stale term")
            return StreamFailure("injected") if not calm and self.rng.random() < 0.05 else None
        if isinstance(step, RunCleanup):
            return CleanupFailure(step.node, "unreachable") if self.is_down(step.node) else None
        return InjectedFault("injected failure at the pause point") if not calm and self.rng.random() < 0.01 else None

    def _check_outcome(self, command, outcome) -> None:
        assert outcome.error_code != "INVALID_ARGUMENT", (command, outcome)

    def _check_order(self, step) -> None:
        """At cleanup_target the pending replica is cleaned only after a barrier of the same term."""
        if isinstance(step, RunCleanup) and step.stage == m.CLEANUP_TARGET:
            assert (step.epoch, step.migration_id) in self.barriers_done, step

    def _check_stage_change(self, command, epoch: int) -> None:
        """A revert only after the barrier and the cleanup of its term; a rollback for a node down long enough."""
        if not isinstance(command, AdvanceTabletMigration):
            return
        key = (epoch, command.migration_id)
        if command.to_stage == m.REVERT_MIGRATION:
            transition = next(t for t in self.state.transitions.values() if t.migration_id == command.migration_id)
            assert key in self.barriers_done and (key in self.cleaned or not transition.moves_data), command
        if command.to_stage == m.CLEANUP_TARGET and command.reason.startswith("node "):
            node = command.reason.split()[1]
            spans = self.down.get(node, [])
            assert any(start <= self.now - self.down_after for start, _ in spans), (command.reason, spans, self.now)

    def record(self, event) -> None:
        if isinstance(event, StepDone) and event.step.stage == m.CLEANUP_TARGET:
            if isinstance(event.step, RunBarrier):
                self.barriers_done.add((event.step.epoch, event.migration_id))
            elif isinstance(event.step, RunCleanup):
                self.cleaned.add((event.step.epoch, event.migration_id))

    def run(self, chaos_steps: int = 250, calm_steps: int = 600) -> None:
        for index in range(chaos_steps + calm_steps):
            calm = index >= chaos_steps
            if index == chaos_steps:  # a last leader change: a new term, every node up
                self.leader, self.down, self.term = True, {}, self.term + 1
            self.step(calm)
            if calm and self.settled():
                return
        raise AssertionError(f"seed {self.seed}: still moving after the calm phase: {self.state.transitions}")

    def settled(self) -> bool:
        rf = self.state.keyspaces["ks"].rf
        replicas = self.state.tablets[self.table_id].replicas
        return (not self.state.transitions and not self.state.merge_requests and not self.arriving and not self.late
                and all(len(rs) == rf for rs in replicas) and not self.loop.planning)


@pytest.mark.parametrize("seed", range(60))
def test_random_schedules_keep_the_invariants_and_every_migration_ends(seed):
    Sim(seed).run()


# ------------------------------------------------------------------ the shell


class FakeCalls:
    def __init__(self, stream_error: Exception | None = None):
        self.calls: list[tuple] = []
        self.stream_error = stream_error
        self._lock = threading.Lock()

    def barrier(self, nodes, version, timeout):
        with self._lock:
            self.calls.append(("barrier", tuple(nodes), version))
        return []

    def stream(self, node, term, migration_id, table_id, first, last, source, version):
        with self._lock:
            self.calls.append(("stream", node, source, term))
        if self.stream_error is not None:
            raise self.stream_error
        return 7

    def cleanup(self, node, term, migration_id, table_id, first, last, version):
        with self._lock:
            self.calls.append(("cleanup", node, term))
        return 7

    def as_calls(self) -> MigrationCalls:
        return MigrationCalls(barrier=self.barrier, stream=self.stream, cleanup=self.cleanup)


def run_driver(state: Group0State, calls: FakeCalls, injections: Injections | None = None,
               until=None, timeout: float = 10.0) -> FakeGroup0:
    group0 = FakeGroup0(state, term=TERM)
    group0.remove_member = lambda raft_addr, timeout=10.0: None
    driver = MigrationDriver(group0=group0, leadership=lambda: (True, TERM), calls=calls.as_calls(),
                             injections=injections, retry_delay=0.05)
    driver.start()
    try:
        until = until or (lambda: not group0.read(lambda s: s.transitions))
        wait_until(until, timeout, message="the driver's migrations to end", interval=0.01)
    finally:
        driver.stop()
    return group0


def test_the_shell_drives_a_move_through_the_calls():
    state = quiet(cluster(nodes=2, shards=1))
    _, leaving, pending, migration_id = moved_tablet(state)
    calls = FakeCalls()
    group0 = run_driver(state, calls)
    assert group0.read(lambda s: s.migration_results[migration_id]) == m.MigrationResult(m.DONE)
    kinds = [c[0] for c in calls.calls]
    assert kinds == ["barrier", "barrier", "stream", "barrier", "barrier", "cleanup"]
    assert ("stream", pending.node, leaving.node, TERM) in calls.calls
    assert ("cleanup", leaving.node, TERM) in calls.calls


def test_the_shell_rolls_back_a_failed_stream_and_pauses_at_the_pause_point():
    state = quiet(cluster(nodes=2, shards=1))
    _, _, pending, migration_id = moved_tablet(state)
    injections = Injections()
    injections.enable("pause_tablet_migration_stage", "pause")
    calls = FakeCalls(stream_error=Unavailable("injected failure at 'stream_tablet_fail'"))
    release = threading.Timer(0.3, lambda: injections.disable("pause_tablet_migration_stage"))
    release.start()
    group0 = run_driver(state, calls, injections)
    release.join()
    assert injections.points()["pause_tablet_migration_stage"].hits >= 1
    result = group0.read(lambda s: s.migration_results[migration_id])
    assert result.outcome == m.REVERTED and "stream" in result.reason
    assert [c[0] for c in calls.calls][-2:] == ["barrier", "cleanup"] and calls.calls[-1][1] == pending.node


def test_without_an_id_source_ids_are_derived_from_the_node_and_the_term():
    def first_start_id(term: int) -> str:
        state = quiet(cluster(nodes=2, shards=1))
        make_table(state, rf=1, tablets=1)
        alter_rf(state, 2)
        loop = MigrationLoop(node_id="n1", down_after=5.0)
        out = loop.handle(state, Tick(0.0), LeadershipChanged(True, term))
        [propose] = [i for i in out if isinstance(i, Propose)]
        assert loop.proposal_done(propose, None) == ProposalDone(propose.epoch, propose.command)
        return propose.command.migration_id

    assert first_start_id(4) == first_start_id(4) != first_start_id(5)
    assert len(first_start_id(4)) == 32
