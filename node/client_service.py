"""The Client gRPC service: statements in, rows or messages out."""
from __future__ import annotations

import time
from collections.abc import Callable

from common.arrow_values import decode_table, longest_string_bytes, plain_columns
from common.arrow_stream import batch_ipc
from common.values import values_from_proto, values_to_proto
from common.open_calls import OpenCalls
from common.status import streaming, unary
from coordinator.core.auth import CLUSTER, Principal
from coordinator.core.errors import InvalidArgument
from cql.columnar import ArrowValues
from cql.executor import Executor
from cql.limits import Limits
from cql.result import Result
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc

STREAM_PAGE_ROWS = 1000  # ExecuteStream's page size when the request names none
DEADLINE_MARGIN_S = 1.0
DEADLINE_NONE_ABOVE_S = 365 * 24 * 3600.0  # a deadline this far away is no deadline


class ClientService(rpc.ClientServicer):
    """Runs statements through the executor for the caller's principal; failures are counted by status code.

    `principal_of(context)` says who calls (None: a node without authentication, where every caller may do
    anything); `still_allowed(principal)` raises when a session's role was dropped or may no longer log in: a
    session's statements are checked against its role as it is now."""

    def __init__(self, executor: Executor, error_counter, open_calls: OpenCalls,
                 principal_of: Callable[[object], Principal] | None = None,
                 still_allowed: Callable[[Principal], None] = lambda principal: None):
        self._executor = executor
        self.error_counter = error_counter
        self._open_calls = open_calls
        self._principal_of = principal_of
        self._still_allowed = still_allowed

    @unary
    def Execute(self, request, context):
        return self._execute(request, self._principal(context), context)

    def Session(self, request_iterator, context):
        principal = self._principal(context)
        return self._open_calls.answers(
            self, request_iterator, context,
            lambda request: pb.SessionAnswer(response=self._session_statement(request, principal)),
            lambda code, message: pb.SessionAnswer(error_code=code, error_message=message))

    def _session_statement(self, request: pb.ExecuteRequest, principal: Principal) -> pb.ExecuteResponse:
        self._still_allowed(principal)
        return self._execute(request, principal)

    def _principal(self, context) -> Principal:
        return CLUSTER if self._principal_of is None else self._principal_of(context)

    def _execute(self, request: pb.ExecuteRequest, principal: Principal, context=None) -> pb.ExecuteResponse:
        params = _params(request, self._executor.limits)
        result = self._executor.answer(request.statement, params, request.prepared_id, request.page_size or None,
                                       request.paging_state, deadline_of(context), principal=principal)
        if result.keyspace:
            raise InvalidArgument("USE sets the keyspace of a CQL native protocol connection; over gRPC, name the "
                                  f"keyspace in each statement ({result.keyspace}.table)")
        return _response(result, request.arrow_results)

    @streaming
    def ExecuteStream(self, request, context):
        params = _params(request, self._executor.limits)
        for page in self._executor.execute_pages(request.statement, request.page_size or STREAM_PAGE_ROWS, params,
                                                 request.prepared_id, request.paging_state, deadline_of(context),
                                                 principal=self._principal(context)):
            yield _response(page, request.arrow_results)

    @unary
    def Prepare(self, request, context):
        prepared = self._executor.prepare(request.statement)
        table = prepared.tables[0][1] if prepared.tables else None
        return pb.PrepareResponse(id=prepared.id, primary_key=list(table.primary_key if table else ()),
                                  partition_key=list(table.partition_key if table else ()),
                                  bind_columns=[pb.Column(name=c.name, type=c.type) for c in prepared.bind_columns])


def deadline_of(context) -> float | None:
    """The time.monotonic() by which a statement should answer: a little before the caller's deadline, so that a
    read running late answers DEADLINE_EXCEEDED with its own message rather than the caller's bare timeout."""
    remaining = context.time_remaining() if context is not None else None
    if remaining is None or remaining > DEADLINE_NONE_ABOVE_S:
        return None
    return time.monotonic() + remaining - min(DEADLINE_MARGIN_S, remaining * 0.1)


def _response(result: Result, arrow_results: bool) -> pb.ExecuteResponse:
    response = pb.ExecuteResponse(columns=[pb.Column(name=n, type=t) for n, t in result.columns],
                                  message=result.message, paging_state=result.paging_state, plan=result.plan)
    rows = result.as_arrow() if arrow_results else None
    if rows is not None:
        response.arrow_rows = batch_ipc(rows)
    else:
        response.rows.extend(values_to_proto(r) for r in result.row_values())
    return response


def _params(request: pb.ExecuteRequest, limits: Limits) -> list[list] | ArrowValues | None:
    """The request's bind-value sets, from `params` or from `arrow_values` (sizes checked before converting)."""
    if not request.arrow_values:
        return [values_from_proto(row) for row in request.params] or None
    if request.params:
        raise InvalidArgument("give the bind values either as params or as arrow_values, not both")
    table = decode_table(request.arrow_values)
    if table.num_rows == 0:
        raise InvalidArgument("arrow_values holds no rows: nothing to execute")
    limits.check_rows(table.num_rows)
    columns = plain_columns(table)
    size, position = longest_string_bytes(columns)
    limits.check_value_bytes(size, f"a value of Arrow column {position}")
    return ArrowValues(columns, staged=request.staged)
