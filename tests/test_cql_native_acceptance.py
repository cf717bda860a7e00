"""CQL's native protocol on real nodes, driven by the Python driver (cassandra-driver): TLS and password logins, the
system tables the driver reads on connect, DDL, writes, prepared statements, batches, paging over 3 nodes, USE, a
view and an index, roles, and frames that break the protocol."""
from __future__ import annotations

import os
import socket
import ssl
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from cassandra import AuthenticationFailed, InvalidRequest, Unauthorized
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.policies import RoundRobinPolicy
from cassandra.query import BatchStatement, SimpleStatement

from tests.cluster_harness import LocalCluster, wait_until

pytestmark = pytest.mark.integration

ROOT_PASSWORD = "root's own, given"


def tls_context(cluster: LocalCluster) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(str(cluster.data_dir / "credentials" / "ca.crt"))
    context.check_hostname = False  # the node's certificate names 127.0.0.1 and localhost; the driver passes no name
    return context


def cql_port(cluster: LocalCluster, node: str = "n1") -> int:
    return int(cluster.node(node)["cql"].rsplit(":", 1)[1])


def connect(cluster: LocalCluster, user: str = "root", password: str = ROOT_PASSWORD, node: str = "n1") -> Cluster:
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=60)
    return Cluster(["127.0.0.1"], port=cql_port(cluster, node), ssl_context=tls_context(cluster),
                   auth_provider=PlainTextAuthProvider(user, password), protocol_version=4,
                   execution_profiles={EXEC_PROFILE_DEFAULT: profile}, connect_timeout=20,
                   control_connection_timeout=20)


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(nodes=3, secure=True, root_password=ROOT_PASSWORD) as running:
        yield running


@pytest.fixture(scope="module")
def session(cluster):
    driver = connect(cluster)
    try:
        yield driver.connect()
    finally:
        driver.shutdown()


def test_the_driver_logs_in_over_tls_and_finds_every_node_from_the_system_tables(cluster, session):
    hosts = session.cluster.metadata.all_hosts()
    assert sorted(h.endpoint.port for h in hosts) == sorted(cql_port(cluster, n) for n in ("n1", "n2", "n3"))
    assert all(h.is_up for h in hosts)
    local = session.execute("SELECT cluster_name, release_version, partitioner FROM system.local WHERE key='local'").one()
    assert local.release_version.startswith("4.") and local.partitioner == "vbc.TabletPartitioner"
    assert session.cluster.metadata.token_map is None  # an unknown partitioner: no token-aware routing


def test_statements_prepared_statements_batches_and_use(cluster, session):
    session.execute("CREATE KEYSPACE cq WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 2}")
    session.execute("CREATE TABLE cq.t (k int, c int, v text, d double, b boolean, PRIMARY KEY (k, c))")
    assert "t" in session.cluster.metadata.keyspaces["cq"].tables  # the driver's schema metadata from system_schema
    table = session.cluster.metadata.keyspaces["cq"].tables["t"]
    assert [c.name for c in table.partition_key] == ["k"] and [c.name for c in table.clustering_key] == ["c"]

    session.execute("INSERT INTO cq.t (k, c, v, d, b) VALUES (1, 1, 'one', 1.5, true)")
    insert = session.prepare("INSERT INTO cq.t (k, c, v, d, b) VALUES (?, ?, ?, ?, ?)")
    for k in range(2, 6):
        session.execute(insert, (k, k, f"v{k}", k / 2, k % 2 == 0))
    batch = BatchStatement()
    batch.add(insert, (6, 6, "six", 3.0, True))
    batch.add(SimpleStatement("UPDATE cq.t SET v = 'uno' WHERE k = 1 AND c = 1"))
    session.execute(batch)

    select = session.prepare("SELECT v, d, b FROM cq.t WHERE k = ? AND c = ?")
    assert select.routing_key_indexes == [0]  # the partition key's position among the bind markers
    row = session.execute(select, (6, 6)).one()
    assert (row.v, row.d, row.b) == ("six", 3.0, True)
    assert session.execute(select, (1, 1)).one().v == "uno"

    session.execute("USE cq")
    assert session.keyspace == "cq"
    assert sorted(r.k for r in session.execute("SELECT k FROM t")) == [1, 2, 3, 4, 5, 6]
    with pytest.raises(InvalidRequest, match="keyspace"):
        session.execute("USE nowhere")


def test_paging_over_three_nodes(cluster, session):
    session.execute("CREATE KEYSPACE pg WITH replication = {'replication_factor': 3} AND tablets = {'initial': 4}")
    session.execute("CREATE TABLE pg.t (k int PRIMARY KEY, v text)")
    insert = session.prepare("INSERT INTO pg.t (k, v) VALUES (?, ?)")
    for k in range(250):
        session.execute(insert, (k, str(k)))
    result = session.execute(SimpleStatement("SELECT k, v FROM pg.t", fetch_size=40))
    pages = 1
    first = list(result.current_rows)
    assert len(first) == 40 and result.has_more_pages
    rows = first
    while result.has_more_pages:
        result.fetch_next_page()
        rows += result.current_rows
        pages += 1
    assert sorted(r.k for r in rows) == list(range(250)) and pages >= 7


def test_a_view_is_built_and_read_and_an_index_serves_a_base_query(cluster, session):
    session.execute("CREATE KEYSPACE mv WITH replication = {'replication_factor': 2}")
    session.execute("CREATE TABLE mv.t (k int PRIMARY KEY, a int, v text)")
    insert = session.prepare("INSERT INTO mv.t (k, a, v) VALUES (?, ?, ?)")
    for k in range(60):
        session.execute(insert, (k, k % 6, f"v{k}"))
    session.execute("CREATE MATERIALIZED VIEW mv.by_a AS SELECT * FROM mv.t WHERE a IS NOT NULL AND k IS NOT NULL "
                    "PRIMARY KEY (a, k)")
    session.execute("CREATE INDEX v_idx ON mv.t (v)")
    cluster.wait_view_built("mv.by_a", timeout=120)
    cluster.wait_view_built("mv.v_idx", timeout=120)
    assert sorted(r.k for r in session.execute("SELECT k FROM mv.by_a WHERE a = 3")) == list(range(3, 60, 6))
    assert [r.k for r in session.execute("SELECT k FROM mv.t WHERE v = 'v17'")] == [17]
    metadata = session.cluster.metadata.keyspaces["mv"]
    assert "by_a" in metadata.views and "v_idx" in metadata.tables["t"].indexes


def test_roles_a_refused_grant_and_a_wrong_password(cluster, session):
    session.execute("CREATE KEYSPACE rk WITH replication = {'replication_factor': 1}")
    session.execute("CREATE TABLE rk.t (k int PRIMARY KEY, v text)")
    session.execute("INSERT INTO rk.t (k, v) VALUES (1, 'one')")
    session.execute("CREATE ROLE bob WITH PASSWORD = 'b0b-secret' AND LOGIN = true")
    session.execute("GRANT SELECT ON KEYSPACE rk TO bob")
    bob = connect(cluster, "bob", "b0b-secret", node="n2")
    try:
        as_bob = bob.connect()
        assert [r.v for r in as_bob.execute("SELECT v FROM rk.t WHERE k = 1")] == ["one"]
        with pytest.raises(Unauthorized, match="MODIFY"):
            as_bob.execute("INSERT INTO rk.t (k, v) VALUES (2, 'two')")
        with pytest.raises(Unauthorized):
            as_bob.execute("GRANT MODIFY ON KEYSPACE rk TO bob")
    finally:
        bob.shutdown()
    wrong = connect(cluster, "bob", "not it")
    try:
        with pytest.raises(NoHostAvailable) as refused:
            wrong.connect()
        assert any(isinstance(e, AuthenticationFailed) for e in refused.value.errors.values())
    finally:
        wrong.shutdown()


def raw_connection(cluster: LocalCluster) -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", cql_port(cluster)), timeout=20)
    return tls_context(cluster).wrap_socket(sock)


def read_frame(sock: ssl.SSLSocket) -> tuple[int, bytes]:
    header = b""
    while len(header) < 9:
        header += sock.recv(9 - len(header))
    _, _, _, opcode, length = struct.unpack(">BBhBi", header)
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return opcode, body


def test_a_malformed_and_an_oversized_frame_close_their_connection_and_the_node_goes_on(cluster, session):
    malformed = raw_connection(cluster)
    malformed.sendall(struct.pack(">BBhBi", 4, 0, 1, 0x01, 3) + b"\x00\x05x")  # STARTUP with a broken string map
    opcode, body = read_frame(malformed)
    assert opcode == 0x00 and struct.unpack(">i", body[:4])[0] == 0x000A
    assert malformed.recv(1) == b""  # closed by the node
    oversized = raw_connection(cluster)
    oversized.sendall(struct.pack(">BBhBi", 4, 0, 2, 0x07, 64 * 1024 * 1024))  # a QUERY above 16 MiB
    opcode, body = read_frame(oversized)
    assert opcode == 0x00 and b"limit" in body
    assert oversized.recv(1) == b""
    assert session.execute("SELECT key FROM system.local WHERE key='local'").one().key == "local"


SCYLLA_DRIVER = Path(sys.executable).parent.parent / "scylla-driver"
SCYLLA_SCRIPT = """
import ssl, sys
import cassandra
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import DCAwareRoundRobinPolicy
from cassandra.query import SimpleStatement
assert "scylla-driver" in cassandra.__file__, cassandra.__file__
port, ca, password = int(sys.argv[1]), sys.argv[2], sys.argv[3]
context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
context.load_verify_locations(ca)
context.check_hostname = False
# its default TokenAwarePolicy needs a token ring, which a cluster of tablets does not describe (see the README)
profile = ExecutionProfile(load_balancing_policy=DCAwareRoundRobinPolicy())
cluster = Cluster(["127.0.0.1"], port=port, ssl_context=context, protocol_version=4,
                  auth_provider=PlainTextAuthProvider("root", password),
                  execution_profiles={EXEC_PROFILE_DEFAULT: profile})
session = cluster.connect()
session.execute("CREATE KEYSPACE sd WITH replication = {'class': 'NetworkTopologyStrategy', 'datacenter1': 2}")
session.execute("USE sd")
session.execute("CREATE TABLE t (k int, c int, v text, PRIMARY KEY (k, c))")
insert = session.prepare("INSERT INTO t (k, c, v) VALUES (?, ?, ?)")
for i in range(120):
    session.execute(insert, (i % 7, i, str(i)))
rows = list(session.execute(SimpleStatement("SELECT k, c, v FROM t", fetch_size=25)))
print(len(rows), len(cluster.metadata.all_hosts()), session.execute("SELECT v FROM t WHERE k = 3 AND c = 10").one().v)
cluster.shutdown()
"""


def test_scyllas_driver_connects_writes_and_pages_through_every_node(cluster, tmp_path):
    script = tmp_path / "scylla_client.py"
    script.write_text(SCYLLA_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(cql_port(cluster, "n3")),
                           str(cluster.data_dir / "credentials" / "ca.crt"), ROOT_PASSWORD],
                          env={**os.environ, "PYTHONPATH": str(SCYLLA_DRIVER)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["120", "3", "10"]


def test_cqlsh_runs_statements_describes_and_copies_to_a_file(cluster, session, tmp_path):
    session.execute("CREATE KEYSPACE sh WITH replication = {'replication_factor': 2}")
    session.execute("CREATE TABLE sh.t (k int PRIMARY KEY, v text)")
    for k in range(30):
        session.execute("INSERT INTO sh.t (k, v) VALUES (%s, %s)", (k, f"v{k}"))
    vbc_cql = [sys.executable, "-m", "vbc", "cql", "--cluster", str(cluster.data_dir), "--"]
    described = subprocess.run([*vbc_cql, "-e", "DESCRIBE KEYSPACE sh; SELECT * FROM sh.t WHERE k = 7"],
                               capture_output=True, text=True, timeout=120)
    assert described.returncode == 0, described.stderr
    assert "CREATE TABLE sh.t (" in described.stdout and "v7" in described.stdout
    out = tmp_path / "t.csv"
    copied = subprocess.run([*vbc_cql, "-e", f"COPY sh.t TO '{out}'"], capture_output=True, text=True, timeout=120)
    assert copied.returncode == 0, copied.stderr
    assert sorted(line.split(",")[0] for line in out.read_text().splitlines()) == sorted(str(k) for k in range(30))
    statements = [r.create_statement for r in session.execute("DESCRIBE KEYSPACE sh")]
    session.execute("DROP KEYSPACE sh")
    for statement in statements:  # what DESCRIBE wrote makes the schema again
        session.execute(statement)
    assert session.cluster.metadata.keyspaces["sh"].tables["t"].primary_key[0].name == "k"
    exported = session.cluster.metadata.keyspaces["sh"].export_as_string()  # the driver's own CREATE statements
    session.execute("DROP KEYSPACE sh")
    for statement in filter(None, (part.strip() for part in exported.split(";\n"))):
        session.execute(statement)
    assert "t" in session.cluster.metadata.keyspaces["sh"].tables


def test_a_killed_node_the_driver_fails_over_and_the_application_goes_on(tmp_path):
    with LocalCluster(nodes=3, secure=True, root_password=ROOT_PASSWORD, spark_prestart=False) as three:
        driver = connect(three, node="n1")
        try:
            session = driver.connect()
            session.execute("CREATE KEYSPACE fo WITH replication = {'replication_factor': 3}")
            session.execute("CREATE TABLE fo.t (k int PRIMARY KEY, v int)")
            insert = session.prepare("INSERT INTO fo.t (k, v) VALUES (?, ?)")
            select = session.prepare("SELECT v FROM fo.t WHERE k = ?")
            for k in range(50):
                session.execute(insert, (k, k))
            three.stop_node("n1", kill=True)  # the driver's first contact and control connection
            read = [session.execute(select, (k % 50,)).one().v for k in range(200)]
            assert read == [k % 50 for k in range(200)]
            three.start_node("n1")
            wait_until(lambda: written(session, insert, 1000), timeout=60, message="writes succeed again")
            assert session.execute(select, (1000,)).one().v == 1000
        finally:
            driver.shutdown()


def written(session, insert, k: int) -> bool:
    try:
        session.execute(insert, (k, k))
        return True
    except Exception:  # noqa: BLE001 - UNAVAILABLE until every replica is back
        return False


def test_every_kind_of_statement_of_the_grpc_path(cluster, session):
    run = session.execute
    run("CREATE KEYSPACE IF NOT EXISTS every WITH replication = {'replication_factor': 2} AND tablets = {'initial': 2}")
    run("ALTER KEYSPACE every WITH replication = {'replication_factor': 3}")
    run("CREATE TABLE every.t (k int, c int, v text, PRIMARY KEY (k, c))")
    run("ALTER TABLE every.t ADD (n bigint, flag boolean, at timestamp)")
    run("INSERT INTO every.t (k, c, v, n, flag, at) VALUES (1, 1, 'a', 10, true, '2026-01-02 03:04:05+0000') "
        "USING TIMESTAMP 1000")
    run("UPDATE every.t SET v = 'b', n = 20 WHERE k = 1 AND c = 2")
    run("BEGIN UNLOGGED BATCH INSERT INTO every.t (k, c, v) VALUES (2, 1, 'c'); DELETE FROM every.t WHERE k = 1 AND "
        "c = 1; APPLY BATCH")
    assert sorted((r.k, r.c, r.v) for r in run("SELECT k, c, v FROM every.t")) == [(1, 2, "b"), (2, 1, "c")]
    counted = run("SELECT COUNT(*), MIN(c), MAX(n) FROM every.t").one()
    assert tuple(counted) == (2, 1, 20)
    assert [r.v for r in run("SELECT v FROM every.t WHERE k IN (1, 2) AND c = 2")] == ["b"]
    run("CREATE INDEX every_v ON every.t (v)")
    run("CREATE MATERIALIZED VIEW every.by_c AS SELECT * FROM every.t WHERE c IS NOT NULL AND k IS NOT NULL "
        "PRIMARY KEY (c, k)")
    run("CREATE ROLE carol WITH PASSWORD = 'c4rol-pw' AND LOGIN = true")
    run("ALTER ROLE carol WITH LOGIN = false")
    run("GRANT SELECT ON TABLE every.t TO carol")
    assert any(r.permission == "SELECT" for r in run("LIST ALL PERMISSIONS OF carol"))
    run("REVOKE SELECT ON TABLE every.t FROM carol")
    assert "carol" in {r.role for r in run("LIST ROLES")}
    run("DROP ROLE carol")
    run("DROP MATERIALIZED VIEW every.by_c")
    run("DROP INDEX every.every_v")
    run("DROP TABLE every.t")
    run("DROP KEYSPACE every")
    assert "every" not in session.cluster.metadata.keyspaces
