"""The replica role of a node: applies base writes, generates and delivers view updates, serves scans."""
from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from coordinator.core.errors import CoreError, NotFound, Unavailable
from coordinator.core.schema import Replica, Table
from coordinator.core.state import Group0State
from coordinator.core.tokens import tablet_of
from coordinator.core.views import ViewChange, view_changes
from storage.cells import Row
from storage.store import NodeStore, OutboxEntry
from vbcpb import vbc_pb2 as pb

from common.metrics import NodeMetrics
from replica.inflight import InflightWrites
from common.injection import Injections
from replica.rows import delete_row, row_from_proto, row_to_proto, storage_spec, upsert_row, visible_row
from common.peers import Peers, describe_error
from common.codec import from_proto, to_proto

log = logging.getLogger(__name__)

VIEW_UPDATE_TIMEOUT = 5.0
OUTBOX_BATCH = 500


@dataclass(frozen=True)
class WriteContext:
    """What one base write needs from the schema, read atomically with the schema version."""

    schema_version: int
    table: Table
    views: tuple[Table, ...]
    base_replicas: tuple[tuple[Replica, ...], ...]
    view_replicas: dict


def _write_context(state: Group0State, table_id: str) -> WriteContext | None:
    table = state.tables.get(table_id)
    if table is None:
        return None
    views = tuple(state.views_of(table_id))
    return WriteContext(state.schema_version, table, views, state.tablets[table_id].replicas,
                        {v.id: state.tablets[v.id].replicas for v in views})


class LocalData:
    """Everything this node does with the rows it stores."""

    def __init__(self, node_id: str, store: NodeStore, read_state: Callable, catch_up: Callable[[int], None],
                 peers: Peers, injections: Injections, inflight: InflightWrites, metrics: NodeMetrics):
        self.node_id = node_id
        self.store = store
        self._read_state = read_state
        self._catch_up = catch_up
        self._peers = peers
        self._injections = injections
        self._inflight = inflight
        self._metrics = metrics
        self._ensured: set[str] = set()
        self._ensure_lock = threading.Lock()
        self._delivering: set[int] = set()
        self._delivering_lock = threading.Lock()

    # ------------------------------------------------------------ storage tables

    def ensure_table(self, table: Table) -> None:
        if table.id in self._ensured:
            return
        with self._ensure_lock:
            self.store.ensure_table(storage_spec(table))
            self._ensured.add(table.id)

    def drop_dropped_tables(self) -> None:
        """Drop the storage of tables the schema says were dropped (also those dropped while this node was down).

        Only ids recorded as dropped qualify: a stored table the local schema does not know (yet) may
        belong to commands still being replayed from the Raft journal, and must be kept.
        """
        with self._ensure_lock:
            dropped = self._read_state(lambda s: set(s.dropped_tables))
            for table_id in self.store.table_ids() & dropped:
                self.store.drop_table(table_id)
                self._ensured.discard(table_id)

    # ------------------------------------------------------------ base writes

    def apply_base_write(self, batch: pb.MutationBatch) -> int:
        self._catch_up(batch.schema_version)
        produced: list[tuple[str, bytes]] = []
        with self._inflight.track(self._schema_version):
            context = self._read_state(lambda s: _write_context(s, batch.table_id))
            if context is None:
                raise NotFound(f"table id {batch.table_id} does not exist on node {self.node_id} (dropped?)")
            self._injections.hit("write.replica.before_apply")
            rows = [row_from_proto(m) for m in batch.mutations]
            for token in {row.token for row in rows}:
                self._pair_index(context, token)
            self.ensure_table(context.table)
            for view in context.views:
                self.ensure_table(view)
            derive = self._deriver(context, produced) if context.views else None
            result = self._apply_to_store(context.table, rows, derive)
        self._injections.hit("write.replica.after_apply")
        self._metrics.rows_applied.labels("base").inc(result.changed)
        if result.outbox_ids:
            entries = [OutboxEntry(i, t, p) for i, (t, p) in zip(result.outbox_ids, produced, strict=True)]
            self.deliver(entries)
        return result.changed

    def _apply_to_store(self, table: Table, rows: list[Row], derive=None):
        try:
            return self.store.apply(table.id, rows, derive)
        except KeyError:
            if self.store.has_table(table.id):
                raise
            raise NotFound(f"{table.qualified_name} was dropped while this write was running") from None

    def _schema_version(self) -> int:
        return self._read_state(lambda s: s.schema_version)

    def _deriver(self, context: WriteContext, produced: list):
        def derive(old: Row | None, new: Row) -> list[tuple[str, bytes]]:
            old_values, new_values = visible_row(context.table, old), visible_row(context.table, new)
            pair = self._pair_index(context, new.token)
            entries = []
            for view in context.views:
                for change in view_changes(view, old_values, new_values):
                    entries.append(self._view_entry(context, view, change, new.view_ts, pair))
            produced.extend(entries)
            return entries

        return derive

    def _pair_index(self, context: WriteContext, token: int) -> int:
        replicas = context.base_replicas[tablet_of(token, len(context.base_replicas))]
        for index, replica in enumerate(replicas):
            if replica.node == self.node_id:
                return index
        raise Unavailable(f"node {self.node_id} is not a replica of the tablet owning token {token} of "
                          f"{context.table.qualified_name}; the writer's tablet map is stale, retry")

    def _view_entry(self, context: WriteContext, view: Table, change: ViewChange, ts: int, pair: int):
        if change.is_delete:
            row = delete_row(view, change.key, ts)
        else:
            row = upsert_row(view, change.values, ts)
        view_map = context.view_replicas[view.id]
        target = view_map[tablet_of(row.token, len(view_map))][pair]
        batch = pb.MutationBatch(table_id=view.id, shard=target.shard, mutations=[row_to_proto(row)],
                                 schema_version=context.schema_version)
        return target.node, batch.SerializeToString()

    # ------------------------------------------------------------ view updates

    def apply_view_update(self, batch: pb.MutationBatch) -> int:
        self._injections.hit("view_update.receive")
        self._catch_up(batch.schema_version)
        view = self._read_state(lambda s: s.tables.get(batch.table_id))
        if view is None:
            return 0  # the view was dropped meanwhile: its updates are moot
        self.ensure_table(view)
        changed = self._apply_to_store(view, [row_from_proto(m) for m in batch.mutations]).changed
        self._metrics.rows_applied.labels("view").inc(changed)
        return changed

    def deliver(self, entries: list[OutboxEntry]) -> set[str]:
        """Send outbox entries to their view replicas, grouped per (node, view); ack what was delivered.

        Returns the targets that could not be reached; their entries stay in the outbox for a retry.
        """
        claimed = self._claim(entries)
        failed: set[str] = set()
        try:
            for (target, table_id, shard), group in _group_entries(claimed).items():
                try:
                    self._send_view_batch(target, table_id, shard, group)
                except (grpc.RpcError, CoreError) as error:
                    log.info("view update to %s deferred (kept in outbox): %s", target, describe_error(error))
                    self._metrics.view_updates_deferred.inc(len(group))
                    failed.add(target)
                    continue
                except Exception:  # noqa: BLE001 - unexpected: keep the entries, retry, and say so loudly
                    log.warning("view update to %s failed unexpectedly (kept in outbox)", target, exc_info=True)
                    self._metrics.view_updates_deferred.inc(len(group))
                    failed.add(target)
                    continue
                self.store.outbox_ack([e.id for e, _ in group])
                self._metrics.view_updates_sent.inc(len(group))
            return failed
        finally:
            self._release(claimed)

    def flush_outbox(self, max_pages: int = 20) -> None:
        """Retry pending view updates target by target, oldest first; an unreachable target is left at once.

        Paging per target means entries queued for a node that is down never hold up the others.
        """
        for target in sorted(self.store.outbox_targets()):
            after_id = 0
            for _ in range(max_pages):
                page = self.store.outbox_pending(OUTBOX_BATCH, after_id=after_id, target=target)
                if not page or self.deliver(page):
                    break
                after_id = page[-1].id

    def _send_view_batch(self, target: str, table_id: str, shard: int, group: list) -> None:
        self._injections.hit("view_update.before_send")
        batch = pb.MutationBatch(table_id=table_id, shard=shard,
                                 schema_version=max(b.schema_version for _, b in group))
        for _, entry_batch in group:
            batch.mutations.extend(entry_batch.mutations)
        if target == self.node_id:
            self.apply_view_update(batch)
        else:
            self._peers.internode(target).ViewUpdate(batch, timeout=VIEW_UPDATE_TIMEOUT)

    def _claim(self, entries: list[OutboxEntry]) -> list[OutboxEntry]:
        with self._delivering_lock:
            free = [e for e in entries if e.id not in self._delivering]
            self._delivering.update(e.id for e in free)
            return free

    def _release(self, entries: list[OutboxEntry]) -> None:
        with self._delivering_lock:
            self._delivering.difference_update(e.id for e in entries)

    # ------------------------------------------------------------ scans

    def scan(self, request: pb.ScanRequest) -> Iterator[pb.ScanPage]:
        self._injections.hit("read.replica.scan")
        table = self._read_state(lambda s: s.tables.get(request.table_id))
        if table is None:
            raise NotFound(f"table id {request.table_id} does not exist on node {self.node_id}")
        self.ensure_table(table)
        page_size = request.page_size or 1000
        remaining = request.limit or None
        partition_key = tuple(_values(request.partition_key)) or None
        after = None
        while remaining is None or remaining > 0:
            want = page_size if remaining is None else min(page_size, remaining)
            rows = self.store.scan(request.table_id, request.first_token, request.last_token,
                                   partition_key=partition_key, after=after, limit=want)
            if not rows:
                return
            yield pb.ScanPage(rows=[_scan_row(table, r) for r in rows])
            if len(rows) < want:
                return
            after = (rows[-1].token, rows[-1].key)
            if remaining is not None:
                remaining -= len(rows)


def _values(messages) -> list:
    return [from_proto(v) for v in messages]


def _scan_row(table: Table, row: Row) -> pb.ScanRow:
    values = visible_row(table, row) or {}
    return pb.ScanRow(token=row.token, values=[to_proto(values.get(c.name)) for c in table.columns])


def _group_entries(entries: list[OutboxEntry]) -> dict:
    groups: dict = defaultdict(list)
    for entry in entries:
        batch = pb.MutationBatch.FromString(entry.payload)
        groups[(entry.target, batch.table_id, batch.shard)].append((entry, batch))
    return groups

