"""common.peers against a real in-process gRPC server: cached stubs, the standing call, keepalive settings."""
from __future__ import annotations

import socket
import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common.peers import CHANNEL_OPTIONS, Peers
from coordinator.core.errors import Unavailable
from node.wiring import SERVER_OPTIONS

QUIET_SECONDS = 2.5  # the old health watch re-dialled a peer that was down every second
DOWN_SECONDS = 6.0  # long enough for gRPC's default reconnect wait to pass 4 s


class CountingHealth(health.HealthServicer):
    """The standard health service, counting the Watch calls it was sent."""

    def __init__(self):
        super().__init__()
        self.watches = 0
        self.watched = threading.Condition()

    def Watch(self, request, context, send_response_callback=None):
        with self.watched:
            self.watches += 1
            self.watched.notify_all()
        return super().Watch(request, context, send_response_callback)

    def wait_for_watches(self, count: int, timeout: float = 10.0) -> None:
        with self.watched:
            assert self.watched.wait_for(lambda: self.watches >= count, timeout), f"{self.watches} watches"


def start_peer(port: int = 0) -> tuple[grpc.Server, CountingHealth, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = CountingHealth()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, servicer, port


@pytest.fixture
def peer():
    server, servicer, port = start_peer()
    yield server, servicer, f"127.0.0.1:{port}"
    server.stop(0)


def check(peers: Peers, node: str) -> None:
    health_pb2_grpc.HealthStub(peers.channel(node)).Check(health_pb2.HealthCheckRequest(), timeout=5)


def connections_accepted_on(port: int, seconds: float) -> int:
    """How many TCP connections a plain listener on `port` accepts within `seconds`."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    listener.settimeout(0.1)
    accepted = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            try:
                listener.accept()[0].close()
                accepted += 1
            except TimeoutError:
                continue
    finally:
        listener.close()
    return accepted


def test_a_peer_stub_is_made_once_per_address(peer):
    _, _, address = peer
    peers = Peers(lambda node: address)
    try:
        assert peers.internode("n2") is peers.internode("n2")
    finally:
        peers.close()


def test_a_connected_channel_keeps_one_call_open_to_its_peer(peer):
    _, servicer, address = peer
    peers = Peers(lambda node: address)
    try:
        check(peers, "n2")
        servicer.wait_for_watches(1)
        for _ in range(5):
            check(peers, "n2")
        assert servicer.watches == 1
    finally:
        peers.close()


@pytest.mark.waits
def test_a_peer_that_went_down_is_not_dialled_until_a_call_needs_it():
    """A peer's restart must not leave its channel backing off from reconnects nobody asked for: the first call
    after the restart succeeds."""
    server, servicer, port = start_peer()
    peers = Peers(lambda node: f"127.0.0.1:{port}")
    try:
        check(peers, "n2")
        servicer.wait_for_watches(1)
        server.stop(0).wait()
        assert connections_accepted_on(port, QUIET_SECONDS) == 0
        server, servicer, _ = start_peer(port)
        check(peers, "n2")
        servicer.wait_for_watches(1)
    finally:
        peers.close()
        server.stop(0)


@pytest.mark.waits
def test_a_peer_back_after_failed_calls_is_reached_within_a_second_or_so():
    """Calls that failed while a peer was down made its channel wait before reconnecting: never long enough to keep
    a restarted peer out of reach (gRPC's own wait grows to 120 s)."""
    server, _, port = start_peer()
    peers = Peers(lambda node: f"127.0.0.1:{port}")
    try:
        check(peers, "n2")
        server.stop(0).wait()
        failing_until = time.monotonic() + DOWN_SECONDS
        while time.monotonic() < failing_until:
            with pytest.raises(grpc.RpcError):
                check(peers, "n2")
            time.sleep(0.1)  # a client that keeps calling, as replica writes do
        server, _, _ = start_peer(port)
        back = time.monotonic()
        while True:
            try:
                check(peers, "n2")
                break
            except grpc.RpcError:
                assert time.monotonic() - back < 2.0, "the restarted peer stayed out of reach"
                time.sleep(0.05)
    finally:
        peers.close()
        server.stop(0)


def test_a_node_accepts_the_keepalive_pings_of_its_peers():
    """A node that took a peer's 10 s keepalive pings for abuse would answer GOAWAY "too_many_pings" and fail
    every call in flight on the connection."""
    accepted = dict(SERVER_OPTIONS)["grpc.http2.min_ping_interval_without_data_ms"]
    assert accepted <= dict(CHANNEL_OPTIONS)["grpc.keepalive_time_ms"]


def test_the_standing_call_ends_when_its_peer_turns_not_serving_so_the_peer_stops_without_waiting():
    """A stopping node says NOT_SERVING first; a standing call left open would hold its stop for the whole grace."""
    server, servicer, port = start_peer()
    peers = Peers(lambda node: f"127.0.0.1:{port}")
    try:
        check(peers, "n2")
        servicer.wait_for_watches(1)
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        started = time.monotonic()
        server.stop(grace=5.0).wait()
        assert time.monotonic() - started < 2.5
    finally:
        peers.close()
        server.stop(0)


def test_a_closed_peers_opens_no_new_channel(peer):
    _, _, address = peer
    peers = Peers({"n2": address}.get)
    peers.close()
    with pytest.raises(Unavailable, match="stopping"):
        peers.channel("n2")
