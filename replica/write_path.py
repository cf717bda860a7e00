"""The coordinating side of a write: route each mutation to every replica of its tablet (consistency ALL)."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import grpc

from coordinator.core.errors import CoreError, NotFound, Unavailable
from coordinator.core.schema import Table
from coordinator.core.tokens import tablet_of
from storage.cells import Row
from vbcpb import vbc_pb2 as pb

from common.injection import Injections
from replica.rows import row_to_proto
from common.peers import Peers, describe_error
from replica.local import LocalData

REPLICA_WRITE_TIMEOUT = 10.0


class WriteCoordinator:
    """Sends a write's mutations to all replicas and succeeds only when every replica applied them."""

    def __init__(self, node_id: str, read_state: Callable, local: LocalData, peers: Peers, injections: Injections):
        self.node_id = node_id
        self._read_state = read_state
        self._local = local
        self._peers = peers
        self._injections = injections

    def write(self, mutations: list[tuple[Table, Row]], timestamp: int) -> None:
        batches = self._read_state(lambda s: _route(s, mutations, timestamp))
        self._injections.hit("write.coordinator.before_send")
        pending = [(node, self._peers.internode(node).ReplicaWrite.future(batch, timeout=REPLICA_WRITE_TIMEOUT))
                   for node, batch in batches if node != self.node_id]
        failures = []
        for node, batch in batches:
            if node == self.node_id:
                failures.extend(self._apply_locally(batch))
        for node, future in pending:
            try:
                future.result()
            except grpc.RpcError as error:
                failures.append(f"{node}: {describe_error(error)}")
        if failures:
            tables = ", ".join(sorted({t.qualified_name for t, _ in mutations}))
            raise Unavailable(
                f"write to {tables} did not reach every replica ({'; '.join(failures)}); "
                "it may be applied on some replicas, and retrying it is safe"
            )

    def _apply_locally(self, batch: pb.MutationBatch) -> list[str]:
        try:
            self._local.apply_base_write(batch)
            return []
        except CoreError as error:
            return [f"{self.node_id}: {error.code}: {error.message}"]  # same shape as describe_error


def _route(state, mutations: list[tuple[Table, Row]], timestamp: int) -> list[tuple[str, pb.MutationBatch]]:
    """One MutationBatch per (replica node, table, shard), in the schema version the router saw."""
    grouped: dict = defaultdict(list)
    for table, row in mutations:
        tablet_map = state.tablets.get(table.id)
        if tablet_map is None:
            raise NotFound(f"{table.qualified_name} was dropped while this write was being prepared")
        for replica in tablet_map.replicas[tablet_of(row.token, tablet_map.tablet_count)]:
            grouped[(replica.node, table.id, replica.shard)].append(row_to_proto(row))
    return [
        (node, pb.MutationBatch(table_id=table_id, shard=shard, mutations=rows, timestamp=timestamp,
                                schema_version=state.schema_version))
        for (node, table_id, shard), rows in grouped.items()
    ]
