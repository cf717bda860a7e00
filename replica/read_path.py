"""The coordinating side of a read: one replica per tablet, merged in (token, primary key) order."""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

import grpc

from coordinator.core.errors import CoreError, NotFound, Unavailable
from coordinator.core.schema import Replica, Table
from coordinator.core.tokens import tablet_of, tablet_range
from coordinator.core.types import sort_key
from vbcpb import vbc_pb2 as pb

from replica.rows import partition_token
from common.peers import Peers, describe_error
from replica.local import LocalData
from common.codec import from_proto, to_proto

SCAN_TIMEOUT = 600.0  # a whole streamed scan; pages are flow-controlled by the consumer


class ReadCoordinator:
    """Reads rows of a table or view from the replicas, one replica per tablet, falling back to the next."""

    def __init__(self, node_id: str, read_state: Callable, local: LocalData, peers: Peers):
        self.node_id = node_id
        self._read_state = read_state
        self._local = local
        self._peers = peers

    def rows(self, table: Table, partitions: list[tuple] | None = None, limit: int | None = None) -> Iterator[tuple]:
        """Rows as tuples of every column value (schema order), sorted by (token, primary key).

        With `partitions` (partition key values), only those partitions are read; otherwise every tablet.
        """
        tablet_map = self._read_state(lambda s: s.tablets.get(table.id))
        if tablet_map is None:
            raise NotFound(f"{table.qualified_name} was dropped while this read was being prepared")
        count = tablet_map.tablet_count
        if partitions is None:
            streams = [self._tablet_rows(table, replicas, *tablet_range(i, count), None, limit)
                       for i, replicas in enumerate(tablet_map.replicas)]
        else:
            streams = []
            for key in partitions:
                token = partition_token(table, dict(zip(table.partition_key, key)))
                replicas = tablet_map.replicas[tablet_of(token, count)]
                streams.append(self._tablet_rows(table, replicas, token, token, key, limit))
        return _merge_sorted(table, streams)

    def _tablet_rows(self, table, replicas, first, last, partition_key, limit) -> Iterator[tuple]:
        request = pb.ScanRequest(table_id=table.id, first_token=first, last_token=last, limit=limit or 0,
                                 page_size=1000)
        if partition_key is not None:
            request.partition_key.extend(to_proto(v) for v in partition_key)
        return self._scan_with_fallback(request, _prefer_local(replicas, self.node_id))

    def _scan_with_fallback(self, request: pb.ScanRequest, replicas: list[Replica]) -> Iterator[tuple]:
        """Rows from the first replica that delivers a first page; later pages stream without buffering."""
        errors = []
        for replica in replicas:
            try:
                pages = iter(self._scan_one(replica.node, request))
                first = next(pages, None)
            except (grpc.RpcError, CoreError) as error:
                errors.append(f"{replica.node}: {describe_error(error)}")
                continue
            return _rows_of([] if first is None else [first], pages)
        raise Unavailable(f"no replica could serve tokens {request.first_token}..{request.last_token}: {'; '.join(errors)}")

    def _scan_one(self, node: str, request: pb.ScanRequest) -> Iterator[pb.ScanPage]:
        if node == self.node_id:
            return self._local.scan(request)
        return self._peers.internode(node).Scan(request, timeout=SCAN_TIMEOUT)


def _prefer_local(replicas: tuple[Replica, ...], node_id: str) -> list[Replica]:
    return sorted(replicas, key=lambda r: r.node != node_id)


def _rows_of(first_pages: list, pages: Iterator[pb.ScanPage]) -> Iterator[tuple]:
    for page in itertools.chain(first_pages, pages):
        for row in page.rows:
            yield _decode_row(row)


def _decode_row(row: pb.ScanRow) -> tuple:
    return (row.token, tuple(from_proto(v) for v in row.values))


def _merge_sorted(table: Table, streams: list[Iterator[tuple]]) -> Iterator[tuple]:
    """k-way merge of per-tablet streams by (token, primary key); yields the column values."""
    order = [next(i for i, c in enumerate(table.columns) if c.name == name) for name in table.primary_key]

    def key(item):
        token, values = item
        return (token, tuple(sort_key(values[i]) for i in order))

    return (values for _, values in heapq.merge(*streams, key=key))


