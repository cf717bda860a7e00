"""The mutations of one INSERT executed with Arrow value columns, built with whole-column operations.

The result is a table in storage.arrow_layouts' mutation layout: the token of every row (common.arrow_tokens), the
key columns, a value and a timestamp column per regular column (NULL timestamps for columns the INSERT does
not name), `marker_ts` and an empty `tomb_ts`. Values convert as the row path converts them (integers in
range, doubles from integers or floats with -0.0 stored as 0.0, text from strings, booleans from booleans).
Anything else (a NULL key, a value out of range, a string for a number, a timestamp given as text, a column
count that does not match the markers) raises `NotColumnar`: the row path then runs the same values and
reports the problem exactly as it does for protobuf values, naming the value set and the column.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from common.arrow_tokens import tokens_of
from common.arrow_values import rows_of
from coordinator.core.schema import Table
from replica.rows import storage_spec
from storage.arrow_layouts import arrow_type, mutation_schema

from . import ast
from .catalog import coerce, require_column


@dataclass(frozen=True)
class ArrowValues:
    """Bind-value sets as Arrow columns, one per `?` in marker order (sizes already checked by the caller); `staged`:
    a bulk load's, for the staging area of a table with views (`replica.write_path.WriteCoordinator.write_columns`)."""

    columns: list[pa.ChunkedArray]
    staged: bool = False

    def rows(self) -> list[list]:
        """The value sets as rows of Python values, for the row path."""
        return rows_of(self.columns)


class NotColumnar(Exception):
    """These values need the row path (which converts them one by one, or names what is wrong)."""


def insert_mutations(table: Table, statement: ast.Insert, columns: list[pa.ChunkedArray], ts: int) -> pa.Table:
    """The mutation-layout table of `statement` run once per row of `columns` (one column per `?`), at `ts`."""
    markers = sorted(v.position for v in statement.values if isinstance(v, ast.BindMarker))
    if len(columns) != len(markers) or not columns:
        raise NotColumnar(f"{len(columns)} value columns for {len(markers)} bind markers")
    slot = {position: i for i, position in enumerate(markers)}
    rows = len(columns[0])
    values = {}
    for name, literal in zip(statement.columns, statement.values, strict=True):
        column_type = require_column(table, name).type
        if isinstance(literal, ast.BindMarker):
            values[name] = converted(columns[slot[literal.position]], column_type)
        else:
            values[name] = pa.repeat(pa.scalar(coerce(table, name, literal), arrow_type(column_type)), rows)
    if any(name not in values or values[name].null_count for name in table.primary_key):
        raise NotColumnar("a key column is missing or holds NULL")
    tokens = tokens_of([values[name] for name in table.partition_key], table.partition_key_types)
    return _layout(table, values, pa.array(tokens, pa.int64()), rows, ts)


def converted(column: pa.ChunkedArray, column_type: str) -> pa.ChunkedArray:
    """`column` as the Arrow type of a CQL column, with the row path's rules (NotColumnar where they differ)."""
    target = arrow_type(column_type)
    source = column.type
    if pa.types.is_null(source):
        return pa.chunked_array([pa.nulls(len(column), target)])
    fits = {
        "int": pa.types.is_integer(source), "bigint": pa.types.is_integer(source),
        "timestamp": pa.types.is_integer(source),
        "double": pa.types.is_integer(source) or pa.types.is_floating(source),
        "text": pa.types.is_string(source) or pa.types.is_large_string(source),
        "boolean": pa.types.is_boolean(source),
    }[column_type]
    if not fits:
        raise NotColumnar(f"{source} values for a {column_type} column")
    try:
        result = column.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise NotColumnar(str(error)) from None
    if column_type == "double":
        result = pc.add(result, 0.0)  # -0.0 + 0.0 is 0.0: stored (and hashed) as 0.0, like the row path
    return result


def _layout(table: Table, values: dict, tokens: pa.Array, rows: int, ts: int) -> pa.Table:
    spec = storage_spec(table)
    schema = mutation_schema(spec)
    stamps = pa.repeat(pa.scalar(ts, pa.int64()), rows)
    no_stamps = pa.nulls(rows, pa.int64())
    arrays = [tokens] + [values[c.name] for c in spec.key_columns]  # already of the layout's types (`converted`)
    for c in spec.regular:
        if c.name in values:
            arrays += [values[c.name], stamps]
        else:
            arrays += [pa.nulls(rows, arrow_type(c.type)), no_stamps]
    arrays += [stamps, no_stamps]
    return pa.Table.from_arrays([_whole(a) for a in arrays], schema=schema)


def _whole(array) -> pa.Array:
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
