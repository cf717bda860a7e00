"""Tablet migrations against real node processes: a move during a build with concurrent writes, a failed stream that
rolls back, and moves refused with a clear error.

One 2-node cluster (RF 1) for the module. In each scenario the build's batches are paused with
`worker_pause_build_range` while the migration runs, then released: the view must end BUILT, `vbc check` must find
no difference, and every node must answer a full scan of the base with exactly the expected rows.
"""
from __future__ import annotations

import random
import threading

import grpc
import pytest

from vbc import client

from .cluster_harness import LocalCluster
from .test_view_building_acceptance import (
    VIEW_WHERE,
    _logs_on_failure,
    assert_correct,
    injected,
    insert_rows,
    run,
    wait_hit,
)

pytestmark = pytest.mark.integration

NODES = ("n1", "n2")
MIGRATION_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def _cluster(tmp_path_factory):
    with LocalCluster(2, tmp_path_factory.mktemp("migration-cluster"), shards=1) as started:
        client.balancer(started.addresses(), "off")  # these scenarios place tablets by hand
        yield started


@pytest.fixture
def cluster(_cluster, request):
    with _logs_on_failure(request, _cluster):
        yield _cluster


def make_base(cluster: LocalCluster, ks: str, rows: int) -> dict[tuple[int, int], str]:
    run(cluster, f"CREATE KEYSPACE {ks} WITH replication = {{'rf': 1}} AND tablets = {{'initial': 2}}")
    run(cluster, f"CREATE TABLE {ks}.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    insert_rows(cluster, ks, range(rows))
    return {(i // 10, i % 10): str(i) for i in range(rows)}


def create_view(cluster: LocalCluster, ks: str) -> None:
    run(cluster, f"CREATE MATERIALIZED VIEW {ks}.mv AS SELECT * FROM {ks}.tab WHERE {VIEW_WHERE} "
                 "PRIMARY KEY (c, key, v)")


def holder_of(cluster: LocalCluster, table: str, tablet: int) -> str:
    return client.tablets(cluster.addresses(), table)[tablet]["replicas"][0].split(":")[0]


def other(node: str) -> str:
    return next(n for n in NODES if n != node)


def assert_every_node_scans(cluster: LocalCluster, ks: str, expected: dict[tuple[int, int], str]) -> None:
    want = sorted((key, c, v) for (key, c), v in expected.items())
    for node in NODES:
        got = sorted((r["key"], r["c"], r["v"]) for r in client.query(cluster.addr(node), f"SELECT * FROM {ks}.tab",
                                                                       timeout=120))
        assert got == want, (f"{node}: {len(got)} rows, expected {len(want)}; missing "
                             f"{sorted(set(want) - set(got))[:5]}, extra {sorted(set(got) - set(want))[:5]}")


class Writers:
    """Two clients writing at once (`Writer`s on disjoint keys); `expected` is the table they leave."""

    def __init__(self, cluster: LocalCluster, ks: str, expected: dict[tuple[int, int], str], seed: int):
        self._writers = [Writer(cluster, ks, expected, seed, range(0, 200)),
                         Writer(cluster, ks, expected, seed + 1, range(200, 400))]

    def __enter__(self) -> Writers:
        for writer in self._writers:
            writer.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        for writer in self._writers:
            writer.__exit__(*exc_info)

    @property
    def error(self) -> Exception | None:
        return next((w.error for w in self._writers if w.error is not None), None)

    @property
    def writes(self) -> int:
        return min(w.writes for w in self._writers)

    @property
    def expected(self) -> dict[tuple[int, int], str]:
        low, high = self._writers
        return {**{k: v for k, v in low.expected.items() if k[0] < 200},
                **{k: v for k, v in high.expected.items() if k[0] >= 200}}


class Writer:
    """A client's updates, inserts and deletes from another thread until stopped, on partition keys in `keys` (so
    that clients running at once touch different rows); `expected` is the table it leaves."""

    def __init__(self, cluster: LocalCluster, ks: str, expected: dict[tuple[int, int], str], seed: int,
                 keys: range = range(400)):
        self._cluster, self._ks, self.expected = cluster, ks, dict(expected)
        self._keys = keys
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self.writes = 0
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._one_write()
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.error = error

    def _one_write(self) -> None:
        key, c = self._rng.choice(self._keys), self._rng.randrange(10)
        table = f"{self._ks}.tab"
        if self._rng.random() < 0.3:
            run(self._cluster, f"DELETE FROM {table} WHERE key = {key} AND c = {c}")
            self.expected.pop((key, c), None)
        else:
            value = f"w{self._keys.start}-{self.writes}"
            run(self._cluster, f"INSERT INTO {table} (key, c, v) VALUES ({key}, {c}, '{value}')")
            self.expected[(key, c)] = value
        self.writes += 1


def move(cluster: LocalCluster, table: str, tablet: int, source: str, destination: str) -> dict:
    migration_id = client.move_tablet(cluster.addresses(), table, tablet, source, destination)
    return client.wait_migration(cluster.addresses(), migration_id, MIGRATION_TIMEOUT)


def test_a_tablet_moves_during_a_build_with_concurrent_writes(cluster):
    ks = "mig1"
    expected = make_base(cluster, ks, 3000)
    source = holder_of(cluster, f"{ks}.tab", 0)
    with injected(cluster, "worker_pause_build_range", NODES):
        create_view(cluster, ks)
        wait_hit(cluster, "worker_pause_build_range", source)
        with Writers(cluster, ks, expected, seed=1) as writer:
            result = move(cluster, f"{ks}.tab", 0, source, other(source))
        assert writer.error is None and writer.writes > 0, writer.error
        assert result["state"] == "done", result
        assert holder_of(cluster, f"{ks}.tab", 0) == other(source)
        assert all("stage" not in t for t in client.tablets(cluster.addresses(), f"{ks}.tab"))
    assert_correct(cluster, ks)
    assert_every_node_scans(cluster, ks, writer.expected)


def test_a_failed_stream_rolls_back_and_the_view_is_still_built(cluster):
    ks = "mig2"
    expected = make_base(cluster, ks, 2000)
    source = holder_of(cluster, f"{ks}.tab", 1)
    destination = other(source)
    with injected(cluster, "worker_pause_build_range", NODES):
        create_view(cluster, ks)
        wait_hit(cluster, "worker_pause_build_range", source)
        with injected(cluster, "stream_tablet_fail", [destination], mode="fail"):
            result = move(cluster, f"{ks}.tab", 1, source, destination)
        assert result["state"] == "reverted" and "stream" in result["reason"], result
        assert holder_of(cluster, f"{ks}.tab", 1) == source
    assert_correct(cluster, ks)
    assert_every_node_scans(cluster, ks, expected)


def test_a_view_tablet_moves_after_the_build_and_the_view_answers_the_same(cluster):
    ks = "mig3"
    make_base(cluster, ks, 1000)
    create_view(cluster, ks)
    assert_correct(cluster, ks)
    source = holder_of(cluster, f"{ks}.mv", 0)
    assert move(cluster, f"{ks}.mv", 0, source, other(source))["state"] == "done"
    assert holder_of(cluster, f"{ks}.mv", 0) == other(source)
    assert_correct(cluster, ks)


@pytest.mark.parametrize("tablet, source, destination, message", [
    (0, "holder", "holder", "already holds tablet 0"),
    (0, "holder", "n9", "unknown node 'n9'"),
    (7, "holder", "other", "has tablets 0..1, not 7"),
    (0, "other", "holder", "holds no replica of tablet 0"),
    (0, "holder", "other:5", "has shards 0..0, not 5"),
])
def test_bad_moves_are_refused_with_invalid_argument(cluster, tablet, source, destination, message):
    ks = "migbad"
    run(cluster, f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {{'rf': 1}} AND tablets = {{'initial': 2}}")
    run(cluster, f"CREATE TABLE IF NOT EXISTS {ks}.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    holder = holder_of(cluster, f"{ks}.tab", 0)
    names = {"holder": holder, "other": other(holder)}

    def named(text: str) -> str:
        node, sep, shard = text.partition(":")
        return names.get(node, node) + sep + shard

    with pytest.raises(grpc.RpcError) as refused:
        client.move_tablet(cluster.addresses(), f"{ks}.tab", tablet, named(source), named(destination))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in refused.value.details()
    assert holder_of(cluster, f"{ks}.tab", 0) == holder


def resize(cluster: LocalCluster, table: str, merge: bool) -> int:
    _, target = client.resize_tablets(cluster.addresses(), table, merge)
    return len(client.wait_tablet_count(cluster.addresses(), table, target, MIGRATION_TIMEOUT))


def test_a_split_then_two_merges_during_a_build_with_concurrent_writes(cluster):
    ks = "mig4"
    expected = make_base(cluster, ks, 3000)
    with injected(cluster, "worker_pause_build_range", NODES):
        create_view(cluster, ks)
        wait_hit(cluster, "worker_pause_build_range", holder_of(cluster, f"{ks}.tab", 0))
        with Writers(cluster, ks, expected, seed=4) as writer:
            assert resize(cluster, f"{ks}.tab", merge=False) == 4
            assert resize(cluster, f"{ks}.tab", merge=True) == 2
            assert resize(cluster, f"{ks}.tab", merge=True) == 1
        assert writer.error is None and writer.writes > 0, writer.error
        assert client.tablets(cluster.addresses(), f"{ks}.mv")  # the view keeps its own map
        assert len(client.tablets(cluster.addresses(), f"{ks}.mv")) == 2
    assert_correct(cluster, ks)
    assert_every_node_scans(cluster, ks, writer.expected)
    one = client.resize_tablets
    with pytest.raises(grpc.RpcError) as refused:
        one(cluster.addresses(), f"{ks}.tab", True)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "one tablet" in refused.value.details()
