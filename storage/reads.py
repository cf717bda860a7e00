"""Columnar reads of live rows: a token range's visible values as Arrow pages, and CQL aggregates computed in SQL.

A row is live when its stored `tombstone` flag is false; a regular column's visible value is its stored value when
the cell was written after the row tombstone (`storage.cells.visible_values`), else null. Both are SQL expressions
here, so projection, filters, limits and aggregates run in the database and only the answer crosses into Python.

Filters follow `coordinator.core.views.matches`: a null fails every comparison, a NaN fails every comparison but
`!=`. Doubles are guarded explicitly because the two engines disagree about NaN (SQLite stores it as the text
'NaN', PostgreSQL orders it above every number and calls it equal to itself).

Pages are read with keyset paging (`after` the last row's token and key), one short read transaction per page, so a
slow reader never holds a snapshot that keeps the write-ahead log from being checkpointed.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from coordinator.core.views import COMPARISONS

from .arrow_layouts import arrow_type, ts_column_name, value_column_name
from .cells import TableSpec
from .physical import deleted
from .store import NodeStore

_SQLITE = sqlite.dialect()
AGGREGATE_FUNCTIONS = ("count", "min", "max", "sum", "avg")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
NUMERIC_TYPES = ("int", "bigint", "double")
ORDERED_TYPES = ("int", "bigint", "timestamp", "double", "text")


class Condition(Protocol):
    """A WHERE term: `column op value` (op one of = != < <= > >= IN IS NOT NULL; value a tuple for IN)."""

    column: str
    op: str
    value: object


@dataclass(frozen=True)
class Aggregate:
    """One aggregate over the rows: `function` of AGGREGATE_FUNCTIONS, `column` None only for COUNT(*)."""

    function: str
    column: str | None = None


@dataclass(frozen=True)
class RangeRead:
    """Which live rows of one table: an inclusive token range, optionally one partition, after a (token, key)."""

    table_id: str
    first_token: int
    last_token: int
    partition_key: tuple | None = None
    after: tuple[int, tuple] | None = None
    conditions: tuple = ()


class _Columns:
    """SQL expressions for one table's visible values, liveness and conditions, for one database engine."""

    def __init__(self, spec: TableSpec, table: sa.Table, postgres: bool):
        self.spec = spec
        self.table = table
        self.postgres = postgres
        self.types = {c.name: c.type for c in spec.columns}
        self.keys = {c.name for c in spec.key_columns}

    def value(self, name: str) -> sa.ColumnElement:
        stored = self.table.c[value_column_name(name)]
        if name in self.keys:
            return stored
        tomb_ts, ts = self.table.c.tomb_ts, self.table.c[ts_column_name(name)]
        return sa.case((sa.or_(tomb_ts.is_(None), ts > tomb_ts), stored), else_=sa.null())

    def nan(self) -> sa.ColumnElement:
        return sa.cast(sa.literal("NaN"), sa.Double) if self.postgres else sa.literal("NaN")

    def number(self, name: str) -> sa.ColumnElement:
        """The visible value, null for a NaN (doubles) — what MIN, MAX and SUM take."""
        value = self.value(name)
        if self.types[name] != "double":
            return value
        return sa.case((value != self.nan(), value), else_=sa.null())

    def is_nan(self, name: str) -> sa.ColumnElement:
        if self.types[name] != "double":
            return sa.literal(0)
        return sa.case((self.value(name) == self.nan(), 1), else_=0)

    def condition(self, column: str, op: str, never: bool | int, name: str) -> sa.ColumnElement[bool]:
        """`column op :name`, false when the term can never hold (`never` True); for IN, `never` is the number of
        values (`:name_0`, `:name_1`, ...; 0 never holds)."""
        value = self.value(column)
        if op == "IS NOT NULL":
            return value.is_not(None)
        if never is True or (op == "IN" and not never):
            return sa.false()
        if self.types[column] == "text" and self.postgres:
            value = sa.collate(value, "C")  # code point order, as CQL and SQLite compare text
        if op == "IN":
            test = value.in_([sa.bindparam(f"{name}_{k}") for k in range(never)])
        else:
            test = COMPARISONS[op](value, sa.bindparam(name))
        if self.types[column] != "double":
            return test
        if op == "!=":
            return sa.or_(value == self.nan(), test)
        return sa.and_(value != self.nan(), test)


def _never_true(term: Condition) -> bool:
    """A double compared with NaN, or IN a list of NaNs only: no row passes (a NaN fails every comparison)."""
    if term.op == "IN":
        return not _finite(term.value)
    return term.op not in ("!=", "IS NOT NULL") and isinstance(term.value, float) and math.isnan(term.value)


def _finite(values) -> list:
    return [v for v in values if not (isinstance(v, float) and math.isnan(v))]




def _shape(read: RangeRead) -> tuple:
    """What decides a read's SQL text (its values are bound parameters): statements are cached by it."""
    after = -1 if read.after is None else len(read.after[1])
    terms = tuple((t.column, t.op, len(_finite(t.value)) if t.op == "IN" else _never_true(t)) for t in read.conditions)
    return read.partition_key is not None, after, terms


def _where(columns: _Columns, physical, shape: tuple) -> list[sa.ColumnElement[bool]]:
    partition, after, terms = shape
    table = columns.table
    where = [table.c.token >= sa.bindparam("first_token"), table.c.token <= sa.bindparam("last_token"),
             sa.not_(table.c.tombstone)]
    if partition:
        where += [table.c[value_column_name(c.name)] == sa.bindparam(f"pk{i}")
                  for i, c in enumerate(columns.spec.partition_key)]
    if after >= 0:
        where.append(sa.tuple_(*physical.key_columns[:after + 1])
                     > sa.tuple_(*(sa.bindparam(f"after{i}") for i in range(after + 1))))
    for position, (column, op, never) in enumerate(terms):
        where.append(columns.condition(column, op, never, f"term{position}"))
    return where


def _params(physical, read: RangeRead) -> dict[str, object]:
    params: dict[str, object] = {"first_token": read.first_token, "last_token": read.last_token}
    if read.partition_key is not None:
        values = physical.coerce_key(read.partition_key, physical.spec.partition_key)
        params.update({f"pk{i}": v for i, v in enumerate(values)})
    if read.after is not None:
        token, key = read.after
        prefix = (token, *physical.coerce_key(key, physical.spec.key_columns))
        params.update({f"after{i}": v for i, v in enumerate(prefix)})
    for position, term in enumerate(read.conditions):
        if _never_true(term):
            continue
        if term.op == "IN":
            params.update({f"term{position}_{k}": v for k, v in enumerate(_finite(term.value))})
        elif term.op != "IS NOT NULL":
            params[f"term{position}"] = term.value
    return params


def _columns(store: NodeStore, table_id: str) -> _Columns:
    physical = store.physical_table(table_id)
    return _Columns(physical.spec, physical.table, store.is_postgres)


@functools.lru_cache(maxsize=1024)
def _page_statement(physical, postgres: bool, names: tuple[str, ...], shape: tuple) -> tuple[sa.Select, pa.Schema]:
    """The SELECT of a page of live rows of `physical` (the key columns, then `names`), and its Arrow schema."""
    columns = _Columns(physical.spec, physical.table, postgres)
    selected = list(dict.fromkeys([*(c.name for c in physical.spec.key_columns), *names]))
    expressions = [physical.table.c.token] + [columns.value(n).label(value_column_name(n)) for n in selected]
    schema = pa.schema([pa.field("token", pa.int64())] + [pa.field(n, arrow_type(columns.types[n])) for n in selected])
    statement = (sa.select(*expressions).where(*_where(columns, physical, shape)).order_by(*physical.key_columns)
                 .limit(sa.bindparam("page_rows")))
    return statement, schema


def live_pages(store: NodeStore, read: RangeRead, names: Sequence[str], page_rows: int,
               limit: int | None = None) -> Iterator[pa.RecordBatch]:
    """The live rows `read` selects as Arrow record batches of at most `page_rows` rows, in (token, key) order.

    Each batch has `token` (int64) then the visible values of `names` (Arrow types of `storage.arrow_layouts`);
    at most `limit` rows in all. Every key column is read too, to resume the next page after the last row."""
    physical = store.physical_table(read.table_id)
    key_count = len(physical.spec.key_columns)
    after, remaining = read.after, limit
    while remaining is None or remaining > 0:
        want = page_rows if remaining is None else min(page_rows, remaining)
        page = RangeRead(read.table_id, read.first_token, read.last_token, read.partition_key, after, read.conditions)
        statement, schema = _page_statement(physical, store.is_postgres, tuple(names), _shape(page))
        rows = _fetch(store, statement, {**_params(physical, page), "page_rows": want})
        if not rows:
            return
        batch = _record_batch(schema, rows)
        yield batch if schema.names[1:] == list(names) else batch.select(["token", *names])
        if len(rows) < want:
            return
        last = rows[-1]
        after = (last[0], tuple(last[1:1 + key_count]))
        if remaining is not None:
            remaining -= len(rows)


def _fetch(store: NodeStore, statement: sa.Select, params: dict[str, object]) -> list:
    """The rows of a cached statement. On SQLite straight through the driver with the statement's SQL text compiled
    once: SQLAlchemy's execution costs more than the query of a point read."""
    if store.is_postgres:
        with store.reading() as conn:
            return conn.execute(statement, params).all()
    sql, names, defaults = _sqlite_text(statement)
    values = [_sqlite_bindable(params[n] if n in params else defaults[n]) for n in names]
    with store.reading() as conn:
        return conn.connection.driver_connection.execute(sql, values).fetchall()


@functools.lru_cache(maxsize=1024)
def _sqlite_text(statement: sa.Select) -> tuple[str, tuple[str, ...], dict[str, object]]:
    compiled = statement.compile(dialect=_SQLITE)
    return compiled.string, tuple(compiled.positiontup), dict(compiled.params)


def _sqlite_bindable(value: object) -> object:
    """A value as the store binds it on SQLite (a NaN double is stored as the text 'NaN':
    `storage.store_types.Float64`)."""
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


def _record_batch(schema: pa.Schema, rows: list) -> pa.RecordBatch:
    arrays = []
    for position, field in enumerate(schema):
        values = [row[position] for row in rows]
        arrays.append(_array(values, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _array(values: list, arrow: pa.DataType) -> pa.Array:
    if arrow == pa.bool_():
        values = [None if v is None else bool(v) for v in values]
    elif arrow == pa.float64():
        values = [None if v is None else float(v) for v in values]
    return pa.array(values, type=arrow)


def aggregate(store: NodeStore, read: RangeRead, aggregates: Sequence[Aggregate]) -> list:
    """Partial aggregates of the rows `read` selects, to be combined across ranges by `combine`.

    One value list per aggregate: COUNT -> [n]; MIN/MAX -> [value or None, NaNs seen, non-NaN values seen];
    SUM/AVG -> [exact sum, values counted, NaNs seen]."""
    columns = _columns(store, read.table_id)
    if all(a == Aggregate("count") for a in aggregates) and not (read.conditions or read.partition_key or read.after):
        counted = count_live(store, columns, read)
        return [[counted] for _ in aggregates]
    expressions: list[sa.ColumnElement] = []
    shapes = []
    for item in aggregates:
        parts = _partial_expressions(columns, item)
        shapes.append(len(parts))
        expressions += parts
    physical = store.physical_table(read.table_id)
    where = _where(columns, physical, _shape(read))
    statement = sa.select(*expressions).select_from(columns.table).where(*where)
    with store.reading() as conn:
        values = list(conn.execute(statement, _params(physical, read)).one())
    partials, position = [], 0
    for item, width in zip(aggregates, shapes):
        partials.append(_normalised(columns, item, values[position:position + width]))
        position += width
    return partials


def count_live(store: NodeStore, columns: _Columns, read: RangeRead) -> int:
    """The live rows of a token range: its rows less its deleted ones (the tombstone index), in one statement (one
    snapshot); neither count reads a row, and a range spanning every token needs no token condition at all."""
    table = columns.table
    in_range = [] if (read.first_token, read.last_token) == (INT64_MIN, INT64_MAX) else [
        table.c.token >= read.first_token, table.c.token <= read.last_token]
    rows = sa.select(sa.func.count()).select_from(table).where(*in_range).scalar_subquery()
    gone = sa.select(sa.func.count()).select_from(table).where(deleted(table), *in_range).scalar_subquery()
    with store.reading() as conn:
        return int(conn.execute(sa.select(rows - gone)).scalar_one())


def _partial_expressions(columns: _Columns, item: Aggregate) -> list[sa.ColumnElement]:
    if item.function == "count":
        return [sa.func.count()] if item.column is None else [sa.func.count(columns.value(item.column))]
    number = columns.number(item.column)
    nans = sa.func.coalesce(sa.func.sum(columns.is_nan(item.column)), 0)
    if item.function in ("min", "max"):
        return [getattr(sa.func, item.function)(number), nans, sa.func.count(number)]
    if columns.types[item.column] == "double":
        return [sa.func.sum(number), sa.func.count(number), nans]
    return [sa.func.sum(sa.cast(number, sa.Numeric) if columns.postgres else number), sa.func.count(number), nans]


def _normalised(columns: _Columns, item: Aggregate, values: list) -> list:
    if item.function == "count":
        return [int(values[0])]
    kind = columns.types[item.column]
    if item.function in ("min", "max"):
        value = values[0]
        if value is not None and kind == "double":
            value = float(value)
        return [value, int(values[1] or 0), int(values[2] or 0)]
    total = values[0]
    if total is not None:
        total = float(total) if kind == "double" else int(total)
    return [total, int(values[1] or 0), int(values[2] or 0)]


def combine(aggregates: Sequence[Aggregate], column_types: dict[str, str], partials: Sequence[list]) -> list:
    """The final values of `aggregates` from the partials of every range (`aggregate`), as CQL defines them.

    COUNT counts; MIN and MAX order NaN above every number (as Java's Double.compare does) and are null over no
    values; SUM and AVG are 0 over no values, NaN when a NaN was summed, and keep the column's type: an int sum
    wraps around as a 32-bit integer and an int average is the sum divided by the count, truncated."""
    results = []
    for position, item in enumerate(aggregates):
        parts = [p[position] for p in partials]
        kind = column_types.get(item.column, "bigint")
        if item.function == "count":
            results.append(sum(p[0] for p in parts))
        elif item.function in ("min", "max"):
            results.append(_extreme(item.function, parts))
        else:
            results.append(_sum_or_average(item.function, kind, parts))
    return results


def _extreme(function: str, parts: list[list]) -> object:
    values = [p[0] for p in parts if p[0] is not None]
    nans, numbers = sum(p[1] for p in parts), sum(p[2] for p in parts)
    if nans and (function == "max" or not numbers):
        return math.nan
    if not values:
        return None
    return max(values) if function == "max" else min(values)


_WIDTH = {"int": 32, "bigint": 64}


def _sum_or_average(function: str, kind: str, parts: list[list]) -> object:
    total = sum(p[0] for p in parts if p[0] is not None)
    count, nans = sum(p[1] for p in parts), sum(p[2] for p in parts)
    if kind == "double":
        if nans:
            return math.nan
        total = float(total)
        return total if function == "sum" else (total / count if count else 0.0)
    if function == "avg":
        total = 0 if not count else (abs(total) // count) * (1 if total >= 0 else -1)
    return _wrapped(total, _WIDTH[kind])


def _wrapped(value: int, bits: int) -> int:
    """`value` as a two's complement integer of `bits` bits (Java's overflow)."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value
