"""Unit tests of the error → gRPC status mapping and of the servicer wrappers that apply it."""
from __future__ import annotations

import logging

import grpc
import pytest

from common.metrics import NodeMetrics
from common.status import status_for, streaming, unary
from coordinator.core import errors
from coordinator.raft import Group0Unavailable
from cql.parser import CqlSyntaxError, parse


class Aborted(Exception):
    """What a real grpc context's abort does: raise, so the handler stops."""


class FakeContext:
    def __init__(self):
        self.status = None

    def abort(self, code, message):
        self.status = (code, message)
        raise Aborted(message)


class FailedCall(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self):
        return "deadline exceeded after 5 s"


@pytest.mark.parametrize("error_class, code", [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (Group0Unavailable, grpc.StatusCode.UNAVAILABLE),
])
def test_core_errors_keep_their_code_and_message(error_class, code):
    assert status_for(error_class("table ks.t does not exist")) == (code, "table ks.t does not exist")


def test_every_code_of_the_core_is_a_grpc_status_code():
    for code in errors.ERRORS_BY_CODE:
        assert grpc.StatusCode[code].name == code


def test_a_syntax_error_is_invalid_argument_with_its_position():
    with pytest.raises(CqlSyntaxError) as raised:
        parse("SELEKT * FROM t")
    code, message = status_for(raised.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith("syntax error") and "line 1" in message


def test_a_failed_call_to_another_node_is_unavailable_and_says_why():
    code, message = status_for(FailedCall())
    assert code == grpc.StatusCode.UNAVAILABLE
    assert message == "a node this request needed failed: DEADLINE_EXCEEDED: deadline exceeded after 5 s"


def test_anything_else_is_internal_and_logged_with_its_trace(caplog):
    with caplog.at_level(logging.ERROR, logger="common.status"):
        try:
            {}["missing"]
        except KeyError as bug:
            code, message = status_for(bug)
    assert code == grpc.StatusCode.INTERNAL
    assert message == "internal error (KeyError: 'missing'); see the node log"
    assert caplog.records and caplog.records[0].exc_info is not None


class Servicer:
    def __init__(self, error: Exception | None, counter=None):
        self.error = error
        if counter is not None:
            self.error_counter = counter

    @unary
    def Call(self, request, context):
        if self.error:
            raise self.error
        return f"answer to {request}"

    @streaming
    def Stream(self, request, context):
        yield "first"
        if self.error:
            raise self.error
        yield "second"


def test_unary_passes_answers_through_and_aborts_with_the_status():
    assert Servicer(None).Call("q", FakeContext()) == "answer to q"
    context = FakeContext()
    with pytest.raises(Aborted):
        Servicer(errors.NotFound("view ks.v does not exist")).Call("q", context)
    assert context.status == (grpc.StatusCode.NOT_FOUND, "view ks.v does not exist")


def test_streaming_aborts_after_the_pages_already_sent():
    context = FakeContext()
    received = []
    with pytest.raises(Aborted):
        for item in Servicer(errors.Unavailable("replica n2 is down")).Stream("q", context):
            received.append(item)
    assert received == ["first"]
    assert context.status == (grpc.StatusCode.UNAVAILABLE, "replica n2 is down")


def test_errors_are_counted_by_code_in_the_nodes_own_registry():
    metrics, other_node = NodeMetrics(), NodeMetrics()
    servicer = Servicer(errors.AlreadyExists("table ks.t exists"), counter=metrics.statement_errors)
    for _ in range(2):
        with pytest.raises(Aborted):
            servicer.Call("q", FakeContext())
    sample = {"code": "ALREADY_EXISTS"}
    assert metrics.registry.get_sample_value("vbc_statement_errors_total", sample) == 2
    assert other_node.registry.get_sample_value("vbc_statement_errors_total", sample) is None
