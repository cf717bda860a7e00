"""Statements on open Session calls (vbc.client.execute_on, node.client_service, common.open_calls) against a real
in-process gRPC server running the node's Client service over a fake executor."""
from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest

from common.open_calls import OpenCalls
from coordinator.core.errors import InvalidArgument
from cql.limits import Limits
from cql.result import Result
from node.client_service import ClientService
from node.wiring import SERVER_OPTIONS
from vbc import client
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc

TIMEOUT = 10.0


class FakeExecutor:
    """Echoes a statement back as its message; refuses "bad"; holds "slow" until released."""

    limits = Limits()

    def __init__(self):
        self.ran: list[str] = []
        self.released = threading.Event()
        self.released.set()
        self.started = threading.Event()

    def answer(self, statement, params, prepared_id, page_size=None, paging_state=b"", deadline=None,
               principal=None) -> Result:
        if statement == "bad":
            raise InvalidArgument("line 1: no viable alternative at 'bad'")
        if statement == "slow":
            self.started.set()
            assert self.released.wait(TIMEOUT)
        self.ran.append(statement)
        return Result(message=f"ran {statement}")


class CountingClientService(ClientService):
    def __init__(self, executor: FakeExecutor, open_calls: OpenCalls):
        super().__init__(executor, None, open_calls)
        self.unary_calls = 0
        self.sessions = 0

    def Execute(self, request, context):
        self.unary_calls += 1
        return super().Execute(request, context)

    def Session(self, request_iterator, context):
        self.sessions += 1
        yield from super().Session(request_iterator, context)


@pytest.fixture
def node():
    """(address, executor, service, open calls) of a server; the client's cached channels are closed after."""
    executor = FakeExecutor()
    open_calls = OpenCalls(4)
    service = CountingClientService(executor, open_calls)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=SERVER_OPTIONS)
    rpc.add_ClientServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", executor, service, open_calls
    executor.released.set()
    client.close_all()
    server.stop(0).wait()


def run(address: str, statement: str, timeout: float = TIMEOUT) -> str:
    return client.execute_on(address, pb.ExecuteRequest(statement=statement), timeout).message


def test_statements_run_one_after_another_on_one_session(node):
    address, executor, service, _ = node
    assert [run(address, f"s{i}") for i in range(5)] == [f"ran s{i}" for i in range(5)]
    assert (service.sessions, service.unary_calls) == (1, 0)


def test_a_refused_statement_raises_what_a_unary_call_raises_and_the_session_goes_on(node):
    address, executor, service, _ = node
    with pytest.raises(grpc.RpcError) as unary:
        client.client_stub(address).Execute(pb.ExecuteRequest(statement="bad"), timeout=TIMEOUT)
    with pytest.raises(grpc.RpcError) as session:
        run(address, "bad")
    assert (session.value.code(), session.value.details()) == (unary.value.code(), unary.value.details())
    assert client.error_text(session.value) == "INVALID_ARGUMENT: line 1: no viable alternative at 'bad'"
    assert run(address, "after") == "ran after"
    assert service.sessions == 1


def test_a_stopping_node_ends_an_idle_session_and_the_next_statement_runs_once(node):
    address, executor, service, open_calls = node
    assert run(address, "first") == "ran first"
    open_calls.end_all()
    assert run(address, "second") == "ran second"
    assert executor.ran == ["first", "second"]
    assert service.unary_calls == 1


def test_a_session_busy_when_its_node_stops_answers_its_statement(node):
    address, executor, service, open_calls = node
    executor.released.clear()
    with futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(run, address, "slow")
        assert executor.started.wait(TIMEOUT)
        open_calls.end_all()
        executor.released.set()
        assert slow.result(TIMEOUT) == "ran slow"
    assert run(address, "next") == "ran next"
    assert executor.ran == ["slow", "next"]


def test_a_late_answer_fails_as_deadline_exceeded(node):
    address, executor, _, _ = node
    executor.released.clear()
    with pytest.raises(grpc.RpcError) as caught:
        run(address, "slow", timeout=0.3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    executor.released.set()
    assert run(address, "after") == "ran after"


def test_a_node_without_room_for_sessions_runs_statements_as_unary_calls(node):
    address, executor, service, open_calls = node
    open_calls.end_all()  # refuses every new session, as a node at its limit does
    assert [run(address, f"s{i}") for i in range(3)] == ["ran s0", "ran s1", "ran s2"]
    assert service.unary_calls == 3 and service.sessions == 1  # one refused session, then backing off
