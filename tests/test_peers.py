"""common.peers against a real in-process gRPC server: cached stubs, and keepalive settings the node accepts."""
from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from common.peers import CHANNEL_OPTIONS, Peers
from node.wiring import SERVER_OPTIONS


@pytest.fixture
def peer():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield server, servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_a_peer_stub_is_made_once_per_address(peer):
    _, _, address = peer
    peers = Peers(lambda node: address)
    try:
        assert peers.internode("n2") is peers.internode("n2")
    finally:
        peers.close()


def test_a_node_accepts_the_keepalive_pings_of_its_peers():
    """A node that took a peer's 10 s keepalive pings for abuse would answer GOAWAY "too_many_pings" and fail
    every call in flight on the connection."""
    accepted = dict(SERVER_OPTIONS)["grpc.http2.min_ping_interval_without_data_ms"]
    assert accepted <= dict(CHANNEL_OPTIONS)["grpc.keepalive_time_ms"]
