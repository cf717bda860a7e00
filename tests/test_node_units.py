"""Unit tests of node parts that need no cluster: in-flight write tracking, injections, outbox delivery."""
from __future__ import annotations

import threading
import uuid

import pytest

from common.injection import InjectedFailure, Injections
from common.internode import InternodeTransport, replica_write_timeout
from common.metrics import NodeMetrics
from common.peers import Peers
from common.replica_messages import RowBatch
from coordinator.core.state import Group0State
from replica.inflight import InflightWrites
from replica.local import LocalData, SchemaAccess
from replica.outbox import OUTBOX_BATCH
from replica.outbox_payload import encode_payload
from replica.rows import storage_spec, upsert_row
from storage.cells import Row
from storage.store import NodeStore
from vbc.cluster import free_port


def test_a_write_registers_under_the_version_it_reads_so_a_newer_schema_waits_for_it():
    inflight = InflightWrites()
    version = {"now": 1}
    with inflight.track(lambda: version["now"]) as registered:
        version["now"] = 2  # a CREATE VIEW is applied while the write runs
        assert registered == 1
        assert inflight.applied_version(version["now"]) == 1
        assert not inflight.wait_applied(2, lambda: version["now"], timeout=0.05)
    assert inflight.wait_applied(2, lambda: version["now"], timeout=0.05)


def test_waiting_for_a_schema_version_alone_does_not_wait_for_older_writes():
    inflight = InflightWrites()
    version = {"now": 1}
    with inflight.track(lambda: version["now"]):
        assert not inflight.wait_version(2, lambda: version["now"], timeout=0.05)
        version["now"] = 2
        assert inflight.wait_version(2, lambda: version["now"], timeout=0.05)  # the version-1 write still runs


def test_schema_agreement_names_unreachable_unknown_and_not_asked_nodes_without_raising():
    dead_address = f"127.0.0.1:{free_port()}"  # nothing listens: a real connection failure
    peers = Peers(lambda node: dead_address if node == "dead" else None)
    transport = InternodeTransport(peers)
    try:
        dead, unknown = transport.schema_agreement(["dead", "gone"], version=3, timeout=5.0)
        assert dead.startswith("dead: unreachable or still applying (") and unknown.startswith("gone: ")
        assert "not a member of the cluster" in unknown
    finally:
        peers.close()
    assert transport.schema_agreement(["dead"], version=3) == ["dead: this node is stopping: no new calls to other nodes"]


def test_fail_point_raises_once_when_one_shot():
    injections = Injections()
    injections.enable("read.replica.scan", mode="fail", one_shot=True)
    with pytest.raises(InjectedFailure):
        injections.hit("read.replica.scan")
    injections.hit("read.replica.scan")  # spent: passes
    assert injections.wait_hit("read.replica.scan", timeout=0)


def test_one_shot_pause_holds_the_first_hit_until_disabled_and_lets_later_hits_pass():
    injections = Injections()
    injections.enable("write.replica.before_apply", mode="pause", one_shot=True)
    released = threading.Event()

    def first_writer():
        injections.hit("write.replica.before_apply")
        released.set()

    thread = threading.Thread(target=first_writer)
    thread.start()
    assert injections.wait_hit("write.replica.before_apply", timeout=5)
    assert not released.wait(0.2), "a one-shot pause point must pause its first hit"
    injections.hit("write.replica.before_apply")  # a second hit is not paused
    injections.disable("write.replica.before_apply")
    assert released.wait(5)
    thread.join(5)


def test_unknown_injection_points_are_refused():
    with pytest.raises(KeyError, match="unknown injection point"):
        Injections().enable("no.such.point")


class _StateReader:
    """Reads a real Group0State the way the node's Raft adapter does (a function applied to the state)."""

    def __init__(self, state: Group0State):
        self.state = state

    def __call__(self, fn):
        return fn(self.state)


def _local_data(store: NodeStore, state: Group0State, peers: Peers) -> LocalData:
    schema = SchemaAccess(_StateReader(state), lambda _version: None, InflightWrites())
    return LocalData("alive", store, schema, InternodeTransport(peers), Injections(), NodeMetrics())


def _state_with_view() -> tuple[Group0State, str, str]:
    state = Group0State()
    state.apply({"op": "register_node", "node_id": "alive", "grpc": "unused", "raft": "unused", "shards": 1})
    state.apply({"op": "create_keyspace", "name": "ks", "rf": 1, "initial_tablets": 1})
    table_id, view_id = uuid.uuid4().hex, uuid.uuid4().hex
    state.apply({"op": "create_table", "id": table_id, "keyspace": "ks", "name": "t",
                 "columns": [["k", "int"], ["v", "int"]], "partition_key": ["k"], "clustering_key": []})
    state.apply({"op": "create_view", "id": view_id, "keyspace": "ks", "name": "mv", "base": "t", "columns": None,
                 "where": [["v", "IS NOT NULL", None], ["k", "IS NOT NULL", None]],
                 "partition_key": ["v"], "clustering_key": ["k"]})
    return state, table_id, view_id


def test_an_unreachable_view_replica_does_not_block_deliveries_to_others(tmp_path):
    state, table_id, view_id = _state_with_view()
    view = state.tables[view_id]
    store = NodeStore.for_data_dir(tmp_path)
    dead_address = f"127.0.0.1:{free_port()}"  # nothing listens: a real connection failure
    peers = Peers(lambda node: dead_address if node == "dead" else None)
    local = _local_data(store, state, peers)
    try:
        for table in (state.tables[table_id], view):
            store.ensure_table(storage_spec(table))
        dead_entries = OUTBOX_BATCH * 21 + 1  # more pages than one flush reads, all for the dead node, queued first
        update = upsert_row(view, {"v": 1, "k": 1}, ts=10)
        payload = encode_payload(RowBatch(view_id, shard=0, rows=(update,), schema_version=state.schema_version))
        entries = [("dead", payload)] * dead_entries + [("alive", payload)]
        base_row = upsert_row(state.tables[table_id], {"k": 1, "v": 1}, ts=10)
        store.apply(table_id, [base_row], derive=lambda changes: entries)
        assert store.outbox_size() == dead_entries + 1
        local.flush_outbox()
        assert store.outbox_size() == dead_entries, "the entry for the live replica must be delivered"
        assert [r.key for r in store.scan(view_id, -(2**63), 2**63 - 1)] == [(1, 1)]
    finally:
        peers.close()
        store.close()


def test_storage_is_dropped_only_for_tables_the_schema_says_were_dropped(tmp_path):
    state, table_id, view_id = _state_with_view()
    store = NodeStore.for_data_dir(tmp_path)
    local = _local_data(store, state, Peers(lambda node: None))
    try:
        for table in (state.tables[table_id], state.tables[view_id]):
            local.ensure_table(table)
        # a node replaying its journal does not know the tables yet
        _local_data(store, Group0State(), Peers(lambda node: None)).drop_dropped_tables()
        assert store.table_ids() == {table_id, view_id}
        state.apply({"op": "drop_view", "keyspace": "ks", "name": "mv", "cmd_id": "drop"})
        local.drop_dropped_tables()
        assert store.table_ids() == {table_id}
    finally:
        store.close()


def test_a_replica_write_deadline_grows_with_the_rows_of_the_batch():
    rows = tuple(Row(token=i, key=(i,), marker_ts=1) for i in range(5000))
    assert replica_write_timeout(RowBatch(table_id="t", shard=0, rows=rows[:1], timestamp=1, schema_version=1)) < 11
    assert replica_write_timeout(RowBatch(table_id="t", shard=0, rows=rows, timestamp=1, schema_version=1)) == 35.0


# ------------------------------------------------------------------ Admin.Inject behind --enable-injections


@pytest.fixture
def admin_nodes():
    """Two in-process Admin services over gRPC: "on" (started with --enable-injections) and "off"; their addresses."""
    from concurrent import futures

    import grpc

    from node.admin_service import AdminDeps, AdminService
    from vbcpb import vbc_pb2_grpc as rpc

    servers, addresses = [], {}
    for node_id, enabled in (("on", True), ("off", False)):
        deps = AdminDeps(node_id=node_id, read_state=None, raft_status=dict, require_ready=lambda: None,
                         probe=lambda _: None, injections=Injections(), catch_up=lambda: None, check_view=None,
                         clock=lambda: 0.0, injections_enabled=enabled)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        rpc.add_AdminServicer_to_server(AdminService(deps), server)
        addresses[node_id] = f"127.0.0.1:{free_port()}"
        assert server.add_insecure_port(addresses[node_id])
        server.start()
        servers.append(server)
    yield addresses
    for server in servers:
        server.stop(0)


@pytest.mark.parametrize("action", ["enable", "disable", "wait_hit"])
def test_inject_is_permission_denied_on_a_node_without_enable_injections(admin_nodes, action):
    import grpc

    from vbc import client

    with pytest.raises(grpc.RpcError) as refused:
        client.inject(admin_nodes["off"], "read.replica.scan", action, timeout=1.0)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == ("fault injection is disabled on node off: "
                                       "start the node with --enable-injections")
    listed = client.inject(admin_nodes["off"], action="list")
    assert listed["injections_enabled"] is False and not any(p["enabled"] for p in listed["points"])


def test_inject_works_on_a_node_with_enable_injections(admin_nodes):
    from vbc import client

    enabled = client.inject(admin_nodes["on"], "read.replica.scan", "enable", mode="pause", one_shot=True)
    assert enabled["injections_enabled"] is True and enabled["node"] == "on"
    assert {"name": "read.replica.scan", "enabled": True, "mode": "pause", "one_shot": True, "hits": 0} \
        in enabled["points"]
    assert client.inject(admin_nodes["on"], "read.replica.scan", "wait_hit", timeout=0.01)["hit"] is False
    disabled = client.inject(admin_nodes["on"], "read.replica.scan", "disable")
    assert not any(p["enabled"] for p in disabled["points"])


def test_vbc_inject_shows_the_refusal_and_lists_with_a_note(admin_nodes, capsys):
    from vbc import cli

    assert cli.main(["inject", "--addr", admin_nodes["off"], "read.replica.scan", "--enable"]) == 1
    assert capsys.readouterr().err == ("error: PERMISSION_DENIED: fault injection is disabled on node off: "
                                       "start the node with --enable-injections\n")
    assert cli.main(["inject", "--addr", admin_nodes["off"], "--list"]) == 0
    out = capsys.readouterr().out
    assert "read.replica.scan" in out and out.endswith(
        "\nfault injection is disabled on off: start the node with --enable-injections to switch these points on\n")
    assert cli.main(["inject", "--addr", admin_nodes["on"], "--list"]) == 0
    assert "read.replica.scan" in (out := capsys.readouterr().out) and "disabled on" not in out


# ------------------------------------------------------------------ Admin: a migration that rolls back


def rolling_back_state():
    """A group0 state whose tablet 1 rolls back from streaming (cleanup_target, with a reason); the migration's id."""
    from coordinator.core import migrations as m
    from tests.test_tablet_migrations import advance, other_node, run_to, start, two_node_table

    state, table_id = two_node_table()
    leaving, migration_id = state.tablets[table_id].replicas[1][0], uuid.uuid4().hex
    assert start(state, table_id, 1, leaving, other_node(state, leaving), migration_id=migration_id).ok
    run_to(state, table_id, 1, "streaming")
    assert advance(state, m.transition_of(state, table_id, 1), "cleanup_target", reason="stream failed: boom").ok
    return state, migration_id


def test_migration_info_tells_why_a_migration_in_progress_rolls_back():
    from node.admin_service import migration_info

    state, migration_id = rolling_back_state()
    info = migration_info(state, migration_id)
    assert (info.state, info.stage, info.reason) == ("in_progress", "cleanup_target", "stream failed: boom")
    assert migration_info(state, "unknown-id").reason == ""


def test_admin_tablets_tells_why_a_move_rolls_back():
    from node.admin_service import AdminDeps, AdminService
    from vbcpb import vbc_pb2 as pb

    state, migration_id = rolling_back_state()
    service = AdminService(AdminDeps(node_id="n1", read_state=lambda read: read(state), raft_status=dict,
                                     require_ready=lambda: None, probe=lambda _: None, injections=Injections(),
                                     catch_up=lambda: None, check_view=None, clock=lambda: 0.0))
    try:
        tablets = service.Tablets(pb.TabletsRequest(table="ks.t"), None)
    finally:
        service.close()
    moving, still = tablets.tablets[1], tablets.tablets[0]
    assert (moving.stage, moving.migration_id, moving.reason) == ("cleanup_target", migration_id, "stream failed: boom")
    assert (still.stage, still.reason) == ("", "")


def test_worker_metrics_export_the_phases_the_spark_state_and_failing_views():
    from prometheus_client import generate_latest

    metrics = NodeMetrics()
    metrics.bind_worker(lambda: {"spark_jobs": 4, "read_s": 1.5, "spark_s": 2.5, "merge_s": 0.5,
                                 "spark_state": "warming", "spark_start_s": 0.0, "batches_running": 1,
                                 "failures": [{"view_id": "v1", "error": "boom", "attempts": 3}]})
    text = generate_latest(metrics.registry).decode()
    for line in ("vbc_worker_spark_jobs_total 4.0", "vbc_worker_read_seconds_total 1.5",
                 "vbc_worker_spark_seconds_total 2.5", "vbc_worker_merge_seconds_total 0.5",
                 'vbc_worker_spark_state{state="warming"} 1.0', 'vbc_worker_spark_state{state="ready"} 0.0',
                 "vbc_worker_spark_start_seconds 0.0", "vbc_worker_batches_running 1.0",
                 'vbc_worker_view_failed_attempts{view_id="v1"} 3.0'):
        assert line in text.splitlines(), line
