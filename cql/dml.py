"""Write statements (INSERT, UPDATE, DELETE, BATCH) as timestamped row mutations handed to the write path."""
from __future__ import annotations

from collections.abc import Callable

from coordinator.core.errors import InvalidArgument
from coordinator.core.schema import Table
from replica.rows import partition_token
from replica.write_path import WriteCoordinator
from storage.cells import Cell, Row

from . import ast
from .catalog import Catalog, coerce
from .result import Result

MAX_TIMESTAMP = 2**62  # leaves room for view_ts bumps within a signed 64-bit timestamp
WRITES = (ast.Insert, ast.Update, ast.Delete, ast.Batch)


class WriteStatements:
    """Builds the mutations of write statements and sends them as one write with one default timestamp."""

    def __init__(self, catalog: Catalog, writer: WriteCoordinator, now: Callable[[], int]):
        self._catalog = catalog
        self._writer = writer
        self._now = now

    def run(self, statements: list) -> Result:
        """INSERT/UPDATE/DELETE/BATCH statements (one per bind-value set) as one write with one timestamp."""
        default_ts = self._now()
        mutations = []
        for statement in statements:
            inner, outer_ts = (statement.statements, statement.timestamp) if isinstance(statement, ast.Batch) else (
                (statement,), None)
            batch_ts = _timestamp(outer_ts, default_ts)
            mutations.extend(self._mutation(s, _timestamp(s.timestamp, batch_ts)) for s in inner)
        if mutations:
            self._writer.write(mutations, default_ts)
        if len(statements) == 1 and not isinstance(statements[0], ast.Batch):
            return Result(message="ok")
        return Result(message=f"ok: {len(mutations)} statements applied")

    def _mutation(self, statement, ts: int) -> tuple[Table, Row]:
        table = self._catalog.writable(statement.table)
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
    values = {c: coerce(table, c, v) for c, v in zip(s.columns, s.values, strict=True)}
    key = _full_key(table, values, "INSERT")
    cells = {c: Cell(v, ts) for c, v in values.items() if c not in table.primary_key}
    return Row(token=partition_token(table, values), key=key, marker_ts=ts, cells=cells)


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
