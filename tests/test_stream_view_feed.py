"""A pending replica's double writes that the stream's source missed: once streamed, they make their view updates
(replica.streaming, `LocalData.feed_streamed`, `storage.cells.fed_after_stream`), on in-process replicas."""
from __future__ import annotations

import pytest

from coordinator.core import migrations
from coordinator.core.schema import Replica
from coordinator.core.tokens import tablet_range
from replica.rows import storage_spec, upsert_row
from replica.streaming import TabletStream
from replica.write_path import route
from storage import bulk
from storage.cells import Cell, Row, fed_after_stream
from tests.replica_fakes import InProcessCluster, cluster_state
from tests.test_tablet_migrations import run_to, start

TS = 1_000
TERM = 1


@pytest.fixture
def cluster(tmp_path):
    cluster = InProcessCluster(tmp_path, cluster_state(nodes=("n1", "n2"), rf=1, tablets=1, with_view=True))
    yield cluster
    cluster.close()


def _base_write(cluster, values: dict, ts: int, only_on: str | None = None) -> None:
    """A client's write through n1's coordinator, or its delivery to `only_on` alone (the others refused it)."""
    table = cluster.schema.table
    row = upsert_row(table, values, ts)
    if only_on is None:
        cluster.nodes["n1"].writer.write([(table, row)], ts)
        return
    [batch] = [b for node, b in route(cluster.schema.state, [(table, row)], ts) if node == only_on]
    cluster.nodes[only_on].local.apply_base_write(batch)


def _view_rows(cluster) -> dict[tuple, bool]:
    """Every view replica's rows: (v, key, c) -> live."""
    spec = storage_spec(cluster.schema.view)
    rows = {}
    for node in cluster.nodes.values():
        if node.store.has_table(spec.table_id):
            stored = bulk.read_token_range(node.store, spec, -2**63, 2**63 - 1, include_tombstones=True)
            for row in stored.to_pylist():
                rows[(row["c_v"], row["c_key"], row["c_c"])] = not row["tombstone"]
    return rows


def _move_to_other_node(cluster) -> tuple[str, str]:
    state, table_id = cluster.schema.state, cluster.schema.table_id
    [leaving] = state.tablets[table_id].replicas[0]
    pending = Replica("n2" if leaving.node == "n1" else "n1", 0)
    assert start(state, table_id, 0, leaving, pending).ok
    run_to(state, table_id, 0, migrations.STREAMING)
    return leaving.node, pending.node


def _stream(cluster, leaving: str, pending: str):
    first, last = tablet_range(0, 1)
    request = TabletStream(TERM, "m1", cluster.schema.table_id, first, last, leaving, cluster.schema.state.schema_version)
    return cluster.nodes[pending].local.stream_tablet(request, current_term=TERM)


def test_a_write_only_the_filling_replica_applied_makes_its_view_updates_once_streamed(cluster):
    _base_write(cluster, {"key": 1, "c": 0, "v": "old"}, TS)
    leaving, pending = _move_to_other_node(cluster)
    _base_write(cluster, {"key": 1, "c": 0, "v": "new"}, TS + 1, only_on=pending)  # refused by the leaving one
    _base_write(cluster, {"key": 2, "c": 0, "v": "fresh"}, TS + 1, only_on=pending)  # a row the source never had
    assert _view_rows(cluster) == {("old", 1, 0): True}  # a filling replica makes no view updates
    _stream(cluster, leaving, pending)
    assert _view_rows(cluster) == {("old", 1, 0): False, ("new", 1, 0): True, ("fresh", 2, 0): True}


def test_double_writes_both_replicas_applied_make_nothing_more_when_streamed(cluster):
    _base_write(cluster, {"key": 1, "c": 0, "v": "old"}, TS)
    leaving, pending = _move_to_other_node(cluster)
    _base_write(cluster, {"key": 1, "c": 0, "v": "new"}, TS + 1)
    before = _view_rows(cluster)
    outbox_before = cluster.nodes[pending].store.outbox_targets()
    _stream(cluster, leaving, pending)
    assert _view_rows(cluster) == before == {("old", 1, 0): False, ("new", 1, 0): True}
    assert cluster.nodes[pending].store.outbox_targets() == outbox_before


def test_the_fed_row_orders_its_view_updates_after_the_sources_for_the_same_write():
    source = Row(7, (1, 0), marker_ts=TS, cells={"v": Cell("a", TS)}, view_ts=TS + 5)
    here = Row(7, (1, 0), marker_ts=TS, cells={"v": Cell("a", TS), "w": Cell(3, TS - 1)}, view_ts=TS)
    assert fed_after_stream(source, source) is None
    assert fed_after_stream(source, here).view_ts == TS + 6
    assert fed_after_stream(None, here).view_ts == TS
