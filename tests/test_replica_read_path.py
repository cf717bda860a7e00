"""Unit tests of the read path without processes: k-way merge order, fallback to another replica, all failing."""
from __future__ import annotations

import pytest

from common.replica_messages import ScannedRow
from coordinator.core.errors import NotFound, Unavailable
from coordinator.core.tokens import tablet_of, tablet_range
from coordinator.core.types import sort_key
from replica.read_path import merge_by_primary_key
from replica.rows import upsert_row
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


# ----------------------------------------------------------------- merge order


def test_a_full_read_merges_every_tablet_in_token_then_primary_key_order(cluster):
    table = cluster.schema.table
    rows = list(cluster.nodes["n1"].reader.rows(table))
    assert rows == _expected_order(table, [_values(i) for i in range(ROWS)])
    scanned = {c.target for c in cluster.network.calls_of("scan")}
    assert scanned and "n1" not in scanned, "local tablets are scanned without the transport"
    assert len(cluster.network.calls_of("scan")) == len(_remote_tablets(cluster, "n1"))


def test_a_read_of_some_partitions_returns_only_them_in_token_order_whatever_order_they_were_asked_in(cluster):
    table = cluster.schema.table
    partitions = [(3,), (-10,), (7,), (0,), (12345,)]  # 12345 holds no rows
    rows = list(cluster.nodes["n2"].reader.rows(table, partitions=partitions))
    wanted = [_values(i) for i in range(ROWS) if (_values(i)["key"],) in partitions]
    assert rows == _expected_order(table, wanted) and len(rows) == 16


def test_the_limit_caps_the_rows_read_from_each_tablet_and_the_merge_keeps_their_order(cluster):
    table = cluster.schema.table
    tablets = cluster.schema.state.tablets[table.id].tablet_count
    in_order = _expected_order(table, [_values(i) for i in range(ROWS)])
    per_tablet: dict[int, list] = {}
    for row in in_order:
        token = upsert_row(table, dict(zip(("key", "c", "v"), row)), TS).token
        per_tablet.setdefault(tablet_of(token, tablets), []).append(row)
    expected = [row for tablet in sorted(per_tablet) for row in per_tablet[tablet][:2]]
    assert list(cluster.nodes["n1"].reader.rows(table, limit=2)) == expected


def test_merge_orders_rows_of_equal_token_by_primary_key_under_the_value_order():
    schema = cluster_state()
    table = schema.table  # primary key (key, c), both int
    first = iter([ScannedRow(5, (1, -3, "a")), ScannedRow(5, (2, -7, "c")), ScannedRow(9, (0, 0, "e"))])
    second = iter([ScannedRow(-1, (9, 9, "z")), ScannedRow(5, (1, 4, "b")), ScannedRow(5, (2, 10, "d"))])
    merged = list(merge_by_primary_key(table, [first, second]))
    assert [r[2] for r in merged] == ["z", "a", "b", "c", "d", "e"]


# ----------------------------------------------------------------- fallback


def test_a_failing_local_replica_falls_back_to_another_replica_of_its_tablet(cluster):
    table = cluster.schema.table
    cluster.nodes["n1"].injections.enable("read.replica.scan", mode="fail")
    rows = list(cluster.nodes["n1"].reader.rows(table))
    assert rows == _expected_order(table, [_values(i) for i in range(ROWS)])
    assert cluster.nodes["n1"].injections.wait_hit("read.replica.scan", timeout=0)


def test_a_down_remote_replica_falls_back_to_the_next_one_in_tablet_order(cluster):
    table = cluster.schema.table
    remote = _remote_tablets(cluster, "n1")
    down = remote[0][1][0].node  # the first replica of a tablet n1 does not hold
    cluster.network.down.add(down)
    rows = list(cluster.nodes["n1"].reader.rows(table))
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
        list(cluster.nodes["n1"].reader.rows(table))
    for replica in replicas:
        assert f"{replica.node}: UNAVAILABLE: {replica.node} is down" in caught.value.message


def test_a_replica_failing_after_its_first_page_ends_the_read_instead_of_mixing_replicas(cluster):
    table = cluster.schema.table
    cluster.network.failing_after_first_page.update({"n2", "n3", "n4"})
    with pytest.raises(Unavailable, match="failed in the middle of a scan"):
        list(cluster.nodes["n1"].reader.rows(table))


def test_reading_a_dropped_table_is_not_found(cluster):
    table = cluster.schema.table
    del cluster.schema.state.tablets[table.id]
    with pytest.raises(NotFound, match="was dropped"):
        cluster.nodes["n1"].reader.rows(table)
