"""Stored row states as tuples in `storage.arrow_layouts.state_schema` order, for tests of the columnar derive."""
from __future__ import annotations

from storage.cells import Row, TableSpec


def state_tuple(spec: TableSpec, row: Row | None) -> tuple:
    """A Row as `state_schema` values: token, key values, value and timestamp per regular column, marker,
    tombstone, view_ts (all None for a missing row)."""
    if row is None:
        return (None,) * (1 + len(spec.key_columns) + 2 * len(spec.regular) + 3)
    values = [row.token, *row.key]
    for column in spec.regular:
        cell = row.cells.get(column.name)
        values += [None, None] if cell is None else [cell.value, cell.ts]
    return tuple(values + [row.marker_ts, row.tomb_ts, row.view_ts])
