"""Tests of the storage side of tablet streaming: merging stored rows, token-aligned windows, deleting a range."""
from __future__ import annotations

import math
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import bulk
from storage.arrow_layouts import storage_schema, value_column_name
from storage.cells import Cell, ColumnSpec, Row, TableSpec, merge, same_key
from storage.store import NodeStore

from .test_storage_bulk import KEYS, MAX_TOKEN, REGULAR, MIN_TOKEN, canonical_row, layout_of, new_table, stored_rows

EVERYTHING = (MIN_TOKEN, MAX_TOKEN)


def stored(store, spec) -> pa.Table:
    """The whole replica as another node reads it for a stream (tombstones included)."""
    return bulk.read_token_range(store, spec, *EVERYTHING, include_tombstones=True)


def without_view_ts(layout: dict) -> dict:
    return {name: value for name, value in canonical_row(layout).items() if name != "view_ts"}


def only_row(store, spec) -> Row:
    [row] = store.scan(spec.table_id, *EVERYTHING, include_tombstones=True)
    return row


def key(n: int = 1) -> tuple:
    return ("a", 1.0, n)


def test_newer_cells_win_one_by_one_and_older_ones_change_nothing(store):
    source, destination = new_table(store), new_table(store)
    store.apply(source.table_id, [Row(5, key(), marker_ts=10, cells={"t": Cell("new", 10), "i": Cell(1, 2)})])
    store.apply(destination.table_id, [Row(5, key(), marker_ts=4, cells={"t": Cell("old", 4), "i": Cell(7, 8)})])
    assert bulk.merge_stored_rows(store, destination, stored(store, source)) == 1
    row = only_row(store, destination)
    assert (row.cells["t"], row.cells["i"], row.marker_ts) == (Cell("new", 10), Cell(7, 8), 10)
    older = new_table(store)
    store.apply(older.table_id, [Row(5, key(), marker_ts=1, cells={"t": Cell("older", 1), "i": Cell(0, 1)})])
    assert bulk.merge_stored_rows(store, destination, stored(store, older)) == 0
    assert only_row(store, destination) == row


def test_row_tombstones_travel_and_win_or_lose_by_timestamp(store):
    source, destination, stale = new_table(store), new_table(store), new_table(store)
    store.apply(source.table_id, [Row(5, key(), tomb_ts=20), Row(6, key(2), marker_ts=3, tomb_ts=2)])
    store.apply(destination.table_id, [Row(5, key(), marker_ts=10, cells={"t": Cell("x", 10)})])
    store.apply(stale.table_id, [Row(5, key(), marker_ts=30, cells={"t": Cell("late", 30)})])
    assert bulk.merge_stored_rows(store, destination, stored(store, source)) == 2
    first, second = store.scan(destination.table_id, *EVERYTHING, include_tombstones=True)
    assert (first.tomb_ts, first.marker_ts) == (20, 10) and store.get(destination.table_id, 5, key()) is None
    assert (second.marker_ts, second.tomb_ts) == (3, 2) and store.get(destination.table_id, 6, key(2)) is not None
    assert bulk.merge_stored_rows(store, destination, stored(store, stale)) == 1  # a newer write beats the tombstone
    assert store.get(destination.table_id, 5, key()).cells["t"] == Cell("late", 30)


def test_deleted_cells_and_nan_travel_as_stored(store):
    source, destination = new_table(store), new_table(store)
    nan_key = ("é", math.nan, 3)
    store.apply(source.table_id, [Row(0, nan_key, marker_ts=5, cells={"d": Cell(math.nan, 5), "t": Cell(None, 6)})])
    store.apply(destination.table_id, [Row(0, nan_key, marker_ts=1, cells={"t": Cell("kept?", 4), "d": Cell(2.5, 1)})])
    assert bulk.merge_stored_rows(store, destination, stored(store, source)) == 1
    row = only_row(store, destination)
    assert math.isnan(row.cells["d"].value) and row.cells["d"].ts == 5
    assert row.cells["t"] == Cell(None, 6)
    assert bulk.merge_stored_rows(store, destination, stored(store, source)) == 0  # NaN equals NaN: no change


def test_a_retried_merge_changes_nothing_and_empty_input_merges_nothing(store):
    source, destination = new_table(store), new_table(store)
    store.apply(source.table_id, [Row(n, key(n), marker_ts=n + 1, tomb_ts=n if n % 3 else None,
                                      cells={"big": Cell(n, n + 1), "flag": Cell(n % 2 == 0, n)}) for n in range(50)])
    rows = stored(store, source)
    assert bulk.merge_stored_rows(store, destination, rows, chunk_rows=7) == 50
    before = stored(store, destination)
    assert bulk.merge_stored_rows(store, destination, rows, chunk_rows=7) == 0
    assert stored(store, destination).equals(before)
    assert [canonical_row(r) for r in before.to_pylist()] == [canonical_row(r) for r in rows.to_pylist()]
    assert bulk.merge_stored_rows(store, destination, storage_schema(destination).empty_table()) == 0


def test_rows_of_an_older_definition_fill_the_new_columns_with_no_cell(store):
    older = new_table(store, regular=(ColumnSpec("t", "text"),))
    store.apply(older.table_id, [Row(5, key(), marker_ts=1, cells={"t": Cell("x", 1)})])
    newer = new_table(store, regular=(ColumnSpec("t", "text"), ColumnSpec("u", "int")))
    assert bulk.merge_stored_rows(store, newer, stored(store, older)) == 1
    assert only_row(store, newer).cells == {"t": Cell("x", 1)}


def test_bad_stored_rows_are_refused(store):
    spec = new_table(store)
    rows = stored(store, spec)
    good = pa.Table.from_pylist([layout_of(spec, Row(5, key(), marker_ts=1))], schema=storage_schema(spec))
    with pytest.raises(ValueError, match="lack column 'write_ts'"):
        bulk.merge_stored_rows(store, spec, good.drop_columns(["write_ts"]))
    with pytest.raises(ValueError, match="NULL in column 'token'"):
        bulk.merge_stored_rows(store, spec, good.set_column(0, "token", pa.array([None], pa.int64())))
    with pytest.raises(KeyError):
        bulk.merge_stored_rows(store, TableSpec(uuid.uuid4().hex, KEYS[0], KEYS[1], REGULAR), rows)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source_rows=st.lists(stored_rows(), max_size=10), destination_rows=st.lists(stored_rows(), max_size=10))
def test_merging_a_replica_equals_the_per_cell_merge_of_both(store, source_rows, destination_rows):
    source, destination = new_table(store), new_table(store)
    try:
        for spec, rows in ((source, source_rows), (destination, destination_rows)):
            for row in rows:
                store.apply(spec.table_id, [row])
        expected = _merged_states(store.scan(destination.table_id, *EVERYTHING, include_tombstones=True),
                                  store.scan(source.table_id, *EVERYTHING, include_tombstones=True))
        bulk.merge_stored_rows(store, destination, stored(store, source))
        got = [without_view_ts(r) for r in stored(store, destination).to_pylist()]
        assert got == [without_view_ts(layout_of(destination, r)) for r in expected]
    finally:
        store.drop_table(source.table_id)
        store.drop_table(destination.table_id)


def _merged_states(destination: list[Row], source: list[Row]) -> list[Row]:
    """storage.cells' merge of the two replicas, key by key, in (token, key) order."""
    merged = list(destination)
    for row in source:
        at = next((i for i, r in enumerate(merged) if r.token == row.token and same_key(r.key, row.key)), None)
        if at is None:
            merged.append(row)
        else:
            merged[at] = merge(merged[at], row)
    order = {id(r): n for n, r in enumerate(destination + source)}
    return sorted(merged, key=lambda r: (r.token, *(_sort_value(v) for v in r.key), order.get(id(r), 0)))


def _sort_value(value):
    """The order the store keeps key values in: NaN above every double (SQLite's 'NaN' text, PostgreSQL's NaN)."""
    if isinstance(value, float):
        return (1, 0.0) if math.isnan(value) else (0, value)
    return (0, value.encode("utf-8")) if isinstance(value, str) else (0, value)


# --- windows and deletes --------------------------------------------------------------------------------


def test_windows_end_at_token_boundaries_and_cover_the_range_once(store):
    spec = new_table(store)
    rows = [Row(token, ("a", float(n), n), marker_ts=1) for token, count in ((1, 3), (2, 1), (3, 6), (4, 2))
            for n in range(count)]
    store.apply(spec.table_id, rows + [Row(9, key(), tomb_ts=4)])
    windows, low = [], MIN_TOKEN
    while True:
        window = bulk.read_token_window(store, spec, low, MAX_TOKEN, 3)
        if window.num_rows == 0:
            break
        windows.append(window.column("token").to_pylist())
        low = windows[-1][-1] + 1
    assert windows == [[1, 1, 1], [2], [3] * 6, [4, 4, 9]]
    with pytest.raises(ValueError):
        bulk.read_token_window(store, spec, MIN_TOKEN, MAX_TOKEN, 0)


def test_deleting_a_range_removes_its_rows_and_tombstones_only(store):
    spec = new_table(store)
    store.apply(spec.table_id, [Row(token, key(n), marker_ts=1) for token in range(-3, 10) for n in range(2)]
                + [Row(4, key(9), tomb_ts=3)])
    assert store.delete_token_range(spec.table_id, 0, 5, rows_per_transaction=3) == 13
    left = [row.token for row in store.scan(spec.table_id, *EVERYTHING, include_tombstones=True)]
    assert left == sorted([t for t in range(-3, 0) for _ in range(2)] + [t for t in range(6, 10) for _ in range(2)])
    assert store.delete_token_range(spec.table_id, 0, 5) == 0
    assert store.delete_token_range(spec.table_id, *EVERYTHING, rows_per_transaction=1) == len(left)
    assert store.delete_token_range("no_such_table", *EVERYTHING) == 0


def test_merged_rows_keep_the_value_columns_of_every_type(store):
    source, destination = new_table(store), new_table(store)
    cells = {"i": Cell(-(2**31), 1), "big": Cell(2**63 - 1, 1), "t": Cell("\U0001f600", 1), "flag": Cell(False, 1),
             "d": Cell(-math.inf, 1), "at": Cell(-5, 1)}
    store.apply(source.table_id, [Row(MAX_TOKEN, ("\U0001f600", -math.inf, 7), marker_ts=1, cells=cells)])
    bulk.merge_stored_rows(store, destination, stored(store, source))
    row = only_row(store, destination)
    assert row.cells == cells and row.token == MAX_TOKEN
    assert stored(store, destination).column(value_column_name("flag")).to_pylist() == [False]


# merge_stored_window: a stream's window, inserted with a plain INSERT when its token span holds no row here.


def _mixed_rows(store, spec, count: int = 40) -> None:
    store.apply(spec.table_id, [Row(n, key(n), marker_ts=n + 1, tomb_ts=n if n % 3 else None,
                                    cells={"big": Cell(n, n + 1), "d": Cell(math.nan if n % 5 == 0 else n / 2, n + 2),
                                           "t": Cell(None, n + 3)}) for n in range(count)])


def _canonical(store, spec) -> list[dict]:
    return [canonical_row(r) for r in stored(store, spec).to_pylist()]


@pytest.mark.parametrize("durable", [True, False])
def test_a_window_into_an_empty_range_equals_the_merge(store, durable):
    source, merged, inserted = new_table(store), new_table(store), new_table(store)
    _mixed_rows(store, source)
    rows = stored(store, source)
    assert bulk.merge_stored_rows(store, merged, rows) == 40
    assert bulk.merge_stored_window(store, inserted, rows, durable=durable, chunk_rows=16) == 40
    assert _canonical(store, inserted) == _canonical(store, merged)
    assert bulk.merge_stored_window(store, inserted, rows) == 0  # a retried window changes nothing
    assert _canonical(store, inserted) == _canonical(store, merged)


def test_a_window_over_a_newer_row_falls_back_to_the_merge_and_keeps_it(store):
    source, destination = new_table(store), new_table(store)
    _mixed_rows(store, source)
    store.apply(destination.table_id, [Row(7, key(7), marker_ts=100, cells={"t": Cell("live", 100)})])
    assert bulk.merge_stored_window(store, destination, stored(store, source)) == 40
    live = store.get(destination.table_id, 7, key(7))
    assert live.cells["t"] == Cell("live", 100) and live.marker_ts == 100
    assert live.cells["big"] == Cell(7, 8)  # the streamed cell had no rival here
    assert len(store.scan(destination.table_id, *EVERYTHING, include_tombstones=True)) == 40


def test_a_window_repeating_a_key_merges_it_in_order(store):
    source, destination = new_table(store), new_table(store)
    store.apply(source.table_id, [Row(5, key(), marker_ts=3, cells={"t": Cell("a", 3)})])
    once = stored(store, source)
    newer = once.set_column(once.column_names.index("ts_t"), "ts_t", pa.array([9], pa.int64()))
    assert bulk.merge_stored_window(store, destination, pa.concat_tables([newer, once])) == 1
    assert only_row(store, destination).cells["t"] == Cell("a", 9)


def test_the_window_statements_probe_the_range():
    spec = TableSpec(uuid.uuid4().hex, KEYS[0], KEYS[1], REGULAR)
    assert "ON CONFLICT" not in bulk.sqlite_stored_insert_sql(spec)
    assert "token >= ?1 AND token <= ?2" in bulk.sqlite_range_probe_sql(spec)


def test_a_kept_child_connection_follows_a_database_replaced_at_its_path(tmp_path):
    path = tmp_path / "node.db"
    for _ in range(2):  # the second store is a new file at the same path
        with NodeStore(f"sqlite:///{path}") as store:
            source, destination = new_table(store), new_table(store)
            _mixed_rows(store, source, count=5)
            assert bulk.merge_stored_window(store, destination, stored(store, source)) == 5
            assert len(store.scan(destination.table_id, *EVERYTHING, include_tombstones=True)) == 5
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
