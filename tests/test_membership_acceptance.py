"""Nodes that join and leave a running cluster, against real node processes: a node added and another
decommissioned during a build (RF 3), a killed node removed with `vbc node remove` during a build, and a removed
node's data directory refused.

The view must end BUILT with `vbc check` clean, every live node must answer a full scan of the base with every
row, and the view's per-node build statuses must name exactly the nodes that hold base replicas.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from vbc import client

from .cluster_harness import LocalCluster, wait_until
from .test_tablet_migration_acceptance import Writer, create_view
from .test_view_building_acceptance import _logs_on_failure, assert_correct, injected, insert_rows, run, wait_hit

pytestmark = pytest.mark.integration

LEAVE_TIMEOUT = 300.0


@pytest.fixture
def cluster(tmp_path, request):
    with LocalCluster(3, tmp_path / "cluster", shards=1) as started:
        with _logs_on_failure(request, started):
            yield started


def vbc(*args: str, timeout: float = LEAVE_TIMEOUT + 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vbc", *args], capture_output=True, text=True, timeout=timeout)


def live_nodes(cluster: LocalCluster) -> list[str]:
    return [n["id"] for n in cluster.nodes if cluster.is_running(n["id"])]


def assert_statuses_follow_the_replicas(cluster: LocalCluster, ks: str) -> None:
    holders = {r.split(":")[0] for t in client.tablets(cluster.addresses(), f"{ks}.tab") for r in t["replicas"]}
    view = client.view_status(cluster.addresses(), f"{ks}.mv")
    assert set(view["hosts"]) == holders, (view["hosts"], holders)


def assert_every_node_scans(cluster: LocalCluster, ks: str, expected: dict) -> None:
    want = sorted((key, c, v) for (key, c), v in expected.items())
    for node in live_nodes(cluster):
        got = sorted((r["key"], r["c"], r["v"]) for r in client.query(cluster.addr(node), f"SELECT * FROM {ks}.tab",
                                                                       timeout=120))
        assert got == want, f"{node}: {len(got)} rows, expected {len(want)}"


def test_nodes_join_leave_and_a_dead_one_is_removed_during_a_build(cluster):
    ks = "mem1"
    run(cluster, f"CREATE KEYSPACE {ks} WITH replication = {{'rf': 3}} AND tablets = {{'initial': 2}}")
    run(cluster, f"CREATE TABLE {ks}.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    insert_rows(cluster, ks, range(1500))
    expected = {(i // 10, i % 10): str(i) for i in range(1500)}
    with injected(cluster, "worker_pause_build_range", ["n1", "n2", "n3"]):
        create_view(cluster, ks)
        wait_hit(cluster, "worker_pause_build_range", "n1")
        added = [cluster.add_node()["id"], cluster.add_node()["id"]]
        assert added == ["n4", "n5"]
        wait_until(lambda: {"n4", "n5"} <= {n["id"] for n in client.status(cluster.addresses())["nodes"]
                                            if n["alive"]}, 120, "n4 and n5 to serve")
        leaving = cluster.wait_for_leader()  # the harder case: a leader cannot take itself out of the Raft group
        dead = next(n for n in ("n1", "n2", "n3") if n != leaving)
        with Writer(cluster, ks, expected, seed=11) as writer:
            left = vbc("node", "decommission", "--cluster", str(cluster.data_dir), leaving)
        assert left.returncode == 0, left.stderr
        assert writer.error is None, writer.error
        assert leaving not in {n["id"] for n in cluster.nodes}
        cluster.stop_node(dead, kill=True)
        removed = vbc("node", "remove", "--cluster", str(cluster.data_dir), dead)
        assert removed.returncode == 0, removed.stderr
    assert client.node_state(cluster.addresses(), leaving)["state"] == "removed"
    holders = {r.split(":")[0] for t in client.tablets(cluster.addresses(), f"{ks}.tab") for r in t["replicas"]}
    assert holders == {"n1", "n2", "n3", "n4", "n5"} - {leaving, dead}
    assert_correct(cluster, ks)
    assert_statuses_follow_the_replicas(cluster, ks)
    assert_every_node_scans(cluster, ks, writer.expected)
    survivor = next(n for n in ("n3", "n4", "n5") if n not in (leaving, dead))
    refused = vbc("node", "start", "--id", dead, "--data-dir", str(cluster.data_dir / dead), "--grpc", "127.0.0.1:1",
                  "--raft", "127.0.0.1:2", "--peers", f"{survivor}={cluster.addr(survivor)}/127.0.0.1:3",
                  "--raft-secret-file", str(cluster.data_dir / "raft.secret"), "--insecure", timeout=60)
    assert refused.returncode == 1 and "was removed from the cluster" in refused.stderr, refused.stderr


def test_leaving_is_refused_when_the_rest_could_not_hold_the_replicas(cluster):
    run(cluster, "CREATE KEYSPACE mem2 WITH replication = {'rf': 3} AND tablets = {'initial': 1}")
    left = vbc("node", "decommission", "--cluster", str(cluster.data_dir), "n1", "--no-wait", timeout=60)
    assert left.returncode == 1 and "FAILED_PRECONDITION" in left.stderr and "rf 3" in left.stderr, left.stderr
    unknown = vbc("node", "decommission", "--cluster", str(cluster.data_dir), "n9", "--no-wait", timeout=60)
    assert unknown.returncode == 1 and "unknown node 'n9'" in unknown.stderr, unknown.stderr


def test_the_balancer_spreads_64_tablets_over_two_new_nodes_during_a_build(cluster):
    ks = "mem3"
    run(cluster, f"CREATE KEYSPACE {ks} WITH replication = {{'rf': 1}} AND tablets = {{'initial': 64}}")
    run(cluster, f"CREATE TABLE {ks}.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    insert_rows(cluster, ks, range(3000))
    expected = {(i // 10, i % 10): str(i) for i in range(3000)}
    assert client.balancer(cluster.addresses())["enabled"]

    def even() -> dict | None:
        status = client.balancer(cluster.addresses())
        loads = status["loads"]
        spread = max(loads.values()) - min(loads.values())
        return status if len(loads) == 5 and spread <= 1 and status["migrations"] == 0 else None

    with injected(cluster, "worker_pause_build_range", ["n1", "n2", "n3"]):
        create_view(cluster, ks)
        wait_hit(cluster, "worker_pause_build_range", "n1")
        cluster.add_node()
        cluster.add_node()
        balanced = wait_until(even, LEAVE_TIMEOUT, "the balancer to spread the replicas over 5 nodes within one")
    assert sum(balanced["loads"].values()) == 128, balanced
    assert_correct(cluster, ks)
    assert not any(True for _ in client.tablets(cluster.addresses(), f"{ks}.tab") if _.get("stage"))
    assert_every_node_scans(cluster, ks, expected)
