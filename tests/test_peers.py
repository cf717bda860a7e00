"""common.peers against a real in-process gRPC server: cached stubs and the health watch on each peer."""
from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common.peers import CHANNEL_OPTIONS, UNREACHABLE, Peers
from node.wiring import SERVER_OPTIONS
from tests.cluster_harness import wait_until


@pytest.fixture
def peer():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield server, servicer, f"127.0.0.1:{port}"
    server.stop(0)


def watch_threads(address: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == f"watch-{address}"]


def test_a_peer_stub_is_made_once_per_address(peer):
    _, _, address = peer
    peers = Peers(lambda node: address)
    try:
        assert peers.internode("n2") is peers.internode("n2")
    finally:
        peers.close()


def test_the_health_watch_follows_the_peer_until_the_channel_closes(peer):
    server, servicer, address = peer
    peers = Peers(lambda node: address if node == "n2" else None)
    try:
        assert peers.health("n2") is None, "no channel to the peer yet"
        peers.internode("n2")
        wait_until(lambda: peers.health("n2") == "SERVING", 10, "the watch to see the peer serving")
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        wait_until(lambda: peers.health("n2") == "NOT_SERVING", 10, "the watch to see the peer stop serving")
        server.stop(0)
        wait_until(lambda: peers.health("n2") == UNREACHABLE, 10, "the watch to see the peer gone")
        assert peers.health("n9") is None, "an unknown node has no health"
    finally:
        peers.close()
    wait_until(lambda: not watch_threads(address), 10, "the watch thread to end after close")


def test_a_node_accepts_the_keepalive_pings_of_its_peers():
    """A peer's connection stays open (the health watch) with nothing to send; a node that took its 10 s pings
    for abuse would answer GOAWAY "too_many_pings" and fail every call in flight on the connection."""
    accepted = dict(SERVER_OPTIONS)["grpc.http2.min_ping_interval_without_data_ms"]
    assert accepted <= dict(CHANNEL_OPTIONS)["grpc.keepalive_time_ms"]
