"""The replica role's transport adapter (common.internode) and the protobuf codec it uses, with fake gRPC stubs."""
from __future__ import annotations

import math
from dataclasses import replace

import grpc
import pyarrow as pa
import pytest

from common.codec import (
    batch_from_proto,
    batch_to_proto,
    row_from_proto,
    row_to_proto,
    scan_page_from_proto,
    scan_page_to_proto,
    scan_request_from_proto,
    scan_request_to_proto,
    values_from_proto,
    values_to_proto,
)
from common.internode import InternodeTransport
from common.replica_messages import RowBatch, ScanPage, ScanRequest
from coordinator.core.schema import Filter
from storage.reads import Aggregate
from coordinator.core.errors import InvalidArgument, NotFound, Unavailable
from storage.cells import Cell, Row
from vbcpb import vbc_pb2 as pb

BATCH = RowBatch("cd" * 16, 2, (Row(token=-5, key=(1, "a"), marker_ts=7, cells={"v": Cell(None, 7), "w": Cell(2.5, 6)}),
                               Row(token=9, key=(2, "b"), tomb_ts=8)), schema_version=11, timestamp=1234)


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str):
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeFuture:
    def __init__(self, response=None, error=None):
        self._response, self._error = response, error

    def result(self):
        if self._error is not None:
            raise self._error
        return self._response


class FakeScanCall:
    """A server-streaming call: iterates pages, then maybe fails; remembers whether it was cancelled."""

    def __init__(self, pages, error=None):
        self._pages, self._error = pages, error
        self.cancelled = False

    def __iter__(self):
        yield from self._pages
        if self._error is not None:
            raise self._error

    def cancel(self):
        self.cancelled = True


class _Method:
    def __init__(self, handler):
        self._handler = handler
        self.future = lambda request, timeout: handler(request, timeout, future=True)

    def __call__(self, request, timeout):
        return self._handler(request, timeout)


class FakeStub:
    """Answers like a peer's Internode stub; records the requests it got."""

    def __init__(self, error=None, scan_call=None):
        self.requests = []
        self._error = error
        self.scan_call = scan_call
        self.ReplicaWrite = _Method(self._replica_write)
        self.ViewUpdate = _Method(self._view_update)
        self.Scan = _Method(self._scan)

    def _replica_write(self, request, timeout, future=False):
        self.requests.append(request)
        return FakeFuture(pb.Ack(applied=len(request.mutations)), self._error)

    def _view_update(self, request, timeout):
        self.requests.append(request)
        if self._error is not None:
            raise self._error
        return pb.Ack(applied=len(request.mutations))

    def _scan(self, request, timeout):
        self.requests.append(request)
        if self._error is not None:
            raise self._error
        return self.scan_call


class NoFreeStream:
    """A write stream pool whose streams are all busy: replica writes go as unary calls (tests/test_replica_streams.py
    covers the streams against a real server)."""

    def take(self, now: float):
        return None


class FakePeers:
    def __init__(self, stubs: dict):
        self._stubs = stubs

    def internode(self, node: str):
        if node not in self._stubs:
            raise Unavailable(f"node {node!r} is not a member of the cluster")
        return self._stubs[node]

    def streams(self, node: str, method: str):
        self.internode(node)
        return NoFreeStream()


# ----------------------------------------------------------------- codec


def test_a_batch_crosses_protobuf_unchanged():
    message = batch_to_proto(BATCH)
    assert isinstance(message, pb.MutationBatch)
    assert batch_from_proto(pb.MutationBatch.FromString(message.SerializeToString())) == BATCH


def test_a_row_keeps_absent_marker_and_tombstone_apart_from_zero():
    row = Row(token=0, key=(0,), marker_ts=0)
    assert row_from_proto(row_to_proto(row)) == row
    assert row_from_proto(row_to_proto(Row(token=0, key=(0,)))).marker_ts is None


def test_scan_requests_and_pages_cross_protobuf_unchanged():
    requests = (
        ScanRequest("ef" * 16, -10, 10),
        ScanRequest("ef" * 16, 3, 3, partition_key=(4, "x"), limit=5, page_size=7, after=(3, (4, "x", 1.5)),
                    columns=("a", "b"), filters=(Filter("v", "IN", (1, 2)), Filter("w", ">=", "x"),
                                                 Filter("z", "IS NOT NULL", None))),
        ScanRequest("ef" * 16, 0, 9, aggregates=(Aggregate("count"), Aggregate("max", "v"))),
    )
    for request in requests:
        assert scan_request_from_proto(scan_request_to_proto(request)) == request
    batch = pa.RecordBatch.from_pydict({"token": pa.array([1, 2], pa.int64()), "a": [True, None],
                                        "b": pa.array([-0.0, math.inf])})
    assert scan_page_from_proto(scan_page_to_proto(ScanPage(batch=batch))).batch.equals(batch)
    partials = [[3], [None, 1, 0], [2.5, 1, 0]]
    assert scan_page_from_proto(scan_page_to_proto(ScanPage(partials=partials))).partials == partials


def test_client_value_lists_cross_protobuf_unchanged():
    values = [None, True, -(2**63), 1.25, "t"]
    assert values_from_proto(values_to_proto(values)) == values


# ----------------------------------------------------------------- transport


def test_a_replica_write_is_sent_as_protobuf_and_answers_the_rows_applied():
    stub = FakeStub()
    [pending] = InternodeTransport(FakePeers({"n2": stub})).start_replica_writes([("n2", BATCH)])
    assert pending.result() == 2
    assert batch_from_proto(stub.requests[0]) == BATCH


def test_the_replicas_of_a_row_each_get_the_whole_row():
    stubs = {"n2": FakeStub(), "n3": FakeStub()}
    other_shard = replace(BATCH, shard=1)
    pending = InternodeTransport(FakePeers(stubs)).start_replica_writes([("n2", BATCH), ("n3", other_shard)])
    assert [write.result() for write in pending] == [2, 2]
    assert batch_from_proto(stubs["n2"].requests[0]) == BATCH
    assert batch_from_proto(stubs["n3"].requests[0]) == other_shard


@pytest.mark.parametrize("code, error_type, message", [
    (grpc.StatusCode.UNAVAILABLE, Unavailable, "connection refused"),
    (grpc.StatusCode.NOT_FOUND, NotFound, "connection refused"),
    (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument, "connection refused"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, Unavailable, "DEADLINE_EXCEEDED: connection refused"),
    (grpc.StatusCode.INTERNAL, Unavailable, "INTERNAL: connection refused"),
])
def test_a_failed_call_becomes_the_core_error_of_its_status(code, error_type, message):
    transport = InternodeTransport(FakePeers({"n2": FakeStub(error=FakeRpcError(code, "connection refused"))}))
    for call in (lambda: transport.start_replica_writes([("n2", BATCH)])[0].result(),
                 lambda: transport.view_update("n2", BATCH),
                 lambda: next(transport.scan("n2", ScanRequest("ef" * 16, 0, 1)))):
        with pytest.raises(error_type) as caught:
            call()
        assert type(caught.value) is error_type and caught.value.message == message


def test_a_node_that_is_not_a_member_fails_the_pending_write_not_the_caller():
    [pending] = InternodeTransport(FakePeers({})).start_replica_writes([("n9", BATCH)])
    with pytest.raises(Unavailable, match="not a member"):
        pending.result()


def test_a_scan_streams_pages_and_maps_an_error_after_the_first_page():
    pages = [scan_page_to_proto(ScanPage(batch=pa.RecordBatch.from_pydict({"token": pa.array([t], pa.int64())})))
             for t in (1, 2)]
    call = FakeScanCall(pages, error=FakeRpcError(grpc.StatusCode.UNAVAILABLE, "peer went away"))
    scan = InternodeTransport(FakePeers({"n2": FakeStub(scan_call=call)})).scan("n2", ScanRequest("ef" * 16, 0, 9))
    assert [page.batch["token"][0].as_py() for page in (next(scan), next(scan))] == [1, 2]
    with pytest.raises(Unavailable, match="peer went away"):
        next(scan)
    assert call.cancelled


def test_a_scan_closed_early_cancels_its_call():
    page = ScanPage(batch=pa.RecordBatch.from_pydict({"token": pa.array([1], pa.int64())}))
    call = FakeScanCall([scan_page_to_proto(page)] * 3)
    scan = InternodeTransport(FakePeers({"n2": FakeStub(scan_call=call)})).scan("n2", ScanRequest("ef" * 16, 0, 9))
    next(scan)
    scan.close()
    assert call.cancelled
