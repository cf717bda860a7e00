"""A full scan that spans a tablet migration, against real node processes: the scan of the last tablet is paused at its
replica while the tablet moves away (its rows there cleaned up); resumed, the read comes back with every row."""
from __future__ import annotations

import threading

import pytest

from vbc import client

from .cluster_harness import LocalCluster, wait_until

pytestmark = pytest.mark.integration

ROWS = 2_000
LAST = 1  # the last of the table's two tablets
MIGRATION_TIMEOUT = 180.0
READ_TIMEOUT = 240.0
HIT_TIMEOUT = 30.0


@pytest.fixture
def cluster(tmp_path):
    with LocalCluster(2, tmp_path / "cluster", shards=1, spark_prestart=False) as started:  # no view is built
        client.balancer(started.addresses(), "off")  # tablets are placed and moved by hand here
        yield started


class BackgroundRead:
    """One statement run on `node` from another thread; `rows` or `error` once it ended."""

    def __init__(self, cluster: LocalCluster, node: str, statement: str):
        self.rows: list[dict] | None = None
        self.error: Exception | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(cluster.addr(node), statement), daemon=True)
        self._thread.start()

    def _run(self, address: str, statement: str) -> None:
        try:
            self.rows = client.query(address, statement, timeout=READ_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.error = error
        finally:
            self._done.set()

    def result(self, timeout: float) -> list[dict]:
        assert self._done.wait(timeout), f"the read did not end within {timeout:g} s"
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.rows


def load(cluster: LocalCluster) -> set[tuple[int, int, str]]:
    client.execute(cluster.addresses(), "CREATE KEYSPACE rd WITH replication = {'rf': 1} AND tablets = {'initial': 2}")
    client.execute(cluster.addresses(), "CREATE TABLE rd.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    rows = [[i // 10, i % 10, f"v{i}"] for i in range(ROWS)]
    _, _, message = client.execute(cluster.addresses(), "INSERT INTO rd.tab (key, c, v) VALUES (?, ?, ?)", params=rows)
    assert message == f"ok: {ROWS} statements applied", message
    return {tuple(row) for row in rows}


def holder_of(cluster: LocalCluster, tablet: int) -> str:
    return client.tablets(cluster.addresses(), "rd.tab")[tablet]["replicas"][0].split(":")[0]


def test_a_full_scan_paused_while_its_last_tablet_moves_away_returns_every_row(cluster):
    expected = load(cluster)
    holder = holder_of(cluster, LAST)
    coordinator = next(n["id"] for n in cluster.nodes if n["id"] != holder)
    assert holder_of(cluster, 0) == coordinator, "one tablet on each node"
    cluster.inject("read.replica.scan", holder, mode="pause")  # explicitly pause: not the point's default
    try:
        read = BackgroundRead(cluster, coordinator, "SELECT * FROM rd.tab")
        assert cluster.inject("read.replica.scan", holder, "wait_hit", timeout=HIT_TIMEOUT)["hit"]
        migration_id = client.move_tablet(cluster.addresses(), "rd.tab", LAST, holder, coordinator)
        result = client.wait_migration(cluster.addresses(), migration_id, MIGRATION_TIMEOUT)
        assert result["state"] == "done", result
        assert holder_of(cluster, LAST) == coordinator
    finally:
        cluster.inject("read.replica.scan", holder, "disable")
    rows = read.result(READ_TIMEOUT)
    got = {(r["key"], r["c"], r["v"]) for r in rows}
    assert len(rows) == ROWS and got == expected, (f"{len(rows)} of {ROWS} rows; missing {sorted(expected - got)[:5]}, "
                                                   f"extra {sorted(got - expected)[:5]}")
    wait_until(lambda: "planned again" in cluster.log(coordinator), 10.0, "the coordinator to log its re-plan")
