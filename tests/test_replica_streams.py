"""Replica writes on open ReplicaWrites calls (common.stream_pool, common.open_calls, common.internode) against a
real in-process gRPC server running the node's Internode service over a fake replica."""
from __future__ import annotations

import threading
import time
from concurrent import futures
from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import common.internode
import common.stream_pool
from common.open_calls import OpenCalls
from common.codec import batch_to_proto
from common.internode import InternodeTransport
from common.peers import Peers
from common.replica_messages import RowBatch
from coordinator.core.errors import NotFound, Unavailable
from node.health import HealthService
from node.internode_service import InternodeDeps, InternodeService
from node.wiring import SERVER_OPTIONS
from storage.cells import Cell, Row
from vbcpb import vbc_pb2_grpc as rpc

TIMEOUT = 10.0


def batch(key: int, table_id: str = "cd" * 16) -> RowBatch:
    return RowBatch(table_id, 0, (Row(token=key, key=(key,), marker_ts=5, cells={"v": Cell(key, 5)}),),
                    schema_version=1, timestamp=5)


class FakeReplica:
    """Applies base writes by remembering them; refuses a table named "dropped"; can be held."""

    def __init__(self):
        self.batches: list[RowBatch] = []
        self.view_batches: list[RowBatch] = []
        self.released = threading.Event()
        self.released.set()
        self.entered = threading.Event()  # a base write is being applied
        self._lock = threading.Lock()

    def apply_base_write(self, written: RowBatch) -> int:
        self.entered.set()
        assert self.released.wait(TIMEOUT)
        if written.table_id == "dropped":
            raise NotFound("table dropped was dropped")
        with self._lock:
            self.batches.append(written)
        return len(written.rows)

    def apply_view_update(self, written: RowBatch) -> int:
        if written.table_id == "dropped":
            raise NotFound("view dropped was dropped")
        self.view_batches.append(written)
        return len(written.rows)


class CountingInternode(InternodeService):
    """The node's Internode service, counting the calls of each kind and the ReplicaWrites calls still open."""

    def __init__(self, replica: FakeReplica, open_calls: OpenCalls):
        super().__init__(InternodeDeps(replica=replica, observe_timestamp=lambda ts: None,
                                       local_status=lambda: None, wait_schema_applied=lambda version, timeout: None,
                                       wait_schema_version=lambda version, timeout: None, open_calls=open_calls))
        self.unary_calls = 0
        self.stream_calls = 0
        self.unary_view_calls = 0
        self.view_stream_calls = 0
        self.open_streams = 0
        self.changed = threading.Condition()

    def ReplicaWrite(self, request, context):
        with self.changed:
            self.unary_calls += 1
            self.changed.notify_all()
        return super().ReplicaWrite(request, context)

    def ViewUpdate(self, request, context):
        self.unary_view_calls += 1
        return super().ViewUpdate(request, context)

    def ViewUpdates(self, request_iterator, context):
        self.view_stream_calls += 1
        yield from super().ViewUpdates(request_iterator, context)

    def ReplicaWrites(self, request_iterator, context):
        with self.changed:
            self.stream_calls += 1
            self.open_streams += 1
            self.changed.notify_all()
        try:
            yield from super().ReplicaWrites(request_iterator, context)
        finally:
            with self.changed:
                self.open_streams -= 1
                self.changed.notify_all()

    def wait_until(self, condition, timeout: float = TIMEOUT) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: condition(self), timeout), vars(self)


class Peer:
    """A gRPC server on 127.0.0.1 with the Internode and health services; restartable on its port."""

    def __init__(self, open_calls_limit: int = 8):
        self.replica = FakeReplica()
        self.port = 0
        self.open_calls_limit = open_calls_limit
        self.start()

    def start(self) -> None:
        self.open_calls = OpenCalls(self.open_calls_limit)
        self.service = CountingInternode(self.replica, self.open_calls)
        self.health = HealthService()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=SERVER_OPTIONS)
        rpc.add_InternodeServicer_to_server(self.service, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait()

    def stop_as_a_node_does(self) -> float:
        """End the open calls, then stop with the node's grace period; the seconds the stop took."""
        started = time.monotonic()
        self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.open_calls.end_all()
        self.server.stop(grace=5.0).wait()
        return time.monotonic() - started


@contextmanager
def transport_to_peer(**peer_options):
    peer = Peer(**peer_options)
    peers = Peers(lambda node: f"127.0.0.1:{peer.port}")
    try:
        yield InternodeTransport(peers), peer
    finally:
        peer.replica.released.set()
        peers.close()
        peer.stop()


def write(transport: InternodeTransport, written: RowBatch) -> int:
    [pending] = transport.start_replica_writes([("n2", written)])
    return pending.result()


def test_replica_writes_travel_one_after_another_on_one_open_call():
    with transport_to_peer() as (transport, peer):
        assert [write(transport, batch(key)) for key in range(5)] == [1] * 5
        assert peer.replica.batches == [batch(key) for key in range(5)]
        assert (peer.service.stream_calls, peer.service.unary_calls) == (1, 0)


def test_a_refused_batch_is_answered_with_its_error_and_the_call_goes_on():
    with transport_to_peer() as (transport, peer):
        with pytest.raises(NotFound, match="table dropped was dropped"):
            write(transport, batch(1, table_id="dropped"))
        assert write(transport, batch(2)) == 1
        assert peer.service.stream_calls == 1


def test_writes_beyond_the_streams_a_peer_may_hold_go_as_unary_calls():
    extra = 2
    with transport_to_peer() as (transport, peer):
        peer.replica.released.clear()
        count = common.stream_pool.STREAMS_PER_SERVER + extra
        pending = [transport.start_replica_writes([("n2", batch(key))])[0] for key in range(count)]
        peer.service.wait_until(lambda s: s.stream_calls == count - extra and s.unary_calls == extra)
        peer.replica.released.set()
        assert [write.result() for write in pending] == [1] * count
        assert sorted(b.rows[0].key for b in peer.replica.batches) == [(key,) for key in range(count)]


def test_a_batch_left_unanswered_fails_at_its_deadline_and_its_stream_is_closed(monkeypatch):
    monkeypatch.setattr(common.internode, "REPLICA_WRITE_TIMEOUT", 0.3)
    with transport_to_peer() as (transport, peer):
        peer.replica.released.clear()
        with pytest.raises(Unavailable, match="DEADLINE_EXCEEDED"):
            write(transport, batch(1))
        peer.replica.released.set()
        peer.service.wait_until(lambda s: s.open_streams == 0)
        assert write(transport, batch(2)) == 1


def test_a_write_after_a_peer_restart_reaches_the_restarted_peer():
    with transport_to_peer() as (transport, peer):
        assert write(transport, batch(1)) == 1
        peer.stop()
        peer.start()
        assert write(transport, batch(2)) == 1
        assert peer.replica.batches[-1] == batch(2)
        assert peer.service.stream_calls + peer.service.unary_calls == 1


def test_a_stopping_node_ends_its_idle_streams_at_once_and_then_gets_unary_calls():
    with transport_to_peer() as (transport, peer):
        assert write(transport, batch(1)) == 1
        peer.open_calls.end_all()
        peer.service.wait_until(lambda s: s.open_streams == 0)
        assert write(transport, batch(2)) == 1
        assert peer.service.unary_calls == 1
        assert peer.stop_as_a_node_does() < 2.0


def test_a_batch_on_a_stream_ended_by_a_stopping_node_is_not_lost():
    with transport_to_peer() as (transport, peer):
        assert write(transport, batch(1)) == 1
        peer.replica.released.clear()
        peer.replica.entered.clear()
        [pending] = transport.start_replica_writes([("n2", batch(2))])
        assert peer.replica.entered.wait(TIMEOUT)
        peer.open_calls.end_all()  # the stream is busy: it ends after its answer
        peer.replica.released.set()
        assert pending.result() == 1
        peer.service.wait_until(lambda s: s.open_streams == 0)
        assert peer.replica.batches == [batch(1), batch(2)]
        assert peer.service.unary_calls == 0  # answered on the stream


def test_a_node_holding_its_limit_of_open_calls_refuses_a_new_one_and_gets_unary_calls():
    with transport_to_peer(open_calls_limit=0) as (transport, peer):
        assert write(transport, batch(1)) == 1
        assert write(transport, batch(2)) == 1
        assert (peer.service.stream_calls, peer.service.unary_calls) == (1, 2)  # then backing off


def test_a_stream_left_idle_is_closed(monkeypatch):
    monkeypatch.setattr(common.stream_pool, "IDLE_SECONDS", 0.2)
    with transport_to_peer() as (transport, peer):
        assert write(transport, batch(1)) == 1
        peer.service.wait_until(lambda s: s.stream_calls == 1 and s.open_streams == 0)


def test_a_peer_that_is_down_fails_the_write_as_unavailable():
    with transport_to_peer() as (transport, peer):
        peer.stop()
        with pytest.raises(Unavailable):
            write(transport, batch(1))


def test_the_stream_answers_what_the_unary_call_answers():
    with transport_to_peer() as (transport, peer):
        message = batch_to_proto(batch(7))
        stub = rpc.InternodeStub(grpc.insecure_channel(f"127.0.0.1:{peer.port}"))
        assert stub.ReplicaWrite(message, timeout=TIMEOUT).applied == write(transport, batch(7)) == 1


def test_view_updates_travel_on_one_open_call_and_a_refusal_keeps_its_type():
    with transport_to_peer() as (transport, peer):
        assert [transport.view_update("n2", batch(key)) for key in range(3)] == [1, 1, 1]
        with pytest.raises(NotFound, match="view dropped was dropped"):
            transport.view_update("n2", batch(9, table_id="dropped"))
        assert peer.replica.view_batches == [batch(key) for key in range(3)]
        assert (peer.service.view_stream_calls, peer.service.unary_view_calls) == (1, 0)
