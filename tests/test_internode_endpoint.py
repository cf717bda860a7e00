"""common.internode_endpoint: this node's replicas and status in process, another node's over a real in-process
gRPC server running the node's Internode service over a fake replica."""
from __future__ import annotations

import socket
import threading
from concurrent import futures

import grpc
import pyarrow as pa
import pytest

from common.internode import InternodeTransport
from common.internode_endpoint import InternodeEndpoint
from common.open_calls import OpenCalls
from common.peers import Peers
from coordinator.core.schema import Column, Replica, Table
from node.internode_service import InternodeDeps, InternodeService
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc

WAIT = 10.0
VIEW = Table("f1" * 16, "ks", "by_v", (Column("v", "int"), Column("k", "int")), ("v",), ("k",))
ROWS = pa.table({"v": [1, 2, 3], "k": [10, 20, 30]})


class RecordingReplica:
    """Merges by remembering what it was given; reads back the rows of `ROWS` in the token range's bounds."""

    def __init__(self, node_id: str):
        self.node_id = node_id
        self.merged: list[tuple[str, int, int]] = []  # (view id, schema version, rows)
        self.reads: list[tuple[str, int, int, int]] = []

    def merge_view_rows(self, view_id: str, schema_version: int, rows: pa.Table) -> int:
        self.merged.append((view_id, schema_version, rows.num_rows))
        return rows.num_rows

    def read_range(self, table_id: str, schema_version: int, first_token: int, last_token: int,
                   include_tombstones: bool = False) -> pa.Table:
        self.reads.append((table_id, schema_version, first_token, last_token))
        return ROWS


class RemoteNode:
    """A gRPC server on 127.0.0.1 with the node's Internode service over a RecordingReplica."""

    def __init__(self, node_id: str):
        self.replica = RecordingReplica(node_id)
        self.answering = threading.Event()
        self.answering.set()
        self._open_calls = OpenCalls(4)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        rpc.add_InternodeServicer_to_server(InternodeService(InternodeDeps(
            replica=self.replica, observe_timestamp=lambda ts: None, local_status=self._status,
            wait_schema_applied=lambda version, timeout: None, wait_schema_version=lambda version, timeout: None,
            open_calls=self._open_calls)), self._server)
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def _status(self, state_digest: bool = False) -> pb.LocalStatusResponse:
        self.answering.wait(WAIT)
        return pb.LocalStatusResponse(node_id=self.replica.node_id, applied_index=12)

    def stop(self) -> None:
        self.answering.set()
        self._open_calls.end_all()
        self._server.stop(0)


def unused_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def cluster():
    """Node n1's endpoint (a RecordingReplica in process), n2 served by a RemoteNode, n3 listened on by nobody."""
    remote = RemoteNode("n2")
    addresses = {"n2": remote.address, "n3": unused_address()}
    peers = Peers(addresses.get)
    local = RecordingReplica("n1")
    endpoint = InternodeEndpoint("n1", local, lambda: pb.LocalStatusResponse(node_id="n1"),
                                 InternodeTransport(peers), peers, probe_timeout=0.5)
    yield endpoint, local, remote
    peers.close()
    remote.stop()


def test_view_rows_for_this_nodes_replica_are_merged_in_process(cluster):
    endpoint, local, remote = cluster
    assert endpoint.merge_view_rows(Replica("n1", 0), VIEW, 4, ROWS) == 3
    assert local.merged == [(VIEW.id, 4, 3)] and remote.replica.merged == []


def test_view_rows_for_another_nodes_replica_are_sent_to_it(cluster):
    endpoint, local, remote = cluster
    assert endpoint.merge_view_rows(Replica("n2", 1), VIEW, 4, ROWS) == 3
    assert remote.replica.merged == [(VIEW.id, 4, 3)] and local.merged == []


def test_a_range_of_this_nodes_replica_is_read_in_process(cluster):
    endpoint, local, remote = cluster
    assert endpoint.read_range(Replica("n1", 0), VIEW, 4, -10, 10).equals(ROWS)
    assert local.reads == [(VIEW.id, 4, -10, 10)] and remote.replica.reads == []


def test_a_range_of_another_nodes_replica_is_read_over_internode(cluster):
    endpoint, local, remote = cluster
    assert endpoint.read_range(Replica("n2", 0), VIEW, 4, -10, 10).equals(ROWS)
    assert remote.replica.reads == [(VIEW.id, 4, -10, 10)] and local.reads == []


def test_this_nodes_status_is_its_own_and_another_nodes_is_asked_for(cluster):
    endpoint, _, _ = cluster
    assert endpoint.local_status("n1").node_id == "n1"
    answer = endpoint.local_status("n2")
    assert (answer.node_id, answer.applied_index) == ("n2", 12)


def test_a_node_that_does_not_answer_has_no_status(cluster):
    endpoint, _, remote = cluster
    remote.answering.clear()  # n2 answers only after the probe's timeout
    assert endpoint.local_status("n2") is None
    assert endpoint.local_status("n3") is None  # nobody listens
    assert endpoint.local_status("n4") is None  # not a member
