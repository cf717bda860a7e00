"""Integration tests with 3 real node processes on 127.0.0.1: DDL, writes, reads, view maintenance, bad input."""
from __future__ import annotations

import random
import threading

import grpc
import pytest

from common.codec import scan_page_from_proto, values_to_proto
from coordinator.core.tokens import token_of
from vbc import client
from vbcpb import vbc_pb2 as pb

from .cluster_harness import LocalCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(3, tmp_path_factory.mktemp("cluster"), shards=2) as running:
        yield running


def addr(cluster, node_id: str) -> str:
    return next(n["grpc"] for n in cluster.nodes if n["id"] == node_id)


def run(cluster, node_id: str, statement: str):
    return client.execute(addr(cluster, node_id), statement)


def rows(cluster, node_id: str, statement: str) -> list[dict]:
    return client.query(addr(cluster, node_id), statement)


def error_of(cluster, node_id: str, statement: str) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        run(cluster, node_id, statement)
    return caught.value.code(), caught.value.details()


def wait_views_flushed(cluster) -> None:
    cluster.wait_until(
        lambda: all(n["alive"] and n["pending_view_updates"] == 0 for n in client.status(addr(cluster, "n1"))["nodes"]),
        timeout=30, message="view update outboxes did not drain")


def test_ddl_from_any_node_is_visible_on_all(cluster):
    run(cluster, "n1", "CREATE KEYSPACE ddl WITH replication = {'rf': 3} AND tablets = {'initial': 4}")
    run(cluster, "n2", "CREATE TABLE ddl.t (key int, c int, v text, PRIMARY KEY (key, c))")
    run(cluster, "n3", "CREATE MATERIALIZED VIEW ddl.mv AS SELECT * FROM ddl.t WHERE c IS NOT NULL AND key IS NOT NULL PRIMARY KEY (c, key)")
    run(cluster, "n1", "CREATE INDEX ON ddl.t (v)")
    maps = []
    for node in ("n1", "n2", "n3"):
        cluster.wait_until(lambda: any(v["name"] == "ddl.t_v_idx" for v in client.status(addr(cluster, node))["views"]),
                           timeout=10, message=f"{node} did not see the index")
        maps.append(client.tablets(addr(cluster, node), "ddl.t"))
        assert rows(cluster, node, "SELECT * FROM ddl.t") == []
    assert maps[0] == maps[1] == maps[2] and len(maps[0]) == 4
    for tablet in maps[0]:
        assert len({r.split(":")[0] for r in tablet["replicas"]}) == 3
    view = next(v for v in client.status(addr(cluster, "n2"))["views"] if v["name"] == "ddl.mv")
    # a view over an empty table may already be built here: its 12 tasks need no scan
    assert view["base"] == "ddl.t" and view["state"] in ("BUILDING", "BUILT") and view["tasks_total"] == 12
    assert set(view["hosts"]) == {"n1", "n2", "n3"}


@pytest.fixture(scope="module")
def rw_table(cluster):
    """rw.t with 1,000 rows written in batches through n1, n2 and n3 in turn; returns the expected rows."""
    run(cluster, "n1", "CREATE KEYSPACE rw WITH replication = {'rf': 3} AND tablets = {'initial': 8}")
    run(cluster, "n1", "CREATE TABLE rw.t (id int, name text, score double, ok boolean, PRIMARY KEY (id))")
    expected = {}
    for start in range(0, 1000, 50):
        node = ("n1", "n2", "n3")[start // 50 % 3]
        inserts = []
        for i in range(start, start + 50):
            expected[i] = {"id": i, "name": f"name-{i}", "score": i / 4, "ok": i % 2 == 0}
            inserts.append(f"INSERT INTO rw.t (id, name, score, ok) VALUES ({i}, 'name-{i}', {i / 4}, {str(i % 2 == 0).lower()})")
        run(cluster, node, "BEGIN BATCH " + "; ".join(inserts) + " APPLY BATCH")
    return expected


def test_rows_written_through_different_nodes_are_read_back_from_every_node(cluster, rw_table):
    expected = rw_table
    for node in ("n1", "n2", "n3"):
        got = rows(cluster, node, "SELECT * FROM rw.t")
        assert {r["id"]: r for r in got} == expected
        tokens = [token_of((r["id"],), ("int",)) for r in got]
        assert tokens == sorted(tokens), "rows must come back in token order"
        assert rows(cluster, node, "SELECT COUNT(*) FROM rw.t") == [{"count": 1000}]
        assert rows(cluster, node, "SELECT COUNT(*) FROM rw.t LIMIT 2") == [{"count": 1000}]
        assert rows(cluster, node, "SELECT name FROM rw.t WHERE id = 7") == [{"name": "name-7"}]
    assert len(rows(cluster, "n2", "SELECT * FROM rw.t LIMIT 10")) == 10


def test_every_replica_holds_its_tablets_rows(cluster):
    run(cluster, "n1", "CREATE KEYSPACE rep WITH replication = {'rf': 2} AND tablets = {'initial': 4}")
    run(cluster, "n1", "CREATE TABLE rep.t (id int, v text, PRIMARY KEY (id))")
    run(cluster, "n3", "BEGIN BATCH " + " ".join(f"INSERT INTO rep.t (id, v) VALUES ({i}, 'v{i}');" for i in range(200)) + " APPLY BATCH")
    table_id = _table_id(cluster, "rep", "t")
    for tablet in client.tablets(addr(cluster, "n1"), "rep.t"):
        want = sorted(i for i in range(200) if tablet["first_token"] <= token_of((i,), ("int",)) <= tablet["last_token"])
        assert len(tablet["replicas"]) == 2
        for replica in tablet["replicas"]:
            node = replica.split(":")[0]
            stub = client.internode_stub(addr(cluster, node))
            pages = stub.Scan(pb.ScanRequest(table_id=table_id, first_token=tablet["first_token"],
                                             last_token=tablet["last_token"]), timeout=10)
            got = sorted(row["id"] for page in pages for row in scan_page_from_proto(page).batch.to_pylist())
            assert got == want, f"replica {replica} of tablet {tablet['tablet']}"


def _table_id(cluster, keyspace: str, name: str) -> str:
    response = client.admin_stub(addr(cluster, "n1")).Tablets(pb.TabletsRequest(table=f"{keyspace}.{name}"), timeout=10)
    return response.table_id


def test_view_equals_its_function_of_the_base_after_concurrent_random_writes(cluster):
    run(cluster, "n1", "CREATE KEYSPACE mv WITH replication = {'rf': 3} AND tablets = {'initial': 4}")
    run(cluster, "n2", "CREATE TABLE mv.t (key int, c int, v text, w int, PRIMARY KEY (key, c))")
    run(cluster, "n3", "CREATE MATERIALIZED VIEW mv.by_v AS SELECT * FROM mv.t WHERE v IS NOT NULL AND key IS NOT NULL "
                       "AND c IS NOT NULL AND w > 10 PRIMARY KEY (v, key, c)")
    run(cluster, "n1", "CREATE INDEX by_w ON mv.t (w)")
    errors = []

    def client_loop(seed: int, node: str, operations: int) -> None:
        rnd = random.Random(seed)
        for _ in range(operations):
            key, c = rnd.randrange(40), rnd.randrange(3)
            choice = rnd.random()
            if choice < 0.45:
                statement = (f"INSERT INTO mv.t (key, c, v, w) VALUES ({key}, {c}, 'v{rnd.randrange(6)}', "
                             f"{rnd.randrange(20)})")
            elif choice < 0.8:
                statement = f"UPDATE mv.t SET v = 'v{rnd.randrange(6)}' WHERE key = {key} AND c = {c}"
            elif choice < 0.9:
                statement = f"UPDATE mv.t SET w = {rnd.randrange(20)} WHERE key = {key} AND c = {c}"
            else:
                statement = f"DELETE FROM mv.t WHERE key = {key} AND c = {c}"
            try:
                run(cluster, node, statement)
            except grpc.RpcError as error:  # pragma: no cover - reported below
                errors.append(f"{statement}: {error.details()}")

    threads = [threading.Thread(target=client_loop, args=(seed, ("n1", "n2", "n3")[seed % 3], 500)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    wait_views_flushed(cluster)
    base = rows(cluster, "n1", "SELECT * FROM mv.t")
    expected_view = sorted((r["v"], r["key"], r["c"], r["w"]) for r in base
                           if r["v"] is not None and r["w"] is not None and r["w"] > 10)
    expected_index = sorted((r["w"], r["key"], r["c"]) for r in base if r["w"] is not None)
    for node in ("n1", "n2", "n3"):  # each node reads its own replica of every tablet
        assert rows(cluster, node, "SELECT * FROM mv.t") == base
        view = rows(cluster, node, "SELECT * FROM mv.by_v ALLOW STALE")
        assert sorted((r["v"], r["key"], r["c"], r["w"]) for r in view) == expected_view
        index = rows(cluster, node, "SELECT * FROM mv.by_w ALLOW STALE")
        assert sorted((r["w"], r["key"], r["c"]) for r in index) == expected_index


def test_unbuilt_view_is_refused_unless_allow_stale(cluster):
    run(cluster, "n1", "CREATE KEYSPACE st WITH replication = {'rf': 1} AND tablets = {'initial': 2}")
    run(cluster, "n1", "CREATE TABLE st.t (k int, v int, PRIMARY KEY (k))")
    nodes = ("n1", "n2", "n3")
    for node in nodes:  # whichever node leads dispatches nothing: the view stays unbuilt
        client.inject(addr(cluster, node), "coordinator_pause_main_loop", action="enable", mode="pause")
    try:
        run(cluster, "n1", "CREATE MATERIALIZED VIEW st.mv AS SELECT * FROM st.t WHERE v IS NOT NULL AND k IS NOT NULL "
                           "PRIMARY KEY (v, k)")
        code, message = error_of(cluster, "n2", "SELECT * FROM st.mv")
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "being built" in message and "ALLOW STALE" in message
        run(cluster, "n2", "INSERT INTO st.t (k, v) VALUES (1, 5)")
        assert rows(cluster, "n3", "SELECT * FROM st.mv ALLOW STALE") == [{"v": 5, "k": 1}]
    finally:
        for node in nodes:
            client.inject(addr(cluster, node), "coordinator_pause_main_loop", action="disable")


def test_a_write_begun_before_a_view_holds_back_the_schema_barrier(cluster):
    run(cluster, "n1", "CREATE KEYSPACE sb WITH replication = {'rf': 3} AND tablets = {'initial': 1}")
    run(cluster, "n1", "CREATE TABLE sb.t (k int, v int, PRIMARY KEY (k))")
    client.inject(addr(cluster, "n2"), "write.replica.before_apply", action="enable", mode="pause")
    writer = threading.Thread(target=run, args=(cluster, "n1", "INSERT INTO sb.t (k, v) VALUES (1, 1)"))
    writer.start()
    try:
        assert client.inject(addr(cluster, "n2"), "write.replica.before_apply", action="wait_hit", timeout=10)["hit"]
        run(cluster, "n3", "CREATE MATERIALIZED VIEW sb.mv AS SELECT * FROM sb.t WHERE v IS NOT NULL AND k IS NOT NULL PRIMARY KEY (v, k)")
        version = client.status(addr(cluster, "n3"))["schema_version"]
        n2 = client.internode_stub(addr(cluster, "n2"))
        with pytest.raises(grpc.RpcError) as caught:
            n2.SchemaBarrier(pb.SchemaBarrierRequest(schema_version=version, timeout=0.5), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert n2.LocalStatus(pb.LocalStatusRequest(), timeout=5).schema_version < version
    finally:
        client.inject(addr(cluster, "n2"), "write.replica.before_apply", action="disable")
        writer.join(timeout=30)
    assert n2.SchemaBarrier(pb.SchemaBarrierRequest(schema_version=version, timeout=10), timeout=15).schema_version >= version


BAD_INPUT = [
    ("SELEC * FROM rw.t", grpc.StatusCode.INVALID_ARGUMENT, "unexpected 'SELEC'"),
    ("SELECT * FROM nope.t", grpc.StatusCode.NOT_FOUND, "keyspace 'nope' does not exist"),
    ("SELECT * FROM rw.nope", grpc.StatusCode.NOT_FOUND, "rw.nope does not exist"),
    ("SELECT nope FROM rw.t", grpc.StatusCode.INVALID_ARGUMENT, "unknown column 'nope'"),
    ("INSERT INTO rw.t (id, name) VALUES ('x', 'y')", grpc.StatusCode.INVALID_ARGUMENT, "column 'id' is int"),
    ("INSERT INTO rw.t (id, nope) VALUES (1, 2)", grpc.StatusCode.INVALID_ARGUMENT, "unknown column 'nope'"),
    ("INSERT INTO rw.t (id, name) VALUES (99999999999, 'y')", grpc.StatusCode.INVALID_ARGUMENT, "out of range"),
    ("CREATE TABLE rw.t (id int, PRIMARY KEY (id))", grpc.StatusCode.ALREADY_EXISTS, "rw.t already exists"),
    ("CREATE KEYSPACE rw WITH replication = {'rf': 1}", grpc.StatusCode.ALREADY_EXISTS, "keyspace 'rw' already exists"),
    ("CREATE KEYSPACE big WITH replication = {'rf': 4}", grpc.StatusCode.INVALID_ARGUMENT, "exceeds the number of nodes"),
    ("CREATE KEYSPACE odd WITH replication = {'rf': 1} AND tablets = {'initial': 6}", grpc.StatusCode.INVALID_ARGUMENT, "power of two"),
    ("DELETE FROM rw.t WHERE name = 'x'", grpc.StatusCode.INVALID_ARGUMENT, "must restrict the partition key"),
    ("CREATE MATERIALIZED VIEW rw.bad AS SELECT * FROM rw.t WHERE name IS NOT NULL PRIMARY KEY (name)",
     grpc.StatusCode.INVALID_ARGUMENT, "missing: id"),
    ("CREATE MATERIALIZED VIEW rw.bad AS SELECT * FROM rw.t WHERE name IS NOT NULL AND score IS NOT NULL "
     "AND id IS NOT NULL PRIMARY KEY (name, score, id)", grpc.StatusCode.INVALID_ARGUMENT, "at most one non-primary-key"),
    ("CREATE TABLE rw.u (id float, PRIMARY KEY (id))", grpc.StatusCode.INVALID_ARGUMENT, "float"),
    ("DROP TABLE rw.nope", grpc.StatusCode.NOT_FOUND, "rw.nope does not exist"),
    ("SELECT * FROM rw.t LIMIT 99999999999999999999", grpc.StatusCode.INVALID_ARGUMENT, "between 1 and 2147483647"),
]


@pytest.mark.parametrize("statement, code, words", BAD_INPUT)
def test_bad_input_gets_a_clear_error_and_loses_nothing(cluster, rw_table, statement, code, words):
    before = rows(cluster, "n1", "SELECT COUNT(*) FROM rw.t")
    got_code, message = error_of(cluster, ("n1", "n2", "n3")[len(statement) % 3], statement)
    assert got_code == code and words in message, message
    assert rows(cluster, "n2", "SELECT COUNT(*) FROM rw.t") == before


def test_streaming_execute_returns_pages(cluster, rw_table):
    stub = client.client_stub(addr(cluster, "n3"))
    pages = list(stub.ExecuteStream(pb.ExecuteRequest(statement="SELECT id FROM rw.t", page_size=300), timeout=30))
    assert [len(p.rows) for p in pages] == [300, 300, 300, 100]


def test_health_and_reflection_services_answer(cluster):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    channel = client.connect(addr(cluster, "n2"))
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="vbc.v1.Client"), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"vbc.v1.Client", "vbc.v1.Admin", "vbc.v1.Internode", "vbc.v1.Worker", "grpc.health.v1.Health"} <= names


def test_worker_rpc_is_fenced_by_term_and_answers_unknown_tasks_as_not_finished(cluster):
    from vbcpb import vbc_pb2_grpc

    term = client.status(addr(cluster, "n1"))["term"]
    worker = vbc_pb2_grpc.WorkerStub(client.connect(addr(cluster, "n1")))

    def code_of(request):
        with pytest.raises(grpc.RpcError) as caught:
            worker.WorkOnViewBuildingTasks(request, timeout=5)
        return caught.value.code(), caught.value.details()

    answer = worker.WorkOnViewBuildingTasks(pb.WorkRequest(term=term, shard=0, task_ids=["nope"]), timeout=5)
    assert list(answer.finished_task_ids) == [] and answer.rows_scanned == 0
    assert code_of(pb.WorkRequest(term=term, shard=0))[0] == grpc.StatusCode.INVALID_ARGUMENT
    code, message = code_of(pb.WorkRequest(term=term + 5, shard=0, task_ids=["nope"]))
    assert code == grpc.StatusCode.UNAVAILABLE and "ahead of this node's group0 term" in message
    code, message = code_of(pb.WorkRequest(term=term - 1, shard=0, task_ids=["nope"]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stale coordinator term" in message
    state = client.status(addr(cluster, "n1"))
    assert state["term"] == term  # a refused call moves nothing


def test_dropping_a_table_removes_its_storage_on_every_node(cluster):
    import sqlite3

    run(cluster, "n1", "CREATE KEYSPACE dr WITH replication = {'rf': 3} AND tablets = {'initial': 2}")
    run(cluster, "n1", "CREATE TABLE dr.t (k int, v int, PRIMARY KEY (k))")
    run(cluster, "n2", "CREATE INDEX ON dr.t (v)")
    run(cluster, "n3", "INSERT INTO dr.t (k, v) VALUES (1, 2)")
    table_id = _table_id(cluster, "dr", "t")

    def stored_ids(node: dict) -> set[str]:
        db = sqlite3.connect(f"file:{node['data_dir']}/storage.db?mode=ro", uri=True)
        try:
            return {row[0] for row in db.execute("SELECT table_id FROM storage_catalog")}
        finally:
            db.close()

    assert all(table_id in stored_ids(n) for n in cluster.nodes)
    run(cluster, "n2", "DROP KEYSPACE dr")
    cluster.wait_until(lambda: all(table_id not in stored_ids(n) for n in cluster.nodes), timeout=15,
                       message="storage of the dropped table is still there")
    code, _ = error_of(cluster, "n1", "SELECT * FROM dr.t")
    assert code == grpc.StatusCode.NOT_FOUND


def test_bind_markers_with_many_value_sets_write_once_and_read_back(cluster):
    run(cluster, "n1", "CREATE KEYSPACE bm WITH replication = {'rf': 3} AND tablets = {'initial': 4}")
    run(cluster, "n1", "CREATE TABLE bm.t (k int, name text, score double, PRIMARY KEY (k))")
    run(cluster, "n1", "CREATE INDEX ON bm.t (name)")
    params = [[i, f"n{i % 3}", i / 2] for i in range(300)]
    _, _, message = client.execute(addr(cluster, "n2"), "INSERT INTO bm.t (k, name, score) VALUES (?, ?, ?)",
                                   params=params)
    assert message == "ok: 300 statements applied"
    assert client.query(addr(cluster, "n3"), "SELECT COUNT(*) FROM bm.t") == [{"count": 300}]
    _, rows_, _ = client.execute(addr(cluster, "n1"), "SELECT name, score FROM bm.t WHERE k = ?", params=[[7]])
    assert rows_ == [["n1", 3.5]]
    client.execute(addr(cluster, "n1"), "UPDATE bm.t SET name = ? WHERE k = ?", params=[["moved", 7]])
    wait_views_flushed(cluster)
    assert rows(cluster, "n2", "SELECT k FROM bm.t_name_idx WHERE name = 'moved' ALLOW STALE") == [{"k": 7}]
    with pytest.raises(grpc.RpcError) as caught:
        client.execute(addr(cluster, "n1"), "INSERT INTO bm.t (k, name) VALUES (?, ?)", params=[[1]])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "2 bind marker(s)" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        client.execute(addr(cluster, "n1"), "SELECT * FROM bm.t WHERE k = ?", params=[[1], [2]])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most one set" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        client.execute(addr(cluster, "n1"), "INSERT INTO bm.t (k, name) VALUES (?, ?)", params=[["x", "y"]])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "column 'k' is int" in caught.value.details()


def test_oversized_statements_and_values_are_refused_naming_the_limit(cluster, rw_table):
    code, message = error_of(cluster, "n1", "INSERT INTO rw.t (id, name) VALUES (1, '" + "x" * 4 * 2**20 + "')")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "(max_statement_bytes)" in message, message[:200]
    with pytest.raises(grpc.RpcError) as caught:
        client.execute(addr(cluster, "n2"), "INSERT INTO rw.t (id, name) VALUES (?, ?)",
                       params=[[1, "x" * (16 * 2**20 + 1)]])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "value 2 of value set 1 is 16,777,217 bytes" in caught.value.details()
    assert rows(cluster, "n3", "SELECT name FROM rw.t WHERE id = 1") == [{"name": "name-1"}], "nothing written"


def test_prepared_statements_run_by_id_and_are_prepared_again_after_the_table_changes(cluster):
    run(cluster, "n1", "CREATE KEYSPACE ps WITH replication = {'rf': 3} AND tablets = {'initial': 2}")
    run(cluster, "n1", "CREATE TABLE ps.t (k int, v text, PRIMARY KEY (k))")
    stub = client.client_stub(addr(cluster, "n2"))
    insert = "INSERT INTO ps.t (k, v) VALUES (?, ?)"
    prepared = stub.Prepare(pb.PrepareRequest(statement=insert), timeout=30)
    assert [(c.name, c.type) for c in prepared.bind_columns] == [("k", "int"), ("v", "text")]
    rows_ = [values_to_proto([i, f"v{i}"]) for i in range(50)]
    assert stub.Execute(pb.ExecuteRequest(prepared_id=prepared.id, params=rows_), timeout=30).message == \
        "ok: 50 statements applied"
    with pytest.raises(grpc.RpcError) as caught:  # prepared on n2 only
        client.client_stub(addr(cluster, "n3")).Execute(pb.ExecuteRequest(prepared_id=prepared.id, params=rows_[:1]),
                                                        timeout=30)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details().startswith("unprepared statement " + prepared.id)
    # the client library prepares transparently, and again once the table under the name changed
    client.execute(addr(cluster, "n2"), insert, params=[[100, "a"]])
    run(cluster, "n1", "DROP TABLE ps.t")
    # DDL returns once every node applied it (schema agreement): the next statement on any node finds it
    assert run(cluster, "n1", "CREATE TABLE ps.t (k int, v int, PRIMARY KEY (k))")[2] == "created table ps.t"
    run(cluster, "n3", "INSERT INTO ps.t (k, v) VALUES (5, 6)")
    client.execute(addr(cluster, "n2"), insert, params=[[1, 2], [3, 4]])
    assert sorted(r["v"] for r in rows(cluster, "n3", "SELECT v FROM ps.t")) == [2, 4, 6]
    run(cluster, "n1", "DROP TABLE ps.t")
    with pytest.raises(grpc.RpcError) as caught:
        client.execute(addr(cluster, "n2"), insert, params=[[1, 2]])
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND, caught.value.details()


def test_alter_table_add_reaches_every_replica_and_prepared_clients_prepare_again(cluster):
    import pyarrow as pa
    run(cluster, "n1", "CREATE KEYSPACE al WITH replication = {'rf': 3} AND tablets = {'initial': 4}")
    run(cluster, "n1", "CREATE TABLE al.t (k int, v text, PRIMARY KEY (k))")
    run(cluster, "n1", "CREATE MATERIALIZED VIEW al.by_v AS SELECT * FROM al.t WHERE v IS NOT NULL AND k IS NOT NULL "
                       "PRIMARY KEY (v, k)")
    insert = "INSERT INTO al.t (k, v) VALUES (?, ?)"
    client.execute(addr(cluster, "n2"), insert, params=[[1, "a"], [2, "b"]])
    run(cluster, "n3", "ALTER TABLE al.t ADD (score double, tag text)")
    client.execute(addr(cluster, "n2"), insert, params=[[3, "c"]])  # prepared before the ALTER: prepared again
    client.execute(addr(cluster, "n1"), "INSERT INTO al.t (k, v, score, tag) VALUES (?, ?, ?, ?)",
                   params=pa.table({"k": pa.array([4, 1], pa.int32()), "v": ["d", "a"], "score": [0.5, 1.5],
                                    "tag": ["x", None]}))
    run(cluster, "n2", "UPDATE al.t SET tag = 'y' WHERE k = 2")
    expected = [{"k": 1, "v": "a", "score": 1.5, "tag": None}, {"k": 2, "v": "b", "score": None, "tag": "y"},
                {"k": 3, "v": "c", "score": None, "tag": None}, {"k": 4, "v": "d", "score": 0.5, "tag": "x"}]
    for node in ("n1", "n2", "n3"):
        assert sorted(rows(cluster, node, "SELECT k, v, score, tag FROM al.t"), key=lambda r: r["k"]) == expected
    client.wait_built(addr(cluster, "n1"), "al.by_v", timeout=60)
    by_v = rows(cluster, "n1", "SELECT v, k FROM al.by_v")
    assert sorted((r["v"], r["k"]) for r in by_v) == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    with pytest.raises(grpc.RpcError, match="already has column 'tag'"):
        client.execute(addr(cluster, "n1"), "ALTER TABLE al.t ADD tag int")


def test_arrow_value_sets_of_every_column_type_read_back_equal(cluster):
    import math

    import pyarrow as pa
    run(cluster, "n1", "CREATE KEYSPACE av WITH replication = {'rf': 3} AND tablets = {'initial': 4}")
    run(cluster, "n1", "CREATE TABLE av.t (k bigint, i int, d double, b boolean, s text, ts timestamp, "
                       "PRIMARY KEY (k))")
    values = pa.table({
        "k": pa.array([-(2**63), 2**63 - 1, 0, 1, 2], pa.int64()),
        "i": pa.array([-(2**31), 2**31 - 1, None, 0, 5], pa.int32()),
        "d": pa.array([math.nan, -0.0, math.inf, None, 1e-300]),
        "b": pa.array([True, False, None, True, False]),
        "s": pa.array(["é✓ \U0001F600", "", None, "a'b", "x" * 1000]),
        "ts": pa.array([0, 1_700_000_000_000, None, 1, -2], pa.timestamp("ms")),
    })
    insert = "INSERT INTO av.t (k, i, d, b, s, ts) VALUES (?, ?, ?, ?, ?, ?)"
    _, _, message = client.execute(addr(cluster, "n2"), insert, params=values)
    assert message == "ok: 5 statements applied"
    got = {r["k"]: r for r in rows(cluster, "n3", "SELECT k, i, d, b, s, ts FROM av.t")}
    millis = values.column("ts").cast(pa.int64()).to_pylist()  # a CQL timestamp stores milliseconds
    for row, expected_ts in zip(values.to_pylist(), millis):
        stored = got[row["k"]]
        for name in ("i", "b", "s"):
            assert stored[name] == row[name], (name, stored, row)
        expected_d = row["d"]
        assert (math.isnan(stored["d"]) if expected_d is not None and math.isnan(expected_d)
                else stored["d"] == expected_d), (stored, row)
        assert stored["ts"] == expected_ts, (stored, row)


def _replica_row_counts(cluster, keyspace: str, name: str) -> dict[str, int]:
    """Rows held per tablet replica ("tablet/node:shard" -> count), read from each replica's own store."""
    table_id = _table_id(cluster, keyspace, name)
    counts = {}
    for tablet in client.tablets(addr(cluster, "n1"), f"{keyspace}.{name}"):
        for replica in tablet["replicas"]:
            stub = client.internode_stub(addr(cluster, replica.split(":")[0]))
            pages = stub.Scan(pb.ScanRequest(table_id=table_id, first_token=tablet["first_token"],
                                             last_token=tablet["last_token"]), timeout=30)
            counts[f"{tablet['tablet']}/{replica}"] = sum(scan_page_from_proto(page).batch.num_rows for page in pages)
    return counts


@pytest.fixture(scope="module")
def load_table(cluster):
    run(cluster, "n1", "CREATE KEYSPACE ld WITH replication = {'rf': 3} AND tablets = {'initial': 4}")
    run(cluster, "n1", "CREATE TABLE ld.t (k int, c int, v text, d double, ts timestamp, PRIMARY KEY (k, c))")
    run(cluster, "n1", "CREATE MATERIALIZED VIEW ld.mv AS SELECT * FROM ld.t WHERE v IS NOT NULL AND k IS NOT NULL "
                       "AND c IS NOT NULL PRIMARY KEY (v, k, c)")
    client.wait_built(addr(cluster, "n1"), "ld.mv", 120)
    return "ld.t"


def _load(cluster, table: str, path) -> int:
    from vbc import cli
    return cli.main(["load", "--addr", addr(cluster, "n2"), table, str(path), "--quiet", "--batch-rows", "1000"])


def test_vbc_load_of_csv_and_parquet_fills_base_and_view_on_every_replica(cluster, load_table, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    total = 10_000

    def part(start: int, stop: int) -> pa.Table:
        ids = range(start, stop)
        return pa.table({"k": [i // 10 for i in ids], "c": [i % 10 for i in ids], "v": [f"v{i}é" for i in ids],
                         "d": [i / 7 for i in ids], "ts": [1_700_000_000_000 + i for i in ids]})

    pacsv.write_csv(part(0, total // 2), tmp_path / "first.csv")
    pq.write_table(part(total // 2, total), tmp_path / "second.parquet", row_group_size=1500)
    assert _load(cluster, load_table, tmp_path / "first.csv") == 0
    assert "loaded 5,000 rows into ld.t" in capsys.readouterr().out
    assert _load(cluster, load_table, tmp_path / "second.parquet") == 0
    assert _load(cluster, load_table, tmp_path / "second.parquet") == 0, "loading again is harmless"
    assert rows(cluster, "n3", "SELECT COUNT(*) FROM ld.t") == [{"count": total}]
    assert rows(cluster, "n1", "SELECT v, d, ts FROM ld.t WHERE k = 777 AND c = 3") == [
        {"v": "v7773é", "d": 7773 / 7, "ts": 1_700_000_007_773}]
    wait_views_flushed(cluster)
    assert sum(_replica_row_counts(cluster, "ld", "t").values()) == 3 * total
    assert sum(_replica_row_counts(cluster, "ld", "mv").values()) == 3 * total
    report = client.check(addr(cluster, "n1"), "ld.mv", 3, 300)
    assert report["consistent"], report


BAD_FILES = [
    ("unknown.csv", "k,c,nope\n1,1,x\n", "unknown column 'nope'"),
    ("nokey.csv", "k,v\n1,x\n", "lacks primary key column(s) c of ld.t"),
    ("badint.csv", "k,c,v\n1,1,a\n2,2,b\n3,x3,c\n", "data row 3 (line 4), column 'c': 'x3' does not convert to int"),
    ("overflow.csv", "k,c\n1,1\n99999999999,2\n", "data row 2 (line 3), column 'k': '99999999999' does not convert to int"),
    ("nullkey.csv", "k,c,v\n1,1,a\n2,,b\n", "data row 2 (line 3), column 'c': primary key columns cannot be NULL"),
    ("good.csv", "k,c,v\n1,1,a\n", None),  # a good file: the table takes rows
    ("text.txt.gz", "", "unknown file type .gz"),
]


@pytest.mark.parametrize("name, content, words", BAD_FILES)
def test_vbc_load_refuses_a_bad_file_with_nothing_written(cluster, tmp_path, capsys, name, content, words):
    run(cluster, "n1", "CREATE KEYSPACE IF NOT EXISTS lb WITH replication = {'rf': 3} AND tablets = {'initial': 2}")
    run(cluster, "n1", "CREATE TABLE IF NOT EXISTS lb.t (k int, c int, v text, PRIMARY KEY (k, c))")
    before = rows(cluster, "n1", "SELECT COUNT(*) FROM lb.t")[0]["count"]
    path = tmp_path / name
    path.write_text(content)
    status = _load(cluster, "lb.t", path)
    err = capsys.readouterr().err
    if words is None:
        assert status == 0, err
        return
    assert status == 1 and words.replace("ld.t", "lb.t") in err and "nothing was written" in err, err
    assert rows(cluster, "n1", "SELECT COUNT(*) FROM lb.t")[0]["count"] == before


def test_vbc_load_refuses_a_bad_parquet_value_naming_row_group_and_row(cluster, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    run(cluster, "n1", "CREATE KEYSPACE IF NOT EXISTS lb WITH replication = {'rf': 3} AND tablets = {'initial': 2}")
    run(cluster, "n1", "CREATE TABLE IF NOT EXISTS lb.t (k int, c int, v text, PRIMARY KEY (k, c))")
    before = rows(cluster, "n1", "SELECT COUNT(*) FROM lb.t")[0]["count"]
    values = pa.table({"k": pa.array(list(range(100, 110)) + [2**40], pa.int64()), "c": [1] * 11})
    pq.write_table(values, tmp_path / "wide.parquet", row_group_size=4)
    assert _load(cluster, "lb.t", tmp_path / "wide.parquet") == 1
    err = capsys.readouterr().err
    assert "row group 2, row 3, column 'k': 1099511627776 does not convert to int" in err and "nothing was written" in err, err
    assert rows(cluster, "n1", "SELECT COUNT(*) FROM lb.t")[0]["count"] == before
