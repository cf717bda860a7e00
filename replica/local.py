"""The replica role of a node: applies base writes and view updates to its local tables, serves scans.

Its API speaks domain values only (RowBatch, ScanRequest, ScanPage of `common.replica_messages`); a local
write never touches protobuf. Other nodes are reached through a `ReplicaTransport`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import pyarrow as pa

from common.arrow_tokens import tablets_of
from common.injection import Injections
from common.metrics import NodeMetrics
from common.replica_messages import RowBatch, ScanPage, ScanRequest
from coordinator.core.errors import FailedPrecondition, InvalidArgument, NotFound, RangeMoved
from coordinator.core.migrations import read_replicas
from coordinator.core.schema import Table
from coordinator.core.tokens import tablet_of, tablet_range
from storage import bulk
from storage.arrow_layouts import conformed, rows_of_mutations
from storage.cells import Row
from storage.store import NodeStore

from replica.inflight import InflightWrites
from replica.rows import storage_spec
from replica.staging import Register, StagedTablet, StagingArea
from replica.streaming import StreamProgress, StreamResult, TabletRows, TabletStream, TabletStreams
from replica.outbox import QueuedViewUpdate, ViewUpdateOutbox, grouped_updates
from replica.outbox_payload import encode_payload
from replica.tables import LocalTables
from replica.transport import ReplicaTransport
from replica.view_columns import columnar_views_supported, view_updates_of_states
from replica.view_updates import WriteContext, pair_index, view_updates, write_context


@dataclass(frozen=True)
class SchemaAccess:
    """How the replica role sees group0: read the applied state, catch up to a version, track writes per version.

    `read(fn)` applies `fn` to the group0 state; `catch_up(version)` returns once this node applied schema
    `version` (a peer saw it, so it is committed); `inflight` lets a schema change wait for older writes.
    """

    read: Callable
    catch_up: Callable[[int], None]
    inflight: InflightWrites

    def version(self) -> int:
        return self.read(lambda s: s.schema_version)


class LocalData:
    """Everything this node does with the rows it stores, built from its local tables and its outbox."""

    def __init__(self, node_id: str, store: NodeStore, schema: SchemaAccess, transport: ReplicaTransport,
                 injections: Injections, metrics: NodeMetrics,
                 read_outbox_version_1: Callable[[bytes], RowBatch] | None = None,
                 register_staged: Register | None = None):
        self.node_id = node_id
        self.tables = LocalTables(store, schema.read)
        self.outbox = ViewUpdateOutbox(store, self._send_view_update, metrics, read_outbox_version_1,
                                       removed_nodes=lambda: schema.read(lambda s: frozenset(s.removed_nodes)))
        self._schema = schema
        self._transport = transport
        self._injections = injections
        self._metrics = metrics
        self.staging = StagingArea(node_id, store, schema.read, schema.catch_up, self.apply_base_write,
                                   register_staged or _no_staging)

    # ------------------------------------------------------------ base writes

    def apply_base_write(self, batch: RowBatch) -> int:
        """Merge a base write into this replica, queue its view updates durably and try to deliver them.

        Returns the number of rows whose stored state changed. A `staged` batch goes to the staging area instead
        (`replica.staging`): kept and registered, not applied; the number of rows kept.
        """
        if batch.staged:
            return self.staging.stage(batch)
        self._schema.catch_up(batch.schema_version)
        queued: list[tuple[str, RowBatch]] = []
        with self._schema.inflight.track(self._schema.version):
            context = self._schema.read(lambda s: write_context(s, batch.table_id))
            if context is None:
                raise NotFound(f"table id {batch.table_id} does not exist on node {self.node_id} (dropped?)")
            self._injections.hit("write.replica.before_apply")
            batch = self._conformed(context.table, batch)
            self._check_replica_of(context, batch)  # refuse a write routed with a stale tablet map
            for table in (context.table, *context.views):
                self.tables.ensure(table)
            if batch.columns is not None and columnar_views_supported(context):
                derive = self._queue_view_columns(context, queued) if context.views else None
                result = self.tables.apply_columns(context.table, batch.columns, derive)
            else:
                derive = self._queue_view_updates(context, queued) if context.views else None
                result = self.tables.apply(context.table, self._rows(context.table, batch), derive,
                                           typed=batch.columns is not None)
        self._injections.hit("write.replica.after_apply")
        self._metrics.rows_applied.labels("base").inc(result.changed)
        if result.outbox_ids:
            self.outbox.deliver([QueuedViewUpdate(id, target, update)
                                 for id, (target, update) in zip(result.outbox_ids, queued, strict=True)])
        return result.changed

    @staticmethod
    def _conformed(table: Table, batch: RowBatch) -> RowBatch:
        """The batch with its columns (if any) in the table's mutation layout; INVALID_ARGUMENT if they cannot be."""
        if batch.columns is None:
            return batch
        try:
            return replace(batch, columns=conformed(storage_spec(table), batch.columns))
        except ValueError as error:
            raise InvalidArgument(str(error)) from None

    def _check_replica_of(self, context: WriteContext, batch: RowBatch) -> None:
        if batch.columns is None:
            for token in {row.token for row in batch.rows}:
                pair_index(context, self.node_id, token)
            return
        tablets = np.unique(tablets_of(batch.columns.column("token").to_numpy(), len(context.base_replicas)))
        for tablet in tablets.tolist():
            pair_index(context, self.node_id, tablet_range(tablet, len(context.base_replicas))[0])

    @staticmethod
    def _rows(table: Table, batch: RowBatch) -> list[Row]:
        if batch.columns is None:
            return list(batch.rows)
        return rows_of_mutations(storage_spec(table), batch.columns)

    def _queue_view_updates(self, context: WriteContext, queued: list[tuple[str, RowBatch]], filled: bool = False):
        """The store's `derive`: one outbox entry per (view replica, view, shard) holding every view row the
        batch's changes produce there, in order (also kept in `queued`, in the same order). `filled`: made by a pending
        replica that holds its stream source's rows (`view_updates`)."""
        def derive(changes: list[tuple[Row | None, Row]]) -> list[tuple[str, bytes]]:
            updates = [update for old, new in changes
                       for update in view_updates(context, self.node_id, old, new, filled)]
            groups = grouped_updates(updates)
            queued.extend(groups)
            return [(target, encode_payload(update)) for target, update in groups]

        return derive

    def _queue_view_columns(self, context: WriteContext, queued: list[tuple[str, RowBatch]]):
        """The store's columnar `derive`: the view mutations of the changed rows' states, computed in bulk
        (replica.view_columns), one outbox entry per (view replica, view, shard), also kept in `queued`."""
        def derive(before: pa.Table, after: pa.Table) -> list[tuple[str, bytes]]:
            groups = view_updates_of_states(context, self.node_id, before, after)
            queued.extend(groups)
            return [(target, encode_payload(update)) for target, update in groups]

        return derive

    def feeds_views(self, table_id: str) -> bool:
        """Whether writes to the table make view updates (it is a base table with views)."""
        return self._schema.read(lambda s: any(True for _ in s.views_of(table_id)))

    def feed_streamed(self, table_id: str, streamed: dict[tuple[int, tuple], Row | None]) -> int:
        """The view updates a tablet stream's source never made: for the rows this pending replica held before the
        stream (its double writes), from the source's row to the merged one where they differ (a write the source
        missed: refused there, applied here); queued and delivered as a write's. The number of rows that made some."""
        context = self._schema.read(lambda s: write_context(s, table_id))
        if context is None or not context.views:
            return 0
        queued: list[tuple[str, RowBatch]] = []
        result = self.tables.store.feed_streamed(table_id, streamed,
                                                 self._queue_view_updates(context, queued, filled=True))
        if result.outbox_ids:
            self.outbox.deliver([QueuedViewUpdate(id, target, update)
                                 for id, (target, update) in zip(result.outbox_ids, queued, strict=True)])
        return result.changed

    # ------------------------------------------------------------ view updates

    def apply_view_update(self, batch: RowBatch) -> int:
        """Merge view rows sent by a paired base replica; the number of rows that changed (0 if the view is gone)."""
        self._injections.hit("view_update.receive")
        self._schema.catch_up(batch.schema_version)
        view = self._schema.read(lambda s: s.tables.get(batch.table_id))
        if view is None:
            return 0  # the view was dropped meanwhile: its updates are moot
        self.tables.ensure(view)
        if batch.columns is not None:
            changed = self.tables.apply_columns(view, batch.columns).changed
        else:
            changed = self.tables.apply(view, list(batch.rows)).changed
        self._metrics.rows_applied.labels("view").inc(changed)
        return changed

    def merge_view_rows(self, view_id: str, schema_version: int, rows: pa.Table) -> int:
        """Merge view rows computed by a view building batch (`storage.arrow_layouts.view_rows_schema`), set-based
        and last-write-wins; the number of rows that changed (0 if the view was dropped meanwhile)."""
        self._injections.hit("view_rows.receive")
        self._schema.catch_up(schema_version)
        view = self._schema.read(lambda s: s.tables.get(view_id))
        if view is None:
            return 0  # the view was dropped meanwhile: its rows are moot
        if view.view is None:
            raise InvalidArgument(f"{view.qualified_name} is a base table, not a view: view rows cannot go into it")
        try:
            self.tables.ensure(view)
            changed = bulk.merge_view_rows(self.tables.store, storage_spec(view), rows)
        except (NotFound, KeyError):
            return 0  # dropped between the read above and the merge
        self._metrics.rows_applied.labels("view").inc(changed)
        return changed

    def read_range(self, table_id: str, schema_version: int, first_token: int, last_token: int,
                   include_tombstones: bool = False) -> pa.Table:
        """The live rows of this replica of a table in a token range, in the storage layout (one snapshot); deleted
        rows too with `include_tombstones`."""
        self._schema.catch_up(schema_version)
        table = self._schema.read(lambda s: s.tables.get(table_id))
        if table is None:
            raise NotFound(f"table id {table_id} does not exist on node {self.node_id} (dropped?)")
        self.tables.ensure(table)
        return bulk.read_token_range(self.tables.store, storage_spec(table), first_token, last_token,
                                     include_tombstones=include_tombstones)

    def flush_outbox(self, max_pages: int = 20) -> None:
        self.outbox.flush(max_pages)

    def queue_view_rows(self, target: str, view_id: str, shard: int, schema_version: int, rows: pa.Table) -> None:
        """Keep a view building batch's rows for a view replica it could not reach in the outbox, durably; the
        outbox loop merges them there once it answers (`outbox_holds_view` tells when none are left)."""
        batch = RowBatch(table_id=view_id, shard=shard, rows=(), schema_version=schema_version, columns=rows,
                         view_rows=True)
        self.tables.store.outbox_queue([(target, encode_payload(batch))], view_id)

    def _send_view_update(self, target: str, batch: RowBatch) -> None:
        self._injections.hit("view_update.before_send")
        if batch.view_rows:
            self._send_view_rows(target, batch)
        elif target == self.node_id:
            self.apply_view_update(batch)
        else:
            self._transport.view_update(target, batch)

    def _send_view_rows(self, target: str, batch: RowBatch) -> None:
        if target == self.node_id:
            self.merge_view_rows(batch.table_id, batch.schema_version, batch.columns)
        else:
            self._transport.merge_view_rows(target, batch.table_id, batch.shard, batch.schema_version, batch.columns)

    # ------------------------------------------------------------ tables and scans

    def ensure_table(self, table: Table) -> None:
        self.tables.ensure(table)

    def drop_dropped_tables(self) -> None:
        self.tables.drop_dropped()
        existing = self._schema.read(lambda s: set(s.tables))
        for table_id in {entry.table_id for entry in self.staging.entries()} - existing:
            self.tables.store.unstage_table(table_id)

    def create_new_tables(self) -> None:
        self.tables.create_new()

    def scan(self, request: ScanRequest) -> Iterator[ScanPage]:
        """The pages of a scan of this replica (see ScanRequest); NotFound for a table this node does not know.

        A versioned request (planned at `schema_version`) is served only while this node is a read replica of every
        tablet its range overlaps: checked once caught up to that version, then before and after reading each page
        (RangeMoved otherwise). A page read after checking is checked again before it is handed on, so a page that
        ran into the range's cleanup (which starts only after this node applied the `cleanup` stage, when it is no
        longer a read replica) is never served.
        """
        self._injections.hit("read.replica.scan")
        self._schema.catch_up(request.schema_version)
        table = self._schema.read(lambda s: s.tables.get(request.table_id))
        if table is None:
            raise NotFound(f"table id {request.table_id} does not exist on node {self.node_id}")
        if not request.schema_version:
            return self.tables.scan(table, request)
        self._check_serves(request)
        return self._checked_pages(request, self.tables.scan(table, request))

    def catch_up(self, version: int) -> None:
        """Return once this node applied schema `version` (a peer saw it, so it is committed)."""
        self._schema.catch_up(version)

    def _checked_pages(self, request: ScanRequest, pages: Iterator[ScanPage]) -> Iterator[ScanPage]:
        """`pages` (each read as it is taken), each read between two checks that this node still serves the request's
        range: the one before the first page is `scan`'s."""
        for page in pages:
            self._check_serves(request)  # no cleanup of the range can have run under this page's read
            yield page
            self._check_serves(request)  # overtaken while the caller held the page: read no more

    def _check_serves(self, request: ScanRequest) -> None:
        """RangeMoved when this node, by the group0 state it applied, no longer reads from the request's range."""
        moved = self._schema.read(lambda s: moved_away(s, request.table_id, self.node_id, request.first_token,
                                                        request.last_token))
        if moved is not None:
            raise RangeMoved(moved)

    # ------------------------------------------------------------ tablet migration (replica.streaming)

    @cached_property
    def tablet_streams(self) -> TabletStreams:
        return TabletStreams(self.tables.store, lambda table_id: self._schema.read(lambda s: s.tables.get(table_id)),
                             self.tables.ensure, self._schema.catch_up, self._transport, self._injections,
                             self._metrics, self.node_id, feed=self)

    def stream_tablet(self, request: TabletStream, current_term: int) -> StreamResult:
        """Pull a token range's rows from the source replica and merge them here (TabletStreams.stream)."""
        return self.tablet_streams.stream(request, current_term)

    def cleanup_tablet(self, term: int, current_term: int, migration_id: str, table_id: str, first_token: int,
                       last_token: int, schema_version: int) -> int:
        """Delete this replica's rows of a token range (TabletStreams.cleanup); the number deleted."""
        return self.tablet_streams.cleanup(term, current_term, migration_id, table_id, first_token, last_token,
                                           schema_version)

    def read_tablet_rows(self, table_id: str, schema_version: int, first_token: int, last_token: int,
                         after_token: int | None, window_rows: int) -> TabletRows:
        """This replica's stored rows of a token range for a stream (TabletStreams.read_rows)."""
        return self.tablet_streams.read_rows(table_id, schema_version, first_token, last_token, after_token,
                                             window_rows)

    def tablet_stream_progress(self) -> list[StreamProgress]:
        return self.tablet_streams.progress()


def _no_staging(entry: StagedTablet) -> None:
    raise FailedPrecondition(f"this node keeps no staged rows (table id {entry.table_id}): write them directly")


def moved_away(state, table_id: str, node_id: str, first_token: int, last_token: int) -> str | None:
    """Why `node_id` may not serve tokens first_token..last_token of a table by group0 `state`: the first tablet they
    overlap whose read replicas (`migrations.read_replicas`) do not include the node, named with the nodes that serve
    it now; None when the node reads from every one of them."""
    table, tablet_map = state.tables.get(table_id), state.tablets.get(table_id)
    if table is None or tablet_map is None:
        raise NotFound(f"table id {table_id} does not exist on node {node_id} (dropped?)")
    count = tablet_map.tablet_count
    for tablet in range(tablet_of(first_token, count), tablet_of(last_token, count) + 1):
        serving = read_replicas(state, table_id, tablet)
        if all(replica.node != node_id for replica in serving):
            first, last = tablet_range(tablet, count)
            now = ", ".join(sorted({replica.node for replica in serving})) or "no node"
            return (f"{table.qualified_name} tablet {tablet} (tokens {first}..{last}) is no longer read from node "
                    f"{node_id}: {now} serves it now (schema version {state.schema_version}); plan the read again")
    return None
