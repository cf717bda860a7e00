"""Unit tests of the write path without processes: routing to tablet replicas, local vs remote, view updates."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from common.replica_messages import RowBatch
from coordinator.core.errors import InvalidArgument, NotFound, Unavailable
from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN
from replica.rows import delete_row, storage_spec, upsert_row, visible_row
from replica.write_path import route, write_failure
from storage.arrow_layouts import mutation_table
from storage.cells import Cell, Row
from tests.replica_fakes import InProcessCluster, cluster_state
from tests.strength import fast_and_deep

TS = 1_000


@pytest.fixture
def cluster(request, tmp_path):
    options = getattr(request, "param", {})
    cluster = InProcessCluster(tmp_path, cluster_state(**options))
    yield cluster
    cluster.close()


def base_rows(schema, count: int, ts: int = TS) -> list:
    return [(schema.table, upsert_row(schema.table, {"key": k, "c": k % 3, "v": f"v{k % 5}"}, ts))
            for k in range(count)]


def stored_keys(node, table_id: str) -> set[tuple]:
    return {row.key for row in node.store.scan(table_id, MIN_TOKEN, MAX_TOKEN)}


# ----------------------------------------------------------------- routing


def test_route_makes_one_batch_per_replica_node_table_and_shard_at_the_routers_schema_version():
    schema = cluster_state(nodes=("n1", "n2", "n3"), rf=2, tablets=8, shards=2)
    mutations = base_rows(schema, 30)
    batches = route(schema.state, mutations, timestamp=77)
    seen = [(node, batch.table_id, batch.shard) for node, batch in batches]
    assert len(seen) == len(set(seen))
    for node, batch in batches:
        assert (batch.timestamp, batch.schema_version) == (77, schema.state.schema_version)
        for row in batch.rows:
            replicas = schema.replicas_of(schema.table_id, row.token)
            assert any(r.node == node and r.shard == batch.shard for r in replicas)
    routed = sorted((node, row.key) for node, batch in batches for row in batch.rows)
    expected = sorted((r.node, row.key) for _, row in mutations for r in schema.replicas_of(schema.table_id, row.token))
    assert routed == expected


@pytest.mark.parametrize("cluster", [{"nodes": ("n1", "n2", "n3", "n4"), "rf": 2, "tablets": 8}], indirect=True)
def test_each_row_is_stored_on_exactly_the_replicas_of_its_tablet(cluster):
    schema = cluster.schema
    mutations = base_rows(schema, 60)
    cluster.nodes["n1"].writer.write(mutations, TS)
    for node_id, node in cluster.nodes.items():
        expected = {row.key for _, row in mutations
                    if node_id in {r.node for r in schema.replicas_of(schema.table_id, row.token)}}
        assert stored_keys(node, schema.table_id) == expected, node_id


def test_the_coordinator_applies_its_own_replica_locally_and_sends_only_other_replicas_through_the_transport(cluster):
    schema = cluster.schema
    mutations = base_rows(schema, 40)
    cluster.nodes["n1"].writer.write(mutations, TS)
    calls = cluster.network.calls_of("replica_write")
    assert calls and {c.sender for c in calls} == {"n1"}
    assert "n1" not in {c.target for c in calls}, "the local replica must not go through the transport"
    local_keys = {row.key for _, row in mutations
                  if "n1" in {r.node for r in schema.replicas_of(schema.table_id, row.token)}}
    assert local_keys and stored_keys(cluster.nodes["n1"], schema.table_id) == local_keys
    for call in calls:
        assert isinstance(call.message, RowBatch) and call.message.timestamp == TS


def test_a_write_that_misses_a_replica_fails_naming_it_and_still_reaches_the_others(cluster):
    schema = cluster.schema
    cluster.network.down.add("n3")
    mutations = base_rows(schema, 40)
    with pytest.raises(Unavailable, match=r"did not reach every replica \(n3: UNAVAILABLE: n3 is down\)"):
        cluster.nodes["n1"].writer.write(mutations, TS)
    for node_id in ("n1", "n2"):
        expected = {row.key for _, row in mutations
                    if node_id in {r.node for r in schema.replicas_of(schema.table_id, row.token)}}
        assert stored_keys(cluster.nodes[node_id], schema.table_id) == expected


def test_a_failing_local_replica_is_reported_like_a_remote_one(cluster):
    cluster.nodes["n1"].injections.enable("write.replica.before_apply", mode="fail")
    with pytest.raises(Unavailable, match=r"n1: UNAVAILABLE: injected failure"):
        cluster.nodes["n1"].writer.write(base_rows(cluster.schema, 40), TS)


def test_a_replica_that_found_the_table_dropped_makes_the_write_not_found_rather_than_unavailable():
    dropped = write_failure(["ks.t"], [("n2", Unavailable("n2 is down")), ("n3", NotFound("no table t on n3"))])
    assert isinstance(dropped, NotFound)
    assert "was dropped while this write was running" in dropped.message and "n2: UNAVAILABLE" in dropped.message
    missed = write_failure(["ks.t"], [("n2", Unavailable("n2 is down"))])
    assert isinstance(missed, Unavailable) and "retrying it is safe" in missed.message


def test_a_replica_refuses_rows_of_tablets_it_does_not_hold(cluster):
    schema = cluster.schema
    table, row = next((t, r) for t, r in base_rows(schema, 40)
                      if "n1" not in {x.node for x in schema.replicas_of(schema.table_id, r.token)})
    batch = RowBatch(table.id, 0, (row,), schema.state.schema_version)
    with pytest.raises(Unavailable, match="not a replica of the tablet"):
        cluster.nodes["n1"].local.apply_base_write(batch)


# ----------------------------------------------------------------- columnar writes


def columns_of(schema, mutations) -> pa.Table:
    return mutation_table(storage_spec(schema.table), [row for _, row in mutations])


@pytest.mark.parametrize("cluster", [{"rf": 2, "tablets": 8}, {"rf": 2, "tablets": 8, "with_view": True}],
                         indirect=True, ids=["no-view", "view"])
def test_a_columnar_write_leaves_every_replica_as_the_row_write_does(cluster, tmp_path):
    schema = cluster.schema
    mutations = base_rows(schema, 60)
    cluster.nodes["n2"].writer.write_columns(schema.table, columns_of(schema, mutations), TS)
    twin = InProcessCluster(tmp_path / "twin", schema)
    try:
        twin.nodes["n2"].writer.write(mutations, TS)
        tables = [schema.table_id] + ([schema.view_id] if schema.view_id else [])
        if schema.view_id:
            assert sum(len(n.store.scan(schema.view_id, MIN_TOKEN, MAX_TOKEN)) for n in cluster.nodes.values()) == 120
        for node_id, node in cluster.nodes.items():
            assert stored_keys(node, schema.table_id), node_id
            for table_id in tables:
                assert node.store.scan(table_id, MIN_TOKEN, MAX_TOKEN) == \
                    twin.nodes[node_id].store.scan(table_id, MIN_TOKEN, MAX_TOKEN), (node_id, table_id)
        calls = cluster.network.calls_of("replica_write")
        assert calls and all(c.message.columns is not None and not c.message.rows for c in calls)
    finally:
        twin.close()


def test_a_replica_refuses_columns_that_do_not_fit_the_table_or_tablets_it_does_not_hold(cluster):
    schema = cluster.schema
    mutations = base_rows(schema, 40)
    columns = columns_of(schema, mutations)
    batch = RowBatch(schema.table_id, 0, (), schema.state.schema_version, columns=columns.drop_columns(["c_key"]))
    with pytest.raises(InvalidArgument, match=r"lack columns \['c_key'\]"):
        cluster.nodes["n1"].local.apply_base_write(batch)
    foreign = [i for i, (_, row) in enumerate(mutations)
               if "n1" not in {x.node for x in schema.replicas_of(schema.table_id, row.token)}]
    batch = RowBatch(schema.table_id, 0, (), schema.state.schema_version, columns=columns.take(foreign))
    with pytest.raises(Unavailable, match="not a replica of the tablet"):
        cluster.nodes["n1"].local.apply_base_write(batch)


# ----------------------------------------------------------------- view updates


@pytest.mark.parametrize("cluster", [{"nodes": ("n1", "n2", "n3", "n4"), "rf": 3, "tablets": 4, "with_view": True}],
                         indirect=True)
def test_view_updates_go_from_base_replica_i_to_view_replica_i_of_the_view_rows_tablet(cluster):
    schema = cluster.schema
    mutations = base_rows(schema, 40)
    cluster.nodes["n1"].writer.write(mutations, TS)
    by_key = {row.key: row for _, row in mutations}
    for call in cluster.network.calls_of("view_update"):
        for view_row in call.message.rows:
            base_key = view_row.key[1:]
            base_replicas = [r.node for r in schema.replicas_of(schema.table_id, by_key[base_key].token)]
            view_replicas = schema.replicas_of(schema.view_id, view_row.token)
            pair = base_replicas.index(call.sender)
            assert (view_replicas[pair].node, view_replicas[pair].shard) == (call.target, call.message.shard)
    for node_id, node in cluster.nodes.items():
        expected = {(f"v{k % 5}", k, k % 3) for k in range(40)
                    if node_id in {r.node for r in schema.replicas_of(schema.view_id, _view_token(schema, k))}}
        assert stored_keys(node, schema.view_id) == expected, node_id
        assert node.store.outbox_size() == 0


def _view_token(schema, k: int) -> int:
    return upsert_row(schema.view, {"v": f"v{k % 5}", "key": k, "c": k % 3}, TS).token


@pytest.mark.parametrize("cluster", [{"nodes": ("n1", "n2", "n3"), "rf": 3, "tablets": 2, "with_view": True}],
                         indirect=True)
def test_a_changed_view_key_deletes_the_old_view_row_and_a_deleted_base_row_deletes_its_view_row(cluster):
    schema = cluster.schema
    writer = cluster.nodes["n2"].writer
    writer.write([(schema.table, upsert_row(schema.table, {"key": 1, "c": 1, "v": "old"}, TS))], TS)
    writer.write([(schema.table, upsert_row(schema.table, {"key": 1, "c": 1, "v": "new"}, TS + 1))], TS + 1)
    writer.write([(schema.table, upsert_row(schema.table, {"key": 2, "c": 2, "v": "gone"}, TS))], TS)
    writer.write([(schema.table, delete_row(schema.table, (2, 2), TS + 1))], TS + 1)
    for node in cluster.nodes.values():
        assert stored_keys(node, schema.view_id) == {("new", 1, 1)}


@pytest.mark.parametrize("cluster", [{"nodes": ("n1", "n2", "n3", "n4"), "rf": 3, "tablets": 4, "with_view": True}],
                         indirect=True)
def test_view_updates_an_unreachable_view_replica_refuses_stay_in_the_outbox_until_a_flush_delivers_them(cluster):
    schema = cluster.schema
    cluster.network.refusing_view_updates.add("n3")
    cluster.nodes["n1"].writer.write(base_rows(schema, 20), TS)
    assert sum(node.store.outbox_size() for node in cluster.nodes.values()) > 0
    assert set().union(*(node.store.outbox_targets() for node in cluster.nodes.values())) == {"n3"}
    cluster.network.refusing_view_updates.clear()
    for node in cluster.nodes.values():
        node.local.flush_outbox()
    assert sum(node.store.outbox_size() for node in cluster.nodes.values()) == 0
    for node_id, node in cluster.nodes.items():
        expected = {(f"v{k % 5}", k, k % 3) for k in range(20)
                    if node_id in {r.node for r in schema.replicas_of(schema.view_id, _view_token(schema, k))}}
        assert stored_keys(node, schema.view_id) == expected, node_id


# ----------------------------------------------------------------- columnar writes to a table with a view


def history_mutation(schema, key: int, c: int, op: str, v: str | None, ts: int) -> tuple:
    if op == "delete":
        return schema.table, delete_row(schema.table, (key, c), ts)
    row = upsert_row(schema.table, {"key": key, "c": c, "v": v}, ts)
    if op == "set_v":  # an UPDATE: the v cell alone, no row marker
        row = Row(row.token, row.key, cells={"v": Cell(v, ts)})
    return schema.table, row


HISTORY_STEP = st.tuples(st.integers(0, 4), st.integers(0, 1), st.sampled_from(["insert", "set_v", "delete"]),
                         st.sampled_from([None, "x", "y", "é"]), st.integers(1, 5))


def stored_rows(node, table_id: str) -> list:
    return [(row.token, row.key, row.marker_ts, row.tomb_ts, dict(row.cells))
            for row in node.store.scan(table_id, MIN_TOKEN, MAX_TOKEN)]


def live_view_rows(node, view) -> list:
    """The view rows a reader sees: their timestamps may differ, since the bulk path sends a row written several
    times by one batch once, at the row's last version, and never the versions in between."""
    rows = (visible_row(view, row) for row in node.store.scan(view.id, MIN_TOKEN, MAX_TOKEN))
    return [row for row in rows if row is not None]


def columnar_writes_with_repeated_keys_leave_the_view_as_row_writes_do(batches):
    """The bulk view updates send the net change of a row written several times in one batch; the base rows are
    stored exactly as by the row path and the view shows the same rows, whatever the ties and the order."""
    schema = cluster_state(nodes=("n1", "n2", "n3"), rf=3, tablets=2, shards=2, with_view=True)
    with tempfile.TemporaryDirectory() as directory:
        columnar = InProcessCluster(Path(directory) / "columnar", schema)
        by_rows = InProcessCluster(Path(directory) / "rows", schema)
        try:
            for steps in batches:
                mutations = [history_mutation(schema, *step) for step in steps]
                columnar.nodes["n1"].writer.write_columns(schema.table, columns_of(schema, mutations), TS)
                by_rows.nodes["n1"].writer.write(mutations, TS)
            for node_id in columnar.nodes:
                assert stored_rows(columnar.nodes[node_id], schema.table_id) == \
                    stored_rows(by_rows.nodes[node_id], schema.table_id), node_id
                assert live_view_rows(columnar.nodes[node_id], schema.view) == \
                    live_view_rows(by_rows.nodes[node_id], schema.view), node_id
            calls = columnar.network.calls_of("view_update")
            assert all(c.message.columns is not None and not c.message.rows for c in calls)
        finally:
            columnar.close()
            by_rows.close()


test_columnar_writes_with_repeated_keys_leave_the_view_as_row_writes_do, \
    test_columnar_writes_with_repeated_keys_leave_the_view_as_row_writes_do_in_25_examples = fast_and_deep(
        columnar_writes_with_repeated_keys_leave_the_view_as_row_writes_do, 8, 25,
        given(batches=st.lists(st.lists(HISTORY_STEP, min_size=1, max_size=8), min_size=1, max_size=4)),
        deadline=None, suppress_health_check=[HealthCheck.too_slow])
