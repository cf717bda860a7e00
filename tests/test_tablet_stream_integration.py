"""Tablet streaming between 2 real node processes: StreamTablet copies a replica's stored rows, CleanupTablet removes
them; retries, injected failures and stale terms."""
from __future__ import annotations

import grpc
import pytest

from common.arrow_stream import batches_from_pieces
from common.codec import scan_page_from_proto
from vbc import client
from vbcpb import vbc_pb2 as pb

from .cluster_harness import LocalCluster
from .test_storage_bulk import canonical_row

pytestmark = pytest.mark.integration

ROWS = 400


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(2, tmp_path_factory.mktemp("stream"), spark_prestart=False) as running:
        yield running


@pytest.fixture(scope="module")
def tablet(cluster):
    """mv.t (RF 1, 2 tablets) written with inserts, updates and deletes: (table id, tablet, holder, other node)."""
    cluster.execute("CREATE KEYSPACE mv WITH replication = {'rf': 1} AND tablets = {'initial': 2}", node="n1")
    cluster.execute("CREATE TABLE mv.t (id int, c int, v text, d double, PRIMARY KEY (id, c))", node="n1")
    for start in range(0, ROWS, 100):
        cluster.execute("BEGIN BATCH " + " ".join(
            f"INSERT INTO mv.t (id, c, v, d) VALUES ({i // 4}, {i % 4}, 'v{i}', {i / 3});"
            for i in range(start, start + 100)) + " APPLY BATCH", node="n2")
    for i in range(0, ROWS, 7):
        cluster.execute(f"UPDATE mv.t SET v = 'updated{i}', d = null WHERE id = {i // 4} AND c = {i % 4}", node="n1")
    for i in range(0, ROWS, 11):
        cluster.execute(f"DELETE FROM mv.t WHERE id = {i // 4} AND c = {i % 4}", node="n2")
    table_id = client.admin_stub(cluster.addr("n1")).Tablets(pb.TabletsRequest(table="mv.t"), timeout=10).table_id
    holder_of = lambda t: t["replicas"][0].split(":")[0]  # noqa: E731
    chosen = next(t for t in client.tablets(cluster.addr("n1"), "mv.t") if scan(cluster, holder_of(t), table_id, t))
    holder = holder_of(chosen)
    return table_id, chosen, holder, "n2" if holder == "n1" else "n1"


def scan(cluster, node: str, table_id: str, tablet: dict) -> list[tuple]:
    """The live rows of `node`'s local replica of the tablet (Internode.Scan)."""
    pages = client.internode_stub(cluster.addr(node)).Scan(
        pb.ScanRequest(table_id=table_id, first_token=tablet["first_token"], last_token=tablet["last_token"]),
        timeout=30)
    return [tuple(row.values()) for page in pages for row in scan_page_from_proto(page).batch.to_pylist()]


def stored(cluster, node: str, table_id: str, tablet: dict) -> list[dict]:
    """Every stored row of `node`'s local replica of the tablet, tombstones included (Internode.ReadTabletRows)."""
    pieces = client.internode_stub(cluster.addr(node)).ReadTabletRows(
        pb.ReadTabletRowsRequest(table_id=table_id, first_token=tablet["first_token"],
                                 last_token=tablet["last_token"], schema_version=schema_version(cluster, node)),
        timeout=30)
    return [canonical_row(row) for batch in batches_from_pieces(p.ipc for p in pieces if not p.done)
            for row in batch.to_pylist()]


def schema_version(cluster, node: str) -> int:
    return client.local_status(cluster.addr(node))["schema_version"]


def term(cluster, node: str) -> int:
    return client.local_status(cluster.addr(node))["term"]


def stream(cluster, tablet_info, migration_id: str, term_of_call: int | None = None) -> pb.StreamTabletResponse:
    table_id, tablet, holder, other = tablet_info
    request = pb.StreamTabletRequest(
        term=term(cluster, other) if term_of_call is None else term_of_call, migration_id=migration_id,
        table_id=table_id, first_token=tablet["first_token"], last_token=tablet["last_token"], source_node=holder,
        schema_version=schema_version(cluster, holder))
    return client.internode_stub(cluster.addr(other)).StreamTablet(request, timeout=120)


def cleanup(cluster, tablet_info, migration_id: str) -> int:
    table_id, tablet, _, other = tablet_info
    request = pb.CleanupTabletRequest(term=term(cluster, other), migration_id=migration_id, table_id=table_id,
                                      first_token=tablet["first_token"], last_token=tablet["last_token"],
                                      schema_version=schema_version(cluster, other))
    return client.internode_stub(cluster.addr(other)).CleanupTablet(request, timeout=60).rows


def test_a_stream_copies_the_replica_and_a_retry_changes_nothing_and_cleanup_removes_it(cluster, tablet):
    table_id, chosen, holder, other = tablet
    source_stored = stored(cluster, holder, table_id, chosen)
    assert any(row["tombstone"] == ("bool", True) for row in source_stored), "the tablet should hold tombstones"
    assert scan(cluster, other, table_id, chosen) == []
    response = stream(cluster, tablet, "move-1")
    assert response.rows == len(source_stored) and response.seconds > 0
    assert scan(cluster, other, table_id, chosen) == scan(cluster, holder, table_id, chosen)
    assert stored(cluster, other, table_id, chosen) == source_stored
    assert stream(cluster, tablet, "move-1").rows == len(source_stored)
    assert stream(cluster, tablet, "move-again").rows == len(source_stored)
    assert stored(cluster, other, table_id, chosen) == source_stored
    assert cleanup(cluster, tablet, "move-1") == len(source_stored)
    assert stored(cluster, other, table_id, chosen) == [] and scan(cluster, other, table_id, chosen) == []
    assert scan(cluster, holder, table_id, chosen) != []  # the source keeps its rows


def test_an_injected_failure_fails_the_stream_with_a_clear_error(cluster, tablet):
    other = tablet[3]
    client.inject(cluster.addr(other), "stream_tablet_fail", "enable", mode="fail")
    try:
        with pytest.raises(grpc.RpcError) as caught:
            stream(cluster, tablet, "move-failing")
    finally:
        client.inject(cluster.addr(other), "stream_tablet_fail", "disable")
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "injected failure at 'stream_tablet_fail'" in caught.value.details()
    assert f"from {tablet[2]} to {other} failed after 0 rows" in caught.value.details()
    cleanup(cluster, tablet, "move-failing")


def test_a_stale_term_and_bad_requests_are_refused(cluster, tablet):
    current = term(cluster, tablet[3])
    assert current >= 1
    with pytest.raises(grpc.RpcError) as caught:
        stream(cluster, tablet, "move-stale", term_of_call=current - 1)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION and "stale term" in caught.value.details()
    table_id, chosen, holder, other = tablet
    bad = pb.StreamTabletRequest(term=current, migration_id="bad", table_id=table_id, first_token=5, last_token=4,
                                 source_node=holder)
    with pytest.raises(grpc.RpcError) as caught:
        client.internode_stub(cluster.addr(other)).StreamTablet(bad, timeout=30)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "empty token range" in caught.value.details()
