"""A view replica's node stopped during a build (3 real nodes): the other tasks finish with its rows kept in their
nodes' outboxes, the view is BUILT only after the node is back and those rows reached it, and `vbc check` passes."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from vbc import cli, client

from .cluster_harness import LocalCluster

pytestmark = pytest.mark.integration

ROWS = 3_000
TIMEOUT = 180.0


def view(cluster: LocalCluster) -> dict:
    return client.view_status(cluster.addresses(), "ks.mv", views_only=True)


def test_a_stopped_view_replica_gets_its_rows_from_the_outbox_before_the_view_is_built(tmp_path):
    with LocalCluster(3, tmp_path / "cluster") as cluster:
        cluster.execute("CREATE KEYSPACE ks WITH replication = {'rf': 1} AND tablets = {'initial': 8}")
        cluster.execute("CREATE TABLE ks.t (key int, c int, v text, PRIMARY KEY (key, c))")
        ids = range(ROWS)
        path = tmp_path / "rows.csv"
        pacsv.write_csv(pa.table({"key": [i // 10 for i in ids], "c": [i % 10 for i in ids],
                                  "v": [f"v{i}" for i in ids]}), path)
        assert cli.main(["load", "--addr", cluster.addresses()[0], "ks.t", str(path), "--quiet"]) == 0
        for node in ("n1", "n2"):
            cluster.inject("worker_pause_build_range", node, mode="pause")
        cluster.execute("CREATE MATERIALIZED VIEW ks.mv AS SELECT * FROM ks.t WHERE v IS NOT NULL AND key IS NOT NULL "
                        "AND c IS NOT NULL PRIMARY KEY (v, key, c)")
        assert any(t["replicas"][0].startswith("n3:") for t in cluster.tablets("ks.mv"))
        for node in ("n1", "n2"):
            assert cluster.inject("worker_pause_build_range", node, "wait_hit", timeout=60)["hit"]
        cluster.stop_node("n3")
        for node in ("n1", "n2"):
            cluster.inject("worker_pause_build_range", node, "disable")

        def others_done() -> dict | None:
            current = view(cluster)
            return current if {current["hosts"].get(n) for n in ("n1", "n2")} == {"SUCCESS"} else None
        waiting = cluster.wait_until(others_done, TIMEOUT, "the tasks on n1 and n2 to finish")
        held = cluster.wait_until(lambda: view(cluster)["held"], 10, "the holds of the kept view rows")
        assert waiting["state"] == "BUILDING" and view(cluster)["state"] == "BUILDING"
        assert {h["target"] for h in held} == {"n3"} and {h["holder"] for h in held} <= {"n1", "n2"}
        kept = sum(n["worker"]["view_rows_kept"] for n in cluster.status()["nodes"] if n["alive"] and n["worker"])
        assert kept > 0

        cluster.start_node("n3")
        built = client.wait_built(cluster.addresses(), "ks.mv", TIMEOUT)
        assert built["held"] == []
        check = client.check(cluster.addresses(), "ks.mv")
        assert check["consistent"] and check["view_rows"] == ROWS, check
        assert cluster.query("SELECT COUNT(*) FROM ks.mv") == [{"count": ROWS}]
