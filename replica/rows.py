"""Schema tables as storage specs, rows built from values, and how stored rows are shown to readers."""
from __future__ import annotations

from coordinator.core.schema import Table
from coordinator.core.tokens import token_of
from storage.cells import Cell, ColumnSpec, Row, TableSpec, is_live, visible_values


def storage_spec(table: Table) -> TableSpec:
    def specs(names):
        return tuple(ColumnSpec(n, table.column_type(n)) for n in names)

    regular = tuple(ColumnSpec(c.name, c.type) for c in table.regular_columns)
    return TableSpec(table.id, specs(table.partition_key), specs(table.clustering_key), regular)


def partition_token(table: Table, values: dict) -> int:
    return token_of(tuple(values[c] for c in table.partition_key), table.partition_key_types)


def visible_row(table: Table, row: Row | None) -> dict | None:
    """A live row as column name -> value (nulls absent), or None for a missing or deleted row."""
    if row is None or not is_live(row):
        return None
    values = dict(zip(table.primary_key, row.key))
    values.update(visible_values(row))
    return values


def upsert_row(table: Table, values: dict, ts: int) -> Row:
    """A full-row write of `values` (every regular column of `table`, null where absent) at `ts`."""
    key = tuple(values[c] for c in table.primary_key)
    cells = {c.name: Cell(values.get(c.name), ts) for c in table.regular_columns}
    return Row(token=partition_token(table, values), key=key, marker_ts=ts, cells=cells)


def delete_row(table: Table, key: tuple, ts: int) -> Row:
    values = dict(zip(table.primary_key, key))
    return Row(token=partition_token(table, values), key=key, tomb_ts=ts)
