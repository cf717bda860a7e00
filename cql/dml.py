"""Write statements (INSERT, UPDATE, DELETE, BATCH) as timestamped row mutations handed to the write path."""
from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from coordinator.core import types as coltypes
from coordinator.core.errors import InvalidArgument
from coordinator.core.schema import Table
from coordinator.core.tokens import token_of
from replica.rows import partition_token
from replica.write_path import WriteCoordinator
from storage.cells import Cell, Row

from . import ast
from .catalog import Catalog, coerce, require_column
from .columnar import insert_mutations
from .result import Result

MAX_TIMESTAMP = 2**62  # leaves room for view_ts bumps within a signed 64-bit timestamp
WRITES = (ast.Insert, ast.Update, ast.Delete, ast.Batch)


class WriteStatements:
    """Builds the mutations of write statements and sends them as one write with one default timestamp."""

    def __init__(self, catalog: Catalog, writer: WriteCoordinator, now: Callable[[], int]):
        self._catalog = catalog
        self._writer = writer
        self._now = now

    def run(self, statements: list, timestamp: int | None = None) -> Result:
        """INSERT/UPDATE/DELETE/BATCH statements (one per bind-value set) as one write with one timestamp (the
        client's `timestamp` if given, else the node's clock) for those without USING TIMESTAMP."""
        default_ts = self._default_ts(timestamp)
        mutations = []
        tables: dict[ast.QualifiedName, Table] = {}  # each table resolved once per write
        for statement in statements:
            inner, outer_ts = (statement.statements, statement.timestamp) if isinstance(statement, ast.Batch) else (
                (statement,), None)
            batch_ts = _timestamp(outer_ts, default_ts)
            mutations.extend(self._mutation(s, _timestamp(s.timestamp, batch_ts), tables) for s in inner
                             if not (isinstance(s, ast.Update) and not s.assignments))  # every value left unset
        single = len(statements) == 1 and not isinstance(statements[0], ast.Batch)
        return self._write(mutations, default_ts, single)

    def run_insert_values(self, statement: ast.Insert, params: list[list], timestamp: int | None = None) -> Result:
        """One INSERT with bind markers, once per value set, as one write: the rows are built from the values
        directly (the statement is not rebuilt per value set)."""
        table = self._catalog.writable(statement.table)
        default_ts = self._default_ts(timestamp)
        ts = _timestamp(statement.timestamp, default_ts)
        markers = sorted(v.position for v in statement.values if isinstance(v, ast.BindMarker))
        slot = {position: i for i, position in enumerate(markers)}
        sources = [slot.get(v.position) if isinstance(v, ast.BindMarker) else None for v in statement.values]
        rows, mutations = InsertRows(table, statement.columns), []
        for values in params:
            if len(values) != len(markers):
                raise InvalidArgument(f"the statement has {len(markers)} bind marker(s) (?) but {len(values)} "
                                      "value(s) were given")
            literals = [values[i] if i is not None else literal for i, literal in zip(sources, statement.values)]
            mutations.append((table, rows.row(literals, ts)))
        return self._write(mutations, default_ts, single=len(params) == 1)

    def run_insert_columns(self, statement: ast.Insert, columns: list[pa.ChunkedArray], staged: bool = False,
                           timestamp: int | None = None) -> Result:
        """One INSERT with bind markers, once per row of the Arrow value columns, as one columnar write
        (NotColumnar when the values need the row path); `staged`: a bulk load's (see `ArrowValues`)."""
        table = self._catalog.writable(statement.table)
        default_ts = self._default_ts(timestamp)
        mutations = insert_mutations(table, statement, columns, _timestamp(statement.timestamp, default_ts))
        self._writer.write_columns(table, mutations, default_ts, staged=staged)
        rows = mutations.num_rows
        return Result(message="ok") if rows == 1 else Result(message=f"ok: {rows} statements applied")

    def _default_ts(self, timestamp: int | None) -> int:
        return self._now() if timestamp is None else _timestamp(timestamp, 0)

    def _write(self, mutations: list, default_ts: int, single: bool) -> Result:
        if mutations:
            self._writer.write(mutations, default_ts)
        return Result(message="ok") if single else Result(message=f"ok: {len(mutations)} statements applied")

    def _mutation(self, statement, ts: int, tables: dict) -> tuple[Table, Row]:
        table = tables.get(statement.table)
        if table is None:
            table = tables[statement.table] = self._catalog.writable(statement.table)
        builders = {ast.Insert: _insert_row, ast.Update: _update_row, ast.Delete: _delete_row}
        return table, builders[type(statement)](table, statement, ts)


def _timestamp(statement_ts: int | None, default_ts: int) -> int:
    if statement_ts is None:
        return default_ts
    if not 0 < statement_ts <= MAX_TIMESTAMP:
        raise InvalidArgument(f"USING TIMESTAMP {statement_ts} is out of range: use microseconds since the epoch, "
                              f"between 1 and {MAX_TIMESTAMP}")
    return statement_ts


def _insert_row(table: Table, s: ast.Insert, ts: int) -> Row:
    return InsertRows(table, s.columns).row(s.values, ts)


class InsertRows:
    """The rows of `INSERT INTO table (columns) VALUES (...)`, with the column lookups done once."""

    def __init__(self, table: Table, columns: tuple[str, ...]):
        self._table = table
        self._columns = columns
        self._types = tuple(require_column(table, c).type for c in columns)
        position = {c: i for i, c in enumerate(columns)}
        self._key_at = tuple(position.get(k) for k in table.primary_key)
        self._partition_columns = len(table.partition_key)
        self._partition_types = table.partition_key_types
        keys = set(table.primary_key)
        self._regular = tuple((i, c) for i, c in enumerate(columns) if c not in keys)

    def row(self, literals, ts: int) -> Row:
        values = [coltypes.coerce(t, v, c) for t, v, c in zip(self._types, literals, self._columns, strict=True)]
        key = tuple(None if i is None else values[i] for i in self._key_at)
        if any(k is None for k in key):
            _full_key(self._table, dict(zip(self._table.primary_key, key)), "INSERT")  # raises, naming the missing
        token = token_of(key[:self._partition_columns], self._partition_types)
        return Row(token=token, key=key, marker_ts=ts, cells={c: Cell(values[i], ts) for i, c in self._regular})


def _update_row(table: Table, s: ast.Update, ts: int) -> Row:
    key_values = _key_equalities(table, s.where, "UPDATE")
    cells = {}
    for column, value in s.assignments:
        if column in table.primary_key:
            raise InvalidArgument(f"UPDATE cannot set primary key column {column!r} of {table.qualified_name}")
        cells[column] = Cell(coerce(table, column, value), ts)
    key = _full_key(table, key_values, "UPDATE")
    return Row(token=partition_token(table, key_values), key=key, marker_ts=ts, cells=cells)


def _delete_row(table: Table, s: ast.Delete, ts: int) -> Row:
    key_values = _key_equalities(table, s.where, "DELETE")
    key = _full_key(table, key_values, "DELETE")
    return Row(token=partition_token(table, key_values), key=key, tomb_ts=ts)


def _full_key(table: Table, values: dict, statement: str) -> tuple:
    missing = [c for c in table.primary_key if values.get(c) is None]
    if missing:
        raise InvalidArgument(f"{statement} on {table.qualified_name} needs the full primary key "
                              f"({', '.join(table.primary_key)}); missing: {', '.join(missing)}")
    return tuple(values[c] for c in table.primary_key)


def _key_equalities(table: Table, where: tuple[ast.Relation, ...], statement: str) -> dict:
    if not any(r.column in table.partition_key for r in where):
        raise InvalidArgument(f"{statement} on {table.qualified_name} must restrict the partition key "
                              f"({', '.join(table.partition_key)}) with '='")
    values = {}
    for relation in where:
        if relation.column not in table.primary_key or relation.op != "=":
            raise InvalidArgument(f"{statement} WHERE supports only '=' on primary key columns "
                                  f"({', '.join(table.primary_key)}); got {relation.column} {relation.op}")
        values[relation.column] = coerce(table, relation.column, relation.value)
        if values[relation.column] is None:
            raise InvalidArgument(f"primary key column {relation.column!r} cannot be compared with null")
    return values
