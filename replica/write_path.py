"""The coordinating side of a write: route each row to every replica of its tablet (consistency ALL), the pending
replica of a moving tablet included."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import numpy as np
import pyarrow as pa

from common.arrow_tokens import tablets_of
from common.injection import Injections
from common.replica_messages import RowBatch
from coordinator.core.errors import CoreError, FailedPrecondition, NotFound, Unavailable
from coordinator.core.migrations import write_replicas
from coordinator.core.schema import Table
from coordinator.core.tokens import tablet_of
from storage.cells import Row

from replica.transport import PendingWrite, ReplicaTransport, describe


class TableDropped(NotFound):
    """A replica found a table of the write dropped (this node may not have applied the drop yet)."""


class LocalBaseReplica(Protocol):
    def apply_base_write(self, batch: RowBatch) -> int:
        """Apply a base write to this node's replica; the number of rows that changed."""


class WriteCoordinator:
    """Sends a write's rows to all replicas and succeeds only when every replica applied them."""

    def __init__(self, node_id: str, read_state: Callable, local: LocalBaseReplica, transport: ReplicaTransport,
                 injections: Injections, track_write: Callable[[], AbstractContextManager] = nullcontext):
        self.node_id = node_id
        self._read_state = read_state
        self._local = local
        self._transport = transport
        self._injections = injections
        # registers a write with the schema version it is routed under until every replica answered, so that a
        # barrier at a newer version (a tablet migration's) waits for the writes routed the old way
        self._track_write = track_write

    def write(self, mutations: list[tuple[Table, Row]], timestamp: int) -> None:
        """Apply every (table, row) on all replicas of the row's tablet, remote ones in parallel with the local one.

        Raises Unavailable naming each replica that failed; the write may then be applied on some replicas.
        Raises NotFound when a replica found the table dropped: replicas first catch up with the schema
        version the write was routed with, so a replica that does not know the table saw it dropped.
        """
        with self._track_write():
            batches = self._read_state(lambda s: route(s, mutations, timestamp))
            self._send(batches, sorted({t.qualified_name for t, _ in mutations}))

    def write_columns(self, table: Table, mutations: pa.Table, timestamp: int, staged: bool = False) -> None:
        """Like `write`, for mutations of one table given as columns (storage.arrow_layouts' mutation layout):
        routed with whole-column operations and sent as Arrow.

        `staged` (a bulk load): the rows of a table with views go to the staging area of every replica of their
        tablet (`replica.staging`) unless the tablet is in transition; if a replica refuses them (FAILED_PRECONDITION:
        a tablet operation or a drop of the last view came first), the write is made again directly."""
        with self._track_write():
            batches = self._read_state(lambda s: route_columns(s, table, mutations, timestamp, staged=staged))
            failures = self._send_all(batches)
            if failures and any(b.staged for _, b in batches) and all(
                    isinstance(error, FailedPrecondition) for _, error in failures):
                batches = self._read_state(lambda s: route_columns(s, table, mutations, timestamp))
                failures = self._send_all(batches)
            if failures:
                raise write_failure([table.qualified_name], failures)

    def _send(self, batches: list[tuple[str, RowBatch]], tables: list[str]) -> None:
        failures = self._send_all(batches)
        if failures:
            raise write_failure(tables, failures)

    def _send_all(self, batches: list[tuple[str, RowBatch]]) -> list[tuple[str, CoreError]]:
        """Send every batch (remote ones in parallel with the local one); the (node, error) of each that failed."""
        self._injections.hit("write.coordinator.before_send")
        remote = [(node, batch) for node, batch in batches if node != self.node_id]
        pending = list(zip([node for node, _ in remote], self._transport.start_replica_writes(remote), strict=True))
        try:
            failures = [failure for node, batch in batches if node == self.node_id
                        for failure in self._apply_locally(batch)]
        finally:
            remote_failures = _wait_for(pending)  # even if the local apply raised: each answer must be read
        return failures + remote_failures

    def _apply_locally(self, batch: RowBatch) -> list[tuple[str, CoreError]]:
        try:
            self._local.apply_base_write(batch)
            return []
        except CoreError as error:
            return [(self.node_id, error)]


def _wait_for(pending: list[tuple[str, PendingWrite]]) -> list[tuple[str, CoreError]]:
    """Wait for every remote write; the (node, error) of each that failed."""
    failures = []
    for node, write in pending:
        try:
            write.result()
        except CoreError as error:
            failures.append((node, error))
    return failures


def write_failure(table_names: list[str], failures: list[tuple[str, CoreError]]) -> CoreError:
    """The error of a write some replicas refused: NotFound if the table was dropped meanwhile, else Unavailable."""
    tables = ", ".join(table_names)
    reasons = "; ".join(f"{node}: {describe(error)}" for node, error in failures)
    if any(isinstance(error, NotFound) for _, error in failures):
        return TableDropped(f"{tables} was dropped while this write was running ({reasons})")
    return Unavailable(f"write to {tables} did not reach every replica ({reasons}); "
                       "it may be applied on some replicas, and retrying it is safe")


def route(state, mutations: list[tuple[Table, Row]], timestamp: int) -> list[tuple[str, RowBatch]]:
    """One RowBatch per (replica node, table, shard), stamped with the schema version the router saw."""
    grouped: dict[tuple[str, str, int], list[Row]] = defaultdict(list)
    for table, row in mutations:
        tablet_map = state.tablets.get(table.id)
        if tablet_map is None:
            raise NotFound(f"{table.qualified_name} was dropped while this write was being prepared")
        for replica in write_replicas(state, table.id, tablet_of(row.token, tablet_map.tablet_count)):
            grouped[(replica.node, table.id, replica.shard)].append(row)
    return [
        (node, RowBatch(table_id=table_id, shard=shard, rows=tuple(rows), timestamp=timestamp,
                        schema_version=state.schema_version))
        for (node, table_id, shard), rows in grouped.items()
    ]


def route_columns(state, table: Table, mutations: pa.Table, timestamp: int,
                  staged: bool = False) -> list[tuple[str, RowBatch]]:
    """`route` for mutation-layout columns of one table: rows grouped by tablet (a stable sort keeps the order of
    one key's mutations), each replica shard's rows taken in one `take`. With `staged`, the rows of a table with
    views whose tablet is not in transition go in batches of their own, marked `staged`."""
    tablet_map = state.tablets.get(table.id)
    if tablet_map is None:
        raise NotFound(f"{table.qualified_name} was dropped while this write was being prepared")
    stages = staged and any(True for _ in state.views_of(table.id))
    tablets = tablets_of(mutations.column("token").to_numpy(), tablet_map.tablet_count)
    order = np.argsort(tablets, kind="stable")
    present, starts = np.unique(tablets[order], return_index=True)
    ends = list(starts[1:]) + [len(order)]
    grouped: dict[tuple[str, int, bool], list[np.ndarray]] = defaultdict(list)
    for tablet, start, end in zip(present.tolist(), starts.tolist(), ends):
        to_staging = stages and (table.id, tablet) not in state.transitions
        for replica in write_replicas(state, table.id, tablet):
            grouped[(replica.node, replica.shard, to_staging)].append(order[start:end])
    return [
        (node, RowBatch(table_id=table.id, shard=shard, rows=(), timestamp=timestamp,
                        schema_version=state.schema_version, columns=mutations.take(np.concatenate(parts)),
                        staged=to_staging))
        for (node, shard, to_staging), parts in grouped.items()
    ]
