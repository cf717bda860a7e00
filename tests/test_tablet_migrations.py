"""Unit and property tests of the pure tablet migration core: stages, routing, and build tasks that follow."""
from __future__ import annotations

import pickle
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import migrations as m
from coordinator.core.migration_loop import stage_actions
from coordinator.core.commands import (
    AdvanceTabletMigration,
    FinishViewBuildingTasks,
    StartTabletMigration,
    decode,
    encode,
)
from coordinator.core.schema import BUILD_STARTED, BUILD_SUCCESS, Replica
from coordinator.core.state import Group0State
from tests.test_core_state import cluster, make_table, make_view


def start(state: Group0State, table_id: str, tablet: int, leaving: Replica, pending: Replica,
          migration_id: str | None = None):
    return state.apply(StartTabletMigration(
        cmd_id=uuid.uuid4().hex, migration_id=migration_id or uuid.uuid4().hex, table_id=table_id, tablet_id=tablet,
        leaving_node=leaving.node, leaving_shard=leaving.shard, pending_node=pending.node, pending_shard=pending.shard))


def advance(state: Group0State, transition: m.TabletTransition, to_stage: str, term: int = 1, reason: str = ""):
    return state.apply(AdvanceTabletMigration(
        cmd_id=uuid.uuid4().hex, term=term, migration_id=transition.migration_id, table_id=transition.table_id,
        tablet_id=transition.tablet_id, from_stage=transition.stage, to_stage=to_stage, reason=reason))


def run_to(state: Group0State, table_id: str, tablet: int, stage: str, term: int = 1) -> None:
    """Advance the tablet's migration along the forward path until it reaches `stage`."""
    while (transition := m.transition_of(state, table_id, tablet)) is not None and transition.stage != stage:
        assert advance(state, transition, m.NEXT_STAGE[transition.stage], term).ok


def two_node_table(tablets: int = 2):
    state = cluster(nodes=2, shards=2)
    table_id = make_table(state, rf=1, tablets=tablets)
    return state, table_id


def other_node(state: Group0State, replica: Replica) -> Replica:
    return Replica(next(n for n in sorted(state.nodes) if n != replica.node), 0)


def test_the_forward_stages_move_the_replica_and_switch_reads_then_writes():
    state, table_id = two_node_table()
    leaving = state.tablets[table_id].replicas[0][0]
    pending = other_node(state, leaving)
    version = state.schema_version
    assert start(state, table_id, 0, leaving, pending).ok
    assert state.schema_version == version + 1
    seen = []
    while (transition := m.transition_of(state, table_id, 0)) is not None:
        seen.append((transition.stage, m.write_replicas(state, table_id, 0), m.read_replicas(state, table_id, 0)))
        assert advance(state, transition, m.NEXT_STAGE[transition.stage]).ok
    both, old, new = (leaving, pending), (leaving,), (pending,)
    assert seen == [("allow_write_both_read_old", both, old), ("write_both_read_old", both, old),
                    ("streaming", both, old), ("write_both_read_new", both, new), ("use_new", new, new),
                    ("cleanup", new, new)]
    assert state.tablets[table_id].replicas[0] == (pending,)
    assert list(state.migration_results.values()) == [m.MigrationResult(m.DONE)]


def test_a_rollback_keeps_the_map_and_writes_go_back_to_the_old_replica():
    state, table_id = two_node_table()
    leaving = state.tablets[table_id].replicas[1][0]
    pending = other_node(state, leaving)
    assert start(state, table_id, 1, leaving, pending).ok
    run_to(state, table_id, 1, "streaming")
    transition = m.transition_of(state, table_id, 1)
    assert advance(state, transition, "cleanup_target", reason="stream failed: injected").ok
    assert m.write_replicas(state, table_id, 1) == (leaving,) and m.read_replicas(state, table_id, 1) == (leaving,)
    assert m.position_of(state, table_id, 1, pending.node) is None
    assert advance(state, m.transition_of(state, table_id, 1), "revert_migration").ok
    assert state.tablets[table_id].replicas[1] == (leaving,) and not state.transitions
    assert list(state.migration_results.values()) == [m.MigrationResult(m.REVERTED, "stream failed: injected")]


def test_a_rollback_is_possible_while_writes_reach_the_leaving_replica_and_not_after():
    state, table_id = two_node_table()
    leaving = state.tablets[table_id].replicas[0][0]
    assert start(state, table_id, 0, leaving, other_node(state, leaving)).ok
    run_to(state, table_id, 0, "write_both_read_new")  # reads switched, writes still reach both
    assert m.can_roll_back(m.transition_of(state, table_id, 0))
    run_to(state, table_id, 0, "use_new")
    refused = advance(state, m.transition_of(state, table_id, 0), "cleanup_target")
    assert refused.error_code == "INVALID_ARGUMENT" and "cannot go from use_new" in refused.error_message


def test_stage_changes_are_compare_and_set_and_fenced_by_term():
    state, table_id = two_node_table()
    leaving = state.tablets[table_id].replicas[0][0]
    assert start(state, table_id, 0, leaving, other_node(state, leaving)).ok
    first = m.transition_of(state, table_id, 0)
    assert advance(state, first, "write_both_read_old", term=5).ok
    again = advance(state, first, "write_both_read_old", term=5)
    assert again.error_code == "FAILED_PRECONDITION" and "is at stage write_both_read_old" in again.error_message
    stale = advance(state, m.transition_of(state, table_id, 0), "streaming", term=4)
    assert stale.error_code == "FAILED_PRECONDITION" and stale.error_kind == "StaleTerm"
    skip = advance(state, m.transition_of(state, table_id, 0), "use_new", term=5)
    assert skip.error_code == "INVALID_ARGUMENT"


def test_the_pending_replica_takes_the_leaving_position_and_stays_quiet_until_reads_switch():
    state = cluster(nodes=4, shards=1)
    table_id = make_table(state, rf=3, tablets=1)
    replicas = state.tablets[table_id].replicas[0]
    spare = next(n for n in state.nodes if n not in {r.node for r in replicas})
    assert start(state, table_id, 0, replicas[1], Replica(spare, 0)).ok
    assert m.position_of(state, table_id, 0, spare) == 1
    assert not m.makes_view_updates(state, table_id, 0, spare)
    assert m.makes_view_updates(state, table_id, 0, replicas[1].node)
    run_to(state, table_id, 0, "write_both_read_new")
    assert m.makes_view_updates(state, table_id, 0, spare)
    assert m.position_targets(replicas[1], m.transition_of(state, table_id, 0)) == (replicas[1], Replica(spare, 0))


BAD_MOVES = [
    (lambda s, t, r: (t, 5, r, other_node(s, r)), "INVALID_ARGUMENT", "has tablets 0..1, not 5"),
    (lambda s, t, r: (t, 0, Replica("n9", 0), r), "INVALID_ARGUMENT", "is not a replica of tablet 0"),
    (lambda s, t, r: (t, 0, r, Replica("n9", 0)), "INVALID_ARGUMENT", "unknown node 'n9'"),
    (lambda s, t, r: (t, 0, r, Replica(other_node(s, r).node, 7)), "INVALID_ARGUMENT", "has shards 0..1, not 7"),
    (lambda s, t, r: (t, 0, r, r), "INVALID_ARGUMENT", "already holds tablet 0"),
    (lambda s, t, r: ("f" * 32, 0, r, other_node(s, r)), "NOT_FOUND", "does not exist"),
]


@pytest.mark.parametrize("move, code, message", BAD_MOVES)
def test_bad_moves_are_refused_and_change_nothing(move, code, message):
    state, table_id = two_node_table()
    leaving = state.tablets[table_id].replicas[0][0]
    before = pickle.dumps((state.tablets, state.tasks, state.transitions, state.schema_version))
    outcome = start(state, *move(state, table_id, leaving))
    assert outcome.error_code == code and message in outcome.error_message
    assert pickle.dumps((state.tablets, state.tasks, state.transitions, state.schema_version)) == before


def test_one_transition_per_tablet():
    state, table_id = two_node_table()
    leaving = state.tablets[table_id].replicas[0][0]
    assert start(state, table_id, 0, leaving, other_node(state, leaving)).ok
    busy = start(state, table_id, 0, leaving, Replica(leaving.node, 1))
    assert busy.error_code == "FAILED_PRECONDITION" and "is in transition" in busy.error_message


def test_a_move_between_shards_of_one_node_moves_no_rows():
    state, table_id = two_node_table()
    leaving = state.tablets[table_id].replicas[0][0]
    assert start(state, table_id, 0, leaving, Replica(leaving.node, 1 - leaving.shard)).ok
    assert not m.transition_of(state, table_id, 0).moves_data


# ------------------------------------------------------------------ build tasks follow


def tasks_on(state: Group0State, table_id: str, tablet: int) -> list:
    return sorted((t.replica, t.aborted) for t in state.tasks.values() if t.base_id == table_id and t.tablet_id == tablet)


def test_tasks_of_the_leaving_replica_are_aborted_then_recreated_on_the_destination():
    state, table_id = two_node_table()
    view_id = make_view(state)
    leaving = state.tablets[table_id].replicas[0][0]
    pending = other_node(state, leaving)
    old_ids = {t.id for t in state.tasks.values() if t.tablet_id == 0}
    assert start(state, table_id, 0, leaving, pending).ok
    assert tasks_on(state, table_id, 0) == [(leaving, True)]
    assert state.view_progress(view_id)["tasks_done"] == 0  # an aborted task is not done
    run_to(state, table_id, 0, "end_migration")
    assert tasks_on(state, table_id, 0) == [(pending, False)]
    assert not old_ids & {t.id for t in state.tasks.values()}
    assert state.build_status[(view_id, pending.node)] == BUILD_STARTED
    assert state.view_progress(view_id)["tasks_total"] == 2


def test_rollback_recreates_tasks_on_the_source_with_new_ids():
    state, table_id = two_node_table()
    make_view(state)
    leaving = state.tablets[table_id].replicas[0][0]
    old_ids = {t.id for t in state.tasks.values() if t.tablet_id == 0}
    assert start(state, table_id, 0, leaving, other_node(state, leaving)).ok
    assert advance(state, m.transition_of(state, table_id, 0), "cleanup_target", reason="no").ok
    assert advance(state, m.transition_of(state, table_id, 0), "revert_migration").ok
    assert tasks_on(state, table_id, 0) == [(leaving, False)]
    assert not old_ids & {t.id for t in state.tasks.values()}


def test_a_view_created_during_a_migration_gets_an_aborted_task_on_the_leaving_replica():
    state, table_id = two_node_table()
    leaving = state.tablets[table_id].replicas[0][0]
    pending = other_node(state, leaving)
    assert start(state, table_id, 0, leaving, pending).ok
    view_id = make_view(state)
    assert tasks_on(state, table_id, 0) == [(leaving, True)]
    run_to(state, table_id, 0, "end_migration")
    assert tasks_on(state, table_id, 0) == [(pending, False)]
    assert not state.view_is_built(view_id)


def test_a_built_replica_needs_no_task_and_its_status_follows_the_holders():
    state, table_id = two_node_table(tablets=1)
    view_id = make_view(state)
    assert state.apply(FinishViewBuildingTasks(cmd_id=None, term=1, task_ids=tuple(state.tasks))).ok
    assert state.view_is_built(view_id)
    leaving = state.tablets[table_id].replicas[0][0]
    pending = other_node(state, leaving)
    assert start(state, table_id, 0, leaving, pending).ok
    run_to(state, table_id, 0, "end_migration")
    assert not state.tasks and state.view_is_built(view_id)
    assert (view_id, leaving.node) not in state.build_status or state.build_status[(view_id, leaving.node)] == BUILD_SUCCESS


def test_dropping_the_table_ends_its_migrations():
    state, table_id = two_node_table()
    leaving = state.tablets[table_id].replicas[0][0]
    assert start(state, table_id, 0, leaving, other_node(state, leaving)).ok
    assert state.apply({"op": "drop_table", "cmd_id": None, "keyspace": "ks", "name": "t"}).ok
    assert not state.transitions
    assert list(state.migration_results.values())[0].outcome == m.REVERTED


def test_migration_commands_round_trip_through_the_journal():
    command = StartTabletMigration(cmd_id="x", migration_id="a" * 32, table_id="b" * 32, tablet_id=3,
                                   leaving_node="n1", leaving_shard=0, pending_node="n2", pending_shard=1)
    assert decode(encode(command)) == command
    step = AdvanceTabletMigration(cmd_id=None, term=2, migration_id="a" * 32, table_id="b" * 32, tablet_id=3,
                                  from_stage="streaming", to_stage="cleanup_target", reason="why")
    assert decode(encode(step)) == step


def test_a_snapshot_from_before_migrations_restores_with_none_in_progress():
    state, _ = two_node_table()
    saved = dict(state.__dict__)
    for name in ("transitions", "migration_results", "_migration_term"):
        saved.pop(name)
    restored = Group0State.__new__(Group0State)
    restored.__setstate__(saved)
    assert restored.transitions == {} and restored._migration_term == 0


# ------------------------------------------------------------------ property: any path, tasks and maps stay sound


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.booleans(), st.integers(0, 6)), max_size=25))
def test_any_sequence_of_moves_keeps_one_live_task_per_unbuilt_replica(steps):
    """Whatever moves start, advance or roll back: every tablet keeps rf distinct nodes, each replica of the map
    holds exactly one live task per unbuilt view while no migration runs, and no aborted task outlives its
    migration."""
    state = cluster(nodes=4, shards=2)
    table_id = make_table(state, rf=2, tablets=4)
    view_id = make_view(state)
    for tablet, target, roll_back, advances in steps:
        transition = m.transition_of(state, table_id, tablet)
        if transition is None:
            leaving = state.tablets[table_id].replicas[tablet][target % 2]
            start(state, table_id, tablet, leaving, Replica(f"n{target + 1}", tablet % 2))
            continue
        for _ in range(advances):
            transition = m.transition_of(state, table_id, tablet)
            if transition is None:
                break
            wanted = "cleanup_target" if roll_back and transition.stage in m.CAN_ROLL_BACK else \
                m.NEXT_STAGE[transition.stage]
            assert advance(state, transition, wanted).ok
        for replicas in state.tablets[table_id].replicas:
            assert len({r.node for r in replicas}) == 2
    for tablet in range(4):
        run_to(state, table_id, tablet, "end_migration")
    assert not state.transitions
    assert not any(t.aborted for t in state.tasks.values())
    expected = sorted((r, tablet) for tablet, replicas in enumerate(state.tablets[table_id].replicas)
                      for r in replicas)
    assert sorted((t.replica, t.tablet_id) for t in state.tasks.values() if t.view_id == view_id) == expected
    holders = {r.node for replicas in state.tablets[table_id].replicas for r in replicas}
    assert {node for (v, node) in state.build_status if v == view_id} <= holders
    assert all(state.build_status[(view_id, r.node)] == BUILD_STARTED for r, _ in expected)
    assert BUILD_SUCCESS not in {s for (v, _), s in state.build_status.items() if v == view_id}


# ------------------------------------------------------------------ split and merge

from coordinator.core import resize  # noqa: E402
from coordinator.core.commands import MergeTablets, RequestTabletMerge, SplitTablets  # noqa: E402


def split(state: Group0State, table_id: str):
    return state.apply(SplitTablets(cmd_id=None, table_id=table_id, id_seed=uuid.uuid4().hex))


def merge(state: Group0State, table_id: str, term: int = 1):
    return state.apply(MergeTablets(cmd_id=None, term=term, table_id=table_id, id_seed=uuid.uuid4().hex))


def request_merge(state: Group0State, table_id: str):
    return state.apply(RequestTabletMerge(cmd_id=None, table_id=table_id))


def co_locate(state: Group0State, table_id: str) -> int:
    """Run the driver's merge moves to their end, as the leader would; the number of migrations."""
    count = 0
    while moves := resize.merge_moves(state, table_id):
        busy = {t for (table, t) in state.transitions if table == table_id}
        for tablet, leaving, pending in moves:
            if tablet not in busy:
                assert start(state, table_id, tablet, leaving, pending).ok, (tablet, leaving, pending)
                busy.add(tablet)
                count += 1
        for tablet in busy:
            run_to(state, table_id, tablet, "end_migration")
    return count


def test_a_split_doubles_the_tablets_on_the_same_replicas_and_splits_the_tasks():
    state = cluster(nodes=3, shards=2)
    table_id = make_table(state, rf=2, tablets=2)
    view_id = make_view(state)
    before = state.tablets[table_id].replicas
    progress = state.view_progress(view_id)
    assert split(state, table_id).value == 4
    assert state.tablets[table_id].replicas == (before[0], before[0], before[1], before[1])
    assert sorted((t.tablet_id, t.replica) for t in state.tasks.values()) == sorted(
        (tablet, r) for tablet in range(4) for r in before[tablet // 2])
    assert state.view_progress(view_id)["tasks_done"] == progress["tasks_done"]
    assert state.tablets[view_id].tablet_count == 2  # views keep their own maps


def test_a_merge_waits_for_co_located_pairs_then_maps_tasks_to_the_merged_tablet():
    state = cluster(nodes=4, shards=2)
    table_id = make_table(state, rf=2, tablets=4)
    view_id = make_view(state)
    assert request_merge(state, table_id).ok
    refused = merge(state, table_id)
    if resize.merge_moves(state, table_id):
        assert refused.error_code == "FAILED_PRECONDITION" and "do not share their replicas" in refused.error_message
    co_locate(state, table_id)
    replicas = state.tablets[table_id].replicas
    assert all(set(replicas[2 * n]) == set(replicas[2 * n + 1]) for n in range(2))
    total = state.view_progress(view_id)["tasks_total"]
    assert merge(state, table_id, term=2).value == 2
    assert state.tablets[table_id].replicas == replicas[::2]
    assert sorted((t.tablet_id, t.replica) for t in state.tasks.values()) == sorted(
        (n, r) for n in range(2) for r in replicas[2 * n])
    assert state.view_progress(view_id)["tasks_total"] == total - 4 and state.view_progress(view_id)["tasks_done"] == 0
    assert not state.merge_requests


def test_split_and_merge_refusals_change_nothing():
    state = cluster(nodes=2, shards=1)
    table_id = make_table(state, rf=1, tablets=1)
    one = request_merge(state, table_id)
    assert one.error_code == "INVALID_ARGUMENT" and "one tablet" in one.error_message
    assert merge(state, table_id).error_code == "FAILED_PRECONDITION"
    assert split(state, table_id).ok
    leaving = state.tablets[table_id].replicas[0][0]
    assert start(state, table_id, 0, leaving, other_node(state, leaving)).ok
    before = pickle.dumps((state.tablets, state.tasks, state.schema_version))
    busy = split(state, table_id)
    assert busy.error_code == "FAILED_PRECONDITION" and "while tablet(s) 0 move" in busy.error_message
    assert pickle.dumps((state.tablets, state.tasks, state.schema_version)) == before


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(2, 5), st.integers(1, 2), st.integers(0, 2**32))
def test_any_layout_co_locates_and_merges(rf, nodes, shards, seed):
    """Whatever the placement, the merge moves make every pair share its replicas, and the merge keeps one live
    task per (view, replica) of each merged tablet."""
    import random
    if rf > nodes:
        return
    state = cluster(nodes=nodes, shards=shards)
    table_id = make_table(state, rf=rf, tablets=8)
    rng = random.Random(seed)
    for tablet in range(8):  # scatter the replicas first
        replicas = state.tablets[table_id].replicas[tablet]
        free = [n for n in sorted(state.nodes) if n not in {r.node for r in replicas}]
        if free and rng.random() < 0.5:
            assert start(state, table_id, tablet, rng.choice(replicas), Replica(rng.choice(free), 0)).ok
            run_to(state, table_id, tablet, "end_migration")
    make_view(state)
    assert request_merge(state, table_id).ok
    co_locate(state, table_id)
    assert merge(state, table_id).ok
    replicas = state.tablets[table_id].replicas
    assert len(replicas) == 4 and all(len({r.node for r in rs}) == rf for rs in replicas)
    assert sorted((t.tablet_id, t.replica) for t in state.tasks.values()) == sorted(
        (n, r) for n in range(4) for r in replicas[n])


# ------------------------------------------------------------------ replication factor changes

from coordinator.core.commands import AlterKeyspace  # noqa: E402


def alter_rf(state: Group0State, rf: int):
    return state.apply(AlterKeyspace(cmd_id=None, name="ks", rf=rf, id_seed=uuid.uuid4().hex))


def reconcile(state: Group0State) -> int:
    """Start and finish the driver's replication moves until none is left; how many ran."""
    ran = 0
    while planned := m.replication_moves(state, limit=100):
        for move in planned:
            outcome = state.apply(StartTabletMigration(
                cmd_id=None, migration_id=uuid.uuid4().hex, table_id=move.table_id, tablet_id=move.tablet_id,
                leaving_node=move.leaving.node, leaving_shard=move.leaving.shard, pending_node=move.pending.node,
                pending_shard=move.pending.shard, kind=move.kind))
            assert outcome.ok, outcome
            run_to(state, move.table_id, move.tablet_id, "end_migration")
            ran += 1
    return ran


def test_paired_positions_cover_every_view_replica_whatever_the_two_counts():
    assert m.paired_positions(0, 2, 2) == (0,) and m.paired_positions(1, 2, 2) == (1,)
    assert m.paired_positions(0, 2, 3) == (0, 2) and m.paired_positions(1, 2, 3) == (1,)
    assert m.paired_positions(2, 3, 2) == ()  # a base replica the view has no partner for feeds nothing
    for base in range(1, 5):
        for view in range(1, 5):
            fed = [p for pair in range(base) for p in m.paired_positions(pair, base, view)]
            assert sorted(fed) == list(range(view)), (base, view)


def test_an_rf_increase_adds_a_streamed_replica_per_tablet_that_builds_the_unbuilt_views():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=1, tablets=2)
    view_id = make_view(state)
    assert alter_rf(state, 3).ok
    planned = m.replication_moves(state, limit=100)
    assert {(p.kind, p.table_id) for p in planned} == {("add", table_id), ("add", view_id)}
    assert reconcile(state) == 8  # 2 tables x 2 tablets x 2 replicas, one at a time per tablet
    assert all(len(rs) == 3 and len({r.node for r in rs}) == 3 for t in (table_id, view_id)
               for rs in state.tablets[t].replicas)
    assert sorted((t.tablet_id, t.replica) for t in state.tasks.values()) == sorted(
        (tablet, r) for tablet, rs in enumerate(state.tablets[table_id].replicas) for r in rs)


def test_an_added_replica_gets_the_writes_of_its_source_and_no_reads_before_it_is_done():
    state = cluster(nodes=2, shards=1)
    table_id = make_table(state, rf=1, tablets=1)
    source = state.tablets[table_id].replicas[0][0]
    assert alter_rf(state, 2).ok
    [move] = m.replication_moves(state, limit=10)
    assert state.apply(StartTabletMigration(cmd_id=None, migration_id=uuid.uuid4().hex, table_id=table_id,
                                            tablet_id=0, leaving_node=source.node, leaving_shard=source.shard,
                                            pending_node=move.pending.node, pending_shard=move.pending.shard,
                                            kind="add")).ok
    assert m.write_replicas(state, table_id, 0) == (source, move.pending)
    assert m.read_replicas(state, table_id, 0) == (source,)
    assert m.position_of(state, table_id, 0, move.pending.node) == 1
    assert not m.makes_view_updates(state, table_id, 0, move.pending.node)
    run_to(state, table_id, 0, "cleanup")
    assert stage_actions(m.transition_of(state, table_id, 0), lambda node: False) == ("pause",)  # source stays
    run_to(state, table_id, 0, "end_migration")
    assert state.tablets[table_id].replicas[0] == (source, move.pending)


def test_an_rf_decrease_removes_the_last_replica_its_tasks_and_statuses():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=3, tablets=2)
    view_id = make_view(state)
    last = {tablet: rs[-1] for tablet, rs in enumerate(state.tablets[table_id].replicas)}
    assert alter_rf(state, 2).ok
    [first, *_] = m.replication_moves(state, limit=10)
    assert first.kind == "remove"
    assert reconcile(state) == 4
    for tablet, rs in enumerate(state.tablets[table_id].replicas):
        assert len(rs) == 2 and last[tablet] not in rs
    assert not any(t.replica == last[t.tablet_id] for t in state.tasks.values())
    assert state.view_progress(view_id)["tasks_total"] == 4


def test_a_replica_being_removed_loses_reads_at_once_writes_a_stage_later_and_is_cleaned_up():
    state = cluster(nodes=2, shards=1)
    table_id = make_table(state, rf=2, tablets=1)
    replicas = state.tablets[table_id].replicas[0]
    assert alter_rf(state, 1).ok
    [move] = m.replication_moves(state, limit=10)
    assert state.apply(StartTabletMigration(cmd_id=None, migration_id=uuid.uuid4().hex, table_id=table_id,
                                            tablet_id=0, leaving_node=move.leaving.node,
                                            leaving_shard=move.leaving.shard, pending_node=move.leaving.node,
                                            pending_shard=move.leaving.shard, kind="remove")).ok
    transition = m.transition_of(state, table_id, 0)
    assert transition.stage == "write_both_read_new" and m.write_replicas(state, table_id, 0) == replicas
    assert m.read_replicas(state, table_id, 0) == replicas[:1]
    assert not m.makes_view_updates(state, table_id, 0, replicas[1].node)  # position 0 feeds its view position
    run_to(state, table_id, 0, "use_new")
    assert m.write_replicas(state, table_id, 0) == replicas[:1] == m.read_replicas(state, table_id, 0)
    run_to(state, table_id, 0, "cleanup")
    assert stage_actions(m.transition_of(state, table_id, 0), lambda node: False)[-1] == "cleanup_leaving"
    wrong = state.apply(StartTabletMigration(cmd_id=None, migration_id=uuid.uuid4().hex, table_id=table_id,
                                             tablet_id=0, leaving_node=replicas[0].node,
                                             leaving_shard=replicas[0].shard, pending_node=replicas[0].node,
                                             pending_shard=replicas[0].shard, kind="remove"))
    assert wrong.error_code == "FAILED_PRECONDITION"  # busy


# ------------------------------------------------------------------ the balancer

from coordinator.core import balancer  # noqa: E402
from coordinator.core.commands import RegisterNode, SetBalancer  # noqa: E402


def balance(state: Group0State) -> int:
    """Run the balancer's moves to their end until it has none; how many ran."""
    ran = 0
    while planned := balancer.balance_moves(state, limit=4):
        for move in planned:
            assert start(state, move.table_id, move.tablet_id, move.leaving, move.pending).ok, move
            ran += 1
        for move in planned:
            run_to(state, move.table_id, move.tablet_id, "end_migration")
        assert ran < 1000, "the balancer does not converge"
    return ran


def counts(state: Group0State) -> list[int]:
    return sorted(balancer.imbalance(state).values())


def test_the_balancer_spreads_replicas_over_new_nodes_within_one():
    state = cluster(nodes=3, shards=2)
    make_table(state, rf=1, tablets=64)
    make_view(state)
    for node in ("n4", "n5"):
        assert state.apply(RegisterNode(cmd_id=None, node_id=node, grpc="g", raft="r", shards=2)).ok
    assert counts(state)[0] == 0
    assert balance(state) > 0
    assert counts(state)[-1] - counts(state)[0] <= 1
    assert sum(counts(state)) == 128 and not any(t.aborted for t in state.tasks.values())
    _, per_shard = m.replica_loads(state.tablets.values())
    for node in state.nodes:
        assert abs(per_shard[Replica(node, 0)] - per_shard[Replica(node, 1)]) <= 1


def test_the_balancer_does_nothing_when_off_or_while_tablets_move():
    state = cluster(nodes=2, shards=1)
    table_id = make_table(state, rf=1, tablets=4)
    assert state.apply(RegisterNode(cmd_id=None, node_id="n3", grpc="g", raft="r", shards=1)).ok
    assert state.apply(SetBalancer(cmd_id=None, enabled=False)).ok
    assert balancer.balance_moves(state, 4) == []
    assert state.apply(SetBalancer(cmd_id=None, enabled=True)).ok
    assert balancer.balance_moves(state, 4)
    leaving = state.tablets[table_id].replicas[0][0]
    assert start(state, table_id, 0, leaving, Replica("n3", 0)).ok
    assert balancer.balance_moves(state, 4) == []


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5), st.integers(1, 3), st.integers(1, 3), st.integers(0, 3))
def test_any_cluster_the_balancer_converges_to_even(nodes, rf, shards, added):
    if rf > nodes:
        return
    state = cluster(nodes=nodes, shards=shards)
    make_table(state, rf=rf, tablets=16)
    for index in range(added):
        assert state.apply(RegisterNode(cmd_id=None, node_id=f"m{index}", grpc="g", raft="r", shards=shards)).ok
    balance(state)
    assert counts(state)[-1] - counts(state)[0] <= 1
    for replicas in state.tablets[next(iter(state.tablets))].replicas:
        assert len({r.node for r in replicas}) == rf


# ------------------------------------------------------------------ nodes leaving

from coordinator.core.commands import DecommissionNode, RemoveNode  # noqa: E402


def drain(state: Group0State) -> int:
    ran = 0
    while planned := m.drain_moves(state, limit=100):
        for move in planned:
            source = move.source
            assert state.apply(StartTabletMigration(
                cmd_id=None, migration_id=uuid.uuid4().hex, table_id=move.table_id, tablet_id=move.tablet_id,
                leaving_node=move.leaving.node, leaving_shard=move.leaving.shard, pending_node=move.pending.node,
                pending_shard=move.pending.shard, source_node=source.node if source else "",
                source_shard=source.shard if source else 0)).ok, move
            run_to(state, move.table_id, move.tablet_id, "end_migration")
            ran += 1
    return ran


def test_a_decommissioned_node_is_drained_then_removed_and_cannot_come_back():
    state = cluster(nodes=4, shards=1)
    table_id = make_table(state, rf=3, tablets=4)
    view_id = make_view(state)
    assert state.apply(DecommissionNode(cmd_id=None, node_id="n1")).value == "leaving"
    assert "n1" not in {r.node for r in m.choose_replicas(state.nodes, 3, frozenset(), *m.replica_loads([]))}
    assert m.removable_nodes(state) == []
    early = state.apply(RemoveNode(cmd_id=None, term=1, node_id="n1"))
    assert early.error_code == "FAILED_PRECONDITION" and "still holds" in early.error_message
    drain(state)
    assert not any(r.node == "n1" for m_ in state.tablets.values() for rs in m_.replicas for r in rs)
    assert m.removable_nodes(state) == ["n1"]
    assert state.apply(RemoveNode(cmd_id=None, term=1, node_id="n1")).ok
    assert "n1" not in state.nodes and "n1" in state.removed_nodes
    assert not any(node == "n1" for (_, node) in state.build_status)
    again = state.apply(RegisterNode(cmd_id=None, node_id="n1", grpc="g", raft="r", shards=1))
    assert again.error_code == "FAILED_PRECONDITION" and "was removed from the cluster" in again.error_message
    assert len(list(state.tasks_of_view(view_id))) == 12 and table_id in state.tablets


def test_a_dead_node_is_rebuilt_from_the_surviving_replicas():
    state = cluster(nodes=3, shards=1)
    table_id = make_table(state, rf=2, tablets=2)
    assert state.apply(DecommissionNode(cmd_id=None, node_id="n2", dead=True)).value == "removing"
    assert "n2" not in m.barrier_nodes(state)
    for move in m.drain_moves(state, limit=10):
        assert move.source is not None and move.source.node != "n2"
    drain(state)
    assert all(len(rs) == 2 and "n2" not in {r.node for r in rs} for rs in state.tablets[table_id].replicas)


def test_a_dead_base_replica_rebuilt_gives_every_replica_of_its_tablets_a_repair_of_every_view():
    """What the dead replica never delivered may have been for any view position: base position 0 also feeds the
    positions a smaller base tablet lacks (an RF increase under way), and removals shift positions."""
    state = cluster(nodes=4, shards=1)
    table_id = make_table(state, rf=3, tablets=2)
    view_id = make_view(state)
    finished = tuple(t.id for t in state.tasks_of_view(view_id))
    assert state.apply(FinishViewBuildingTasks(cmd_id=None, term=1, task_ids=finished)).ok
    assert state.view_is_built(view_id)
    lost = [tablet for tablet, rs in enumerate(state.tablets[table_id].replicas) if "n1" in {r.node for r in rs}]
    assert state.apply(DecommissionNode(cmd_id=None, node_id="n1", dead=True)).ok
    drain(state)
    repairs = {(t.tablet_id, t.replica) for t in state.tasks_of_view(view_id) if t.repair}
    assert lost and repairs == {(tablet, r) for tablet in lost for r in state.tablets[table_id].replicas[tablet]}
    assert not state.view_is_built(view_id)


def test_leaving_is_refused_when_the_rest_cannot_hold_every_rf():
    state = cluster(nodes=3, shards=1)
    make_table(state, rf=3, tablets=1)
    refused = state.apply(DecommissionNode(cmd_id=None, node_id="n1"))
    assert refused.error_code == "FAILED_PRECONDITION" and "rf 3" in refused.error_message
    lonely = cluster(nodes=1, shards=1)
    last = lonely.apply(DecommissionNode(cmd_id=None, node_id="n1"))
    assert last.error_code == "FAILED_PRECONDITION" and "last node" in last.error_message
    unknown = state.apply(DecommissionNode(cmd_id=None, node_id="n9"))
    assert unknown.error_code == "INVALID_ARGUMENT"
