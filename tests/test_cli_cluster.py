"""The `vbc` command line against a real 3-node cluster started with `vbc cluster up --detach`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def vbc(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "vbc", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"vbc {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


@pytest.fixture
def cluster_dir(tmp_path):
    """A detached cluster; every node pid in cluster.json is killed afterwards, whatever happened."""
    data_dir = tmp_path / "cluster"
    try:
        vbc("cluster", "up", "--nodes", "3", "--data-dir", str(data_dir), "--detach")
        yield data_dir
    finally:
        cluster_file = data_dir / "cluster.json"
        pids = [n.get("pid") for n in json.loads(cluster_file.read_text())["nodes"]] if cluster_file.exists() else []
        subprocess.run([sys.executable, "-m", "vbc", "cluster", "down", "--data-dir", str(data_dir)],
                       capture_output=True, timeout=60)
        for pid in filter(None, pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_cluster_up_exec_status_tablets_inject_down(cluster_dir):
    described = json.loads((cluster_dir / "cluster.json").read_text())
    assert [n["id"] for n in described["nodes"]] == ["n1", "n2", "n3"]
    assert all({"id", "grpc", "raft", "pid", "data_dir"} <= set(n) for n in described["nodes"])
    d = str(cluster_dir)
    vbc("exec", "--cluster", d, "CREATE KEYSPACE ks WITH replication = {'rf': 3} AND tablets = {'initial': 8}")
    vbc("exec", "--cluster", d, "CREATE TABLE ks.t (key int, c int, v text, PRIMARY KEY (key, c))")
    for node in ("n1", "n2", "n3"):  # whichever leads: its view building loop dispatches nothing until released
        vbc("inject", "--cluster", d, "--node", node, "coordinator_pause_main_loop", "--enable", "--mode", "pause")
    vbc("exec", "--cluster", d, "CREATE MATERIALIZED VIEW ks.mv AS SELECT * FROM ks.t WHERE c IS NOT NULL "
                                "AND key IS NOT NULL PRIMARY KEY (c, key)")
    vbc("exec", "--addr", described["nodes"][1]["grpc"], "--credentials", str(cluster_dir / "credentials"),
        "INSERT INTO ks.t (key, c, v) VALUES (1, 2, 'x')")
    vbc("exec", "--cluster", d, "UPDATE ks.t SET v = 'y' WHERE key = 1 AND c = 2")
    out = vbc("exec", "--cluster", d, "--json", "SELECT * FROM ks.mv ALLOW STALE").stdout
    assert [json.loads(line) for line in out.splitlines()] == [{"c": 2, "key": 1, "v": "y"}]

    refused = vbc("exec", "--cluster", d, "SELECT * FROM ks.mv", check=False)
    assert refused.returncode != 0 and "FAILED_PRECONDITION" in refused.stderr and "being built" in refused.stderr

    status = json.loads(vbc("status", "--cluster", d, "--json").stdout)
    assert status["leader"] in {"n1", "n2", "n3"} and status["term"] >= 1
    assert [(n["id"], n["alive"]) for n in status["nodes"]] == [("n1", True), ("n2", True), ("n3", True)]
    assert all(set(n) >= {"id", "grpc", "alive"} for n in status["nodes"])
    (view,) = status["views"]
    assert {k: view[k] for k in ("name", "base", "state", "tasks_total", "tasks_done")} == {
        "name": "ks.mv", "base": "ks.t", "state": "BUILDING", "tasks_total": 24, "tasks_done": 0}
    assert view["progress"] == 0.0 and view["hosts"] == {"n1": "STARTED", "n2": "STARTED", "n3": "STARTED"}
    timed_out = vbc("wait-built", "--cluster", d, "ks.mv", "--timeout", "0.5", check=False)
    assert timed_out.returncode == 1 and "not built after 0.5s: 0/24 tasks" in timed_out.stderr
    for node in ("n1", "n2", "n3"):
        vbc("inject", "--cluster", d, "--node", node, "coordinator_pause_main_loop", "--disable")
    assert "ks.mv is built (24 tasks" in vbc("wait-built", "--cluster", d, "ks.mv", "--timeout", "90").stdout
    out = vbc("exec", "--cluster", d, "--json", "SELECT * FROM ks.mv").stdout
    assert [json.loads(line) for line in out.splitlines()] == [{"c": 2, "key": 1, "v": "y"}]
    checked = json.loads(vbc("check", "--cluster", d, "ks.mv", "--json").stdout)
    assert checked["consistent"] and checked["base_rows"] == 3 and checked["view_rows"] == 3
    assert vbc("wait-built", "--cluster", d, "ks.nope", check=False).returncode == 1

    tablets = [json.loads(line) for line in vbc("tablets", "--cluster", d, "--json", "ks.t").stdout.splitlines()]
    assert [t["tablet"] for t in tablets] == list(range(8))
    assert tablets[0]["first_token"] == -(2**63) and tablets[-1]["last_token"] == 2**63 - 1
    assert all(len(t["replicas"]) == 3 and all(":" in r for r in t["replicas"]) for t in tablets)

    vbc("inject", "--cluster", d, "--node", "n2", "write.replica.before_apply", "--enable", "--one-shot",
        "--mode", "fail")
    failed = vbc("exec", "--cluster", d, "INSERT INTO ks.t (key, c, v) VALUES (2, 2, 'z')", check=False)
    assert failed.returncode != 0 and "UNAVAILABLE" in failed.stderr and "injected failure" in failed.stderr
    assert vbc("inject", "--cluster", d, "--node", "n2", "write.replica.before_apply", "--wait-hit", "5").returncode == 0
    vbc("exec", "--cluster", d, "INSERT INTO ks.t (key, c, v) VALUES (2, 2, 'z')")  # one-shot: the retry works
    not_hit = vbc("inject", "--cluster", d, "--node", "n3", "view_update.receive", "--wait-hit", "0.5", check=False)
    assert not_hit.returncode == 1

    vbc("cluster", "stop-node", "--data-dir", d, "n3")
    rows = vbc("exec", "--cluster", d, "--json", "SELECT * FROM ks.t").stdout.splitlines()
    assert len(rows) == 2  # reads fall back to live replicas
    vbc("cluster", "start-node", "--data-dir", d, "n3")
    assert vbc("exec", "--cluster", d, "--params", '[[3, 2, "p"], [4, 2, "q"]]',
               "INSERT INTO ks.t (key, c, v) VALUES (?, ?, ?)").stdout.strip() == "ok: 2 statements applied"
    out = vbc("exec", "--cluster", d, "--json", "--params", "[[4]]", "SELECT v FROM ks.t WHERE key = ?").stdout
    assert json.loads(out) == {"v": "q"}
    bad = vbc("exec", "--cluster", d, "--params", "{}", "SELECT * FROM ks.t", check=False)
    assert bad.returncode == 2 and "list of lists" in bad.stderr
    vbc("cluster", "down", "--data-dir", d)
    assert all(n["pid"] is None for n in json.loads((cluster_dir / "cluster.json").read_text())["nodes"])


def test_single_node_serves_prometheus_metrics_and_stops_on_sigterm(tmp_path):
    import urllib.request

    from vbc import client
    from vbc.cluster import free_port

    grpc_addr, raft_addr, metrics_addr = (f"127.0.0.1:{free_port()}" for _ in range(3))
    node = subprocess.Popen([sys.executable, "-m", "vbc", "node", "start", "--id", "n1", "--data-dir", str(tmp_path),
                             "--grpc", grpc_addr, "--raft", raft_addr, "--metrics", metrics_addr, "--insecure"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "VBC_RAFT_PASSWORD": "a secret of this test"})
    try:
        from .cluster_harness import wait_until

        wait_until(lambda: client.status(grpc_addr)["leader"] == "n1", timeout=30, message="single node not ready")
        client.execute(grpc_addr, "CREATE KEYSPACE m WITH replication = {'rf': 1} AND tablets = {'initial': 2}")
        client.execute(grpc_addr, "CREATE TABLE m.t (a int, b int, PRIMARY KEY (a))")
        client.execute(grpc_addr, "INSERT INTO m.t (a, b) VALUES (1, 2)")
        text = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=5).read().decode()
        assert 'vbc_statements_total{kind="Insert"} 1.0' in text
        assert 'vbc_rows_applied_total{role="base"} 1.0' in text and "vbc_raft_is_leader 1.0" in text
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=30) == 0
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()


def test_every_statement_form_through_vbc_exec(cluster_dir):
    d = str(cluster_dir)

    def ok(statement: str) -> str:
        return vbc("exec", "--cluster", d, statement).stdout.strip()

    def rows(statement: str) -> list[dict]:
        return [json.loads(line) for line in vbc("exec", "--cluster", d, "--json", statement).stdout.splitlines()]

    assert ok("CREATE KEYSPACE ks WITH replication = {'rf': 3} AND tablets = {'initial': 8}") == "created keyspace ks"
    assert "nothing done" in ok("CREATE KEYSPACE IF NOT EXISTS ks WITH replication = {'rf': 3}")
    assert ok("ALTER KEYSPACE ks WITH replication = {'rf': 2}") == "altered keyspace ks"
    ok("CREATE TABLE ks.t (key int, c int, v text, PRIMARY KEY (key, c))")
    assert ok("ALTER KEYSPACE ks WITH replication = {'rf': 2}") == "altered keyspace ks"  # nothing to move
    refused = vbc("exec", "--cluster", d, "ALTER KEYSPACE ks WITH replication = {'rf': 4}", check=False)
    assert refused.returncode == 1 and "INVALID_ARGUMENT: replication factor 4 exceeds" in refused.stderr
    ok("CREATE TABLE IF NOT EXISTS ks.comp (a int, b text, c bigint, d boolean, e double, f timestamp, "
       "PRIMARY KEY ((a, b), c))")
    ok("CREATE MATERIALIZED VIEW ks.mv AS SELECT * FROM ks.t WHERE c IS NOT NULL AND key IS NOT NULL PRIMARY KEY (c, key)")
    ok("CREATE INDEX t_v ON ks.t (v)")
    ok("CREATE INDEX ON ks.comp (d)")
    ok("INSERT INTO ks.t (key, c, v) VALUES (1, 10, 'a') USING TIMESTAMP 1000")
    ok("INSERT INTO ks.t (key, c, v) VALUES (1, 10, 'older') USING TIMESTAMP 999")  # loses: older timestamp
    ok("UPDATE ks.t SET v = 'b' WHERE key = 1 AND c = 10")
    ok("INSERT INTO ks.comp (a, b, c, d, e, f) VALUES (1, 'x', 5, true, 2.5, '2024-05-01 12:00:00+0000')")
    ok("BEGIN BATCH INSERT INTO ks.t (key, c, v) VALUES (2, 20, 'c'); INSERT INTO ks.t (key, c, v) VALUES (3, 30, 'd'); "
       "DELETE FROM ks.t WHERE key = 3 AND c = 30 APPLY BATCH")
    assert rows("SELECT key, v FROM ks.t WHERE key = 1") == [{"key": 1, "v": "b"}]
    assert len(rows("SELECT * FROM ks.t LIMIT 1")) == 1
    assert sorted(r["key"] for r in rows("SELECT * FROM ks.t")) == [1, 2]
    assert rows("SELECT * FROM ks.comp WHERE a = 1 AND b = 'x'") == [
        {"a": 1, "b": "x", "c": 5, "d": True, "e": 2.5, "f": 1714564800000}]
    assert sorted(r["c"] for r in rows("SELECT * FROM ks.mv ALLOW STALE")) == [10, 20]
    assert rows("SELECT key FROM ks.t_v WHERE v = 'b' ALLOW STALE") == [{"key": 1}]
    ok("DELETE FROM ks.t WHERE key = 2 AND c = 20")
    assert rows("SELECT COUNT(*) FROM ks.t") == [{"count": 1}]
    assert ok("DROP INDEX ks.t_v") == "dropped index ks.t_v"
    assert "nothing done" in ok("DROP INDEX IF EXISTS ks.t_v")
    assert ok("DROP MATERIALIZED VIEW ks.mv") == "dropped materialized view ks.mv"
    assert "nothing done" in ok("DROP MATERIALIZED VIEW IF EXISTS ks.mv")
    assert ok("DROP TABLE ks.t") == "dropped table ks.t"
    assert "nothing done" in ok("DROP TABLE IF EXISTS ks.t")
    assert ok("DROP KEYSPACE ks") == "dropped keyspace ks"
    assert "nothing done" in ok("DROP KEYSPACE IF EXISTS ks")
    assert json.loads(vbc("status", "--cluster", d, "--json").stdout)["views"] == []


def test_a_node_without_enable_injections_refuses_vbc_inject(tmp_path):
    from .cluster_harness import LocalCluster

    with LocalCluster(nodes=1, data_dir=tmp_path / "cluster", injections=False) as cluster:
        d = str(cluster.data_dir)
        refused = vbc("inject", "--cluster", d, "read.replica.scan", "--enable", check=False)
        assert refused.returncode == 1
        assert refused.stderr == ("error: PERMISSION_DENIED: fault injection is disabled on node n1: "
                                  "start the node with --enable-injections\n")
        listed = json.loads(vbc("inject", "--cluster", d, "--list", "--json").stdout)
        assert listed["injections_enabled"] is False and not any(p["enabled"] for p in listed["points"])
        assert "fault injection is enabled" not in cluster.log("n1")
