"""The acceptance scenarios of view building, against real node processes (Raft, gRPC, Spark, SQLite).

Every scenario builds `KS.mv` (or a variant) over `KS.tab(key int, c int, v text, PRIMARY KEY (key, c))` holding
rows `(i // 10, i % 10, str(i))`, in a keyspace of its own. "Correct" means: the view is BUILT, its (key, c, v)
rows read through the client equal the base's (filtered like the view), and `vbc check` finds no difference.

Two clusters, each started once for this module (a node's Spark session stays warm between scenarios):
- the shared 3-node cluster runs every scenario that kills no node;
- the kill cluster (3 nodes, 2 shards each) runs the scenarios that kill nodes with SIGKILL (leader kill,
  worker kill, full cluster kill); each leaves every node running again, and the next one heals what a failed
  one left behind. The shared cluster is stopped before the kill cluster starts (two clusters at once would
  share the 2 CI cores).

Scenario 16 (the deterministic simulation) is tests/test_view_building_sim.py.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from coordinator.core.ids import derived_id
from vbc import client
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as pb_grpc

from .cluster_harness import LocalCluster, wait_until

pytestmark = pytest.mark.integration

NODES = ("n1", "n2", "n3")
BUILD_TIMEOUT = 240.0  # a cold Spark session on a loaded 2-core machine takes up to a minute
HIT_TIMEOUT = 120.0
VIEW_WHERE = "c IS NOT NULL AND key IS NOT NULL AND v IS NOT NULL"


# ============================================================================ clusters


class _Clusters:
    """The module's clusters, started on first use; starting the kill cluster stops the shared one."""

    def __init__(self, tmp_path_factory):
        self._tmp = tmp_path_factory
        self.shared: LocalCluster | None = None
        self.kill: LocalCluster | None = None

    def get_shared(self) -> LocalCluster:
        if self.kill is not None:
            self._close("kill")
        if self.shared is None:
            self.shared = LocalCluster(3, self._tmp.mktemp("shared-cluster"), shards=1).start()
        return self.shared

    def get_kill(self) -> LocalCluster:
        if self.shared is not None:
            self._close("shared")
        if self.kill is None:
            self.kill = LocalCluster(3, self._tmp.mktemp("kill-cluster"), shards=2).start()
        return self.kill

    def _close(self, which: str) -> None:
        """Stop every process of a cluster (its data directory stays under pytest's basetemp)."""
        cluster = getattr(self, which)
        setattr(self, which, None)
        if cluster is not None:
            cluster.close()

    def close_all(self) -> None:
        for which in ("shared", "kill"):
            self._close(which)


@pytest.fixture(scope="module")
def _clusters(tmp_path_factory):
    clusters = _Clusters(tmp_path_factory)
    try:
        yield clusters
    finally:
        clusters.close_all()


@contextmanager
def _logs_on_failure(request, cluster: LocalCluster):
    """Print the tail of every node log when the test using `cluster` failed (the cluster lives on)."""
    failures = request.session.testsfailed
    yield cluster
    if request.session.testsfailed > failures:  # pragma: no cover - diagnostics
        cluster.print_logs()


@pytest.fixture
def cluster(_clusters, request):
    """The shared 3-node cluster (1 shard per node)."""
    shared = _clusters.get_shared()
    with _logs_on_failure(request, shared):
        yield shared


@pytest.fixture
def kill_cluster(_clusters, request):
    """The 3-node cluster (2 shards per node) for the scenarios that kill nodes; every node runs at the start."""
    cluster = _clusters.get_kill()
    heal(cluster)
    with _logs_on_failure(request, cluster):
        yield cluster


def heal(cluster: LocalCluster) -> None:
    """Every node of `cluster` running (continued if stopped), a leader elected, no injection point enabled."""
    for node in cluster.nodes:
        pid = node["pid"]
        if pid and pid in cluster.pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    for node_id in NODES:
        if not cluster.is_running(node_id):
            cluster.start_node(node_id)
    cluster.wait_for_leader(timeout=60)
    for node_id in NODES:
        points = client.inject(cluster.addr(node_id), action="list")["points"]
        for point in points:
            if point["enabled"]:
                cluster.inject(point["name"], node_id, "disable")


# ============================================================================ helpers


def addrs(cluster: LocalCluster) -> list[str]:
    return cluster.addresses()


def run(cluster: LocalCluster, statement: str, params: list[list] | None = None):
    return client.execute(addrs(cluster), statement, params=params)


def status(cluster: LocalCluster) -> dict:
    return client.status(addrs(cluster))


def view_status(cluster: LocalCluster, view: str) -> dict:
    return client.view_status(addrs(cluster), view)


def make_base(cluster: LocalCluster, ks: str, rows: int, rf: int = 3, tablets: int = 4) -> None:
    run(cluster, f"CREATE KEYSPACE {ks} WITH replication = {{'rf': {rf}}} AND tablets = {{'initial': {tablets}}}")
    run(cluster, f"CREATE TABLE {ks}.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    insert_rows(cluster, ks, range(rows))


def insert_rows(cluster: LocalCluster, ks: str, numbers, chunk: int = 2000) -> None:
    numbers = list(numbers)
    for start in range(0, len(numbers), chunk):
        params = [[i // 10, i % 10, str(i)] for i in numbers[start:start + chunk]]
        _, _, message = run(cluster, f"INSERT INTO {ks}.tab (key, c, v) VALUES (?, ?, ?)", params)
        assert message == f"ok: {len(params)} statements applied", message


def create_view(cluster: LocalCluster, ks: str, name: str = "mv", extra_where: str = "") -> None:
    where = VIEW_WHERE + (f" AND {extra_where}" if extra_where else "")
    run(cluster, f"CREATE MATERIALIZED VIEW {ks}.{name} AS SELECT * FROM {ks}.tab WHERE {where} "
                 "PRIMARY KEY (c, key, v)")


def wait_built(cluster: LocalCluster, view: str, timeout: float = BUILD_TIMEOUT, poll: float = 0.1,
               on_progress=None) -> dict:
    """The status of `view` once it is BUILT (`on_progress` sees every status read before)."""
    last: list[dict] = []

    def built():
        current = view_status(cluster, view)
        last[:] = [current]
        if on_progress is not None:
            on_progress(current)
        return current if current["state"] == "BUILT" else None

    try:
        return wait_until(built, timeout, f"{view} to be BUILT", interval=poll)
    except AssertionError as error:
        raise AssertionError(f"{error}; last status: {last[0] if last else None}") from None


def rows_of(cluster: LocalCluster, table: str) -> list[tuple]:
    return sorted((r["key"], r["c"], r["v"]) for r in client.query(addrs(cluster), f"SELECT * FROM {table}",
                                                                     timeout=120))


def assert_correct(cluster: LocalCluster, ks: str, view: str = "mv", keep=lambda row: True) -> dict:
    """The view is BUILT, holds exactly the base rows `keep` selects, and `vbc check` finds no difference."""
    built = wait_built(cluster, f"{ks}.{view}")
    expected = [row for row in rows_of(cluster, f"{ks}.tab") if keep(row)]
    got = rows_of(cluster, f"{ks}.{view}")
    assert got == expected, (f"{ks}.{view}: {len(got)} rows, expected {len(expected)}; "
                             f"missing {sorted(set(expected) - set(got))[:5]}, extra {sorted(set(got) - set(expected))[:5]}")
    checked = client.check(addrs(cluster), f"{ks}.{view}")
    assert checked["consistent"] and checked["state"] == "BUILT", checked
    return built


def worker_stats(cluster: LocalCluster, node_id: str | None = None) -> dict:
    """The worker counters of one node, or their sums over every node (all must be alive)."""
    nodes = status(cluster)["nodes"]
    assert all(n["alive"] and n["worker"] is not None for n in nodes), nodes
    if node_id is not None:
        return next(n["worker"] for n in nodes if n["id"] == node_id)
    totals: dict[str, int] = {}
    for node in nodes:
        for name, value in node["worker"].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[name] = totals.get(name, 0) + value
    return totals


def local_worker_stats(cluster: LocalCluster, node_id: str) -> pb.WorkerStats:
    """The worker counters straight from one node (Internode.LocalStatus: needs no other node)."""
    return client.internode_stub(cluster.addr(node_id)).LocalStatus(pb.LocalStatusRequest(), timeout=5).worker


def inject(cluster: LocalCluster, name: str, nodes=NODES, action: str = "enable", mode: str = "pause",
           one_shot: bool = False) -> None:
    for node_id in nodes:
        if action == "enable":
            client.inject(cluster.addr(node_id), name, "enable", mode=mode, one_shot=one_shot)
        else:
            client.inject(cluster.addr(node_id), name, action)


@contextmanager
def injected(cluster: LocalCluster, name: str, nodes=NODES, mode: str = "pause"):
    """`name` enabled on `nodes` inside the block; disabled on every running one of them when it ends."""
    inject(cluster, name, nodes, mode=mode)
    try:
        yield
    finally:
        for node_id in nodes:
            if cluster.is_running(node_id):
                try:
                    client.inject(cluster.addr(node_id), name, "disable")
                except grpc.RpcError:
                    pass


def wait_hit(cluster: LocalCluster, name: str, node_id: str, timeout: float = HIT_TIMEOUT) -> None:
    answer = client.inject(cluster.addr(node_id), name, "wait_hit", timeout=timeout)
    assert answer["hit"], f"{name} was not hit on {node_id} within {timeout:g} s"


def point_hits(cluster: LocalCluster, name: str, node_id: str) -> int:
    points = client.inject(cluster.addr(node_id), action="list")["points"]
    return next(p["hits"] for p in points if p["name"] == name)


def table_id(cluster: LocalCluster, table: str) -> str:
    request = pb.TabletsRequest(table=table)
    return client.call_any(addrs(cluster), lambda a: client.admin_stub(a).Tablets(request, timeout=10),
                           idempotent=True).table_id


def build_task_ids(cluster: LocalCluster, ks: str, view_id: str) -> dict[str, tuple[str, int, int]]:
    """task id -> (node, shard, tablet) of every build task a view over KS.tab was created with (the ids are
    derived in group0 as derived_id(view id, view id, tablet, node, shard))."""
    tasks = {}
    for tablet in client.tablets(addrs(cluster), f"{ks}.tab"):
        for replica in tablet["replicas"]:
            node, shard = replica.split(":")
            task = derived_id(view_id, view_id, tablet["tablet"], node, int(shard))
            tasks[task] = (node, int(shard), tablet["tablet"])
    return tasks


def tasks_in_group0(cluster: LocalCluster, tasks: dict[str, tuple[str, int, int]]) -> set[str]:
    """The ids among `tasks` that group0 still holds, asked through the Worker RPC of a node that is NOT the
    task's replica: a task group0 holds is refused there as not belonging to that node (INVALID_ARGUMENT), a
    task it does not hold is answered as not finished. Nothing runs either way. The probed node first applies
    everything any node applied (the request's applied_index), so a command applied elsewhere is seen."""
    applied = max(client.local_status(cluster.addr(n))["applied_index"] for n in NODES)
    present = set()
    for task_id, (node, _shard, _tablet) in tasks.items():
        other = next(n for n in NODES if n != node)
        address = cluster.addr(other)
        term = client.local_status(address)["term"]
        request = pb.WorkRequest(term=term, shard=0, task_ids=[task_id], applied_index=applied)
        try:
            answer = pb_grpc.WorkerStub(client.connect(address)).WorkOnViewBuildingTasks(request, timeout=10)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "do not belong" in error.details(), error
            present.add(task_id)
        else:
            assert list(answer.finished_task_ids) == []
    return present


def stored_table_ids(node: dict) -> set[str]:
    """Table ids with storage on a node: its storage catalog and the SQL tables t_<id> in its storage.db."""
    db = sqlite3.connect(f"file:{node['data_dir']}/storage.db?mode=ro", uri=True, timeout=30)
    try:
        catalog = {row[0] for row in db.execute("SELECT table_id FROM storage_catalog")}
        tables = {row[0][2:] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                   "AND name LIKE 't\\_%' ESCAPE '\\'")}
        return catalog | tables
    finally:
        db.close()


def assert_no_storage(cluster: LocalCluster, dropped_id: str) -> None:
    wait_until(lambda: all(dropped_id not in stored_table_ids(n) for n in cluster.nodes), 30,
               f"the storage of dropped view {dropped_id} to be removed on every node")


def vbc_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vbc", *args], capture_output=True, text=True, timeout=timeout)


# ============================================================================ the shared cluster


def test_01_view_over_no_data_is_built_on_every_node_and_empty(cluster):
    make_base(cluster, "s01", rows=0)
    create_view(cluster, "s01")
    built = assert_correct(cluster, "s01")
    assert built["hosts"] == {"n1": "SUCCESS", "n2": "SUCCESS", "n3": "SUCCESS"}
    assert built["tasks_total"] == built["tasks_done"] == 12 and built["progress"] == 1.0
    assert rows_of(cluster, "s01.mv") == []


def test_02_view_over_1000_rows_is_correct(cluster):
    make_base(cluster, "s02", rows=1000)
    create_view(cluster, "s02")
    built = assert_correct(cluster, "s02")
    assert len(rows_of(cluster, "s02.mv")) == 1000
    assert built["rows_done"] == 3 * 1000  # every base row scanned once on each of its 3 replicas


def test_03_filtered_view_with_rf_1_holds_exactly_its_partitions(cluster):
    make_base(cluster, "s03", rows=300, rf=1)
    create_view(cluster, "s03", extra_where="key IN (1, 4, 9)")
    assert_correct(cluster, "s03", keep=lambda row: row is None or row[0] in (1, 4, 9))
    assert sorted({row[0] for row in rows_of(cluster, "s03.mv")}) == [1, 4, 9]
    assert len(rows_of(cluster, "s03.mv")) == 30


def test_04_two_views_created_while_the_loop_is_paused_share_one_scan_per_tablet_replica(cluster):
    make_base(cluster, "s04", rows=600)
    replicas = sum(len(t["replicas"]) for t in client.tablets(addrs(cluster), "s04.tab"))
    with injected(cluster, "coordinator_pause_main_loop"):  # on every node: whichever leads dispatches nothing
        create_view(cluster, "s04", "mv1")
        create_view(cluster, "s04", "mv2")
        for view in ("s04.mv1", "s04.mv2"):
            assert view_status(cluster, view)["tasks_done"] == 0
        scans_before = worker_stats(cluster)["tablet_scans"]
    for view in ("mv1", "mv2"):
        assert_correct(cluster, "s04", view)
    assert worker_stats(cluster)["tablet_scans"] - scans_before == replicas == 12


def test_05_a_view_created_while_the_first_ones_batches_are_paused(cluster):
    make_base(cluster, "s05", rows=500)
    with injected(cluster, "worker_pause_build_range"):
        create_view(cluster, "s05", "mv1")
        for node_id in NODES:
            wait_hit(cluster, "worker_pause_build_range", node_id)
        create_view(cluster, "s05", "mv2")
        assert view_status(cluster, "s05.mv1")["state"] == view_status(cluster, "s05.mv2")["state"] == "BUILDING"
    for view in ("mv1", "mv2"):
        assert_correct(cluster, "s05", view)


def test_06_dropping_one_of_two_building_views_while_paused(cluster):
    make_base(cluster, "s06", rows=500)
    with injected(cluster, "worker_pause_build_range"):
        with injected(cluster, "coordinator_pause_main_loop"):  # both views' tasks go out in the same batches
            create_view(cluster, "s06", "keep")
            create_view(cluster, "s06", "gone")
            gone_id = table_id(cluster, "s06.gone")
            gone_tasks = build_task_ids(cluster, "s06", gone_id)
        for node_id in NODES:
            wait_hit(cluster, "worker_pause_build_range", node_id)
        assert tasks_in_group0(cluster, gone_tasks) == set(gone_tasks) and len(gone_tasks) == 12
        run(cluster, "DROP MATERIALIZED VIEW s06.gone")
        assert "s06.gone" not in {v["name"] for v in status(cluster)["views"]}
    assert_correct(cluster, "s06", "keep")
    assert tasks_in_group0(cluster, gone_tasks) == set()
    assert_no_storage(cluster, gone_id)
    assert "s06.gone" not in {v["name"] for v in status(cluster)["views"]}


def test_07_dropping_the_only_view_while_paused_then_a_new_view_builds(cluster):
    make_base(cluster, "s07", rows=500)
    with injected(cluster, "worker_pause_before_finish"):  # its view rows are merged; it is not recorded finished
        create_view(cluster, "s07")
        dropped_id = table_id(cluster, "s07.mv")
        dropped_tasks = build_task_ids(cluster, "s07", dropped_id)
        for node_id in NODES:
            wait_hit(cluster, "worker_pause_before_finish", node_id)
        assert all(dropped_id in stored_table_ids(n) for n in cluster.nodes)
        run(cluster, "DROP MATERIALIZED VIEW s07.mv")
        assert tasks_in_group0(cluster, dropped_tasks) == set()
        assert_no_storage(cluster, dropped_id)
    create_view(cluster, "s07")  # the same name again: a new view with a new id
    assert table_id(cluster, "s07.mv") != dropped_id
    assert_correct(cluster, "s07")
    assert tasks_in_group0(cluster, dropped_tasks) == set()
    assert all(dropped_id not in stored_table_ids(n) for n in cluster.nodes)


def test_09_batches_failing_on_one_node_for_a_while_then_built(cluster):
    make_base(cluster, "s09", rows=500)
    failed_before = worker_stats(cluster, "n2")["batches_failed"]
    with injected(cluster, "worker_fail_build_range", nodes=("n2",), mode="fail"):
        create_view(cluster, "s09")
        wait_until(lambda: worker_stats(cluster, "n2")["batches_failed"] >= failed_before + 3, 120,
                   "three failed batches on n2")
        assert view_status(cluster, "s09.mv")["hosts"]["n2"] == "STARTED"
    assert_correct(cluster, "s09")
    assert worker_stats(cluster, "n2")["batches_failed"] > failed_before


def test_11_concurrent_inserts_updates_and_deletes_during_the_whole_build(cluster):
    total = 20_000
    make_base(cluster, "s11", rows=total, tablets=8)
    stop = threading.Event()
    errors: list[str] = []
    writes = [0]
    lock = threading.Lock()

    def writer(seed: int) -> None:
        rnd = random.Random(seed)
        addresses = addrs(cluster)
        addresses = addresses[seed % len(addresses):] + addresses[:seed % len(addresses)]
        while not stop.is_set():
            # half of the writes on a hot range (rows written again and again while their tablet is scanned),
            # the rest anywhere, new rows too
            i = rnd.randrange(300) if rnd.random() < 0.5 else rnd.randrange(total + 2_000)
            key, c, v = i // 10, i % 10, f"w{seed}-{rnd.randrange(10**9)}"
            choice = rnd.random()
            if choice < 0.35:
                statement, params = "INSERT INTO s11.tab (key, c, v) VALUES (?, ?, ?)", [key, c, v]
            elif choice < 0.8:
                statement, params = "UPDATE s11.tab SET v = ? WHERE key = ? AND c = ?", [v, key, c]
            else:
                statement, params = "DELETE FROM s11.tab WHERE key = ? AND c = ?", [key, c]
            try:
                client.execute(addresses, statement, params=[params])
            except grpc.RpcError as error:  # pragma: no cover - reported below
                errors.append(f"{statement} {params}: {client.error_text(error)}")
                return
            with lock:
                writes[0] += 1

    threads = [threading.Thread(target=writer, args=(seed,), daemon=True) for seed in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: errors or writes[0] >= 20, 60, "the writers to write")
        create_view(cluster, "s11")
        writes_at_create = writes[0]
        wait_built(cluster, "s11.mv", poll=0.05)
        writes_during_build = writes[0] - writes_at_create
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert errors == []
    assert not any(thread.is_alive() for thread in threads)
    assert writes_during_build >= 10, f"only {writes_during_build} writes while the view was building"
    print(f"s11: {writes_during_build} writes while the view was building, {writes[0]} in all")
    cluster.wait_views_flushed(timeout=60)
    assert_correct(cluster, "s11")


def test_13_progress_never_decreases_and_rows_done_equals_rows_scanned(cluster):
    make_base(cluster, "s13", rows=2000, tablets=8)
    before = worker_stats(cluster)
    samples: list[float] = []
    with injected(cluster, "coordinator_pause_main_loop"):
        create_view(cluster, "s13")
        samples.append(view_status(cluster, "s13.mv")["progress"])
    built = wait_built(cluster, "s13.mv", poll=0.05, on_progress=lambda v: samples.append(v["progress"]))
    samples.append(view_status(cluster, "s13.mv")["progress"])
    assert samples[0] == 0.0 and samples[-1] == 1.0 and built["progress"] == 1.0
    assert all(a <= b for a, b in zip(samples, samples[1:])), samples
    assert any(0.0 < p < 1.0 for p in samples), samples  # sampled while it was building, not just before and after
    after = worker_stats(cluster)
    assert after["batches_failed"] == before["batches_failed"]  # nothing was retried
    scanned = after["rows_scanned"] - before["rows_scanned"]
    assert built["rows_done"] == scanned == 3 * 2000
    assert after["tablet_scans"] - before["tablet_scans"] == 24
    assert_correct(cluster, "s13")


def test_14_index_over_existing_data_answers_a_lookup(cluster):
    make_base(cluster, "s14", rows=1000)
    run(cluster, "CREATE INDEX ON s14.tab (v)")
    built = wait_built(cluster, "s14.tab_v_idx")
    assert built["is_index"]
    assert client.query(addrs(cluster), "SELECT * FROM s14.tab WHERE v = '777'") == [{"key": 77, "c": 7, "v": "777"}]
    assert client.query(addrs(cluster), "SELECT * FROM s14.tab WHERE v = 'nope'") == []
    checked = client.check(addrs(cluster), "s14.tab_v_idx")
    assert checked["consistent"] and checked["base_rows"] == checked["view_rows"] == 3000, checked


def test_15_check_reports_a_row_deleted_from_a_view_replica_behind_the_systems_back(cluster):
    make_base(cluster, "s15", rows=200)
    create_view(cluster, "s15")
    assert_correct(cluster, "s15")
    view_id = table_id(cluster, "s15.mv")
    victim = cluster.node("n2")
    db = sqlite3.connect(f"{victim['data_dir']}/storage.db", timeout=30)
    try:
        with db:
            deleted = db.execute(f'DELETE FROM "t_{view_id}" WHERE "c_c" = 4 AND "c_key" = 3').rowcount
    finally:
        db.close()
    assert deleted == 1
    result = vbc_cli("check", "--cluster", str(cluster.data_dir), "s15.mv", "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert not report["consistent"] and (report["missing"], report["extra"], report["different"]) == (1, 0, 0)
    (example,) = report["examples"]
    assert example["kind"] == "MISSING" and example["replica"].startswith("n2:"), example
    assert "c=4" in example["key"] and "key=3" in example["key"] and "v='34'" in example["key"], example
    text = vbc_cli("check", "--cluster", str(cluster.data_dir), "s15.mv")
    assert text.returncode == 1 and "MISSING" in text.stdout and "INCONSISTENT" in text.stdout, text.stdout


# ============================================================================ the kill cluster


def test_08_leader_kill_9_while_batches_are_paused(kill_cluster):
    cluster = kill_cluster
    make_base(cluster, "s08", rows=1000)
    with injected(cluster, "worker_pause_build_range"):
        create_view(cluster, "s08")
        for node_id in NODES:
            wait_hit(cluster, "worker_pause_build_range", node_id)
        leader = cluster.wait_for_leader()
        assert cluster.stop_node(leader, kill=True) == "killed"
        cluster.wait_for_leader(timeout=60, exclude=[leader])
        assert view_status(cluster, "s08.mv")["state"] == "BUILDING"
        cluster.start_node(leader)
    assert_correct(cluster, "s08")
    assert view_status(cluster, "s08.mv")["rows_done"] == 3 * 1000, "each replica's rows counted once"


def test_10_worker_kill_9_while_paused_before_finish_then_its_ledger_answers(kill_cluster):
    """Worker X runs two batches, one per shard. With the group0 leader L and the third node Y frozen (SIGSTOP:
    no coordinator can take X's answers, none can be elected), one batch records its task in X's ledger and
    answers into the void, the other waits at worker_pause_before_finish; then X and L are killed with
    SIGKILL. After the restart the recorded task is still in group0, so the new loop sends it again: X answers
    it from its ledger without scanning, and scans only its other tablet replicas."""
    cluster = kill_cluster
    make_base(cluster, "s10", rows=1000)
    leader = cluster.wait_for_leader()
    x, y = [n for n in NODES if n != leader]
    with injected(cluster, "coordinator_pause_main_loop"):
        create_view(cluster, "s10")
        inject(cluster, "worker_pause_build_range", nodes=[x])
    view_id = table_id(cluster, "s10.mv")
    tasks = build_task_ids(cluster, "s10", view_id)
    x_tasks = {task for task, (node, _, _) in tasks.items() if node == x}
    # X's view rows stay on X (base replica i feeds view replica i): its batches need no frozen node
    for base_tablet, view_tablet in zip(client.tablets(addrs(cluster), "s10.tab"),
                                        client.tablets(addrs(cluster), "s10.mv")):
        pair = [r.split(":")[0] for r in base_tablet["replicas"]].index(x)
        assert view_tablet["replicas"][pair].split(":")[0] == x, (base_tablet, view_tablet)
    wait_until(lambda: point_hits(cluster, "worker_pause_build_range", x) >= 2, HIT_TIMEOUT,
               f"a batch on each shard of {x}")
    finished_before = local_worker_stats(cluster, x).tasks_finished
    inject(cluster, "worker_pause_before_finish", nodes=[x], one_shot=True)
    assert cluster.wait_for_leader() == leader  # who is frozen below was chosen by it
    frozen = [cluster.node(leader)["pid"], cluster.node(y)["pid"]]
    try:
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        inject(cluster, "worker_pause_build_range", nodes=[x])  # enabling anew releases both waiting batches
        wait_hit(cluster, "worker_pause_before_finish", x)
        wait_until(lambda: local_worker_stats(cluster, x).tasks_finished == finished_before + 1, HIT_TIMEOUT,
                   f"one batch of {x} recorded finished")
        assert cluster.stop_node(x, kill=True) == "killed"
        assert cluster.stop_node(leader, kill=True) == "killed"
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    ledger = sqlite3.connect(Path(cluster.node(x)["data_dir"]) / "view_building_ledger.db", timeout=30)
    try:  # X is dead: what its ledger holds is what it recorded before the kill
        recorded = {row[0] for row in ledger.execute("SELECT task_id FROM finished_tasks")} & x_tasks
    finally:
        ledger.close()
    assert len(recorded) == 1, recorded
    cluster.start_node(leader)
    cluster.start_node(x)
    cluster.wait_for_leader(timeout=60)
    assert_correct(cluster, "s10")
    stats = worker_stats(cluster, x)
    assert stats["batches_failed"] == 0, stats
    assert stats["tasks_answered_from_ledger"] >= 1, stats
    assert stats["tablet_scans"] == len(x_tasks) - len(recorded), stats
    assert view_status(cluster, "s10.mv")["rows_done"] == 3 * 1000, "the ledger's answer brought its rows"


def test_12_full_cluster_kill_9_mid_build_then_start(kill_cluster):
    cluster = kill_cluster
    make_base(cluster, "s12", rows=1000)
    with injected(cluster, "worker_pause_before_finish", nodes=["n2"]):  # the build cannot end before the kill
        create_view(cluster, "s12")
        wait_hit(cluster, "worker_pause_before_finish", "n2")
        wait_until(lambda: view_status(cluster, "s12.mv")["tasks_done"] > 0, BUILD_TIMEOUT, "some tasks done")
        mid = view_status(cluster, "s12.mv")
        assert 0 < mid["tasks_done"] < mid["tasks_total"] and mid["state"] == "BUILDING", mid
        for node_id in NODES:
            assert cluster.stop_node(node_id, kill=True) == "killed"
    for node_id in NODES:
        cluster.start_node(node_id)
    cluster.wait_for_leader(timeout=60)
    assert_correct(cluster, "s12")
    assert view_status(cluster, "s12.mv")["rows_done"] == 3 * 1000, "each replica's rows counted once"
