"""The store's writes: mutations merged by last-write-wins, with the outbox entries derived from their changes."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
import sqlalchemy as sa

from .arrow_layouts import conformed, inserted_states, missing_states, state_table, storage_column_names
from .cells import Row, changes_state, fed_after_stream, is_empty, merge, next_view_ts, with_view_ts
from .outbox import StoreOutbox
from .physical import PhysicalTable
from .schema import StoreSchema
from .store_types import ApplyResult, Derive, DeriveStates, lookup_key
from .upsert import UpsertBindings, arrow_bindings


def _changed_states(before: dict[tuple, tuple], after: dict[tuple, tuple]) -> tuple[list[tuple], list[tuple]]:
    """The (before, after) states of the rows whose state changed (their view_ts moved), aligned; a row missing
    before is all None."""
    old, new = [], []
    for lookup, state in after.items():
        previous = before.get(lookup)
        if previous is None or previous[-1] != state[-1]:
            old.append(previous or (None,) * len(state))
            new.append(state)
    return old, new


class StoreWrites(StoreSchema, StoreOutbox):
    """The write part of `NodeStore`: merges of mutations (row by row or as Arrow columns) and view_ts floors."""

    def apply(self, table_id: str, mutations: Sequence[Row], derive: Derive | None = None,
              typed: bool = False) -> ApplyResult:
        """Merge a batch of mutations into the table in one transaction, with the derived outbox entries.

        `derive(changes)` is called once with the (previous_or_None, merged) pair of every mutation that changed
        the stored state, in order; it runs inside the write transaction (it must not write to this store) and
        an exception rolls back the whole batch. Without `derive` (a table without views) the batch is merged
        set-based by one SQL upsert (storage.upsert); with it, the stored rows are fetched in one query and
        merged here. `typed` says the mutations' values already have their columns' types (rows made from
        `storage.arrow_layouts.conformed` columns), so they are not checked again.
        """
        physical = self._physical(table_id)
        batch = list(mutations) if typed else [physical.normalise(mutation) for mutation in mutations]
        if not batch:
            return ApplyResult(0, ())
        if derive is None:
            return ApplyResult(self._upsert(physical, batch), ())
        if not self._is_postgres:
            batch = [physical.as_sqlite_stores(mutation) for mutation in batch]
        with self._write_transaction() as conn:
            unique_keys = list({lookup_key(m.token, m.key): (m.token, m.key) for m in batch}.values())
            stored = physical.fetch(conn, unique_keys)
            current = dict(stored)
            changes: list[tuple[Row | None, Row]] = []
            for mutation in batch:
                lookup = lookup_key(mutation.token, mutation.key)
                previous = current.get(lookup)
                merged = self._merged(previous, mutation)
                if merged is not None:
                    current[lookup] = merged
                    changes.append((previous, merged))
            outbox_rows = [{"target": t, "payload": bytes(p)} for t, p in derive(changes)] if changes else []
            physical.write(conn, [row for lookup, row in current.items() if stored.get(lookup) is not row],
                           not self._is_postgres)
            outbox_ids = self._insert_outbox(conn, outbox_rows)
        return ApplyResult(len(changes), outbox_ids)

    def apply_columns(self, table_id: str, mutations: pa.Table, derive: DeriveStates | None = None) -> ApplyResult:
        """Merge mutations given as an Arrow table in the mutation layout (storage.arrow_layouts) set-based, in one
        transaction, with the derived outbox entries.

        `derive(before, after)` gets the state of every row the batch changed before and after it, as two aligned
        `storage.arrow_layouts.state_schema` tables (a row that did not exist before is all NULL there); it runs
        inside the write transaction, as `apply`'s does. A row changed several times by the batch appears once, with
        its first and its last state.
        """
        physical = self._physical(table_id)
        sqlite = not self._is_postgres
        mutations = conformed(physical.spec, mutations)
        statements = physical.upsert_statements(arrow_bindings(physical.spec, mutations, sqlite), sqlite)
        if derive is None:
            return ApplyResult(self._upsert_statements(statements), ())
        with self._write_transaction() as conn:
            keys = physical.keys_of(mutations)
            before = physical.fetch_states(conn, keys)
            changed = self._run_statements(conn, statements)
            if not changed:
                return ApplyResult(0, ())
            if not before and changed == len(keys) == mutations.num_rows:  # new rows, stored as given
                old, new = missing_states(physical.spec, changed), inserted_states(physical.spec, mutations, sqlite)
            else:
                old_rows, new_rows = _changed_states(before, physical.fetch_states(conn, None))  # the same keys
                old, new = state_table(physical.spec, old_rows), state_table(physical.spec, new_rows)
            outbox_rows = [{"target": t, "payload": bytes(p)} for t, p in derive(old, new)]
            return ApplyResult(changed, self._insert_outbox(conn, outbox_rows))

    def feed_streamed(self, table_id: str, streamed: Mapping[tuple[int, tuple], Row | None],
                      derive: Derive) -> ApplyResult:
        """After a tablet stream merged its source's rows: for each (token, key) this replica held before, and the
        row the source sent for it (None: none), the stored row takes a view_ts above the source's where their states
        differ (`cells.fed_after_stream`), and `derive(changes)` gets the (source row, stored row) of those, in one
        write transaction with the outbox entries it returns."""
        physical = self._physical(table_id)
        named = {lookup_key(token, physical.full_key(key)): (token, key) for token, key in streamed}
        if not named:
            return ApplyResult(0, ())
        with self._write_transaction() as conn:
            stored = physical.fetch(conn, [(token, physical.full_key(key)) for token, key in named.values()])
            changes = []
            for lookup, row in stored.items():
                fed = fed_after_stream(streamed[named[lookup]], row)
                if fed is not None:
                    changes.append((streamed[named[lookup]], fed))
            raised = [new for _, new in changes if new.view_ts != stored[lookup_key(new.token, new.key)].view_ts]
            physical.write(conn, raised, not self._is_postgres)
            outbox_rows = [{"target": t, "payload": bytes(p)} for t, p in derive(changes)] if changes else []
            return ApplyResult(len(changes), self._insert_outbox(conn, outbox_rows))

    def stored_rows(self, table_id: str, rows: pa.Table) -> list[Row]:
        """Rows of the table in the storage layout (a range read, a stream's window) as `Row`s."""
        physical = self._physical(table_id)
        columns = [rows.column(name).to_pylist() for name in storage_column_names(physical.spec)]
        return [physical.from_sql(values) for values in zip(*columns)]

    def raise_view_ts(self, table_id: str, floors: Mapping[tuple[int, tuple], int]) -> dict[tuple[int, tuple], int]:
        """Raise the view_ts of the stored rows named by (token, key) (tombstones too) to at least their floor, in one
        write transaction, so the view updates of every later write order after the floor; the view_ts each row
        found has now, by the caller's (token, key). A row this store does not hold is left out."""
        physical = self._physical(table_id)
        named = {lookup_key(token, physical.full_key(key)): (token, key) for token, key in floors}
        if not named:
            return {}
        with self._write_transaction() as conn:
            stored = physical.fetch(conn, [(token, physical.full_key(key)) for token, key in named.values()])
            raised = {}
            for lookup, row in stored.items():
                floor = floors[named[lookup]]
                if row.view_ts is None or row.view_ts < floor:
                    raised[lookup] = with_view_ts(row, floor)
            physical.write(conn, list(raised.values()), not self._is_postgres)
        return {named[lookup]: (raised.get(lookup) or row).view_ts for lookup, row in stored.items()}

    def _upsert(self, physical: PhysicalTable, batch: Sequence[Row]) -> int:
        """Merge the batch set-based (storage.upsert), in one transaction; the number of mutations that changed it."""
        sqlite = not self._is_postgres
        params = [physical.upsert_params(row, sqlite) for row in batch if not is_empty(row)]
        return self._upsert_statements(physical.upsert_statements(UpsertBindings.of_rows(params), sqlite))

    def _upsert_statements(self, statements: list[tuple[str, list[tuple]]]) -> int:
        """Run upsert statements in one write transaction; the number of rows they changed."""
        if not statements:
            return 0
        if self._is_postgres:
            with self._write_transaction() as conn:
                return self._run_statements(conn, statements)
        with self._sqlite_write_cursor() as cursor:
            changed = 0
            for sql, params in statements:
                cursor.executemany(sql, params)
                changed += max(cursor.rowcount, 0)
            return changed

    @staticmethod
    def _run_statements(conn: sa.Connection, statements: list[tuple[str, list[tuple]]]) -> int:
        """Execute each (statement, parameter sets); the number of rows they changed."""
        return sum(max(conn.exec_driver_sql(sql, params).rowcount, 0) for sql, params in statements)

    @staticmethod
    def _merged(previous: Row | None, mutation: Row) -> Row | None:
        """The new state of the row with its view_ts, or None when the mutation changes nothing."""
        if previous is None:
            if is_empty(mutation):
                return None
            merged = mutation
        elif changes_state(previous, mutation):
            merged = merge(previous, mutation)
        else:
            return None
        return with_view_ts(merged, next_view_ts(previous, mutation))
