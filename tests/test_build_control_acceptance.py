"""Controlling view builds against a real node: chunks (one Spark job each, a killed worker resumes at its
checkpoint), the build rate limit, and pausing a view.

One node; each scenario builds `KS.mv` over its own table `KS.tab(key, c, v)` of one tablet holding rows
`(i // 10, i % 10, str(i))`; `vbc build config` sets the chunk size and the rate limit.
"""
from __future__ import annotations

import re
import time

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from vbc import client

from .cluster_harness import LocalCluster, wait_until

pytestmark = pytest.mark.integration

ROWS = 50_000
CHUNK_ROWS = 1_000
BUILD_TIMEOUT = 300.0
VIEW = "CREATE MATERIALIZED VIEW {ks}.mv AS SELECT * FROM {ks}.tab WHERE c IS NOT NULL AND key IS NOT NULL " \
       "AND v IS NOT NULL PRIMARY KEY (c, key)"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(1, tmp_path_factory.mktemp("chunks")) as started:
        yield started


def test_the_chunk_size_is_shown_and_set_by_vbc_build_config(cluster, capsys):
    from vbc import cli
    build_config = ["build", "config", "--addr", cluster.addresses()[0]]
    assert cli.main(build_config) == 0
    assert capsys.readouterr().out == "chunk rows: 250,000\nrate limit: off\nparallel bases: 2\n"
    assert cli.main([*build_config, "--chunk-rows", "5"]) == 1
    assert "a chunk holds 100 to 10,000,000 rows, not 5" in capsys.readouterr().err
    assert cli.main([*build_config, "--chunk-rows", str(CHUNK_ROWS), "--json"]) == 0
    assert capsys.readouterr().out == f'{{"chunk_rows": {CHUNK_ROWS}, "rate_rows_per_s": 0, "parallel_bases": 2}}\n'


def make_base(cluster: LocalCluster, ks: str, tmp_path, rows: int = ROWS, tablets: int = 1) -> None:
    from vbc import cli
    client.execute(cluster.addresses(), f"CREATE KEYSPACE {ks} WITH replication = {{'rf': 1}} "
                                        f"AND tablets = {{'initial': {tablets}}}")
    client.execute(cluster.addresses(), f"CREATE TABLE {ks}.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    ids = range(rows)
    path = tmp_path / f"{ks}.csv"
    pacsv.write_csv(pa.table({"key": [i // 10 for i in ids], "c": [i % 10 for i in ids], "v": [str(i) for i in ids]}),
                    path)
    assert cli.main(["load", "--addr", cluster.addresses()[0], f"{ks}.tab", str(path), "--quiet"]) == 0


def worker(cluster: LocalCluster) -> dict:
    return client.status(cluster.addresses())["nodes"][0]["worker"]


def assert_view_exact(cluster: LocalCluster, ks: str, rows: int = ROWS, view: str = "mv") -> None:
    client.wait_built(cluster.addresses(), f"{ks}.{view}", BUILD_TIMEOUT)
    assert cluster.query(f"SELECT COUNT(*) FROM {ks}.{view}") == [{"count": rows}]
    check = client.check(cluster.addresses(), f"{ks}.{view}")
    assert check["consistent"] and check["view_rows"] == rows, check


def rows_done(cluster: LocalCluster, view: str) -> int:
    return client.view_status(cluster.addresses(), view)["rows_done"]


def chunk_sizes(cluster: LocalCluster, ks: str) -> list[int]:
    """The rows of each chunk of `ks.tab`'s tablet 0 that the node's log reports, in order."""
    return [int(rows) for rows in re.findall(rf"{ks}\.tab tablet 0 chunk -?\d+\.\.-?\d+, (\d+) rows for 1 view",
                                             cluster.log("n1"))]


def chunk_jobs(cluster: LocalCluster, ks: str) -> int:
    return len(re.findall(rf"{ks}\.tab tablet 0 chunk -?\d+\.\.-?\d+, \d+ rows for 1 view\(s\): .*spark [\d.]+s",
                          cluster.log("n1")))


def test_a_tablet_larger_than_a_chunk_builds_one_spark_job_per_chunk(cluster, tmp_path):
    client.build_config(cluster.addresses(), chunk_rows=CHUNK_ROWS)
    make_base(cluster, "one", tmp_path)
    jobs_before = worker(cluster)["spark_jobs"]
    client.execute(cluster.addresses(), VIEW.format(ks="one"))
    assert_view_exact(cluster, "one")
    chunks = chunk_jobs(cluster, "one")
    assert ROWS // CHUNK_ROWS <= chunks <= ROWS // CHUNK_ROWS + 2, chunks
    assert worker(cluster)["spark_jobs"] - jobs_before == chunks
    assert client.view_status(cluster.addresses(), "one.mv")["rows_done"] == ROWS


def test_a_worker_killed_half_way_resumes_at_its_checkpoint(cluster, tmp_path):
    client.build_config(cluster.addresses(), chunk_rows=CHUNK_ROWS)
    make_base(cluster, "two", tmp_path)
    scanned_before = worker(cluster)["rows_scanned"]
    client.execute(cluster.addresses(), VIEW.format(ks="two"))
    wait_until(lambda: client.view_status(cluster.addresses(), "two.mv")["rows_done"] >= ROWS // 2, BUILD_TIMEOUT,
               "half of the tablet built")
    client.inject(cluster.addr("n1"), "worker_pause_after_chunk", "enable", mode="pause")
    assert client.inject(cluster.addr("n1"), "worker_pause_after_chunk", "wait_hit", timeout=60)["hit"]
    before_kill = worker(cluster)["rows_scanned"] - scanned_before  # steady while the batch waits after a chunk
    done_before = client.view_status(cluster.addresses(), "two.mv")["rows_done"]
    cluster.restart_node("n1", kill=True)
    assert_view_exact(cluster, "two")
    after_restart = worker(cluster)["rows_scanned"]  # counted since the node started again
    assert after_restart <= ROWS - done_before + CHUNK_ROWS, (before_kill, done_before, after_restart)
    assert before_kill + after_restart < 1.5 * ROWS
    assert "two.tab tablet 0 resumes at token" in cluster.log("n1")
    assert client.view_status(cluster.addresses(), "two.mv")["rows_done"] >= done_before


THROTTLED_ROWS = 20_000
RATE = 2_000


def test_a_throttled_build_keeps_to_the_rate_and_a_lifted_limit_finishes_at_full_speed(cluster, tmp_path):
    client.build_config(cluster.addresses(), chunk_rows=250_000, rate_rows_per_s=RATE)
    try:
        make_base(cluster, "thr", tmp_path, THROTTLED_ROWS)
        client.execute(cluster.addresses(), VIEW.format(ks="thr"))
        assert_view_exact(cluster, "thr", THROTTLED_ROWS)
        throttled = chunk_sizes(cluster, "thr")
        # a chunk begins once the rows before it are paid for at RATE (worker.rate_limit, property-tested), so this
        # many chunks of at most a second's worth of rows took at least (chunks - 1) seconds
        assert len(throttled) >= THROTTLED_ROWS // RATE and max(throttled) <= RATE, throttled
        assert worker(cluster)["throttled_s"] > 0
        client.execute(cluster.addresses(), VIEW.replace(".mv ", ".mv2 ").format(ks="thr"))
        wait_until(lambda: rows_done(cluster, "thr.mv2") > 0, BUILD_TIMEOUT, "the first throttled chunk")
        assert client.build_config(cluster.addresses(), rate_rows_per_s=0)["rate_rows_per_s"] == 0
        waited_when_lifted = worker(cluster)["throttled_s"]
        assert_view_exact(cluster, "thr", THROTTLED_ROWS, view="mv2")
        assert worker(cluster)["throttled_s"] - waited_when_lifted < 1.5, "the lifted limit still held it back"
        assert max(chunk_sizes(cluster, "thr"), default=0) > RATE, "no chunk larger than a second's worth of rows after the limit lifted"
    finally:
        client.build_config(cluster.addresses(), chunk_rows=CHUNK_ROWS, rate_rows_per_s=0)


def test_a_paused_view_runs_no_batch_while_writes_keep_it_current_and_resumes(cluster, tmp_path):
    from vbc import cli
    client.build_config(cluster.addresses(), chunk_rows=CHUNK_ROWS)
    make_base(cluster, "pau", tmp_path)
    client.execute(cluster.addresses(), VIEW.format(ks="pau"))
    wait_until(lambda: rows_done(cluster, "pau.mv") >= 5 * CHUNK_ROWS, BUILD_TIMEOUT, "a few chunks built")
    assert cli.main(["view", "pause", "--addr", cluster.addresses()[0], "pau.mv"]) == 0
    wait_until(lambda: worker(cluster)["batches_running"] == 0, 60, "the running batch to stop at its next chunk")
    assert client.view_status(cluster.addresses(), "pau.mv")["state"] == "PAUSED"
    done, jobs = rows_done(cluster, "pau.mv"), worker(cluster)["spark_jobs"]
    quiet_until, key = time.monotonic() + 5.0, 0
    while time.monotonic() < quiet_until:  # five seconds of writes: new rows and rows moved to a new view key
        key += 1
        client.execute(cluster.addresses(), "INSERT INTO pau.tab (key, c, v) VALUES (?, ?, ?)",
                       params=[[100_000 + key, 7, "new"], [key, 0, "moved"]])
    assert rows_done(cluster, "pau.mv") == done and worker(cluster)["spark_jobs"] == jobs
    assert cluster.query("SELECT v FROM pau.mv WHERE c = 7 AND key = 100001 ALLOW STALE") == [{"v": "new"}]
    assert cli.main(["view", "resume", "--addr", cluster.addresses()[0], "pau.mv"]) == 0
    assert_view_exact(cluster, "pau", ROWS + key)


def test_two_tables_with_a_view_each_created_one_after_the_other_both_make_progress_at_once(cluster, tmp_path):
    client.build_config(cluster.addresses(), chunk_rows=CHUNK_ROWS)
    rows = 20_000
    for ks in ("par1", "par2"):
        make_base(cluster, ks, tmp_path, rows, tablets=4)
    for ks in ("par1", "par2"):
        client.execute(cluster.addresses(), VIEW.format(ks=ks))

    def both_under_way() -> str | None:
        views = {v["name"]: v for v in client.status(cluster.addresses(), views_only=True)["views"]}
        first, second = views["par1.mv"], views["par2.mv"]
        if first["state"] == "BUILT" or second["state"] == "BUILT":
            return "one was built before both were seen under way"
        return "at once" if first["rows_done"] > 0 and second["rows_done"] > 0 else None

    assert wait_until(both_under_way, BUILD_TIMEOUT, "both views under way", interval=0.05) == "at once"
    for ks in ("par1", "par2"):
        assert_view_exact(cluster, ks, rows)
