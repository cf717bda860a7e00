"""One node's way to every node's replicas and status: its own in process, the others over Internode calls."""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import grpc
import pyarrow as pa

from common.internode import InternodeTransport
from common.peers import Peers
from common.replica_messages import RowBatch
from coordinator.core.errors import Unavailable
from coordinator.core.schema import Replica, Table
from storage.cells import Row
from vbcpb import vbc_pb2 as pb

PROBE_TIMEOUT = 1.5  # a node that does not answer its LocalStatus within this is reported as not answering


class LocalReplicas(Protocol):
    """What the endpoint uses of this node's own replicas (`replica.local.LocalData`)."""

    def merge_view_rows(self, view_id: str, schema_version: int, rows: pa.Table) -> int: ...

    def read_range(self, table_id: str, schema_version: int, first_token: int, last_token: int,
                   include_tombstones: bool = False) -> pa.Table: ...

    def apply_view_update(self, batch: RowBatch) -> int: ...


class InternodeEndpoint:
    """Merges view rows into, and reads token ranges of, any node's replica, and probes any node's status:
    this node's (`node_id`) without an RPC, another's through `transport` and `peers`."""

    def __init__(self, node_id: str, local: LocalReplicas, local_status: Callable[[], pb.LocalStatusResponse],
                 transport: InternodeTransport, peers: Peers, probe_timeout: float = PROBE_TIMEOUT):
        self._node_id = node_id
        self._local = local
        self._local_status = local_status
        self._transport = transport
        self._peers = peers
        self._probe_timeout = probe_timeout

    def merge_view_rows(self, replica: Replica, view: Table, schema_version: int, rows: pa.Table) -> int:
        """A batch's view rows into one view replica; the rows that changed there."""
        if replica.node == self._node_id:
            return self._local.merge_view_rows(view.id, schema_version, rows)
        return self._transport.merge_view_rows(replica.node, view.id, replica.shard, schema_version, rows)

    def read_range(self, replica: Replica, table: Table, schema_version: int, first_token: int,
                   last_token: int, include_tombstones: bool = False) -> pa.Table:
        """The live rows of one replica of a table in a token range (storage layout, one snapshot); deleted rows
        too with `include_tombstones`."""
        if replica.node == self._node_id:
            return self._local.read_range(table.id, schema_version, first_token, last_token, include_tombstones)
        return self._transport.read_range(replica.node, table.id, schema_version, first_token, last_token,
                                          include_tombstones)

    def view_rows(self, replica: Replica, view: Table, schema_version: int, first_token: int,
                  last_token: int) -> pa.Table:
        """Every row one view replica holds in a token range, deleted ones too (what a view repair reads)."""
        return self.read_range(replica, view, schema_version, first_token, last_token, include_tombstones=True)

    def delete_view_rows(self, replica: Replica, view: Table, schema_version: int, rows: list[Row]) -> int:
        """Apply view row deletions (a view repair's) at one view replica; the rows that changed there."""
        batch = RowBatch(table_id=view.id, shard=replica.shard, rows=tuple(rows), schema_version=schema_version)
        if replica.node == self._node_id:
            return self._local.apply_view_update(batch)
        return self._transport.view_update(replica.node, batch)

    def local_status(self, node_id: str) -> pb.LocalStatusResponse | None:
        """A node's own account of its status, or None if it does not answer."""
        if node_id == self._node_id:
            return self._local_status()
        try:
            return self._peers.internode(node_id).LocalStatus(pb.LocalStatusRequest(), timeout=self._probe_timeout)
        except (grpc.RpcError, Unavailable):
            return None
