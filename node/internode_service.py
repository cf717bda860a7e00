"""The Internode gRPC service: replica writes, view updates, scans and local status between nodes.

Requests are converted from protobuf to domain values here (common.codec) before the replica role sees them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.arrow_stream import batch_stream_pieces, ipc_pieces, table_from_pieces
from common.open_calls import OpenCalls
from common.codec import batch_from_proto, scan_page_to_proto, scan_request_from_proto
from coordinator.core.errors import InvalidArgument
from common.status import streaming, unary
from replica.local import LocalData
from replica.streaming import WINDOW_ROWS, TabletStream
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc


@dataclass(frozen=True)
class InternodeDeps:
    """What the Internode service needs of its node."""

    replica: LocalData
    observe_timestamp: Callable[[int], None]
    local_status: Callable[..., pb.LocalStatusResponse]
    wait_schema_applied: Callable[[int, float], None]
    wait_schema_version: Callable[[int, float], None]
    open_calls: OpenCalls
    wait_view_updates: Callable[[float], None] = lambda timeout: None  # delivered: those queued so far
    raft_term: Callable[[], int] = lambda: 0  # this node's Raft term: StreamTablet/CleanupTablet fence on it


class InternodeService(rpc.InternodeServicer):
    def __init__(self, deps: InternodeDeps):
        self._deps = deps

    @unary
    def ReplicaWrite(self, request, context):
        return pb.Ack(applied=self._apply_base_write(request))

    def ReplicaWrites(self, request_iterator, context):
        answer = _applied(self._apply_base_write)
        return self._deps.open_calls.answers(self, request_iterator, context, answer, _refused)

    def ViewUpdates(self, request_iterator, context):
        answer = _applied(self._apply_view_update)
        return self._deps.open_calls.answers(self, request_iterator, context, answer, _refused)

    def _apply_base_write(self, request: pb.MutationBatch) -> int:
        self._deps.observe_timestamp(request.timestamp)
        return self._deps.replica.apply_base_write(batch_from_proto(request))

    @unary
    def ViewUpdate(self, request, context):
        return pb.Ack(applied=self._apply_view_update(request))

    def _apply_view_update(self, request: pb.MutationBatch) -> int:
        return self._deps.replica.apply_view_update(batch_from_proto(request))

    @streaming
    def Scan(self, request, context):
        for page in self._deps.replica.scan(scan_request_from_proto(request)):
            yield scan_page_to_proto(page)

    @unary
    def LocalStatus(self, request, context):
        return self._deps.local_status(state_digest=request.state_digest)

    @unary
    def SchemaBarrier(self, request, context):
        if request.schema_only:
            self._deps.wait_schema_version(request.schema_version, request.timeout or 30.0)
        else:
            self._deps.wait_schema_applied(request.schema_version, request.timeout or 30.0)
        if request.view_updates:
            self._deps.wait_view_updates(request.timeout or 30.0)
        return self._deps.local_status()

    @unary
    def MergeViewRows(self, request_iterator, context):
        first = next(request_iterator, None)
        if first is None:
            raise InvalidArgument("an empty MergeViewRows stream: the first chunk names the view")
        pieces = [first.ipc] + [chunk.ipc for chunk in request_iterator]
        try:
            rows = table_from_pieces(pieces)
        except ValueError as error:
            raise InvalidArgument(f"view rows for {first.table_id}: {error}") from None
        if rows.num_rows != first.rows:
            raise InvalidArgument(f"view rows for {first.table_id}: the stream holds {rows.num_rows} rows, "
                                  f"its first chunk announced {first.rows} (cut short?)")
        return pb.Ack(applied=self._deps.replica.merge_view_rows(first.table_id, first.schema_version, rows))

    @streaming
    def ReadRange(self, request, context):
        rows = self._deps.replica.read_range(request.table_id, request.schema_version,
                                             request.first_token, request.last_token, request.include_tombstones)
        for position, piece in enumerate(ipc_pieces(rows)):
            yield pb.ArrowChunk(table_id=request.table_id, ipc=piece,
                                rows=rows.num_rows if position == 0 else 0)

    @unary
    def StreamTablet(self, request, context):
        stream = TabletStream(term=request.term, migration_id=request.migration_id, table_id=request.table_id,
                              first_token=request.first_token, last_token=request.last_token,
                              source_node=request.source_node, schema_version=request.schema_version)
        result = self._deps.replica.stream_tablet(stream, current_term=self._deps.raft_term())
        return pb.StreamTabletResponse(rows=result.rows, seconds=result.seconds)

    @unary
    def CleanupTablet(self, request, context):
        rows = self._deps.replica.cleanup_tablet(request.term, self._deps.raft_term(), request.migration_id,
                                                 request.table_id, request.first_token, request.last_token,
                                                 request.schema_version)
        return pb.CleanupTabletResponse(rows=rows)

    @streaming
    def ReadTabletRows(self, request, context):
        after = request.after_token if request.HasField("after_token") else None
        rows = self._deps.replica.read_tablet_rows(request.table_id, request.schema_version, request.first_token,
                                                   request.last_token, after, request.batch_rows or WINDOW_ROWS)
        sent = []
        for piece in batch_stream_pieces(rows.schema, _counted(rows.windows, sent)):
            yield pb.TabletRowsPiece(ipc=piece)
        yield pb.TabletRowsPiece(done=True, rows=sum(sent))


def _counted(tables, counts: list[int]):
    """`tables`, each one's row count appended to `counts` as it is taken."""
    for table in tables:
        counts.append(table.num_rows)
        yield table


def _applied(apply: Callable[[pb.MutationBatch], int]) -> Callable[[pb.MutationBatch], pb.ReplicaOutcome]:
    return lambda request: pb.ReplicaOutcome(applied=apply(request))


def _refused(code: str, message: str) -> pb.ReplicaOutcome:
    return pb.ReplicaOutcome(error_code=code, error_message=message)
