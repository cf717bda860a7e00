"""Bind-value sets sent as one Arrow IPC stream (`ExecuteRequest.arrow_values`): decoded to rows of Python values.

One column per `?` in marker order (names are not looked at), one row per value set. Accepted Arrow types:
integers (signed and unsigned), floating point, boolean, UTF-8 strings (also large and dictionary-encoded), and
timestamps (as milliseconds since the epoch, what a CQL timestamp stores; a finer part is dropped). Any other type, or bytes that are not an
Arrow IPC stream, is INVALID_ARGUMENT naming the column.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core.errors import InvalidArgument


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_dictionary(column.type):
        return column.cast(column.type.value_type)
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())
    return column


def _check_type(column: pa.ChunkedArray, position: int, name: str) -> None:
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            or pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
        raise InvalidArgument(f"Arrow column {position} ({name!r}) has type {kind}; bind values take integers, "
                              "floating point, boolean, UTF-8 strings, timestamps or nulls")


def decode_table(data: bytes) -> pa.Table:
    """The Arrow table of an IPC stream (INVALID_ARGUMENT if `data` is not one)."""
    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as error:
        raise InvalidArgument(f"arrow_values is not an Arrow IPC stream: {error}") from None


def plain_columns(table: pa.Table) -> list[pa.ChunkedArray]:
    """The table's columns as the plain types rows are made of (checked: INVALID_ARGUMENT naming a bad column)."""
    columns = []
    for position, (name, column) in enumerate(zip(table.column_names, table.columns), start=1):
        column = _plain(column)
        _check_type(column, position, name)
        columns.append(column)
    return columns


def longest_string_bytes(columns: list[pa.ChunkedArray]) -> tuple[int, int]:
    """(bytes of the longest string value, its column position from 1); (0, 0) without strings."""
    longest, where = 0, 0
    for position, column in enumerate(columns, start=1):
        if (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) and len(column):
            size = pc.max(pc.binary_length(column)).as_py() or 0
            if size > longest:
                longest, where = size, position
    return longest, where


def rows_of(columns: list[pa.ChunkedArray]) -> list[list]:
    """One list of Python values per row (NaN and -0.0 kept; nulls as None)."""
    if not columns:
        return []
    return [list(row) for row in zip(*(column.to_pylist() for column in columns))]
