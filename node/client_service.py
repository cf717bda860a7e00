"""The Client gRPC service: statements in, rows or messages out."""
from __future__ import annotations

from common.codec import values_from_proto, values_to_proto
from common.status import streaming, unary
from cql.executor import Executor
from cql.result import Result
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc


class ClientService(rpc.ClientServicer):
    """Runs statements through the executor; failures are counted by status code."""

    def __init__(self, executor: Executor, error_counter):
        self._executor = executor
        self.error_counter = error_counter

    @unary
    def Execute(self, request, context):
        return _response(self._executor.execute(request.statement, _params(request)))

    @streaming
    def ExecuteStream(self, request, context):
        for page in self._executor.execute_pages(request.statement, request.page_size or 1000, _params(request)):
            yield _response(page)


def _response(result: Result) -> pb.ExecuteResponse:
    return pb.ExecuteResponse(
        columns=[pb.Column(name=n, type=t) for n, t in result.columns],
        rows=[values_to_proto(r) for r in result.rows],
        message=result.message,
    )


def _params(request: pb.ExecuteRequest) -> list[list] | None:
    return [values_from_proto(row) for row in request.params] or None
