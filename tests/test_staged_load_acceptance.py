"""`vbc load` through the staging area (2 real nodes, RF 2): into a table whose view is built and into one whose
view is being built, each with a concurrent writer on overlapping keys; base and views exactly what last-write-wins
gives, and a bad file writes nothing."""
from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vbc import cli, client, load

from .cluster_harness import LocalCluster

pytestmark = pytest.mark.integration

ROWS = 100_000
WRITER_STEP = 97  # the concurrent writer writes every 97th key of the file
TIMEOUT = 240.0
RF = 2


def file_rows(path) -> dict[int, tuple[int, str]]:
    ids = list(range(ROWS))
    pq.write_table(pa.table({"id": pa.array(ids, pa.int32()), "grp": pa.array([i % 100 for i in ids], pa.int32()),
                             "name": [f"n{i}" for i in ids]}), path, row_group_size=10_000)
    return {i: (i % 100, f"n{i}") for i in ids}


def create(cluster: LocalCluster, table: str) -> None:
    cluster.execute(f"CREATE TABLE ks.{table} (id int PRIMARY KEY, grp int, name text)")
    cluster.execute(f"CREATE MATERIALIZED VIEW ks.{table}_by_grp AS SELECT * FROM ks.{table} "
                    "WHERE grp IS NOT NULL AND id IS NOT NULL PRIMARY KEY (grp, id)")


class Writer(threading.Thread):
    """Writes every WRITER_STEP-th key while the load runs: even keys at a timestamp far ahead (they must win over
    the file's rows), odd ones at a timestamp far behind (the file's rows must win); a new `grp` moves the row's
    view row, so a stale view row would show."""

    def __init__(self, cluster: LocalCluster, table: str, started: threading.Event):
        super().__init__(daemon=True)
        self.cluster, self.table, self.started = cluster, table, started
        self.expected: dict[int, tuple[int, str]] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        future = time.time_ns() // 1000 + 10**12
        try:
            for number, key in enumerate(range(0, ROWS, WRITER_STEP)):
                wins = key % 2 == 0
                grp, name = 1000 + key % 7, f"w{key}"
                self.cluster.execute(f"INSERT INTO ks.{self.table} (id, grp, name) VALUES ({key}, {grp}, '{name}') "
                                     f"USING TIMESTAMP {future if wins else 1}")
                if wins:
                    self.expected[key] = (grp, name)
                if number == 20:
                    self.started.set()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error
            self.started.set()


def load_with_writer(cluster: LocalCluster, table: str, path) -> dict[int, tuple[int, str]]:
    """Load the file while a Writer runs; the rows the table must hold then."""
    expected = file_rows(path)
    started = threading.Event()
    writer = Writer(cluster, table, started)
    writer.start()
    assert started.wait(60)
    committed, _ = load.load(cluster.addresses(), f"ks.{table}", path, batch_rows=10_000)
    writer.join(120)
    assert writer.error is None and not writer.is_alive() and committed == ROWS
    expected.update(writer.expected)
    return expected


def assert_exact(cluster: LocalCluster, table: str, expected: dict[int, tuple[int, str]]) -> None:
    base = {r["id"]: (r["grp"], r["name"]) for r in cluster.query(f"SELECT id, grp, name FROM ks.{table}",
                                                                  timeout=120)}
    assert base == expected
    view = {(r["grp"], r["id"]): r["name"] for r in cluster.query(f"SELECT grp, id, name FROM ks.{table}_by_grp",
                                                                  timeout=120)}
    assert view == {(grp, key): name for key, (grp, name) in expected.items()}
    check = client.check(cluster.addresses(), f"ks.{table}_by_grp")
    assert check["consistent"] and check["view_rows"] == RF * ROWS, check  # every view replica counted


def test_staged_loads_with_concurrent_writers_leave_base_and_views_exact(tmp_path):
    with LocalCluster(2, tmp_path / "cluster") as cluster:
        cluster.execute("CREATE KEYSPACE ks WITH replication = {'rf': 2} AND tablets = {'initial': 4}")
        create(cluster, "built")
        client.wait_built(cluster.addresses(), "ks.built_by_grp", TIMEOUT)
        expected = load_with_writer(cluster, "built", tmp_path / "built.parquet")
        assert client.status(cluster.addresses(), views_only=True)["staging"] == []
        assert_exact(cluster, "built", expected)

        for node in ("n1", "n2"):  # the view's first batches wait while its build is paused: it stays BUILDING
            cluster.inject("worker_pause_build_range", node, mode="pause")
        create(cluster, "building")
        for node in ("n1", "n2"):
            assert cluster.inject("worker_pause_build_range", node, "wait_hit", timeout=60)["hit"]
        assert cli.main(["view", "pause", "--addr", cluster.addresses()[0], "ks.building_by_grp"]) == 0
        for node in ("n1", "n2"):
            cluster.inject("worker_pause_build_range", node, "disable")
        expected = load_with_writer(cluster, "building", tmp_path / "building.parquet")
        assert client.view_status(cluster.addresses(), "ks.building_by_grp", views_only=True)["state"] == "PAUSED"
        assert cli.main(["view", "resume", "--addr", cluster.addresses()[0], "ks.building_by_grp"]) == 0
        client.wait_built(cluster.addresses(), "ks.building_by_grp", TIMEOUT)
        assert_exact(cluster, "building", expected)


def test_a_load_that_does_not_wait_shows_its_staged_rows_which_survive_a_kill_and_a_bad_file_writes_nothing(tmp_path):
    with LocalCluster(2, tmp_path / "cluster") as cluster:
        cluster.execute("CREATE KEYSPACE ks WITH replication = {'rf': 2} AND tablets = {'initial': 2}")
        create(cluster, "t")
        client.wait_built(cluster.addresses(), "ks.t_by_grp", TIMEOUT)
        bad = tmp_path / "bad.csv"
        bad.write_text("id,grp,name\n" + "".join(f"{i},{i % 5},n{i}\n" for i in range(5_000)) + "5000,five,x\n")
        assert cli.main(["load", "--addr", cluster.addresses()[0], "ks.t", str(bad), "--quiet"]) == 1
        assert cluster.query("SELECT COUNT(*) FROM ks.t") == [{"count": 0}]

        good = tmp_path / "good.csv"
        good.write_text("id,grp,name\n" + "".join(f"{i},{i % 5},n{i}\n" for i in range(5_000)))
        for node in ("n1", "n2"):
            cluster.inject("worker_pause_process_staging", node, mode="pause")
        assert cli.main(["load", "--addr", cluster.addresses()[0], "ks.t", str(good), "--quiet", "--no-wait"]) == 0
        staged = client.status(cluster.addresses(), views_only=True)["staging"]
        assert [t["table"] for t in staged] == ["ks.t"] and staged[0]["tasks"] >= 2
        assert staged[0]["rows"] == RF * 5_000  # every replica's copy
        assert cluster.query("SELECT COUNT(*) FROM ks.t") == [{"count": 0}]  # invisible until processed
        cluster.stop_node("n1", kill=True)  # its staged rows and their tasks outlive it
        cluster.start_node("n1")
        cluster.inject("worker_pause_process_staging", "n2", "disable")
        load.wait_staged(cluster.addresses(), "ks.t", timeout=TIMEOUT)
        assert cluster.query("SELECT COUNT(*) FROM ks.t") == [{"count": 5_000}]
        check = client.check(cluster.addresses(), "ks.t_by_grp")
        assert check["consistent"] and check["view_rows"] == RF * 5_000, check
