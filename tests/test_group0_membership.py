"""group0 membership against real node processes: two nodes added at the same time join one after the other, and
the certificate a decommissioned node leaves in its data directory no longer acts for the cluster."""
from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from vbc import client

from .cluster_harness import LocalCluster, wait_until

pytestmark = pytest.mark.integration

LEAVE_TIMEOUT = 180.0


def vbc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vbc", *args], capture_output=True, text=True,
                          timeout=LEAVE_TIMEOUT + 60)


def test_two_nodes_added_at_once_both_join_and_a_removed_node_s_certificate_is_refused(tmp_path):
    with LocalCluster(3, tmp_path / "cluster", secure=True) as cluster:
        with ThreadPoolExecutor(max_workers=2) as pool:
            added = sorted(node["id"] for node in pool.map(lambda _: cluster.add_node(), range(2)))
        assert added == ["n4", "n5"]
        wait_until(lambda: {n["id"] for n in client.status(cluster.addresses())["nodes"] if n["alive"]}
                   == {"n1", "n2", "n3", "n4", "n5"}, 120, "all five nodes to serve")
        cluster.execute("CREATE KEYSPACE ks WITH replication = {'rf': 3} AND tablets = {'initial': 2}")
        leader = cluster.wait_for_leader()
        peers = client.status(cluster.addresses())
        assert len(peers["nodes"]) == 5, peers

        leaving = "n5" if leader != "n5" else "n4"
        left = vbc("node", "decommission", "--cluster", str(cluster.data_dir), leaving)
        assert left.returncode == 0, left.stderr
        survivor = next(n["grpc"] for n in cluster.nodes if n["id"] != leaving)
        as_removed_node = vbc("exec", "--addr", survivor, "--credentials", str(tmp_path / "cluster" / leaving),
                              "CREATE ROLE mallory WITH SUPERUSER = true AND LOGIN = true AND PASSWORD = 'x'")
        assert as_removed_node.returncode == 1, as_removed_node.stdout
        assert "UNAUTHENTICATED" in as_removed_node.stderr and f"node {leaving} was removed" in as_removed_node.stderr
        roles = cluster.query("LIST ROLES")
        assert "mallory" not in {row.get("role") for row in roles}
