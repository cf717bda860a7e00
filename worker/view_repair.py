"""View repair: the view rows a repair batch deletes, and the floor it raises its base rows' view_ts to first.

A view replica whose feeder (the base replica at its position) died, or that was itself rebuilt from a copy of
another position's replica, may hold rows its new feeder's base rows do not imply (a delete or a change of view key
the dead replica applied and never delivered) and rows at another feeder's timestamps (a base row's `view_ts` is a
version local to its replica: the new feeder's may be lower for the same state). A repair batch therefore

1. reads the rows, tombstones included, that its position's view replicas hold for its base token range;
2. raises each of its base rows' view_ts above the newest timestamp of that row's view rows (`repair_floors`,
   `NodeStore.raise_view_ts`, under the store's writer lock: every later write's view updates order after it);
3. builds as any batch, from a snapshot taken after that, so its view rows win over every row read in 1;
4. deletes the live view rows read in 1 that the snapshot does not imply, each at its base row's raised view_ts
   (`stale_view_rows`, `stale_deletes`): newer than any row another feeder wrote for that base row, older than
   anything its feeder writes next.

A view row belongs to one base row: a view's primary key holds every column of its base's. A view row whose base
row this replica has never held (no row, no tombstone) is left alone: nothing orders a delete of it.
Pure: Arrow tables in, rows out; the worker's `BuildJob` and the topology simulation both use these functions.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np
import pyarrow as pa

from common.arrow_tokens import tokens_of
from coordinator.core.schema import Table
from replica.rows import delete_row
from storage.arrow_layouts import value_column_name
from storage.cells import Row

BaseRow = tuple[int, tuple]  # (token, primary key) of a base row


def base_rows_of(base: Table, stored: pa.Table) -> list[BaseRow]:
    """The base row each stored view row (storage layout, or any table with the key columns) belongs to."""
    if stored.num_rows == 0:
        return []
    partition = [stored.column(value_column_name(c)).combine_chunks() for c in base.partition_key]
    tokens = tokens_of(partition, base.partition_key_types).tolist()
    keys = zip(*(stored.column(value_column_name(c)).to_pylist() for c in base.primary_key))
    return [(token, tuple(key)) for token, key in zip(tokens, keys)]


def view_keys_of(view: Table, rows: pa.Table) -> list[tuple]:
    """The primary key of each view row of `rows`."""
    return list(zip(*(rows.column(value_column_name(c)).to_pylist() for c in view.primary_key)))


def _in_range(base_rows: list[BaseRow], first: int, last: int) -> np.ndarray:
    tokens = np.fromiter((token for token, _ in base_rows), dtype=np.int64, count=len(base_rows))
    return (tokens >= first) & (tokens <= last)


def repair_floors(base: Table, stored: pa.Table, first: int, last: int) -> dict[BaseRow, int]:
    """Per base row of tokens first..last: one more than the newest timestamp (`write_ts`) of its view rows in
    `stored` (storage layout, tombstones included)."""
    base_rows = base_rows_of(base, stored)
    floors: dict[BaseRow, int] = {}
    if not base_rows:
        return floors
    newest = stored.column("write_ts").to_pylist()
    for base_row, ts, inside in zip(base_rows, newest, _in_range(base_rows, first, last)):
        if inside:
            floors[base_row] = max(floors.get(base_row, 0), ts + 1)
    return floors


def stale_view_rows(base: Table, view: Table, stored: pa.Table, first: int, last: int,
                    implied: Collection[tuple]) -> list[tuple[tuple, BaseRow]]:
    """(view key, base row) of every live view row of `stored` whose base row has a token in first..last and whose
    key is not among `implied` (the view keys a snapshot of the base rows implies)."""
    if stored.num_rows == 0:
        return []
    base_rows = base_rows_of(base, stored)
    live = stored.column("tombstone").to_pylist()
    return [(key, base_row)
            for key, base_row, dead, inside in zip(view_keys_of(view, stored), base_rows, live,
                                                   _in_range(base_rows, first, last))
            if inside and not dead and key not in implied]


def stale_deletes(view: Table, stale: list[tuple[tuple, BaseRow]], view_ts: Mapping[BaseRow, int]) -> list[Row]:
    """The deletion of each stale view row at its base row's (raised) view_ts; none for a base row not held."""
    return [delete_row(view, key, view_ts[base_row]) for key, base_row in stale if base_row in view_ts]
