"""Topology changes that must leave every replica exact, against real node processes (Raft, gRPC, Spark, SQLite):
a merge during a build, views created while the RF goes 2 -> 3 -> 2, an RF decrease under a concurrent writer, and a
rolled-back move followed by a move onto the same node and shard.

One 3-node cluster (2 shards per node, balancer off: every replica is placed by the scenario) for the module; each
scenario has a keyspace of its own. Every scenario ends the same way:
- `vbc check` (Admin.CheckView, view replica by view replica) on every view finds no MISSING, EXTRA or DIFFERENT
  row, and counts RF x the expected rows on both sides (every base and view replica holds every row);
- a full SELECT of the base table from every node (a node reads its own replica first) equals, exactly, the rows
  the test wrote (a client-side model of every acknowledged write), and so does a SELECT of each view.
"""
from __future__ import annotations

import random
import threading
import time

import grpc
import pytest

from common.arrow_stream import table_from_pieces
from coordinator.core.tokens import token_of
from vbc import client
from vbcpb import vbc_pb2 as pb

from .cluster_harness import LocalCluster, wait_until
from .test_view_building_acceptance import (
    VIEW_WHERE,
    _logs_on_failure,
    injected,
    insert_rows,
    point_hits,
    run,
    table_id,
    wait_built,
    wait_hit,
)

pytestmark = pytest.mark.integration

NODES = ("n1", "n2", "n3")
SHARDS = 2
TOPOLOGY_TIMEOUT = 180.0  # an RF change, a merge or a move on 2 busy cores
WRITE_RETRY_TIMEOUT = 60.0  # how long the writer retries one write before it gives up (the model is then unsure)

Model = dict[tuple[int, int], str]  # (key, c) -> v of every live base row


@pytest.fixture(scope="module")
def _cluster(tmp_path_factory):
    with LocalCluster(3, tmp_path_factory.mktemp("topology-cluster"), shards=SHARDS) as started:
        client.balancer(started.addresses(), "off")  # every replica is where the scenario put it
        yield started


@pytest.fixture
def cluster(_cluster, request):
    with _logs_on_failure(request, _cluster):
        yield _cluster


# ============================================================================ helpers


def make_base(cluster: LocalCluster, ks: str, rows: int, rf: int, tablets: int) -> Model:
    run(cluster, f"CREATE KEYSPACE {ks} WITH replication = {{'rf': {rf}}} AND tablets = {{'initial': {tablets}}}")
    run(cluster, f"CREATE TABLE {ks}.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    insert_rows(cluster, ks, range(rows))
    return {(i // 10, i % 10): str(i) for i in range(rows)}


def create_view(cluster: LocalCluster, ks: str, name: str = "mv") -> None:
    """A view holding every base row (every row has a v), keyed (c, key, v)."""
    run(cluster, f"CREATE MATERIALIZED VIEW {ks}.{name} AS SELECT * FROM {ks}.tab WHERE {VIEW_WHERE} "
                 "PRIMARY KEY (c, key, v)")


def tablets_of(cluster: LocalCluster, table: str) -> list[dict]:
    return client.tablets(cluster.addresses(), table)


def wait_rf(cluster: LocalCluster, tables: list[str], rf: int, timeout: float = TOPOLOGY_TIMEOUT) -> None:
    """Every tablet of every table in `tables` has `rf` replicas on distinct nodes, and none is in transition."""
    def reached(table: str) -> bool:
        return all(len(t["replicas"]) == rf and len({r.split(":")[0] for r in t["replicas"]}) == rf
                   and "stage" not in t for t in tablets_of(cluster, table))

    for table in tables:
        wait_until(lambda: reached(table), timeout, f"every tablet of {table} to have {rf} replicas, none moving")


def some_tablet_moves(cluster: LocalCluster, table: str, count: int) -> bool:
    tablets = tablets_of(cluster, table)
    return len(tablets) < count or any("stage" in t for t in tablets)


def key_token(key: int) -> int:
    return token_of((key,), ("int",))


def rows_from(addr: str | list[str], table: str) -> list[tuple[int, int, str]]:
    return sorted((r["key"], r["c"], r["v"]) for r in client.query(addr, f"SELECT * FROM {table}", timeout=120))


def as_rows(model: Model) -> list[tuple[int, int, str]]:
    return sorted((key, c, v) for (key, c), v in model.items())


def difference(got: list[tuple], want: list[tuple]) -> str:
    return (f"{len(got)} rows, expected {len(want)}; missing {sorted(set(want) - set(got))[:5]}, "
            f"extra {sorted(set(got) - set(want))[:5]}")


def replica_rows(cluster: LocalCluster, node: str, table: str, first_token: int, last_token: int) -> list[tuple]:
    """The live (key, c, v) rows `node`'s store holds for `table` in a token range (Internode.ReadRange: that node's
    storage alone, whether or not the node holds a replica of the range)."""
    address = cluster.addr(node)
    request = pb.ReadRangeRequest(table_id=table_id(cluster, table), first_token=first_token, last_token=last_token,
                                  schema_version=client.local_status(address)["schema_version"])
    chunks = list(client.internode_stub(address).ReadRange(request, timeout=60))
    if not chunks:
        return []
    rows = table_from_pieces(chunk.ipc for chunk in chunks)
    assert rows.num_rows == chunks[0].rows, f"{node} sent {rows.num_rows} rows, announced {chunks[0].rows}"
    return sorted(zip(rows["c_key"].to_pylist(), rows["c_c"].to_pylist(), rows["c_v"].to_pylist()))


def assert_exact(cluster: LocalCluster, ks: str, views: list[str], model: Model, rf: int) -> None:
    """Every view BUILT and clean under `vbc check`; the base and every view hold exactly `model`."""
    for view in views:
        wait_built(cluster, f"{ks}.{view}")
    cluster.wait_views_flushed(timeout=60)  # view updates of acknowledged writes are delivered after the ack
    want = as_rows(model)
    for view in views:
        checked = client.check(cluster.addresses(), f"{ks}.{view}", max_examples=5)
        assert checked["state"] == "BUILT", checked
        assert (checked["missing"], checked["extra"], checked["different"]) == (0, 0, 0), checked
        view_tablets = tablets_of(cluster, f"{ks}.{view}")
        assert checked["replicas_checked"] == rf * len(view_tablets), checked
        assert checked["base_rows"] == rf * len(want) and checked["view_rows"] == rf * len(want), checked
        got = rows_from(cluster.addresses(), f"{ks}.{view}")
        assert got == want, f"{ks}.{view}: {difference(got, want)}"
    for node in NODES:
        got = rows_from(cluster.addr(node), f"{ks}.tab")
        assert got == want, f"{ks}.tab read from {node}: {difference(got, want)}"


def apply_writes(cluster: LocalCluster, ks: str, model: Model, rng: random.Random, keys: list[int], count: int,
                 tag: str) -> None:
    """`count` acknowledged upserts and deletes on partitions `keys`, sequentially, recorded in `model`."""
    for number in range(count):
        key, c = rng.choice(keys), rng.randrange(10)
        if rng.random() < 0.4:
            run(cluster, f"DELETE FROM {ks}.tab WHERE key = {key} AND c = {c}")
            model.pop((key, c), None)
        else:
            value = f"{tag}-{number}"
            run(cluster, f"INSERT INTO {ks}.tab (key, c, v) VALUES ({key}, {c}, '{value}')")
            model[(key, c)] = value


class TimestampedWriter:
    """Upserts and deletes from a thread of its own until stopped, each with a `USING TIMESTAMP` of its own (strictly
    increasing); a write that fails is sent again with the same timestamp until it is acknowledged, so that a
    write applied by some replicas only is completed and `expected` (the model of the acknowledged writes) stays
    exact whatever the failures were."""

    def __init__(self, cluster: LocalCluster, ks: str, expected: Model, seed: int, keys: range):
        self._cluster, self._table, self.expected = cluster, f"{ks}.tab", dict(expected)
        self._keys, self._rng = keys, random.Random(seed)
        self._stop = threading.Event()
        self._last_ts = 0
        self.writes = 0
        self.failed_attempts: list[str] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="timestamped-writer", daemon=True)

    def __enter__(self) -> TimestampedWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WRITE_RETRY_TIMEOUT + 30)
        assert not self._thread.is_alive(), "the writer did not stop"

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._one_write()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error

    def _timestamp(self) -> int:
        self._last_ts = max(time.time_ns() // 1000, self._last_ts + 1)
        return self._last_ts

    def _one_write(self) -> None:
        key, c, ts = self._rng.choice(self._keys), self._rng.randrange(10), self._timestamp()
        if self._rng.random() < 0.3:
            statement, value = f"DELETE FROM {self._table} USING TIMESTAMP {ts} WHERE key = {key} AND c = {c}", None
        else:
            value = f"t{self.writes}"
            statement = f"INSERT INTO {self._table} (key, c, v) VALUES ({key}, {c}, '{value}') USING TIMESTAMP {ts}"
        self._until_acknowledged(statement)
        if value is None:
            self.expected.pop((key, c), None)
        else:
            self.expected[(key, c)] = value
        self.writes += 1

    def _until_acknowledged(self, statement: str) -> None:
        deadline = time.monotonic() + WRITE_RETRY_TIMEOUT
        while True:
            try:
                client.execute(self._cluster.addresses(), statement)
                return
            except grpc.RpcError as error:
                self.failed_attempts.append(f"{statement}: {client.error_text(error)}")
                if time.monotonic() >= deadline:
                    raise AssertionError(f"not acknowledged within {WRITE_RETRY_TIMEOUT:g} s: "
                                         f"{self.failed_attempts[-1]}") from None
                time.sleep(0.05)  # a retry pause, not a synchronisation


# ============================================================================ scenarios


def test_a_merge_requested_right_after_a_view_is_created_while_it_builds(cluster):
    """RF 2 on 3 nodes, 8 tablets: the merge's moves (streams, shard moves) and MergeTablets run while the build's
    batches are held, then both finish; the base has 4 tablets, the view keeps its 8."""
    ks = "topo_merge"
    model = make_base(cluster, ks, 3000, rf=2, tablets=8)
    with injected(cluster, "worker_pause_build_range", NODES):
        create_view(cluster, ks)
        current, target = client.resize_tablets(cluster.addresses(), f"{ks}.tab", merge=True)
        assert (current, target) == (8, 4)
        wait_until(lambda: any(point_hits(cluster, "worker_pause_build_range", n) for n in NODES), 120,
                   "a build batch to start")
        wait_until(lambda: some_tablet_moves(cluster, f"{ks}.tab", 8), TOPOLOGY_TIMEOUT,
                   "the merge's first move")
        assert client.view_status(cluster.addresses(), f"{ks}.mv")["state"] == "BUILDING"
    merged = client.wait_tablet_count(cluster.addresses(), f"{ks}.tab", 4, TOPOLOGY_TIMEOUT)
    wait_rf(cluster, [f"{ks}.tab", f"{ks}.mv"], 2)
    assert len(merged) == 4 and len(tablets_of(cluster, f"{ks}.mv")) == 8
    # the merged map takes writes and deletes like any other
    apply_writes(cluster, ks, model, random.Random(11), list(range(300)), 150, "after-merge")
    assert_exact(cluster, ks, ["mv"], model, rf=2)


def test_views_created_while_the_rf_goes_2_to_3_and_back_to_2(cluster):
    """Each view is created right after its ALTER KEYSPACE, while the RF change's transitions are held at their
    first stage (so the view is created while base tablets are in transition and still have the old replica
    count), then the change runs to its end alongside the build."""
    ks = "topo_rf"
    model = make_base(cluster, ks, 2000, rf=2, tablets=4)
    with injected(cluster, "pause_tablet_migration_stage", NODES):
        _, _, message = run(cluster, f"ALTER KEYSPACE {ks} WITH replication = {{'rf': 3}}")
        create_view(cluster, ks, "mv")
        assert "in the background" in message, message
        wait_until(lambda: any(point_hits(cluster, "pause_tablet_migration_stage", n) for n in NODES), 60,
                   "the RF change's first transition")
        assert any(len(t["replicas"]) == 2 for t in tablets_of(cluster, f"{ks}.tab"))
    wait_rf(cluster, [f"{ks}.tab", f"{ks}.mv"], 3)
    assert_exact(cluster, ks, ["mv"], model, rf=3)

    with injected(cluster, "pause_tablet_migration_stage", NODES):
        run(cluster, f"ALTER KEYSPACE {ks} WITH replication = {{'rf': 2}}")
        create_view(cluster, ks, "mv2")
        wait_until(lambda: any(point_hits(cluster, "pause_tablet_migration_stage", n) for n in NODES), 60,
                   "the RF change's first transition")
        assert any(len(t["replicas"]) == 3 for t in tablets_of(cluster, f"{ks}.tab"))
    wait_rf(cluster, [f"{ks}.tab", f"{ks}.mv", f"{ks}.mv2"], 2)
    assert_exact(cluster, ks, ["mv", "mv2"], model, rf=2)


def test_rf_3_to_2_under_a_concurrent_writer_with_timestamps(cluster):
    """The writer runs before, during and after the change; during it, also while the first remove transitions are
    held at their first stage (use_new: the leaving replicas take no writes)."""
    ks = "topo_rfw"
    model = make_base(cluster, ks, 2000, rf=3, tablets=8)
    create_view(cluster, ks)
    wait_built(cluster, f"{ks}.mv")
    with TimestampedWriter(cluster, ks, model, seed=3, keys=range(250)) as writer:
        wait_until(lambda: writer.error or writer.writes >= 20, 60, "the writer to write")
        writes_before = writer.writes
        with injected(cluster, "pause_tablet_migration_stage", NODES):
            run(cluster, f"ALTER KEYSPACE {ks} WITH replication = {{'rf': 2}}")
            wait_until(lambda: any(point_hits(cluster, "pause_tablet_migration_stage", n) for n in NODES), 60,
                       "the RF change's first transition")
            held = writer.writes
            wait_until(lambda: writer.error or writer.writes >= held + 30, 60,
                       "the writer to write while the transitions are held")
        wait_rf(cluster, [f"{ks}.tab", f"{ks}.mv"], 2)
        writes_during = writer.writes - writes_before
        # and on the new replica lists
        wait_until(lambda: writer.error or writer.writes >= writes_before + writes_during + 30, 60,
                   "the writer to write after the RF change")
        writer.stop()
    assert writer.error is None, writer.error
    print(f"{ks}: {writes_before} writes before the RF change, {writes_during} during it, {writer.writes} in all; "
          f"{len(writer.failed_attempts)} failed attempts retried: {writer.failed_attempts[:3]}")
    assert writes_during > 0
    assert_exact(cluster, ks, ["mv"], writer.expected, rf=2)


def test_a_rolled_back_move_then_a_move_onto_the_same_node_and_shard(cluster):
    """The first move of a tablet fails on its second window (after the first one and live writes landed on the
    pending replica): the rollback must leave nothing there. The second move onto the same node and shard must then
    leave that replica with exactly the tablet's rows, the writes and deletes made between the two included."""
    ks = "topo_back"
    model = make_base(cluster, ks, 10_000, rf=2, tablets=2)  # ~5,000 rows a tablet: more than the first window
    create_view(cluster, ks, "mv")
    wait_built(cluster, f"{ks}.mv")
    tablet = tablets_of(cluster, f"{ks}.tab")[1]
    first, last = tablet["first_token"], tablet["last_token"]
    leaving = tablet["replicas"][0]
    destination_node = next(n for n in NODES if n not in {r.split(":")[0] for r in tablet["replicas"]})
    destination = f"{destination_node}:{SHARDS - 1}"
    keys = sorted({key for key, _ in model})
    tablet_keys = [key for key in keys if first <= key_token(key) <= last]
    assert sum(1 for key, _ in model if key in set(tablet_keys)) > 4096, "the tablet needs a second window"
    rng = random.Random(4)

    with injected(cluster, "stream_tablet_fail", [destination_node], mode="pause"):
        migration_id = client.move_tablet(cluster.addresses(), f"{ks}.tab", 1, leaving, destination)
        wait_hit(cluster, "stream_tablet_fail", destination_node)  # streaming: writes go to both replicas
        assert tablets_of(cluster, f"{ks}.tab")[1].get("stage") == "streaming"
        apply_writes(cluster, ks, model, rng, tablet_keys, 200, "during-first")
        create_view(cluster, ks, "mv2")  # its task on the leaving replica is created aborted
        # the paused stream merges its first window and fails at the second
        client.inject(cluster.addr(destination_node), "stream_tablet_fail", "enable", mode="fail")
        result = client.wait_migration(cluster.addresses(), migration_id, TOPOLOGY_TIMEOUT)
    assert result["state"] == "reverted" and "stream_tablet_fail" in (result["reason"] or ""), result
    print(f"{ks}: first move {result}")
    reverted = tablets_of(cluster, f"{ks}.tab")[1]
    assert reverted["replicas"] == tablet["replicas"] and "stage" not in reverted, reverted
    leftovers = replica_rows(cluster, destination_node, f"{ks}.tab", first, last)
    assert leftovers == [], f"{destination_node} kept {len(leftovers)} rows of the reverted tablet: {leftovers[:5]}"

    apply_writes(cluster, ks, model, rng, tablet_keys, 200, "between")
    for key, c in [k for k in model if k[0] in set(tablet_keys)][:50]:  # rows of the tablet, deleted on one replica
        run(cluster, f"DELETE FROM {ks}.tab WHERE key = {key} AND c = {c}")
        model.pop((key, c))

    migration_id = client.move_tablet(cluster.addresses(), f"{ks}.tab", 1, leaving, destination)
    result = client.wait_migration(cluster.addresses(), migration_id, TOPOLOGY_TIMEOUT)
    assert result["state"] == "done", result
    moved = tablets_of(cluster, f"{ks}.tab")[1]
    assert moved["replicas"][0] == destination and "stage" not in moved, moved
    want = sorted((key, c, v) for (key, c), v in model.items() if first <= key_token(key) <= last)
    got = replica_rows(cluster, destination_node, f"{ks}.tab", first, last)
    assert got == want, f"{destination_node}'s replica of tablet 1: {difference(got, want)}"
    assert replica_rows(cluster, leaving.split(":")[0], f"{ks}.tab", first, last) == []
    assert_exact(cluster, ks, ["mv", "mv2"], model, rf=2)
