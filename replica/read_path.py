"""The coordinating side of a read: one replica per tablet, merged in (token, primary key) order."""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Protocol

from common.replica_messages import ScanPage, ScannedRow, ScanRequest
from coordinator.core.errors import CoreError, NotFound, Unavailable
from coordinator.core.migrations import read_replicas
from coordinator.core.schema import Replica, Table
from coordinator.core.tokens import tablet_of, tablet_range
from coordinator.core.types import sort_key

from replica.rows import partition_token
from replica.transport import ReplicaTransport, describe


class LocalScans(Protocol):
    def scan(self, request: ScanRequest) -> Iterator[ScanPage]:
        """The pages of a scan of this node's replica."""


class ReadCoordinator:
    """Reads rows of a table or view from the replicas, one replica per tablet, falling back to the next."""

    def __init__(self, node_id: str, read_state: Callable, local: LocalScans, transport: ReplicaTransport):
        self.node_id = node_id
        self._read_state = read_state
        self._local = local
        self._transport = transport

    def rows(self, table: Table, partitions: list[tuple] | None = None, limit: int | None = None) -> Iterator[tuple]:
        """Rows as tuples of every column value (schema order), sorted by (token, primary key).

        With `partitions` (partition key values), only those partitions are read; otherwise every tablet.
        `limit` caps the rows read from each tablet or partition (the caller still applies its own limit).
        """
        layout = self._read_state(lambda s: read_layout(s, table.id))
        if layout is None:
            raise NotFound(f"{table.qualified_name} was dropped while this read was being prepared")
        count = len(layout)
        if partitions is None:
            streams = [self._tablet_rows(ScanRequest(table.id, *tablet_range(i, count), limit=limit), replicas)
                       for i, replicas in enumerate(layout)]
        else:
            streams = []
            for key in partitions:
                token = partition_token(table, dict(zip(table.partition_key, key)))
                request = ScanRequest(table.id, token, token, partition_key=tuple(key), limit=limit)
                streams.append(self._tablet_rows(request, layout[tablet_of(token, count)]))
        return merge_by_primary_key(table, streams)

    def _tablet_rows(self, request: ScanRequest, replicas: tuple[Replica, ...]) -> Iterator[ScannedRow]:
        """Rows from the first replica that delivers a first page; later pages stream without buffering.

        A replica failing before its first page is skipped for the next one (the local replica is tried
        first); a failure after it ends the read, since rows were already handed on.
        """
        errors = []
        for replica in _prefer_local(replicas, self.node_id):
            try:
                pages = iter(self._scan_one(replica.node, request))
                first = next(pages, None)
            except CoreError as error:
                errors.append(f"{replica.node}: {describe(error)}")
                continue
            return _rows_of([] if first is None else [first], pages)
        raise Unavailable(f"no replica could serve tokens {request.first_token}..{request.last_token}: "
                          f"{'; '.join(errors)}")

    def _scan_one(self, node: str, request: ScanRequest) -> Iterator[ScanPage]:
        if node == self.node_id:
            return self._local.scan(request)
        return self._transport.scan(node, request)


def read_layout(state, table_id: str) -> tuple[tuple[Replica, ...], ...] | None:
    """The replicas a read may use, per tablet (a moving tablet's pending replica once reads switched to it)."""
    tablet_map = state.tablets.get(table_id)
    if tablet_map is None:
        return None
    if not state.transitions:
        return tablet_map.replicas
    return tuple(read_replicas(state, table_id, tablet) for tablet in range(tablet_map.tablet_count))


def _prefer_local(replicas: tuple[Replica, ...], node_id: str) -> list[Replica]:
    return sorted(replicas, key=lambda r: r.node != node_id)


def _rows_of(first_pages: list[ScanPage], pages: Iterator[ScanPage]) -> Iterator[ScannedRow]:
    for page in itertools.chain(first_pages, pages):
        yield from page.rows


def merge_by_primary_key(table: Table, streams: list[Iterator[ScannedRow]]) -> Iterator[tuple]:
    """k-way merge of per-tablet streams, each in (token, primary key) order; yields the column values."""
    order = [next(i for i, c in enumerate(table.columns) if c.name == name) for name in table.primary_key]

    def key(row: ScannedRow):
        return (row.token, tuple(sort_key(row.values[i]) for i in order))

    return (row.values for row in heapq.merge(*streams, key=key))
