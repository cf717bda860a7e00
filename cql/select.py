"""SELECT: plan the WHERE clause (partitions, an index, or a filtered scan), read Arrow pages, aggregate, page."""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from coordinator.core.errors import FailedPrecondition, InvalidArgument
from coordinator.core.schema import Table
from replica.read_path import ReadCoordinator, ReadQuery
from replica.rows import partition_token
from storage.arrow_layouts import arrow_type
from storage.reads import NUMERIC_TYPES, ORDERED_TYPES, Aggregate

from . import ast
from .catalog import Catalog, require_column
from .restrictions import IndexLookup, SelectPlan, indexes_of, plan_select
from .result import Result

PAGING_STATE_VERSION = 1


@dataclass(frozen=True)
class PagingState:
    """Where the next page of a query starts: after `after` = (token, key) of `table_id` (the table, or the index
    the query reads through), with `left` rows of the LIMIT left (None: no limit)."""

    table_id: str
    after: tuple[int, tuple]
    left: int | None

    def encode(self) -> bytes:
        document = {"v": PAGING_STATE_VERSION, "t": self.table_id, "a": [self.after[0], list(self.after[1])],
                    "l": self.left}
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, table_id: str) -> PagingState:
        try:
            document = json.loads(data)
            state = cls(document["t"], (int(document["a"][0]), tuple(document["a"][1])), document["l"])
            valid = document["v"] == PAGING_STATE_VERSION and (state.left is None or isinstance(state.left, int))
        except (ValueError, KeyError, TypeError, IndexError):
            valid = False
        if not valid:
            raise InvalidArgument("paging_state is not one this cluster issued: send back the paging_state of the "
                                  "previous page of the same statement, unchanged")
        if state.table_id != table_id:
            raise InvalidArgument("paging_state belongs to a query of another table (or index): page a statement "
                                  "with the paging_state its own previous page returned")
        return state


class SelectStatements:
    """Runs SELECT statements; rows stream as Arrow pages from the replicas."""

    def __init__(self, catalog: Catalog, reader: ReadCoordinator):
        self._catalog = catalog
        self._reader = reader

    def run(self, s: ast.Select, page_size: int | None, paging_state: bytes = b"",
            deadline: float | None = None) -> Iterator[Result]:
        table = self._catalog.resolve(s.table)
        if table.view is not None and not s.allow_stale:
            self._refuse_unbuilt(table)
        plan = plan_select(table, s.where, self._catalog.read(lambda st: indexes_of(st, table)), s.allow_filtering)
        index = self._usable_index(plan.index, s)
        if s.aggregates:
            yield self._aggregates(table, s, plan, deadline)
            return
        columns = _selected_columns(table, s.columns)
        names = tuple(name for name, _ in columns)
        source = index.index if index is not None else table
        state = PagingState.decode(paging_state, source.id) if paging_state else None
        limit = state.left if state is not None else s.limit
        query = ReadQuery(columns=tuple(dict.fromkeys(table.primary_key + names)), partitions=plan.partitions,
                          filters=plan.filters, after=state.after if state else None, limit=limit,
                          deadline=deadline, doing=f"reading {table.qualified_name}")
        description = _describe(table, plan, index)
        if index is None:
            batches = self._reader.pages(table, query)
            position = _table_position(table)
        else:
            batches = self._through_index(table, index, query)
            position = _index_position(index)
        yield from _pages(batches, columns, page_size, limit, source.id, position, description)

    def _refuse_unbuilt(self, view: Table) -> None:
        progress = self._catalog.read(lambda s: s.view_progress(view.id))
        if not progress["built"]:
            raise FailedPrecondition(
                f"{view.qualified_name} is being built ({progress['tasks_done']} of {progress['tasks_total']} "
                "build tasks done) and cannot be read yet; wait for it (vbc status), or add ALLOW STALE to read "
                "what it holds now"
            )

    def _usable_index(self, lookup: IndexLookup | None, s: ast.Select) -> IndexLookup | None:
        """The index to read through: None when there is none, or when it is building and the query allows
        filtering (then a filtered scan answers); a building index is refused otherwise, unless ALLOW STALE."""
        if lookup is None or s.allow_stale:
            return lookup
        progress = self._catalog.read(lambda st: st.view_progress(lookup.index.id))
        if progress["built"]:
            return lookup
        if s.allow_filtering:
            return None
        raise FailedPrecondition(
            f"index {lookup.index.qualified_name} on {lookup.column} is being built ({progress['tasks_done']} of "
            f"{progress['tasks_total']} build tasks done) and cannot serve this query yet; wait for it (vbc status), "
            "add ALLOW FILTERING to scan the table instead, or ALLOW STALE to read what the index holds now"
        )

    def _through_index(self, table: Table, lookup: IndexLookup, query: ReadQuery) -> Iterator[pa.RecordBatch]:
        """The base rows whose keys the index holds under the value, in index order (each checked against the
        query's filters on the base row, so an index entry behind its base row is never answered)."""
        index = lookup.index
        key_columns = tuple(c for c in index.primary_key if c in table.primary_key)
        entries = ReadQuery(columns=key_columns, partitions=[(lookup.value,)], after=query.after,
                            page_rows=1000, deadline=query.deadline, doing=query.doing)
        remaining = query.limit
        for entry_batch in self._reader.pages(index, entries):
            keys = entry_batch.select(list(table.primary_key)).to_pylist()
            partitions = list(dict.fromkeys(tuple(k[c] for c in table.partition_key) for k in keys))
            base = ReadQuery(columns=query.columns, partitions=partitions, filters=query.filters,
                             deadline=query.deadline, doing=query.doing)
            found = [b for b in self._reader.pages(table, base) if b.num_rows]
            if not found:
                continue
            rows = pa.Table.from_batches(found)
            order = _index_order(table, rows, keys)
            if remaining is not None:
                order = order[:remaining]
                remaining -= len(order)
            if order:
                yield from (rows.take(order) if order != list(range(rows.num_rows)) else rows).to_batches()
            if remaining == 0:
                return

    def _aggregates(self, table: Table, s: ast.Select, plan: SelectPlan, deadline: float | None) -> Result:
        """One row of aggregates, computed by the replicas in SQL (LIMIT applies to that row, as in Cassandra)."""
        aggregates = tuple(_checked_aggregate(table, a) for a in s.aggregates)
        query = ReadQuery(columns=(), partitions=plan.partitions, filters=plan.filters, deadline=deadline,
                          doing=f"aggregating {table.qualified_name}")
        values = self._reader.aggregate(table, query, tuple(Aggregate(a.function, a.column) for a in aggregates))
        columns = [(a.name, "bigint" if a.function == "count" else require_column(table, a.column).type)
                   for a in aggregates]
        rows = [] if s.limit == 0 else [values]
        return Result(columns=columns, rows=rows, plan=_describe(table, plan, None))


def _index_order(table: Table, rows: pa.Table, keys: list[dict]) -> list[int]:
    """The positions of `rows` (base rows) in the order of `keys` (the index entries' base keys); a base row whose
    key is not among them (it took the value after its entry was read) is left out."""
    wanted = [tuple(k[c] for c in table.primary_key) for k in keys]
    if rows.num_rows == 1:
        return [0] if tuple(rows[c][0].as_py() for c in table.primary_key) in wanted else []
    at = {tuple(k[c] for c in table.primary_key): i
          for i, k in enumerate(rows.select(list(table.primary_key)).to_pylist())}
    return [at[key] for key in wanted if key in at]


def _checked_aggregate(table: Table, aggregate: ast.SelectAggregate) -> ast.SelectAggregate:
    if aggregate.column is None:
        return aggregate
    kind = require_column(table, aggregate.column).type
    allowed = NUMERIC_TYPES if aggregate.function in ("sum", "avg") else (
        ORDERED_TYPES if aggregate.function in ("min", "max") else None)
    if allowed is not None and kind not in allowed:
        raise InvalidArgument(f"{aggregate.function}() does not take a {kind} column ({aggregate.column!r}); it takes "
                              f"{', '.join(allowed)}")
    return aggregate


def _selected_columns(table: Table, names: tuple[str, ...] | None) -> list[tuple[str, str]]:
    if names is None:
        return [(c.name, c.type) for c in table.columns]
    return [(n, require_column(table, n).type) for n in names]


def _describe(table: Table, plan: SelectPlan, index: IndexLookup | None) -> str:
    if index is not None:
        how = f"read through index {index.index.qualified_name} ({index.column} = {index.value!r})"
    elif plan.partitions is not None:
        how = f"read {len(plan.partitions)} partition(s) of {table.qualified_name}"
    else:
        how = f"scan of every tablet of {table.qualified_name}"
    return how + (", rows filtered at the replicas" if plan.filtering else "")


def _table_position(table: Table):
    def position(batch: pa.RecordBatch, row: int) -> tuple[int, tuple]:
        return batch["token"][row].as_py(), tuple(batch[c][row].as_py() for c in table.primary_key)
    return position


def _index_position(lookup: IndexLookup):
    index = lookup.index
    token = partition_token(index, {lookup.column: lookup.value})

    def position(batch: pa.RecordBatch, row: int) -> tuple[int, tuple]:
        return token, (lookup.value, *(batch[c][row].as_py() for c in index.primary_key[1:]))
    return position


def _pages(batches: Iterator[pa.RecordBatch], columns: list[tuple[str, str]], page_size: int | None,
           limit: int | None, source_id: str, position, plan: str) -> Iterator[Result]:
    """The rows cut into Results of `page_size` rows (all in one without a page size), never zero Results; a full
    page carries the paging state after its last row."""
    names = [name for name, _ in columns]
    schema = None
    pending: list[pa.RecordBatch] = []
    held = 0
    sent = 0
    for batch in batches:
        schema = batch.schema
        pending.append(batch)
        held += batch.num_rows
        while page_size and held >= page_size:
            page, pending, held = _take(pending, page_size)
            sent += page.num_rows
            left = None if limit is None else limit - sent
            more = left is None or left > 0
            state = PagingState(source_id, position(page, page.num_rows - 1), left).encode() if more else b""
            yield Result(columns=columns, arrow=page.select(names), paging_state=state, plan=plan)
    if held or not sent:
        rows = pa.Table.from_batches(pending, schema=schema).combine_chunks() if pending else None
        page = rows.to_batches()[0] if rows is not None and rows.num_rows else None
        yield Result(columns=columns, arrow=page.select(names) if page is not None else _empty(columns), plan=plan)


def _take(batches: list[pa.RecordBatch], rows: int) -> tuple[pa.RecordBatch, list[pa.RecordBatch], int]:
    """The first `rows` rows of `batches` as one batch, the batches left, and how many rows those hold."""
    table = pa.Table.from_batches(batches)
    page = table.slice(0, rows).combine_chunks().to_batches()[0]
    rest = table.slice(rows)
    return page, rest.to_batches(), rest.num_rows


def _empty(columns: list[tuple[str, str]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=pa.schema([(n, arrow_type(t)) for n, t in columns]))
