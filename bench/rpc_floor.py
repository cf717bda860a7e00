"""The gRPC floor of a single-row write: the same calls as one on 3 nodes RF 3, with handlers that do nothing.

A client runs a statement on its `Client.Session` with a coordinator process (`vbc.client.execute_on`), which
sends a one-row batch to two replica processes on its open `Internode.ReplicaWrites` calls and answers when
both did: the call pattern of a single-row INSERT at RF 3, with the nodes' server options, thread pools and
peer channels (`common.peers`: standing calls, pooled write streams), but no parsing, routing or storage. Its
latency is what gRPC in Python costs on this machine at this moment; the write path benchmark times it in
blocks alternating with its single-row INSERTs and prints the ratio.

Run: `.venv/bin/python bench/rpc_floor.py [--count N]`. The servers are child processes that stop when their
standard input closes, so they end with the benchmark however it ends.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

PROJECT_ROOT = str(Path(__file__).resolve().parents[1])
if PROJECT_ROOT not in sys.path:
    sys.path.insert(0, PROJECT_ROOT)

import grpc  # noqa: E402
from grpc_health.v1 import health, health_pb2_grpc  # noqa: E402

from common.peers import Peers  # noqa: E402
from node.wiring import GRPC_WORKERS, SERVER_OPTIONS  # noqa: E402
from vbc.client import execute_on  # noqa: E402
from vbcpb import vbc_pb2 as pb  # noqa: E402
from vbcpb import vbc_pb2_grpc as rpc  # noqa: E402

ROW = pb.MutationBatch(table_id="ab" * 16, shard=0, timestamp=1, schema_version=1,
                       mutations=[pb.Mutation(token=1, key=[pb.Value(int=1)],
                                              cells=[pb.Cell(column="name", value=pb.Value(text="n1"), ts=1)])])
REQUEST = pb.ExecuteRequest(statement="INSERT INTO ks.t (id, name) VALUES (?, ?)", prepared_id="0" * 32,
                            params=[pb.Row(values=[pb.Value(int=1), pb.Value(text="n1")])])


class EmptyReplica(rpc.InternodeServicer):
    def ReplicaWrites(self, request_iterator, context):
        for request in request_iterator:
            yield pb.ReplicaOutcome(applied=len(request.mutations))


class FanOutCoordinator(rpc.ClientServicer):
    """Answers a statement once both replicas acknowledged a one-row batch, as a write at RF 3 does."""

    def __init__(self, replica_ports: list[str]):
        self._ports = replica_ports
        self._peers = Peers(lambda port: f"127.0.0.1:{port}")

    def Session(self, request_iterator, context):
        for request in request_iterator:
            yield pb.SessionAnswer(response=self.Execute(request, context))

    def Execute(self, request, context):
        streams = [self._peers.streams(port, "ReplicaWrites").take(time.monotonic()) for port in self._ports]
        assert None not in streams, "one client: a stream is always free"
        for stream in streams:
            stream.send(ROW, 10.0, time.monotonic())
        for stream in streams:
            stream.receive()
            stream.pool.give_back(stream, time.monotonic())
        return pb.ExecuteResponse(message="")


def serve(add_servicer) -> None:
    """Serve on a free port (printed first) until standard input closes."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS), options=SERVER_OPTIONS)
    add_servicer(server)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


def start(*args: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    return process, process.stdout.readline().strip()


@contextmanager
def floor_call() -> Iterator[Callable[[], None]]:
    """Start the empty replicas and coordinator; yield a function making one Execute through them."""
    processes = []
    try:
        for _ in range(2):
            processes.append(start("replica"))
        coordinator = start("coordinator", *(port for _, port in processes))
        processes.append(coordinator)
        address = f"127.0.0.1:{coordinator[1]}"
        yield lambda: execute_on(address, REQUEST, timeout=10)
    finally:
        for process, _ in processes:
            process.stdin.close()
        for process, _ in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


def timed(call, *args, **kwargs) -> float:
    """Seconds one call took."""
    started = time.perf_counter()
    call(*args, **kwargs)
    return time.perf_counter() - started


def latencies(count: int = 1500, warm_up: int = 500) -> list[float]:
    """Seconds per Execute through the empty coordinator and replicas, one client, after `warm_up` uncounted."""
    with floor_call() as call:
        for _ in range(warm_up):
            call()
        return [timed(call) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", nargs="?", choices=("replica", "coordinator"), help=argparse.SUPPRESS)
    parser.add_argument("ports", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=1500)
    args = parser.parse_args()
    if args.role == "replica":
        serve(lambda server: rpc.add_InternodeServicer_to_server(EmptyReplica(), server))
    elif args.role == "coordinator":
        serve(lambda server: rpc.add_ClientServicer_to_server(FanOutCoordinator(args.ports), server))
    else:
        timed = latencies(args.count)
        print(f"client -> coordinator -> 2 replicas, empty handlers: p50 {statistics.median(timed) * 1000:.2f} ms, "
              f"p99 {statistics.quantiles(timed, n=100)[98] * 1000:.2f} ms")


if __name__ == "__main__":
    main()
