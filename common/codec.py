"""The one place that converts between domain values and protobuf messages (values, rows, batches, scans).

Names say what is converted: `value_*` one cell value ↔ `Value`; `values_*` a list of values ↔ `Row` (a
client's bind values or result row); `row_*` a storage row ↔ `Mutation`; `batch_*`, `scan_request_*`,
`scan_page_*` the replica messages of `common.replica_messages` (a batch's Arrow columns as one IPC stream).
"""
from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from coordinator.core.errors import InvalidArgument
from coordinator.core.schema import Filter
from storage.cells import Cell, Row
from storage.reads import Aggregate
from vbcpb import vbc_pb2 as pb

from common.arrow_stream import batch_from_ipc, batch_ipc, ipc_pieces, table_from_pieces  # noqa: F401
from common.replica_messages import DEFAULT_PAGE_SIZE, RowBatch, ScanPage, ScanRequest
from common.values import value_from_proto, value_to_proto, values_from_proto, values_to_proto  # noqa: F401


def row_to_proto(row: Row) -> pb.Mutation:
    """A storage row (key, marker, tombstone, timestamped cells) as a Mutation; view_ts stays on the replica."""
    message = pb.Mutation(token=row.token, key=[value_to_proto(v) for v in row.key])
    if row.marker_ts is not None:
        message.marker_ts = row.marker_ts
    if row.tomb_ts is not None:
        message.tomb_ts = row.tomb_ts
    for name, cell in row.cells.items():
        message.cells.append(pb.Cell(column=name, value=value_to_proto(cell.value), ts=cell.ts))
    return message


def row_from_proto(message: pb.Mutation) -> Row:
    return Row(
        token=message.token,
        key=tuple(value_from_proto(v) for v in message.key),
        marker_ts=message.marker_ts if message.HasField("marker_ts") else None,
        tomb_ts=message.tomb_ts if message.HasField("tomb_ts") else None,
        cells={c.column: Cell(value_from_proto(c.value), c.ts) for c in message.cells},
    )


def batch_to_proto(batch: RowBatch, mutation_of: Callable[[Row], pb.Mutation] = row_to_proto) -> pb.MutationBatch:
    """The batch as a MutationBatch; `mutation_of` encodes each row (a caller sending the same rows to several
    replicas passes one that encodes each row once)."""
    message = pb.MutationBatch(table_id=batch.table_id, shard=batch.shard, timestamp=batch.timestamp,
                               schema_version=batch.schema_version, mutations=[mutation_of(r) for r in batch.rows],
                               staged=batch.staged)
    if batch.columns is not None:
        message.arrow_mutations = _ipc_bytes(batch.columns)
    return message


def batch_from_proto(message: pb.MutationBatch) -> RowBatch:
    columns = _ipc_table(message.arrow_mutations) if message.arrow_mutations else None
    return RowBatch(table_id=message.table_id, shard=message.shard,
                    rows=tuple(row_from_proto(m) for m in message.mutations),
                    schema_version=message.schema_version, timestamp=message.timestamp, columns=columns,
                    staged=message.staged)


def _ipc_bytes(table: pa.Table) -> bytes:
    return b"".join(ipc_pieces(table))


def _ipc_table(data: bytes) -> pa.Table:
    try:
        return table_from_pieces([data])
    except ValueError as error:
        raise InvalidArgument(f"arrow_mutations: {error}") from None


def batch_from_proto_bytes(payload: bytes) -> RowBatch:
    """A serialized MutationBatch as a RowBatch (how outbox entries of format version 1 were stored)."""
    return batch_from_proto(pb.MutationBatch.FromString(payload))


def scan_request_to_proto(request: ScanRequest) -> pb.ScanRequest:
    message = pb.ScanRequest(
        table_id=request.table_id, first_token=request.first_token, last_token=request.last_token,
        limit=request.limit or 0, page_size=request.page_size,
        partition_key=[value_to_proto(v) for v in request.partition_key or ()],
        columns=list(request.columns or ()),
        filters=[pb.ScanFilter(column=f.column, op=f.op, values=_filter_values(f)) for f in request.filters],
        aggregates=[pb.ScanAggregate(function=a.function, column=a.column or "") for a in request.aggregates],
        schema_version=request.schema_version)
    if request.after is not None:
        message.has_after = True
        message.after_token = request.after[0]
        message.after_key.extend(value_to_proto(v) for v in request.after[1])
    return message


def _filter_values(term: Filter) -> list[pb.Value]:
    if term.op == "IS NOT NULL":
        return []
    return [value_to_proto(v) for v in (term.value if term.op == "IN" else (term.value,))]


def scan_request_from_proto(message: pb.ScanRequest) -> ScanRequest:
    partition_key = tuple(value_from_proto(v) for v in message.partition_key)
    after = None
    if message.has_after:
        after = (message.after_token, tuple(value_from_proto(v) for v in message.after_key))
    return ScanRequest(table_id=message.table_id, first_token=message.first_token,
                       last_token=message.last_token, partition_key=partition_key or None,
                       limit=message.limit or None, page_size=message.page_size or DEFAULT_PAGE_SIZE,
                       after=after, columns=tuple(message.columns) or None,
                       filters=tuple(_filter_from_proto(f) for f in message.filters),
                       aggregates=tuple(Aggregate(a.function, a.column or None) for a in message.aggregates),
                       schema_version=message.schema_version)


def _filter_from_proto(message: pb.ScanFilter) -> Filter:
    values = tuple(value_from_proto(v) for v in message.values)
    if message.op == "IS NOT NULL":
        return Filter(message.column, message.op, None)
    if message.op == "IN":
        return Filter(message.column, message.op, values)
    if len(values) != 1:
        raise InvalidArgument(f"scan filter {message.column} {message.op} needs one value, got {len(values)}")
    return Filter(message.column, message.op, values[0])


def scan_page_to_proto(page: ScanPage) -> pb.ScanPage:
    if page.partials is not None:
        return pb.ScanPage(partials=[values_to_proto(p) for p in page.partials])
    return pb.ScanPage(arrow=batch_ipc(page.batch))


def scan_page_from_proto(message: pb.ScanPage) -> ScanPage:
    if message.arrow:
        return ScanPage(batch=batch_from_ipc(message.arrow))
    return ScanPage(partials=[values_from_proto(p) for p in message.partials])
