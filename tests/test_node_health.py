"""The node's health service: statuses reach watchers in order, and `set` never waits on a Watch being closed."""
from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from node.health import HealthService

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def served():
    servicer = HealthService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield servicer, health_pb2_grpc.HealthStub(channel)
    finally:
        channel.close()
        server.stop(0)


def test_a_watcher_gets_the_status_then_every_change_in_order(served):
    servicer, stub = served
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="vbc.v1.Client"), timeout=10)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    for status in (SERVING, NOT_SERVING, SERVING):
        servicer.set("vbc.v1.Client", status)
    assert [next(watch).status for _ in range(3)] == [SERVING, NOT_SERVING, SERVING]
    watch.cancel()
    assert stub.Check(health_pb2.HealthCheckRequest(service="vbc.v1.Client"), timeout=10).status == SERVING


def test_setting_a_status_while_watchers_close_never_hangs(served):
    """grpc_health's own servicer hangs here at once: its `set` sends while holding the lock that the close of a
    Watch (run by the server's polling thread, which the send waits for) needs."""
    servicer, stub = served
    for _ in range(20):
        watches = [stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30) for _ in range(8)]
        for watch in watches:
            next(watch)  # registered
        flipped = threading.Event()

        def flip():
            for i in range(50):
                servicer.set("", NOT_SERVING if i % 2 else SERVING)
            flipped.set()

        threading.Thread(target=flip, daemon=True).start()
        for watch in watches:
            watch.cancel()
        assert flipped.wait(10), "set() hung while watchers closed"
    servicer.enter_graceful_shutdown()
    servicer.set("", SERVING)  # ignored once shutting down
    assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status == NOT_SERVING
