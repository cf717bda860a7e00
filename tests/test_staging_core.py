"""Staged bulk loads in group0: process_staging tasks, their batches, and the fence against tablet operations."""
from __future__ import annotations

import uuid

from coordinator.core.commands import (
    DecommissionNode,
    DropView,
    FinishViewBuildingTasks,
    RegisterStagedRows,
    SplitTablets,
    StartTabletMigration,
)
from coordinator.core.planner import SendBatch, plan_dispatch
from coordinator.core.schema import TASK_PROCESS_STAGING, Replica
from coordinator.core.staging import staging_tasks
from coordinator.core.state import Group0State
from tests.test_planner import add_view, all_live, apply, claim, cluster, table_id

BASE = table_id(1)


def register(state: Group0State, replica: Replica, tablet: int = 0, through: int = 1, tablet_count: int = 2,
             base: str = BASE):
    return state.apply(RegisterStagedRows(cmd_id=uuid.uuid4().hex, base_id=base, node=replica.node,
                                          shard=replica.shard, tablet_id=tablet, tablet_count=tablet_count,
                                          through=through))


def replica_of(state: Group0State, tablet: int = 0, position: int = 0) -> Replica:
    return state.tablets[BASE].replicas[tablet][position]


def a_node_without(state: Group0State, tablet: int = 0) -> Replica:
    holders = {r.node for r in state.tablets[BASE].replicas[tablet]}
    return Replica(next(n for n in sorted(state.nodes) if n not in holders), 0)


def with_view() -> Group0State:
    state = cluster()
    add_view(state, 1)
    return state


def test_a_registration_makes_one_process_staging_task_and_a_repeated_one_reuses_it():
    state = with_view()
    replica = replica_of(state)
    first = register(state, replica, through=5)
    assert first.ok, first
    task = state.tasks[first.value]
    assert (task.type, task.view_id, task.replica, task.tablet_id, task.staged_through) == \
        (TASK_PROCESS_STAGING, None, replica, 0, 5)
    assert register(state, replica, through=3).value == first.value  # covered already
    later = register(state, replica, through=9)
    assert later.ok and later.value != first.value
    assert len(staging_tasks(state, BASE, 0)) == 2 and len(staging_tasks(state, BASE)) == 2


def test_registrations_that_must_go_through_the_write_path_are_refused_and_change_nothing():
    state = cluster()
    replica = replica_of(state)
    assert register(state, replica).error_code == "FAILED_PRECONDITION"  # no view
    add_view(state, 1)
    before = dict(state.tasks), state.schema_version
    refusals = [register(state, replica, tablet_count=4),  # the tablets were split since
                register(state, a_node_without(state)),  # not a replica of the tablet
                register(state, replica, base=table_id(9))]  # no such table
    assert [r.error_code for r in refusals] == ["FAILED_PRECONDITION", "FAILED_PRECONDITION", "NOT_FOUND"]
    assert (dict(state.tasks), state.schema_version) == before


def test_a_tablet_in_transition_takes_no_staged_rows_and_staged_rows_hold_back_a_transition():
    state = with_view()
    leaving, pending = replica_of(state), a_node_without(state)

    def move() -> object:
        return state.apply(StartTabletMigration(
            cmd_id=uuid.uuid4().hex, migration_id=uuid.uuid4().hex, table_id=BASE, tablet_id=0,
            leaving_node=leaving.node, leaving_shard=leaving.shard, pending_node=pending.node,
            pending_shard=pending.shard))

    task_id = register(state, replica_of(state, position=1)).value
    refused = move()
    assert refused.error_code == "FAILED_PRECONDITION" and "staged rows" in refused.error_message
    split = state.apply(SplitTablets(cmd_id=uuid.uuid4().hex, table_id=BASE, id_seed=uuid.uuid4().hex))
    assert split.error_code == "FAILED_PRECONDITION"
    apply(state, FinishViewBuildingTasks(term=1, task_ids=(task_id,), cmd_id=None))
    assert not staging_tasks(state, BASE)
    assert move().ok
    assert register(state, replica_of(state, position=1)).error_code == "FAILED_PRECONDITION"


def test_staging_tasks_go_first_whatever_the_processing_bases_all_of_one_tablet_in_one_batch():
    state = with_view()
    claim(state)
    replica = replica_of(state)
    ids = sorted(register(state, replica, through=n).value for n in (1, 2))
    plan = plan_dispatch(state, 1, frozenset(), all_live(state), frozenset())
    assert SendBatch(replica.node, replica.shard, tuple(ids)) in plan.batches
    # once finished (held by the loop), the replica's build tasks come next
    plan = plan_dispatch(state, 1, frozenset(), all_live(state), frozenset(ids))
    sent = next(b for b in plan.batches if b.replica == replica)
    assert all(state.tasks[i].type != TASK_PROCESS_STAGING for i in sent.task_ids)


def test_staging_tasks_count_no_view_progress_and_outlive_the_last_view():
    state = with_view()
    task_id = register(state, replica_of(state)).value
    apply(state, DropView(keyspace="ks", name="mv1", cmd_id=None))
    assert task_id in state.tasks  # the staged rows must still reach the base
    apply(state, FinishViewBuildingTasks(term=1, task_ids=(task_id,), rows_scanned=(10,), cmd_id=None))
    assert task_id not in state.tasks and None not in state.rows_done


def test_a_node_declared_dead_loses_its_staging_tasks():
    state = cluster(nodes=4)
    add_view(state, 1)
    replica = replica_of(state)
    register(state, replica)
    apply(state, DecommissionNode(node_id=replica.node, dead=True, cmd_id=None))
    assert not [t for t in staging_tasks(state, BASE) if t.replica.node == replica.node]
