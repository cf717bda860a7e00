"""The coverage rule through merges and RF changes: every view replica keeps a feeder and a build task that gives it
the existing rows (pure core; group0's invariants are checked after every command by the conftest fixture)."""
from __future__ import annotations

import uuid

import pytest

from coordinator.core import migrations as m
from coordinator.core import planner, resize
from coordinator.core.commands import FinishViewBuildingTasks, StartTabletMigration
from coordinator.core.schema import Replica
from coordinator.core.state import Group0State
from coordinator.core.errors import Unavailable
from tests.test_core_state import cluster, make_table, make_view
from tests.test_tablet_migrations import alter_rf, co_locate, merge, request_merge, run_to
from worker.build_job import build_plan, routed_now


def finish(state: Group0State, tasks) -> None:
    assert state.apply(FinishViewBuildingTasks(cmd_id=None, term=1, task_ids=tuple(t.id for t in tasks))).ok


def start_kind(state: Group0State, table_id: str, tablet: int, kind: str, leaving: Replica, pending: Replica):
    outcome = state.apply(StartTabletMigration(
        cmd_id=None, migration_id=uuid.uuid4().hex, table_id=table_id, tablet_id=tablet, leaving_node=leaving.node,
        leaving_shard=leaving.shard, pending_node=pending.node, pending_shard=pending.shard, kind=kind))
    assert outcome.ok, outcome


def positions_with_tasks(state: Group0State, table_id: str, tablet: int) -> set[int]:
    return {m.position_of(state, table_id, tablet, t.replica.node) for t in state.tasks.values()
            if t.base_id == table_id and t.tablet_id == tablet}


def add_replica(state: Group0State, table_id: str, tablet: int) -> None:
    [move] = [p for p in m.replication_moves(state, limit=100) if (p.table_id, p.tablet_id) == (table_id, tablet)]
    start_kind(state, table_id, tablet, move.kind, move.leaving, move.pending)
    run_to(state, table_id, tablet, "end_migration")


def test_a_merge_keeps_the_tasks_by_position_when_the_odd_half_holds_the_same_replicas_in_another_order():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=2, tablets=2)
    view_id = make_view(state)
    assert request_merge(state, table_id).ok
    co_locate(state, table_id)
    even, odd = state.tablets[table_id].replicas
    assert set(even) == set(odd) and even != odd  # the sets agree, the pairing positions do not
    by_node = {r.node for r in even}
    done = [t for t in state.tasks.values() if t.replica == even[1] and t.view_id == view_id]
    finish(state, done)  # position 1 of the even half, position 0 of the odd one
    assert {(t.tablet_id, m.position_of(state, table_id, t.tablet_id, t.replica.node))
            for t in state.tasks.values()} == {(0, 0), (1, 1)}
    assert merge(state, table_id).ok
    assert positions_with_tasks(state, table_id, 0) == {0, 1}  # the odd half's rows still owed to position 1
    assert {t.replica.node for t in state.tasks.values()} == by_node
    assert not state.view_is_built(view_id)


def build_all(state: Group0State) -> None:
    while state.tasks:
        finish(state, list(state.tasks.values()))


def built_and_co_located(merged: str):
    """A base table and its view, built, on 3 nodes at RF 2, 2 tablets each; the `merged` one ("base" or "view") is
    co-located for a merge. (state, base id, view id, that table's two replica lists)."""
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=2, tablets=2)
    view_id = make_view(state)
    build_all(state)
    merging = table_id if merged == "base" else view_id
    assert request_merge(state, merging).ok
    co_locate(state, merging)
    even, odd = state.tablets[merging].replicas
    return state, table_id, view_id, even, odd


def test_a_merge_that_gives_the_odd_half_other_feeders_repairs_every_built_view_there():
    """A write applied on one replica of the odd half only (refused, retried later) leaves its base replicas
    different: a view replica fed by the other one from now on would keep what its old feeder wrote."""
    state, table_id, view_id, even, odd = built_and_co_located("base")
    assert set(even) == set(odd) and even != odd
    assert state.view_is_built(view_id)
    assert merge(state, table_id).ok
    repairs = sorted((t.tablet_id, t.replica) for t in state.tasks.values() if t.repair and t.view_id == view_id)
    assert repairs == sorted((0, even[p]) for p in resize.reordered_positions(even, odd))
    assert not state.view_is_built(view_id)


def test_a_merge_that_keeps_every_position_repairs_nothing():
    state = cluster(nodes=2, shards=1)
    table_id = make_table(state, rf=2, tablets=2)
    view_id = make_view(state)
    build_all(state)
    assert request_merge(state, table_id).ok
    assert resize.pairs_keep_positions(state, table_id)
    assert merge(state, table_id).ok
    assert not state.tasks and state.view_is_built(view_id)


def test_a_view_whose_merge_gives_a_position_another_node_is_repaired_at_that_position():
    state, table_id, view_id, even, odd = built_and_co_located("view")
    positions = resize.reordered_positions(even, odd)
    assert positions
    assert merge(state, view_id).ok
    feeders = sorted((b, base[p]) for b, base in enumerate(state.tablets[table_id].replicas) for p in positions)
    assert sorted((t.tablet_id, t.replica) for t in state.tasks.values() if t.repair) == feeders
    assert not state.view_is_built(view_id)


def test_a_base_replica_added_before_the_view_grows_waits_for_its_view_replica():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=2, tablets=1)
    view_id = make_view(state)
    assert alter_rf(state, 3).ok
    add_replica(state, table_id, 0)
    added = state.tablets[table_id].replicas[0][2]
    [task] = [t for t in state.tasks.values() if t.replica == added]
    assert "still being added" in m.view_replica_missing(state, task)
    queues = planner.replica_queues(state, (table_id,))
    assert task.id not in {t.id for queue in queues.values() for t in queue[table_id]}
    add_replica(state, view_id, 0)
    [renewed] = [t for t in state.tasks.values() if t.replica == added]  # a new id: see the test below
    assert m.view_replica_missing(state, renewed) is None
    assert renewed.id in {t.id for queue in planner.replica_queues(state, (table_id,)).values()
                          for t in queue[table_id]}


def test_a_view_tablet_that_gains_a_position_renews_the_tasks_of_its_feeders_so_a_stale_batch_cannot_finish_them():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=3, tablets=2)
    assert alter_rf(state, 2).ok
    view_id = make_view(state)  # created at RF 2: its tablets have two replicas, the base tablets three
    assert len(state.tablets[view_id].replicas[0]) == 2
    assert alter_rf(state, 3).ok
    feeders = {tablet: replicas[2] for tablet, replicas in enumerate(state.tablets[table_id].replicas)}
    before = {t.id for t in state.tasks.values() if t.view_id == view_id and t.replica == feeders[t.tablet_id]}
    assert len(before) == 2
    [move] = [p for p in m.replication_moves(state, limit=10) if (p.table_id, p.tablet_id) == (view_id, 0)]
    start_kind(state, view_id, 0, "add", move.leaving, move.pending)
    renewed = {t.id for t in state.tasks.values() if t.view_id == view_id and t.replica == feeders[t.tablet_id]}
    assert len(renewed) == 2 and not renewed & before
    assert state.apply(FinishViewBuildingTasks(cmd_id=None, term=1, task_ids=tuple(before))).ok  # a stale batch's
    assert renewed <= set(state.tasks)


def test_a_batch_routed_before_an_rf_increase_is_refused_at_merge_time_while_its_view_position_is_missing():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=3, tablets=1)
    assert alter_rf(state, 1).ok
    view_id = make_view(state)
    third = state.tablets[table_id].replicas[0][2]
    [task] = [t for t in state.tasks.values() if t.replica == third and t.view_id == view_id]
    plan = build_plan(state, [task], third.node)  # position 2 of RF 1 feeds nothing, and need not
    assert alter_rf(state, 3).ok
    with pytest.raises(Unavailable, match="still being added"):
        routed_now(state, plan, third.node)


def test_a_view_created_while_a_replica_is_added_is_built_on_every_replica():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=2, tablets=1)
    assert alter_rf(state, 3).ok
    [move] = [p for p in m.replication_moves(state, limit=10) if p.table_id == table_id]
    start_kind(state, table_id, 0, "add", move.leaving, move.pending)
    view_id = make_view(state)
    assert not any(t.aborted for t in state.tasks.values())  # the source of an add stays: it builds
    run_to(state, table_id, 0, "end_migration")
    assert positions_with_tasks(state, table_id, 0) == {0, 1, 2}
    assert not state.view_is_built(view_id)


def test_a_replica_being_removed_hands_its_view_position_to_position_0():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=3, tablets=1)
    view_id = make_view(state)
    replicas = state.tablets[table_id].replicas[0]
    finish(state, [t for t in state.tasks.values() if t.replica == replicas[0]])  # position 0 done: fed view pos 0
    assert alter_rf(state, 2).ok
    start_kind(state, table_id, 0, "remove", replicas[2], replicas[2])
    transition = m.transition_of(state, table_id, 0)
    assert m.feeding_count(replicas, transition) == 2
    view_replicas = state.tablets[view_id].replicas[0]
    assert m.paired_targets(view_replicas, None, 0, 2) == (view_replicas[0], view_replicas[2])  # live updates
    assert positions_with_tasks(state, table_id, 0) == {0, 1}  # position 0 builds again, for view position 2
    run_to(state, table_id, 0, "end_migration")
    assert positions_with_tasks(state, table_id, 0) == {0, 1}
    assert not state.view_is_built(view_id)


def test_a_view_created_while_a_replica_is_removed_gets_no_task_there():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=3, tablets=1)
    replicas = state.tablets[table_id].replicas[0]
    assert alter_rf(state, 2).ok
    start_kind(state, table_id, 0, "remove", replicas[2], replicas[2])
    make_view(state)
    assert positions_with_tasks(state, table_id, 0) == {0, 1}


def test_merge_moves_compare_sets_and_the_merge_maps_positions():
    state = cluster(nodes=2, shards=1)
    table_id = make_table(state, rf=2, tablets=2)
    make_view(state)
    assert request_merge(state, table_id).ok
    assert resize.merge_moves(state, table_id) == []  # two nodes, RF 2: every pair already shares its replicas
    assert merge(state, table_id).ok
    assert positions_with_tasks(state, table_id, 0) == {0, 1}


def test_a_batch_whose_node_came_back_as_the_pending_replica_of_an_rf_increase_is_routed_from_its_new_position():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=1, tablets=1)
    view_id = make_view(state)
    [first] = state.tablets[table_id].replicas[0]
    [task] = [t for t in state.tasks.values() if t.view_id == view_id]
    plan = build_plan(state, [task], first.node)  # position 0
    other = next(Replica(n, 0) for n in sorted(state.nodes) if n != first.node)
    start_kind(state, table_id, 0, "move", first, other)
    run_to(state, table_id, 0, "end_migration")
    assert alter_rf(state, 2).ok
    start_kind(state, table_id, 0, "add", other, first)  # the batch's node returns, at position 1
    with pytest.raises(Unavailable, match=f"base replica {first} \\(position 1\\)"):
        routed_now(state, plan, first.node)
