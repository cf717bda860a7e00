"""A node killed with view updates it never delivered, then removed with `vbc node remove`, against real node
processes: the replicas that replace its base and view replicas run repair batches, which delete the view rows its
lost updates would have deleted, and the view ends exact, replica by replica (`vbc check`).
"""
from __future__ import annotations

import pytest

from vbc import client

from .cluster_harness import LocalCluster
from .test_membership_acceptance import vbc
from .test_view_building_acceptance import (
    _logs_on_failure,
    assert_correct,
    create_view,
    injected,
    insert_rows,
    run,
    wait_built,
    wait_hit,
    worker_stats,
)

pytestmark = pytest.mark.integration

ROWS = 400


def test_a_killed_nodes_undelivered_view_updates_are_repaired(tmp_path, request):
    with LocalCluster(4, tmp_path / "cluster", shards=1) as cluster, _logs_on_failure(request, cluster):
        client.balancer(cluster.addresses(), "off")
        ks = "repair1"
        run(cluster, f"CREATE KEYSPACE {ks} WITH replication = {{'rf': 2}} AND tablets = {{'initial': 4}}")
        run(cluster, f"CREATE TABLE {ks}.tab (key int, c int, v text, PRIMARY KEY (key, c))")
        insert_rows(cluster, ks, range(ROWS))
        create_view(cluster, ks)
        wait_built(cluster, f"{ks}.mv")
        cluster.wait_views_flushed(timeout=60)
        leader = cluster.wait_for_leader()
        victim = next(n["id"] for n in cluster.nodes if n["id"] != leader)
        with injected(cluster, "view_update.before_send", [victim], mode="fail"):
            # v is in the view's key: every update moves a view row, a delete the victim never sends
            params = [[i // 10, i % 10, f"new-{i}"] for i in range(ROWS)]
            _, _, message = run(cluster, f"INSERT INTO {ks}.tab (key, c, v) VALUES (?, ?, ?)", params)
            assert message == f"ok: {ROWS} statements applied", message
            run(cluster, f"DELETE FROM {ks}.tab WHERE key = ? AND c = ?", [[3, c] for c in range(10)])
            wait_hit(cluster, "view_update.before_send", victim)
            cluster.stop_node(victim, kill=True)
        removed = vbc("node", "remove", "--cluster", str(cluster.data_dir), victim)
        assert removed.returncode == 0, removed.stderr
        assert_correct(cluster, ks)
        assert worker_stats(cluster)["view_rows_repaired"] > 0
