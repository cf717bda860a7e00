"""The replica's side of a staged bulk load: keep a load's rows in the staging area, move them into the base later.

`stage` stores a staged batch (one staging entry per tablet it touches) and registers each entry in group0
(`coordinator.core.staging`) before answering, so every staged row the loader was told about has a
`process_staging` task. A refused registration deletes the entries again and answers FAILED_PRECONDITION: the
write coordinator then writes the rows directly. `process` (a process_staging batch) applies a tablet's entries,
chunk by chunk, through the write path's own merge on this replica (`LocalData.apply_base_write`): the stored
state of every key is read and merged with the staged mutations inside the write transaction, and the view updates
of each change are derived from those states there, so a concurrent write of the same key orders exactly by
last-write-wins. Entries are deleted once applied; a crash in between applies them again, which changes nothing.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from common.arrow_tokens import tablets_of
from common.replica_messages import RowBatch
from coordinator.core.errors import CoreError, FailedPrecondition, InvalidArgument, NotFound
from coordinator.core.tokens import tablet_of, tablet_range
from storage.arrow_layouts import conformed
from storage.staging import StagedEntry
from storage.store import NodeStore

from replica.rows import storage_spec
from replica.view_updates import WriteContext, pair_index, write_context


@dataclass(frozen=True)
class StagedTablet:
    """A staging entry of one tablet replica, to register: its table, tablet (of `tablet_count`), shard and number."""

    table_id: str
    tablet_id: int
    tablet_count: int
    shard: int
    through: int
    rows: int = 0


Register = Callable[[StagedTablet], None]  # raises the CoreError of a refused registration


class StagingArea:
    """Stores staged batches of this node's replicas and moves them into the base (see the module docstring)."""

    def __init__(self, node_id: str, store: NodeStore, read_state: Callable, catch_up: Callable[[int], None],
                 apply_base_write: Callable[[RowBatch], int], register: Register):
        self.node_id = node_id
        self._store = store
        self._read_state = read_state
        self._catch_up = catch_up
        self._apply_base_write = apply_base_write
        self._register = register

    def stage(self, batch: RowBatch) -> int:
        """Keep a staged batch's rows and register them; the number of rows. FAILED_PRECONDITION (nothing kept) when
        they must be written directly: the table has no view, a tablet is in transition, or group0 refused them."""
        if batch.columns is None:
            raise InvalidArgument("a staged batch carries its rows as Arrow columns")
        self._catch_up(batch.schema_version)
        context = self._read_state(lambda s: write_context(s, batch.table_id))
        if context is None:
            raise NotFound(f"table id {batch.table_id} does not exist on node {self.node_id} (dropped?)")
        if not context.views:
            raise FailedPrecondition(f"{context.table.qualified_name} has no view: its rows are written directly")
        try:
            columns = conformed(storage_spec(context.table), batch.columns)
        except ValueError as error:
            raise InvalidArgument(str(error)) from None
        parts = list(self._tablet_parts(context, columns))
        staged = [StagedTablet(batch.table_id, tablet, len(context.base_replicas), batch.shard,
                               self._store.stage(batch.table_id, *tablet_range(tablet, len(context.base_replicas)),
                                                 part), part.num_rows)
                  for tablet, part in parts]
        try:
            for entry in staged:
                self._register(entry)
        except CoreError:
            self._store.unstage([entry.through for entry in staged])
            raise
        return columns.num_rows

    def _tablet_parts(self, context: WriteContext, columns: pa.Table) -> Iterator[tuple[int, pa.Table]]:
        """The batch's rows by tablet, each tablet checked: this node holds it, and it is not in transition."""
        count = len(context.base_replicas)
        tablets = tablets_of(columns.column("token").to_numpy(), count)
        order = np.argsort(tablets, kind="stable")
        present, starts = np.unique(tablets[order], return_index=True)
        ends = [*starts[1:].tolist(), len(order)]
        for tablet, start, end in zip(present.tolist(), starts.tolist(), ends):
            pair_index(context, self.node_id, tablet_range(tablet, count)[0])  # UNAVAILABLE: a stale tablet map
            if tablet in context.base_moves:
                raise FailedPrecondition(f"tablet {tablet} of {context.table.qualified_name} is in transition: its "
                                         "rows are written directly")
            yield tablet, columns.take(order[start:end])

    def process(self, table_id: str, tablet_id: int, through: int, shard: int, chunk_rows: int,
                stopped: Callable[[], bool] = lambda: False) -> int:
        """Apply this replica's staged entries of a tablet numbered up to `through` to the base, in chunks of about
        `chunk_rows` rows, deleting each chunk's entries once applied; the rows applied (0 for a dropped table)."""
        located = self._read_state(lambda s: (s.tables.get(table_id), s.tablets.get(table_id), s.schema_version))
        table, tablet_map, version = located
        if table is None or tablet_map is None:
            return 0
        first, last = tablet_range(tablet_id, tablet_map.tablet_count)
        applied = 0
        for chunk in _chunks(self._store.staged_entries(table_id, first, last, through), chunk_rows):
            if stopped():
                break
            seqs = [entry.seq for entry in chunk]
            mutations = self._mutations(table, seqs)
            if mutations is not None:
                self._apply_base_write(RowBatch(table_id=table_id, shard=shard, rows=(), schema_version=version,
                                                columns=mutations))
                applied += mutations.num_rows
            self._store.unstage(seqs)
        return applied

    def _mutations(self, table, seqs: Sequence[int]) -> pa.Table | None:
        """The entries' mutations in the table's current layout (a column added since they were staged: NULL)."""
        spec = storage_spec(table)
        parts = [conformed(spec, part) for part in self._store.staged_mutations(seqs)]
        return pa.concat_tables(parts) if parts else None

    def entries(self) -> list[StagedEntry]:
        """Every staged entry this node holds (without its rows)."""
        return self._store.staged_entries()

    def register_again(self, shard_of: Callable[[str, int], int | None]) -> tuple[int, int]:
        """Register every staged entry again (after a restart): those group0 refuses were never acknowledged to a
        loader, or belong to a dropped table, and are deleted. `shard_of(table_id, tablet)` is this node's shard of
        the tablet (None: not a replica). (entries registered, entries deleted)."""
        registered = deleted = 0
        for entry in self._store.staged_entries():
            located = self._read_state(lambda s: s.tablets.get(entry.table_id))
            target = _tablet_of_entry(entry, located.tablet_count if located else 0)
            shard = shard_of(entry.table_id, target) if target is not None else None
            try:
                if shard is None:
                    raise NotFound(f"node {self.node_id} holds no tablet {entry.first_token}..{entry.last_token} of "
                                   f"table id {entry.table_id}")
                self._register(StagedTablet(entry.table_id, target, located.tablet_count, shard, entry.seq,
                                            entry.rows))
                registered += 1
            except (FailedPrecondition, NotFound):
                deleted += self._store.unstage([entry.seq])
        return registered, deleted


def _tablet_of_entry(entry: StagedEntry, tablet_count: int) -> int | None:
    """The tablet whose range the entry was staged for, if the table still has tablets of that size."""
    if not tablet_count:
        return None
    tablet = tablet_of(entry.first_token, tablet_count)
    return tablet if tablet_range(tablet, tablet_count) == (entry.first_token, entry.last_token) else None


def _chunks(entries: Sequence[StagedEntry], chunk_rows: int) -> Iterator[list[StagedEntry]]:
    """The entries in staging order, grouped into runs of about `chunk_rows` rows (at least one entry each)."""
    chunk, rows = [], 0
    for entry in entries:
        if chunk and rows + entry.rows > chunk_rows:
            yield chunk
            chunk, rows = [], 0
        chunk.append(entry)
        rows += entry.rows
    if chunk:
        yield chunk

