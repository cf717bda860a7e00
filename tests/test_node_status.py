"""What `vbc status` shows of real nodes: the prestarted Spark session, failing batches, and a relative data dir."""
from __future__ import annotations

import json
import logging
import re
import statistics
import subprocess
import sys

import pytest

from vbc import client
from vbc import cluster as cluster_mod
from worker import spark_warmup

from .cluster_harness import LocalCluster, free_port, wait_until

pytestmark = pytest.mark.integration

log = logging.getLogger(__name__)

SPARK_READY_TIMEOUT = 120.0  # a cold JVM and its warm-up on a loaded 2-core machine
BUILD_TIMEOUT = 240.0
INJECTED = "injected failure at 'worker_fail_build_range'"
BATCH_LOG = re.compile(r"batch \d+: \S+ tablet (\d+), (\d+) rows .*spark ([\d.]+)s")


def vbc(*args: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vbc", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=cluster_mod.child_env(die_with_parent=False))


def make_table(addresses: list[str], keyspace: str, rows: int, tablets: int) -> None:
    """KEYSPACE.t (key int, c int, v text) with `rows` rows (i // 10, i % 10, str(i)), on one replica per tablet."""
    client.execute(addresses, f"CREATE KEYSPACE {keyspace} WITH replication = {{'rf': 1}} "
                              f"AND tablets = {{'initial': {tablets}}}")
    client.execute(addresses, f"CREATE TABLE {keyspace}.t (key int, c int, v text, PRIMARY KEY (key, c))")
    insert = f"INSERT INTO {keyspace}.t (key, c, v) VALUES (?, ?, ?)"
    for first in range(0, rows, 5_000):
        params = [[i // 10, i % 10, str(i)] for i in range(first, min(first + 5_000, rows))]
        client.execute(addresses, insert, params=params, timeout=120.0)


def create_view(addresses: list[str], keyspace: str) -> None:
    client.execute(addresses, f"CREATE MATERIALIZED VIEW {keyspace}.mv AS SELECT * FROM {keyspace}.t "
                              "WHERE c IS NOT NULL AND key IS NOT NULL PRIMARY KEY (c, key)")


def view_of(status: dict, name: str) -> dict | None:
    return next((view for view in status["views"] if view["name"] == name), None)


def batch_spark_seconds(node_log: str) -> list[tuple[int, int, float]]:
    """(tablet, rows, Spark seconds) of each batch the node's log reports."""
    return [(int(t), int(r), float(s)) for t, r, s in BATCH_LOG.findall(node_log)]


def test_a_node_prestarts_spark_before_any_view_exists(tmp_path):
    with LocalCluster(nodes=1, data_dir=tmp_path / "cluster") as cluster:
        def ready_worker():
            status = cluster.status()
            worker = status["nodes"][0]["worker"] or {}
            assert status["views"] == [], "no view was created: the session starts on its own"
            assert worker.get("spark_state") != "failed", worker.get("spark_error")
            return worker if worker.get("spark_state") == "ready" else None

        worker = wait_until(ready_worker, SPARK_READY_TIMEOUT, "the Spark session to be ready")
        assert worker["spark_error"] == "" and worker["spark_start_s"] > 0 and worker["spark_jobs"] == 0
        runs = spark_warmup.WARMUP_RUNS
        assert f"spark warm-up: {len(runs)} job(s) of {', '.join(f'{n:,}' for n in runs)} rows" in cluster.log("n1")
        assert f"; {spark_warmup.PLANNING_RUNS} planning job(s) of " in cluster.log("n1")

        addresses = cluster.addresses()
        make_table(addresses, "pre", rows=40_000, tablets=8)
        create_view(addresses, "pre")
        cluster.wait_view_built("pre.mv", BUILD_TIMEOUT)
        batches = batch_spark_seconds(cluster.log("n1"))
        log.info("per-batch Spark seconds (tablet, rows, seconds): %s", batches)
        assert {tablet for tablet, _, _ in batches} == set(range(8))
        seconds = [spark for _, _, spark in batches]
        assert max(seconds) <= 3 * statistics.median(seconds), f"a job paid a first-job penalty: {seconds}"
        worker = cluster.status()["nodes"][0]["worker"]
        assert worker["spark_jobs"] == 8 and worker["read_s"] > 0 and worker["spark_s"] > 0 and worker["merge_s"] > 0


def test_a_view_whose_batches_keep_failing_shows_the_last_error_until_it_is_built(tmp_path):
    with LocalCluster(nodes=1, data_dir=tmp_path / "cluster") as cluster:
        addresses = cluster.addresses()
        make_table(addresses, "fail", rows=300, tablets=2)
        cluster.inject("worker_fail_build_range", "n1", "enable", mode="fail")
        create_view(addresses, "fail")

        def failing():
            view = view_of(cluster.status(), "fail.mv")
            errors = view["errors"] if view else []
            return errors if errors and errors[0]["attempts"] >= 2 else None

        (error,) = wait_until(failing, 120, "the view's failing batches in its status")
        assert error["node"] == "n1" and INJECTED in error["error"]
        as_json = json.loads(vbc("status", "--addr", cluster.addr("n1"), "--json").stdout)
        assert INJECTED in view_of(as_json, "fail.mv")["errors"][0]["error"]
        (failure,) = as_json["nodes"][0]["worker"]["failures"]
        assert failure["attempts"] >= 2 and INJECTED in failure["error"]
        human = vbc("status", "--addr", cluster.addr("n1"), timeout=60).stdout
        assert re.search(r"fail\.mv: \d+ batches failed in a row on n1: .*injected failure", human), human
        views_only = client.status(addresses, views_only=True)
        assert views_only["nodes"] == [] and view_of(views_only, "fail.mv")["errors"] == []
        assert view_of(views_only, "fail.mv")["state"] == "BUILDING"
        with pytest.raises(TimeoutError, match=f"fail.mv is not built after 0.5s: .*n1: .*{INJECTED}"):
            client.wait_built(addresses, "fail.mv", timeout=0.5)

        cluster.inject("worker_fail_build_range", "n1", "disable")
        built = cluster.wait_view_built("fail.mv", BUILD_TIMEOUT)
        assert built["errors"] == []
        assert cluster.status()["nodes"][0]["worker"]["failures"] == []


def test_a_node_with_a_relative_data_dir_builds_a_view_that_checks_clean(tmp_path):
    grpc_addr, raft_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    with open(tmp_path / "node.log", "wb") as node_log:
        node = subprocess.Popen([sys.executable, "-m", "vbc", "node", "start", "--id", "n1", "--data-dir", "rel/n1",
                                 "--grpc", grpc_addr, "--raft", raft_addr, "--insecure"], cwd=tmp_path, stdout=node_log,
                                stderr=subprocess.STDOUT,
                                env={**cluster_mod.child_env(die_with_parent=False), "VBC_RAFT_PASSWORD": "a test's secret"})
    try:
        wait_until(lambda: client.status(grpc_addr)["leader"] == "n1", 60, "the node to lead its cluster")
        make_table([grpc_addr], "rel", rows=500, tablets=2)
        create_view([grpc_addr], "rel")
        wait_until(lambda: view_of(client.status(grpc_addr), "rel.mv")["state"] == "BUILT", BUILD_TIMEOUT,
                   "rel.mv to be BUILT")
        checked = vbc("check", "--addr", grpc_addr, "rel.mv", "--json", cwd=tmp_path)
        assert checked.returncode == 0, checked.stderr
        result = json.loads(checked.stdout)
        assert result["consistent"] and result["base_rows"] == 500 and result["view_rows"] == 500
        assert (tmp_path / "rel" / "n1" / "storage.db").exists() and (tmp_path / "rel" / "n1" / "spark").is_dir()
    except BaseException:
        print(cluster_mod.log_tail(tmp_path / "node.log", 40), file=sys.stderr)
        raise
    finally:
        node.terminate()
        try:
            node.wait(60)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
