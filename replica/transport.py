"""What the replica role needs to reach the replica role of other nodes (implemented by `common.internode`).

Failures of a remote call arrive as `coordinator.core.errors.CoreError` (a transport failure is `Unavailable`),
so the replica code handles one error type whether the replica is local or remote; tests pass in-process fakes.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import pyarrow as pa

from coordinator.core.errors import CoreError

from common.replica_messages import RowBatch, ScanPage, ScanRequest


class PendingWrite(Protocol):
    def result(self) -> int:
        """Wait for the write: the number of rows that changed, or raise the CoreError it failed with."""


class ReplicaTransport(Protocol):
    def start_replica_writes(self, writes: list[tuple[str, RowBatch]]) -> list[PendingWrite]:
        """Start applying base writes, each on its node's replica, without waiting; one PendingWrite per write."""

    def view_update(self, node: str, batch: RowBatch) -> int:
        """Apply view rows on `node`'s view replica; the number of rows that changed."""

    def merge_view_rows(self, node: str, view_id: str, shard: int, schema_version: int, rows: pa.Table) -> int:
        """Merge a view building batch's view rows at `node`'s view replica; the number of rows that changed."""

    def scan(self, node: str, request: ScanRequest) -> Iterator[ScanPage]:
        """Stream the pages of a scan of `node`'s replica; an error may surface at any `next()`."""

    def read_tablet_rows(self, node: str, table_id: str, schema_version: int, first_token: int, last_token: int,
                         after_token: int | None = None, batch_rows: int = 0):
        """Start reading `node`'s stored rows of a token range for a tablet stream (replica.streaming.SourceRows)."""


def describe(error: Exception) -> str:
    """`CODE: message` for a CoreError (the shape gRPC errors are reported in), the text of any other error."""
    if isinstance(error, CoreError):
        return f"{error.code}: {error.message}"
    return str(error)
