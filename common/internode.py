"""The replica role's transport to other nodes: domain batches and scans over the Internode gRPC service.

Every failure of a call (the peer refused it, the peer is unreachable, the call timed out) reaches the caller
as a `CoreError`: the peer's own refusal keeps its code (NOT_FOUND, UNAVAILABLE, ...) and its type when it was a
typed one (`RangeMoved`, `StaleTerm`: named in the trailing metadata, `common.status`), any other gRPC status
becomes `Unavailable` whose message names that status.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import grpc
import pyarrow as pa

from coordinator.core.errors import ERRORS_BY_CODE, ERRORS_BY_NAME, CoreError, Unavailable

from common.arrow_stream import batches_from_pieces, ipc_pieces, table_from_pieces
from common.codec import batch_to_proto, row_to_proto, scan_page_from_proto, scan_request_to_proto
from common.peers import Peers
from common.status import error_kind_of
from common.stream_pool import Exchange, start_exchange
from common.replica_messages import RowBatch, ScanPage, ScanRequest
from storage.cells import Row
from vbcpb import vbc_pb2 as pb

REPLICA_WRITE_TIMEOUT = 10.0
REPLICA_WRITE_SECONDS_PER_ROW = 0.005  # a replica applies a large batch (with its view updates) row by row
VIEW_UPDATE_TIMEOUT = 5.0
VIEW_ROWS_TIMEOUT = 600.0  # a whole stream of view rows: merging a million rows takes seconds
SCAN_TIMEOUT = 600.0  # a whole streamed scan; pages are flow-controlled by the consumer
TABLET_STREAM_TIMEOUT = 600.0  # a whole tablet stream (StreamTablet, and the source read it makes)
TABLET_CLEANUP_TIMEOUT = 120.0
# A schema statement's wait for every node to apply it (CQL drivers wait up to 10 s): with the propose's 20 s
# (cql.ddl.DDL_TIMEOUT) it stays within a client's 30 s deadline.
SCHEMA_AGREEMENT_TIMEOUT = 5.0


def error_from_rpc(error: grpc.RpcError) -> CoreError:
    """The typed core error for a failed gRPC call (see the module docstring)."""
    return error_from_status(error.code().name, error.details(), error_kind_of(error))


def error_from_status(code: str, details: str | None, kind: str | None = None) -> CoreError:
    """The typed core error for a gRPC status a peer answered with, of class `kind` when the peer named one of that
    code (see the module docstring)."""
    error_type = ERRORS_BY_CODE.get(code)
    if error_type is None:
        return Unavailable(f"{code}: {details}")
    typed = ERRORS_BY_NAME.get(kind or "")
    if typed is not None and typed.code == code:
        error_type = typed
    return error_type(details or code)


class PendingAck:
    """A replica write in flight; `result()` waits for it: the rows applied, or the CoreError it failed with."""

    def __init__(self, future=None, error: CoreError | None = None):
        self._future = future
        self._error = error

    def result(self) -> int:
        if self._error is not None:
            raise self._error
        try:
            return self._future.result().applied
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None


class StreamedAck:
    """A replica write sent on an open stream (common.stream_pool); `result()` as PendingAck's.

    If the stream ended or failed before the answer came (the peer restarted since the stream was opened), the
    batch is sent once more as a unary call: applying a batch twice changes nothing (last write wins).
    """

    def __init__(self, exchange: Exchange, unary: Callable[[], PendingAck]):
        self._exchange = exchange
        self._unary = unary

    def result(self) -> int:
        try:
            answer = self._exchange.answer(self._unary)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        return answer.result() if isinstance(answer, PendingAck) else applied_of(answer)


def applied_of(answer: pb.ReplicaOutcome | pb.Ack) -> int:
    """The rows an open call's answer (or a unary call's Ack) says changed; the refusal it carries, raised."""
    if isinstance(answer, pb.ReplicaOutcome) and answer.error_code:
        raise error_from_status(answer.error_code, answer.error_message)
    return answer.applied


def replica_write_timeout(batch: RowBatch) -> float:
    """The deadline of one ReplicaWrite: 10 s, plus 5 ms per row (a 5,000-row batch with a view gets 35 s)."""
    return REPLICA_WRITE_TIMEOUT + REPLICA_WRITE_SECONDS_PER_ROW * batch.size


class InternodeTransport:
    """Sends replica writes, view updates and scans to a peer's Internode service (stubs from `Peers`)."""

    def __init__(self, peers: Peers):
        self._peers = peers

    def start_replica_writes(self, writes: list[tuple[str, RowBatch]]) -> list[PendingAck | StreamedAck]:
        """Start sending base writes, each to its node, without waiting; wait on each with `.result()`.

        A row that several of the batches hold (one row's replicas) is encoded once."""
        encoded: dict[int, pb.Mutation] = {}  # by id(): every row stays alive in `writes` meanwhile

        def mutation_of(row: Row) -> pb.Mutation:
            message = encoded.get(id(row))
            if message is None:
                message = encoded[id(row)] = row_to_proto(row)
            return message

        return [self._start_replica_write(node, batch, mutation_of) for node, batch in writes]

    def _start_replica_write(self, node: str, batch: RowBatch,
                             mutation_of: Callable[[Row], pb.Mutation]) -> PendingAck | StreamedAck:
        """On one of the pool's open streams, or as a unary call when none is free."""
        try:
            pool = self._peers.streams(node, "ReplicaWrites")
        except CoreError as error:
            return PendingAck(error=error)
        message, timeout = batch_to_proto(batch, mutation_of), replica_write_timeout(batch)
        unary = functools.partial(self._unary_replica_write, node, message, timeout)
        exchange = start_exchange(pool, message, timeout, idempotent=True)
        return unary() if exchange is None else StreamedAck(exchange, unary)

    def _unary_replica_write(self, node: str, message: pb.MutationBatch, timeout: float) -> PendingAck:
        try:
            stub = self._peers.internode(node)
        except CoreError as error:
            return PendingAck(error=error)
        return PendingAck(stub.ReplicaWrite.future(message, timeout=timeout))

    def view_update(self, node: str, batch: RowBatch) -> int:
        """Apply view rows on `node` (on an open ViewUpdates call, or a unary one when none is free); the number of
        rows that changed there."""
        message = batch_to_proto(batch)
        pool = self._peers.streams(node, "ViewUpdates")

        def unary() -> pb.Ack:
            return self._peers.internode(node).ViewUpdate(message, timeout=VIEW_UPDATE_TIMEOUT)

        try:
            exchange = start_exchange(pool, message, VIEW_UPDATE_TIMEOUT, idempotent=True)
            return applied_of(unary() if exchange is None else exchange.answer(unary))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def scan(self, node: str, request: ScanRequest) -> Iterator[ScanPage]:
        """The pages of a scan on `node`, streamed; the call starts at the first `next()` and is cancelled on close."""
        try:
            call = self._peers.internode(node).Scan(scan_request_to_proto(request), timeout=SCAN_TIMEOUT)
            try:
                for page in call:
                    yield scan_page_from_proto(page)
            finally:
                call.cancel()
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def merge_view_rows(self, node: str, view_id: str, shard: int, schema_version: int, rows: pa.Table) -> int:
        """Merge computed view rows at `node`'s replica (one Arrow IPC stream); the rows that changed there."""
        def chunks():
            for position, piece in enumerate(ipc_pieces(rows)):
                if position == 0:
                    yield pb.ArrowChunk(table_id=view_id, shard=shard, schema_version=schema_version,
                                        ipc=piece, rows=rows.num_rows)
                else:
                    yield pb.ArrowChunk(ipc=piece)

        try:
            return self._peers.internode(node).MergeViewRows(chunks(), timeout=VIEW_ROWS_TIMEOUT).applied
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def read_range(self, node: str, table_id: str, schema_version: int, first_token: int, last_token: int,
                   include_tombstones: bool = False) -> pa.Table:
        """The live rows of `node`'s replica of a table in a token range (storage layout, one snapshot); deleted
        rows too with `include_tombstones`."""
        request = pb.ReadRangeRequest(table_id=table_id, schema_version=schema_version, first_token=first_token,
                                      last_token=last_token, include_tombstones=include_tombstones)
        try:
            chunks = list(self._peers.internode(node).ReadRange(request, timeout=SCAN_TIMEOUT))
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        rows = table_from_pieces(chunk.ipc for chunk in chunks)
        if chunks and rows.num_rows != chunks[0].rows:
            raise Unavailable(f"{node} sent {rows.num_rows} rows of {table_id}, announced {chunks[0].rows}")
        return rows

    def stream_tablet(self, node: str, term: int, migration_id: str, table_id: str, first_token: int,
                      last_token: int, source_node: str, schema_version: int) -> int:
        """Have `node` pull a token range's rows of a table from `source_node` and merge them (its pending replica);
        the rows streamed for the migration there."""
        request = pb.StreamTabletRequest(term=term, migration_id=migration_id, table_id=table_id,
                                         first_token=first_token, last_token=last_token, source_node=source_node,
                                         schema_version=schema_version)
        try:
            return self._peers.internode(node).StreamTablet(request, timeout=TABLET_STREAM_TIMEOUT).rows
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def cleanup_tablet(self, node: str, term: int, migration_id: str, table_id: str, first_token: int,
                       last_token: int, schema_version: int) -> int:
        """Delete `node`'s rows (tombstones too) of a table's token range; the number deleted."""
        request = pb.CleanupTabletRequest(term=term, migration_id=migration_id, table_id=table_id,
                                          first_token=first_token, last_token=last_token,
                                          schema_version=schema_version)
        try:
            return self._peers.internode(node).CleanupTablet(request, timeout=TABLET_CLEANUP_TIMEOUT).rows
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def read_tablet_rows(self, node: str, table_id: str, schema_version: int, first_token: int, last_token: int,
                         after_token: int | None = None, batch_rows: int = 0) -> TabletRowsCall:
        """Start reading `node`'s stored rows of a token range (tombstones included, storage layout, token order;
        only tokens above `after_token` when given); iterate the answer for its record batches."""
        request = pb.ReadTabletRowsRequest(table_id=table_id, first_token=first_token, last_token=last_token,
                                           schema_version=schema_version, after_token=after_token,
                                           batch_rows=batch_rows)
        try:
            call = self._peers.internode(node).ReadTabletRows(request, timeout=TABLET_STREAM_TIMEOUT)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        return TabletRowsCall(node, table_id, call)

    def schema_agreement(self, nodes: list[str], version: int,
                         timeout: float = SCHEMA_AGREEMENT_TIMEOUT, schema_only: bool = True,
                         view_updates: bool = False) -> list[str]:
        """Wait, up to `timeout` in all, until each of `nodes` has applied schema `version` (its SchemaBarrier; and,
        unless `schema_only`, finished every write begun under an older version); "node: why" for each that did
        not confirm (unreachable, or still applying when the time was up)."""
        request = pb.SchemaBarrierRequest(schema_version=version, timeout=timeout, schema_only=schema_only,
                                          view_updates=view_updates)
        calls, problems = {}, {}
        for node in nodes:
            try:
                calls[node] = self._peers.internode(node).SchemaBarrier.future(request, timeout=timeout + 1.0)
            except CoreError as error:
                problems[node] = error.message
            except ValueError:  # the channel closed under the call: this node is stopping
                problems[node] = "not asked, this node is stopping"
        for node, call in calls.items():
            try:
                call.result()
            except grpc.RpcError as error:
                problems[node] = _barrier_failure(error, timeout)
        return [f"{node}: {problems[node]}" for node in nodes if node in problems]


    def write_barrier(self, nodes: list[str], version: int, timeout: float) -> list[str]:
        """`schema_agreement` that also waits for the writes each node began under older versions, and for the
        view updates they queued to be delivered."""
        return self.schema_agreement(nodes, version, timeout, schema_only=False, view_updates=True)


def _barrier_failure(error: grpc.RpcError, timeout: float) -> str:
    """Why a node did not confirm a schema version, in a few words."""
    if error.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout:g}s"
    if error.code() is grpc.StatusCode.UNAVAILABLE:
        return f"unreachable or still applying ({error.details()})"
    return error_from_rpc(error).message


class TabletRowsCall:
    """A ReadTabletRows call in flight: its record batches as they arrive (each ends at a token boundary); a stream
    that ends before the source said it was done, or holds other than the rows it counted, fails `Unavailable`.
    `cancel()` (from any thread) ends the call."""

    def __init__(self, node: str, table_id: str, call) -> None:
        self._node, self._table_id, self._call = node, table_id, call
        self._done: pb.TabletRowsPiece | None = None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        received, pieces = 0, self._pieces()
        try:
            for batch in batches_from_pieces(pieces):
                received += batch.num_rows
                yield batch
            for _ in pieces:  # the IPC stream ended: read on to the source's last message
                pass
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        except ValueError as error:
            raise Unavailable(f"{self._node} sent rows of {self._table_id} that do not decode: {error}") from None
        if self._done is None or self._done.rows != received:
            announced = "no end" if self._done is None else f"{self._done.rows} rows"
            raise Unavailable(f"the stream of {self._table_id}'s rows from {self._node} was cut short: "
                              f"{received} rows received, {announced} announced")

    def _pieces(self) -> Iterator[bytes]:
        for piece in self._call:
            if piece.done:
                self._done = piece
                return
            yield piece.ipc

    def cancel(self) -> None:
        self._call.cancel()
