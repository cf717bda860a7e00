"""In-process replicas for unit tests of the replica role: group0 state, a fake transport, nodes with real stores.

Only `cluster_state` knows how group0 commands are spelled; adapt it alone when the command format changes.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common.injection import Injections
from common.metrics import NodeMetrics
from common.replica_messages import RowBatch, ScanPage, ScanRequest
from coordinator.core.commands import ColumnSpec, CreateKeyspace, CreateTable, CreateView, RegisterNode, WhereTerm
from coordinator.core.errors import CoreError, Unavailable
from coordinator.core.schema import Table
from coordinator.core.state import Group0State
from coordinator.core.tokens import tablet_of
from replica.inflight import InflightWrites
from replica.local import LocalData, SchemaAccess
from replica.read_path import ReadCoordinator
from replica.write_path import WriteCoordinator
from storage.store import NodeStore

# ----------------------------------------------------------------- group0 state


@dataclass(frozen=True)
class Schema:
    state: Group0State
    table_id: str
    view_id: str | None

    @property
    def table(self) -> Table:
        return self.state.tables[self.table_id]

    @property
    def view(self) -> Table:
        return self.state.tables[self.view_id]

    def replicas_of(self, table_id: str, token: int) -> tuple:
        tablet_map = self.state.tablets[table_id]
        return tablet_map.replicas[tablet_of(token, tablet_map.tablet_count)]


def cluster_state(nodes: tuple[str, ...] = ("n1", "n2", "n3"), rf: int = 2, tablets: int = 4, shards: int = 1,
                  with_view: bool = False) -> Schema:
    """Nodes, keyspace ks (rf, tablets), table ks.t (key int, c int, v text, PRIMARY KEY (key, c)) and,
    with `with_view`, view ks.by_v keyed by (v, key, c)."""
    state = Group0State()

    def propose(command) -> None:
        outcome = state.apply(command)
        assert outcome.ok, outcome

    for node in nodes:
        propose(RegisterNode(cmd_id=None, node_id=node, grpc=f"{node}:1", raft=f"{node}:2", shards=shards))
    propose(CreateKeyspace(cmd_id=None, name="ks", rf=rf, initial_tablets=tablets))
    table_id = uuid.uuid4().hex
    propose(CreateTable(cmd_id=None, id=table_id, keyspace="ks", name="t",
                        columns=(ColumnSpec("key", "int"), ColumnSpec("c", "int"), ColumnSpec("v", "text")),
                        partition_key=("key",), clustering_key=("c",)))
    view_id = None
    if with_view:
        view_id = uuid.uuid4().hex
        propose(CreateView(cmd_id=None, id=view_id, keyspace="ks", name="by_v", base="t",
                           partition_key=("v",), clustering_key=("key", "c"),
                           where=tuple(WhereTerm(c, "IS NOT NULL", None) for c in ("v", "key", "c"))))
    return Schema(state, table_id, view_id)


# ----------------------------------------------------------------- transport


@dataclass(frozen=True)
class Call:
    sender: str
    method: str
    target: str
    message: RowBatch | ScanRequest | tuple


class Finished:
    """A replica write that already ran: its result, or the error it raised."""

    def __init__(self, value: int = 0, error: CoreError | None = None):
        self._value, self._error = value, error

    def result(self) -> int:
        if self._error is not None:
            raise self._error
        return self._value


@dataclass
class Network:
    """Routes calls between the in-process replicas; records every call; can make nodes fail."""

    replicas: dict[str, LocalData] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)  # every call fails with Unavailable
    refusing_view_updates: set[str] = field(default_factory=set)
    failing_after_first_page: set[str] = field(default_factory=set)  # scans fail after their first page
    calls: list[Call] = field(default_factory=list)

    def transport_of(self, sender: str) -> NodeTransport:
        return NodeTransport(sender, self)

    def replica(self, node: str, refused: set[str] = frozenset()) -> LocalData:
        if node in self.down or node in refused:
            raise Unavailable(f"{node} is down")
        return self.replicas[node]

    def calls_of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]


class NodeTransport:
    """One node's `ReplicaTransport` into the `Network` (records the sender of each call)."""

    def __init__(self, sender: str, network: Network):
        self._sender = sender
        self._network = network

    def start_replica_writes(self, writes: list[tuple[str, RowBatch]]) -> list[Finished]:
        return [self._start_replica_write(node, batch) for node, batch in writes]

    def _start_replica_write(self, node: str, batch: RowBatch) -> Finished:
        self._record("replica_write", node, batch)
        try:
            return Finished(self._network.replica(node).apply_base_write(batch))
        except CoreError as error:
            return Finished(error=error)

    def view_update(self, node: str, batch: RowBatch) -> int:
        self._record("view_update", node, batch)
        return self._network.replica(node, self._network.refusing_view_updates).apply_view_update(batch)

    def merge_view_rows(self, node: str, view_id: str, shard: int, schema_version: int, rows) -> int:
        self._record("merge_view_rows", node, (view_id, shard, rows.num_rows))
        return self._network.replica(node).merge_view_rows(view_id, schema_version, rows)

    def scan(self, node: str, request: ScanRequest) -> Iterator[ScanPage]:
        self._record("scan", node, request)
        for page in self._network.replica(node).scan(request):
            yield page
            if node in self._network.failing_after_first_page:
                raise Unavailable(f"{node} failed in the middle of a scan")

    def read_tablet_rows(self, node: str, table_id: str, schema_version: int, first_token: int, last_token: int,
                         after_token: int | None = None, batch_rows: int = 0) -> InProcessRows:
        self._network.calls.append(Call(self._sender, "read_tablet_rows", node, (table_id, after_token)))
        rows = self._network.replica(node).read_tablet_rows(table_id, schema_version, first_token, last_token,
                                                            after_token, batch_rows or 65_536)
        return InProcessRows(rows.windows)

    def _record(self, method: str, target: str, message) -> None:
        self._network.calls.append(Call(self._sender, method, target, message))


class InProcessRows:
    """A source read of a tablet stream in process: each window as one record batch; nothing to cancel."""

    def __init__(self, windows):
        self._windows = windows

    def __iter__(self):
        for window in self._windows:
            yield from window.combine_chunks().to_batches()

    def cancel(self) -> None:
        pass


# ----------------------------------------------------------------- nodes


@dataclass
class InProcessNode:
    node_id: str
    store: NodeStore
    local: LocalData
    writer: WriteCoordinator
    reader: ReadCoordinator
    injections: Injections


class InProcessCluster:
    """Replica roles of several nodes in one process, each with its own SQLite store, sharing one group0 state."""

    def __init__(self, directory: Path, schema: Schema, register_staged=None):
        """`register_staged`: each node's `replica.staging.Register` (default: staged rows are refused)."""
        self.schema = schema
        self._register_staged = register_staged
        self.network = Network()
        self.nodes: dict[str, InProcessNode] = {}
        for node_id in schema.state.nodes:
            self.nodes[node_id] = self._node(directory / node_id, node_id)
            self.network.replicas[node_id] = self.nodes[node_id].local

    def _node(self, directory: Path, node_id: str) -> InProcessNode:
        read_state = self.read_state
        store = NodeStore.for_data_dir(directory)
        transport = self.network.transport_of(node_id)
        injections = Injections()
        local = LocalData(node_id, store, SchemaAccess(read_state, lambda _version: None, InflightWrites()),
                          transport, injections, NodeMetrics(),
                          register_staged=self._register_staged(node_id) if self._register_staged else None)
        return InProcessNode(node_id, store, local, WriteCoordinator(node_id, read_state, local, transport, injections),
                             ReadCoordinator(node_id, read_state, local, transport), injections)

    def read_state(self, fn):
        return fn(self.schema.state)

    def close(self) -> None:
        for node in self.nodes.values():
            node.store.close()
