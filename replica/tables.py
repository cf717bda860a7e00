"""This node's stored tables: created with the schema (or on first use), dropped after the schema drops them,
merged into and scanned."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pyarrow as pa

from common.replica_messages import ScanPage, ScanRequest
from coordinator.core.errors import InvalidArgument, NotFound
from coordinator.core.schema import Table
from storage.cells import Row
from storage.reads import RangeRead, aggregate, live_pages
from storage.store import NodeStore
from storage.store_types import ApplyResult, Derive, DeriveStates

from replica.rows import storage_spec


class LocalTables:
    """The store's tables as schema tables; `read_state(fn)` applies `fn` to the group0 state this node applied."""

    def __init__(self, store: NodeStore, read_state: Callable):
        self.store = store
        self._read_state = read_state
        self._ensured: dict[str, Table] = {}  # table id -> the definition its storage was last made to fit
        self._ensure_lock = threading.Lock()

    def ensure(self, table: Table) -> None:
        """Create the table's storage if missing, or add the columns an ALTER TABLE added; NotFound for a dropped
        table, whose storage never comes back (checked under the lock `drop_dropped` holds, so a late writer
        cannot recreate it after the sweep)."""
        if self._ensured.get(table.id) is table:
            return
        with self._ensure_lock:
            if table.id in self._read_state(lambda s: s.dropped_tables):
                raise NotFound(f"{table.qualified_name} was dropped")
            if self._ensured.get(table.id) != table:
                self.store.ensure_table(storage_spec(table))
            self._ensured[table.id] = table

    def create_new(self) -> None:
        """Create the storage of every table and view of the schema not stored here yet, so that a table's first
        write does not wait for its creation."""
        for table in self._read_state(lambda s: list(s.tables.values())):
            try:
                self.ensure(table)
            except NotFound:
                continue  # dropped meanwhile

    def drop_dropped(self) -> None:
        """Drop the storage of tables the schema says were dropped (also those dropped while this node was down).

        Only ids recorded as dropped qualify: a stored table the local schema does not know (yet) may
        belong to commands still being replayed from the Raft journal, and must be kept.
        """
        with self._ensure_lock:
            dropped = self._read_state(lambda s: set(s.dropped_tables))
            for table_id in self.store.table_ids() & dropped:
                self.store.drop_table(table_id)
                self._ensured.pop(table_id, None)

    def apply(self, table: Table, rows: list[Row], derive: Derive | None = None, typed: bool = False) -> ApplyResult:
        """Merge rows into `table` (see NodeStore.apply); NotFound when the table was dropped meanwhile."""
        try:
            return self.store.apply(table.id, rows, derive, typed)
        except KeyError:
            if self.store.has_table(table.id):
                raise
            raise NotFound(f"{table.qualified_name} was dropped while this write was running") from None

    def apply_columns(self, table: Table, mutations: pa.Table, derive: DeriveStates | None = None) -> ApplyResult:
        """Merge mutation-layout columns into `table` (see NodeStore.apply_columns); NotFound when the table was
        dropped meanwhile, INVALID_ARGUMENT when the columns do not fit it."""
        try:
            return self.store.apply_columns(table.id, mutations, derive)
        except KeyError:
            if self.store.has_table(table.id):
                raise
            raise NotFound(f"{table.qualified_name} was dropped while this write was running") from None
        except ValueError as error:
            raise InvalidArgument(str(error)) from None

    def scan(self, table: Table, request: ScanRequest) -> Iterator[ScanPage]:
        """The live rows the request asks for, in pages of at most `request.page_size` rows (Arrow record batches),
        or one page of partial aggregates."""
        self.ensure(table)
        _check_columns(table, request)
        read = RangeRead(table.id, request.first_token, request.last_token, request.partition_key, request.after,
                         request.filters)
        if request.aggregates:
            yield ScanPage(partials=aggregate(self.store, read, request.aggregates))
            return
        names = request.columns or tuple(c.name for c in table.columns)
        for batch in live_pages(self.store, read, names, request.page_size, request.limit):
            yield ScanPage(batch=batch)


def _check_columns(table: Table, request: ScanRequest) -> None:
    known = {c.name for c in table.columns}
    named = [*(request.columns or ()), *(f.column for f in request.filters),
             *(a.column for a in request.aggregates if a.column)]
    unknown = [name for name in named if name not in known]
    if unknown:
        raise InvalidArgument(f"{table.qualified_name} has no column {unknown[0]!r} (schema changed during the read?)")
