"""Unit tests of the read path without processes: token order, limits, resuming, fallback to another replica, all
failing, aggregates."""
from __future__ import annotations

import pytest


from coordinator.core.errors import DeadlineExceeded, NotFound, Unavailable
from coordinator.core.tokens import tablet_range
from coordinator.core.schema import Filter
from coordinator.core.types import sort_key
from replica.read_path import ReadCoordinator, ReadQuery
from replica.rows import delete_row, upsert_row
from storage.reads import Aggregate
from tests.replica_fakes import InProcessCluster, cluster_state

TS = 1_000
ROWS = 120


@pytest.fixture
def cluster(tmp_path):
    cluster = InProcessCluster(tmp_path, cluster_state(nodes=("n1", "n2", "n3", "n4"), rf=2, tablets=8))
    schema = cluster.schema
    cluster.nodes["n1"].writer.write(
        [(schema.table, upsert_row(schema.table, _values(i), TS)) for i in range(ROWS)], TS)
    yield cluster
    cluster.close()


def _rows(reader, table, **query) -> list[tuple]:
    """Every row a read returns, as tuples of all the table's columns, in the order the pages came."""
    names = tuple(c.name for c in table.columns)
    pages = reader.pages(table, ReadQuery(columns=names, **query))
    return [tuple(row[n] for n in names) for page in pages for row in page.to_pylist()]


def _values(i: int) -> dict:
    return {"key": i // 4 - 10, "c": (i * 7) % 4 - 2, "v": f"row{i}"}


def _expected_order(table, rows: list[dict]) -> list[tuple]:
    def order(values: dict):
        token = upsert_row(table, values, TS).token
        return (token, tuple(sort_key(values[c]) for c in table.primary_key))

    return [tuple(v[c.name] for c in table.columns) for v in sorted(rows, key=order)]


def _remote_tablets(cluster, node: str) -> list[tuple[int, tuple]]:
    """(first token, replicas) of every tablet of the table that `node` holds no replica of."""
    tablet_map = cluster.schema.state.tablets[cluster.schema.table_id]
    return [(tablet_range(i, tablet_map.tablet_count)[0], replicas) for i, replicas in enumerate(tablet_map.replicas)
            if node not in {r.node for r in replicas}]


# ----------------------------------------------------------------- order, limits, resuming


def test_a_full_read_returns_every_tablet_in_token_then_primary_key_order(cluster):
    table = cluster.schema.table
    rows = _rows(cluster.nodes["n1"].reader, table, page_rows=7)
    assert rows == _expected_order(table, [_values(i) for i in range(ROWS)])
    scanned = {c.target for c in cluster.network.calls_of("scan")}
    assert scanned and "n1" not in scanned, "local tablets are scanned without the transport"
    assert len(cluster.network.calls_of("scan")) == len(_remote_tablets(cluster, "n1"))


def test_a_read_of_some_partitions_returns_only_them_in_token_order_whatever_order_they_were_asked_in(cluster):
    table = cluster.schema.table
    partitions = [(3,), (-10,), (7,), (0,), (12345,)]  # 12345 holds no rows
    rows = _rows(cluster.nodes["n2"].reader, table, partitions=partitions)
    wanted = [_values(i) for i in range(ROWS) if (_values(i)["key"],) in partitions]
    assert rows == _expected_order(table, wanted) and len(rows) == 16


def test_the_limit_caps_the_rows_of_the_whole_read(cluster):
    table = cluster.schema.table
    in_order = _expected_order(table, [_values(i) for i in range(ROWS)])
    assert _rows(cluster.nodes["n1"].reader, table, limit=17, page_rows=5) == in_order[:17]


def test_a_read_resumes_strictly_after_a_row_whatever_tablet_it_was_in(cluster):
    table = cluster.schema.table
    reader = cluster.nodes["n3"].reader
    in_order = _expected_order(table, [_values(i) for i in range(ROWS)])
    for cut in (0, 1, 29, 60, ROWS - 1):
        row = dict(zip(("key", "c", "v"), in_order[cut]))
        after = (upsert_row(table, row, TS).token, (row["key"], row["c"]))
        assert _rows(reader, table, after=after) == in_order[cut + 1:]


def test_filters_are_applied_at_the_replicas_and_deleted_rows_are_never_read(cluster):
    table = cluster.schema.table
    writer = cluster.nodes["n1"].writer
    writer.write([(table, delete_row(table, (_values(2)["key"], _values(2)["c"]), TS + 1))], TS + 1)
    rows = _rows(cluster.nodes["n4"].reader, table, filters=(Filter("v", "IN", ("row1", "row2", "row3")),))
    assert sorted(r[2] for r in rows) == ["row1", "row3"]


def test_aggregates_are_combined_from_every_tablet(cluster):
    table = cluster.schema.table
    query = ReadQuery(columns=())
    aggregates = (Aggregate("count"), Aggregate("min", "c"), Aggregate("max", "v"), Aggregate("sum", "key"),
                  Aggregate("avg", "key"))
    values = [_values(i) for i in range(ROWS)]
    keys = [v["key"] for v in values]
    expected = [ROWS, min(v["c"] for v in values), max(v["v"] for v in values), sum(keys),
                int(sum(keys) / len(keys))]
    assert cluster.nodes["n2"].reader.aggregate(table, query, aggregates) == expected


# ----------------------------------------------------------------- fallback


def test_a_failing_local_replica_falls_back_to_another_replica_of_its_tablet(cluster):
    table = cluster.schema.table
    cluster.nodes["n1"].injections.enable("read.replica.scan", mode="fail")
    rows = _rows(cluster.nodes["n1"].reader, table)
    assert rows == _expected_order(table, [_values(i) for i in range(ROWS)])
    assert cluster.nodes["n1"].injections.wait_hit("read.replica.scan", timeout=0)


def test_a_down_remote_replica_falls_back_to_the_next_one_in_tablet_order(cluster):
    table = cluster.schema.table
    remote = _remote_tablets(cluster, "n1")
    down = remote[0][1][0].node  # the first replica of a tablet n1 does not hold
    cluster.network.down.add(down)
    rows = _rows(cluster.nodes["n1"].reader, table)
    assert rows == _expected_order(table, [_values(i) for i in range(ROWS)])
    scans = cluster.network.calls_of("scan")
    for first_token, replicas in remote:
        tried = [c.target for c in scans if c.message.first_token == first_token]
        nodes = [r.node for r in replicas]
        assert tried == (nodes if nodes[0] == down else nodes[:1])


def test_a_tablet_whose_replicas_all_fail_makes_the_read_unavailable_naming_each_replica(cluster):
    table = cluster.schema.table
    _, replicas = _remote_tablets(cluster, "n1")[0]
    cluster.network.down.update(r.node for r in replicas)
    with pytest.raises(Unavailable, match="no replica could serve tokens") as caught:
        _rows(cluster.nodes["n1"].reader, table)
    for replica in replicas:
        assert f"{replica.node}: UNAVAILABLE: {replica.node} is down" in caught.value.message


def test_a_replica_failing_after_its_first_page_ends_the_read_instead_of_mixing_replicas(cluster):
    table = cluster.schema.table
    cluster.network.failing_after_first_page.update({"n2", "n3", "n4"})
    with pytest.raises(Unavailable, match="failed in the middle of a scan"):
        _rows(cluster.nodes["n1"].reader, table)


def test_reading_a_dropped_table_is_not_found(cluster):
    table = cluster.schema.table
    del cluster.schema.state.tablets[table.id]
    with pytest.raises(NotFound, match="was dropped"):
        _rows(cluster.nodes["n1"].reader, table)


def test_a_read_past_its_deadline_stops_saying_how_far_it_got(cluster):
    table = cluster.schema.table
    ticks = iter([0.0, 0.0, 0.0] + [100.0] * 50)
    reader = ReadCoordinator("n1", cluster.read_state, cluster.nodes["n1"].local, cluster.network.transport_of("n1"),
                             clock=lambda: next(ticks))
    query = ReadQuery(columns=("key",), deadline=50.0, doing="reading ks.t")
    with pytest.raises(DeadlineExceeded, match=r"while reading ks.t \(\d of 8 token ranges read\).*--timeout"):
        list(reader.pages(table, query))
    with pytest.raises(DeadlineExceeded, match="token ranges aggregated"):
        reader.aggregate(table, ReadQuery(columns=(), deadline=50.0), (Aggregate("count"),))
