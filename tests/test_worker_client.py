"""common.worker_client against a real in-process gRPC server with a fake Worker servicer: the request sent, the
deadline, the reply converted, and every failure as a typed core error."""
from __future__ import annotations

import socket
import threading
from concurrent import futures

import grpc
import pytest

from common.worker_client import WorkerClient, batch_reply_from_response
from coordinator.core.errors import FailedPrecondition, Unavailable
from coordinator.core.leader_loop import BatchReply
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc

WAIT = 10.0


class FakeWorker(rpc.WorkerServicer):
    """Answers with `answer(request, context)` (a WorkResponse, or an abort); remembers the requests and the
    time each had left."""

    def __init__(self):
        self.requests: list[pb.WorkRequest] = []
        self.time_remaining: list[float] = []
        self.answer = lambda request, context: pb.WorkResponse(finished_task_ids=request.task_ids)

    def WorkOnViewBuildingTasks(self, request, context):
        self.requests.append(request)
        self.time_remaining.append(context.time_remaining())
        return self.answer(request, context)


@pytest.fixture
def worker():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = FakeWorker()
    rpc.add_WorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield servicer, channel
    channel.close()
    server.stop(0)


@pytest.fixture
def client_of():
    """Makes WorkerClients that send every node's calls to one channel; closes them after the test."""
    clients: list[WorkerClient] = []

    def make(channel: grpc.Channel, **options) -> WorkerClient:
        clients.append(WorkerClient(lambda node: channel, **options))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_batch_is_sent_as_one_request_and_its_reply_arrives_as_a_batch_reply(worker, client_of):
    servicer, channel = worker
    servicer.answer = lambda request, context: pb.WorkResponse(finished_task_ids=["t1"], finished_rows_scanned=[42])
    reply = client_of(channel).send_batch("n2", 3, ("t1", "t2"), 7, 91).result(WAIT)
    assert reply == BatchReply(("t1",), (42,))
    assert servicer.requests == [pb.WorkRequest(term=7, shard=3, task_ids=["t1", "t2"], applied_index=91)]


def test_the_call_carries_the_clients_timeout(worker, client_of):
    servicer, channel = worker
    client_of(channel, timeout=7.0).send_batch("n2", 0, ("t1",), 1, 1).result(WAIT)
    assert 0 < servicer.time_remaining[0] < 7.5  # 7 s, give or take the deadline's rounding (not the default 120 s)


def test_a_stale_term_refusal_is_a_failed_precondition(worker, client_of):
    servicer, channel = worker
    servicer.answer = lambda request, context: context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                                             "stale term 3: this node has seen term 4")
    future = client_of(channel).send_batch("n2", 0, ("t1",), 3, 1)
    with pytest.raises(FailedPrecondition, match="^FAILED_PRECONDITION: stale term 3"):
        future.result(WAIT)


def test_a_workers_unavailable_answer_is_unavailable_with_the_code_in_its_message(worker, client_of):
    servicer, channel = worker
    servicer.answer = lambda request, context: context.abort(grpc.StatusCode.UNAVAILABLE, "catching up")
    with pytest.raises(Unavailable, match="^UNAVAILABLE: catching up$"):
        client_of(channel).send_batch("n2", 0, ("t1",), 1, 1).result(WAIT)


def test_a_worker_that_does_not_answer_in_time_is_unavailable_naming_the_deadline(worker, client_of):
    servicer, channel = worker
    released = threading.Event()
    servicer.answer = lambda request, context: released.wait(WAIT) and pb.WorkResponse()
    try:
        with pytest.raises(Unavailable, match="^DEADLINE_EXCEEDED"):
            client_of(channel, timeout=0.2).send_batch("n2", 0, ("t1",), 1, 1).result(WAIT)
    finally:
        released.set()


def test_a_node_nobody_listens_on_is_unavailable(client_of):
    channel = grpc.insecure_channel(f"127.0.0.1:{unused_port()}")
    try:
        with pytest.raises(Unavailable, match="^UNAVAILABLE"):
            client_of(channel).send_batch("n9", 0, ("t1",), 1, 1).result(WAIT)
    finally:
        channel.close()


def test_a_node_that_cannot_be_resolved_fails_the_future_not_the_send():
    def channel_of(node: str) -> grpc.Channel:
        raise Unavailable(f"node {node!r} is not a member of the cluster")

    client = WorkerClient(channel_of)
    try:
        future = client.send_batch("gone", 0, ("t1",), 1, 1)
        with pytest.raises(Unavailable, match="not a member"):
            future.result(WAIT)
    finally:
        client.close()


def test_a_reply_takes_each_finished_ids_rows_and_an_older_workers_one_count():
    reply = batch_reply_from_response(pb.WorkResponse(finished_task_ids=["a", "b"], finished_rows_scanned=[5, 0],
                                                     rows_scanned=5))
    assert reply == BatchReply(("a", "b"), (5, 0)) and reply.rows_of() == {"a": 5, "b": 0}
    older = batch_reply_from_response(pb.WorkResponse(finished_task_ids=["a", "b"], rows_scanned=9))
    assert older == BatchReply(("a", "b"), (9, 9))
