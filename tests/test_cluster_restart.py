"""Integration tests of failures: leader kill -9 and restart, and a full cluster stop and start."""
from __future__ import annotations

import grpc
import pytest

from vbc import client

from .cluster_harness import LocalCluster

pytestmark = pytest.mark.integration


def addr(cluster, node_id: str) -> str:
    return next(n["grpc"] for n in cluster.nodes if n["id"] == node_id)


def live_status(cluster, exclude=()):
    addresses = [n["grpc"] for n in cluster.nodes if n["id"] not in exclude]
    return client.status(addresses)


def snapshot(cluster, node_id: str, tables: list[str]) -> dict:
    """Schema, tablets and rows as one node serves them."""
    status = client.status(addr(cluster, node_id))
    return {
        "views": sorted((v["name"], v["base"], v["tasks_total"]) for v in status["views"]),
        "nodes": sorted(n["id"] for n in status["nodes"]),
        "tablets": {t: client.tablets(addr(cluster, node_id), t) for t in tables},
        "rows": {t: client.query(addr(cluster, node_id), f"SELECT * FROM {t} ALLOW STALE") for t in tables},
    }


def seed_data(cluster, node_id: str = "n1") -> list[str]:
    a = addr(cluster, node_id)
    client.execute(a, "CREATE KEYSPACE ks WITH replication = {'rf': 3} AND tablets = {'initial': 4}")
    client.execute(a, "CREATE TABLE ks.t (key int, c int, v text, PRIMARY KEY (key, c))")
    client.execute(a, "CREATE MATERIALIZED VIEW ks.mv AS SELECT * FROM ks.t WHERE c IS NOT NULL AND key IS NOT NULL PRIMARY KEY (c, key)")
    client.execute(a, "BEGIN BATCH " + " ".join(
        f"INSERT INTO ks.t (key, c, v) VALUES ({i}, {i % 7}, 'v{i}');" for i in range(300)) + " APPLY BATCH")
    return ["ks.t", "ks.mv"]


def test_leader_kill_9_then_restart_keeps_ddl_working_and_loses_nothing(tmp_path):
    with LocalCluster(3, tmp_path) as cluster:
        tables = seed_data(cluster)
        before = snapshot(cluster, "n1", tables)
        leader = client.status(addr(cluster, "n1"))["leader"]
        cluster.stop_node(leader, kill=True)
        survivors = [n["id"] for n in cluster.nodes if n["id"] != leader]
        cluster.wait_until(lambda: live_status(cluster, exclude=[leader])["leader"] in survivors, timeout=30,
                           message="no new leader after kill -9")
        _, _, created = client.execute(addr(cluster, survivors[0]), "CREATE TABLE ks.after (k int, PRIMARY KEY (k))")
        assert created.startswith("created table ks.after; not yet confirmed by ")
        assert f"not yet confirmed by {leader}: " in created and survivors[1] not in created  # the dead node only
        client.execute(addr(cluster, survivors[1]), "CREATE INDEX ON ks.t (v)")
        cluster.start_node(leader)
        cluster.wait_until(lambda: _sees(cluster, leader, "ks.t_v_idx"), timeout=30,
                           message="restarted node did not catch up with the schema")
        after = snapshot(cluster, leader, tables)
        assert after["rows"] == before["rows"] and after["tablets"] == before["tablets"]
        assert client.query(addr(cluster, leader), "SELECT * FROM ks.after") == []
        client.execute(addr(cluster, leader), "INSERT INTO ks.t (key, c, v) VALUES (1000, 1, 'new')")
        assert client.query(addr(cluster, survivors[0]), "SELECT v FROM ks.t WHERE key = 1000") == [{"v": "new"}]


def _sees(cluster, node_id: str, view_name: str) -> bool:
    try:
        return any(v["name"] == view_name for v in client.status(addr(cluster, node_id))["views"])
    except grpc.RpcError:
        return False


def test_full_cluster_stop_and_start_keeps_schema_tablets_and_rows(tmp_path):
    with LocalCluster(3, tmp_path) as cluster:
        tables = seed_data(cluster, "n2")
        before = {n["id"]: snapshot(cluster, n["id"], tables) for n in cluster.nodes}
        for node in cluster.nodes:
            cluster.stop_node(node["id"])
        for node in cluster.nodes:
            cluster.start_node(node["id"])
        cluster.wait_until(lambda: client.status(addr(cluster, "n1"))["leader"] != "", timeout=30,
                           message="no leader after a full restart")
        for node_id, expected in before.items():
            assert snapshot(cluster, node_id, tables) == expected
        client.execute(addr(cluster, "n3"), "DROP MATERIALIZED VIEW ks.mv")
        cluster.wait_until(lambda: not _sees(cluster, "n1", "ks.mv"), timeout=10, message="drop not visible on n1")
