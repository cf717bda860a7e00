"""Staged bulk loads in the replica role (in process, real stores, the real group0 core): staging then processing
leaves base and view replicas as writing the same rows directly does; rows that cannot be staged are written
directly; staged entries found at start-up are registered again or deleted."""
from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from coordinator.core.commands import (
    DropView,
    FinishViewBuildingTasks,
    RegisterStagedRows,
    StartTabletMigration,
)
from coordinator.core.errors import FailedPrecondition
from coordinator.core.schema import TASK_PROCESS_STAGING
from coordinator.core.staging import staging_tasks
from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN
from replica.staging import StagedTablet
from tests.replica_fakes import InProcessCluster, cluster_state
from tests.strength import fast_and_deep
from tests.test_replica_write_path import (
    HISTORY_STEP,
    TS,
    base_rows,
    columns_of,
    history_mutation,
    live_view_rows,
    stored_rows,
)


def group0_registry(schema):
    """Each node's `Register`: RegisterStagedRows applied to the shared group0 state, its refusal raised."""
    def for_node(node_id: str):
        def register(entry: StagedTablet) -> None:
            outcome = schema.state.apply(RegisterStagedRows(
                cmd_id=uuid.uuid4().hex, base_id=entry.table_id, node=node_id, shard=entry.shard,
                tablet_id=entry.tablet_id, tablet_count=entry.tablet_count, through=entry.through, rows=entry.rows))
            if not outcome.ok:
                raise outcome.error
        return register
    return for_node


def process_all(cluster: InProcessCluster, chunk_rows: int = 3) -> int:
    """Run every process_staging task as its worker would (one tablet replica at a time), then finish it."""
    state = cluster.schema.state
    applied = 0
    for task in [t for t in state.tasks.values() if t.type == TASK_PROCESS_STAGING]:
        node = cluster.nodes[task.replica.node]
        applied += node.local.staging.process(task.base_id, task.tablet_id, task.staged_through, task.replica.shard,
                                              chunk_rows)
        assert state.apply(FinishViewBuildingTasks(term=1, task_ids=(task.id,), cmd_id=None)).ok
    return applied


def held(node, table_id: str, rows) -> list:
    """`rows(node, table_id)`, or none when the node never stored the table."""
    return rows(node, table_id) if node.store.has_table(table_id) else []


def staged_then_processed_leave_the_replicas_as_direct_writes_do(batches):
    """Each batch goes to staging or directly (its flag), staged rows are processed at random points and at the
    end: base rows stored and view rows seen equal those of the same batches written directly, in order."""
    schema = cluster_state(nodes=("n1", "n2", "n3"), rf=2, tablets=2, with_view=True)
    with tempfile.TemporaryDirectory() as directory:
        staged = InProcessCluster(Path(directory) / "staged", schema, group0_registry(schema))
        direct = InProcessCluster(Path(directory) / "direct", cluster_state(nodes=("n1", "n2", "n3"), rf=2, tablets=2,
                                                                            with_view=True))
        try:
            for stage, process_after, steps in batches:
                mutations = [history_mutation(schema, *step) for step in steps]
                staged.nodes["n1"].writer.write_columns(schema.table, columns_of(schema, mutations), TS, staged=stage)
                twin = [history_mutation(direct.schema, *step) for step in steps]
                direct.nodes["n1"].writer.write_columns(direct.schema.table, columns_of(direct.schema, twin), TS)
                if process_after:
                    process_all(staged)
            process_all(staged)
            assert not staging_tasks(schema.state, schema.table_id)
            for node_id in staged.nodes:
                ours, theirs = staged.nodes[node_id], direct.nodes[node_id]
                assert held(ours, schema.table_id, stored_rows) == held(theirs, direct.schema.table_id, stored_rows)
                assert held(ours, schema.view_id, lambda n, _: live_view_rows(n, schema.view)) == \
                    held(theirs, direct.schema.view_id, lambda n, _: live_view_rows(n, direct.schema.view))
                assert staged.nodes[node_id].local.staging.entries() == []
        finally:
            staged.close()
            direct.close()


test_staged_then_processed_rows_leave_the_replicas_as_direct_writes_do, \
    test_staged_then_processed_rows_leave_the_replicas_as_direct_writes_do_in_60_examples = fast_and_deep(
        staged_then_processed_leave_the_replicas_as_direct_writes_do, 6, 60,
        given(batches=st.lists(st.tuples(st.booleans(), st.booleans(),
                                         st.lists(HISTORY_STEP, min_size=1, max_size=8)), min_size=1, max_size=5)),
        deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def staged(tmp_path):
    schema = cluster_state(nodes=("n1", "n2", "n3"), rf=2, tablets=4, with_view=True)
    cluster = InProcessCluster(tmp_path, schema, group0_registry(schema))
    yield cluster
    cluster.close()


def stored_count(cluster: InProcessCluster, table_id: str) -> int:
    return sum(len(held(n, table_id, lambda node, t: node.store.scan(t, MIN_TOKEN, MAX_TOKEN)))
               for n in cluster.nodes.values())


def test_staged_rows_stay_invisible_until_processed_with_one_task_per_registration_covering_them(staged):
    schema = staged.schema
    staged.nodes["n1"].writer.write_columns(schema.table, columns_of(schema, base_rows(schema, 40)), TS, staged=True)
    assert stored_count(staged, schema.table_id) == 0 and stored_count(staged, schema.view_id) == 0
    tasks = staging_tasks(schema.state, schema.table_id)
    assert tasks and all(t.view_id is None for t in tasks) and sum(t.staged_rows for t in tasks) == 80
    assert {(t.replica.node, t.tablet_id) for t in tasks} == {
        (r.node, tablet) for tablet, replicas in enumerate(schema.state.tablets[schema.table_id].replicas)
        for r in replicas}
    assert process_all(staged) == 80  # every row on its 2 replicas
    assert stored_count(staged, schema.table_id) == 80 and stored_count(staged, schema.view_id) == 80


def test_rows_of_a_tablet_in_transition_or_of_a_table_without_views_are_written_directly(staged):
    schema, state = staged.schema, staged.schema.state
    leaving = state.tablets[schema.table_id].replicas[0][0]
    pending = next(n for n in sorted(state.nodes)
                   if n not in {r.node for r in state.tablets[schema.table_id].replicas[0]})
    assert state.apply(StartTabletMigration(
        cmd_id=uuid.uuid4().hex, migration_id=uuid.uuid4().hex, table_id=schema.table_id, tablet_id=0,
        leaving_node=leaving.node, leaving_shard=leaving.shard, pending_node=pending, pending_shard=0)).ok
    staged.nodes["n1"].writer.write_columns(schema.table, columns_of(schema, base_rows(schema, 40)), TS, staged=True)
    assert {t.tablet_id for t in staging_tasks(state, schema.table_id)} == {1, 2, 3}  # tablet 0 moves
    assert stored_count(staged, schema.table_id) > 0  # its rows were written directly
    process_all(staged)
    assert state.apply(DropView(cmd_id=None, keyspace="ks", name="by_v")).ok
    more = base_rows(schema, 60)[40:]
    staged.nodes["n2"].writer.write_columns(schema.table, columns_of(schema, more), TS, staged=True)
    assert not staging_tasks(state, schema.table_id)


def test_a_refused_registration_deletes_its_entries_and_the_rows_are_written_directly(tmp_path):
    schema = cluster_state(nodes=("n1", "n2", "n3"), rf=2, tablets=4, with_view=True)

    def refusing(node_id):
        def register(entry):
            raise FailedPrecondition("a tablet operation came first")
        return register

    cluster = InProcessCluster(tmp_path, schema, refusing)
    try:
        cluster.nodes["n3"].writer.write_columns(schema.table, columns_of(schema, base_rows(schema, 30)), TS,
                                                 staged=True)
        assert stored_count(cluster, schema.table_id) == 60 and stored_count(cluster, schema.view_id) == 60
        assert all(n.local.staging.entries() == [] for n in cluster.nodes.values())
    finally:
        cluster.close()


def test_entries_found_at_start_up_are_registered_again_and_unacknowledged_ones_deleted(staged):
    schema, state = staged.schema, staged.schema.state
    staged.nodes["n1"].writer.write_columns(schema.table, columns_of(schema, base_rows(schema, 40)), TS, staged=True)
    node = staged.nodes["n1"]
    held = node.local.staging.entries()
    assert held
    ours = [t for t in staging_tasks(state, schema.table_id) if t.replica.node == "n1"]
    for task in ours:  # as if group0 never applied n1's registrations (it crashed before they committed)
        del state.tasks[task.id]

    def shard_of(table_id: str, tablet: int):
        return next((r.shard for r in state.tablets[table_id].replicas[tablet] if r.node == "n1"), None)

    assert node.local.staging.register_again(shard_of) == (len(held), 0)
    assert {t.tablet_id for t in staging_tasks(state, schema.table_id) if t.replica.node == "n1"} == \
        {t.tablet_id for t in ours}
    assert node.local.staging.register_again(shard_of) == (len(held), 0)  # covered by the same tasks
    process_all(staged)
    assert state.apply(DropView(cmd_id=None, keyspace="ks", name="by_v")).ok
    node.store.stage(schema.table_id, *sorted((e.first_token, e.last_token) for e in held)[0],
                     columns_of(schema, base_rows(schema, 2)))
    assert node.local.staging.register_again(shard_of) == (0, 1)  # no view now: never acknowledged, deleted
    assert node.local.staging.entries() == []
