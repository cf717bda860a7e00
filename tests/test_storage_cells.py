"""Property tests of the last-write-wins row merge, visibility and view versions in storage.cells."""
from __future__ import annotations

import math
from functools import reduce

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.cells import (
    Cell,
    ColumnSpec,
    Row,
    TableSpec,
    changes_state,
    is_live,
    merge,
    next_view_ts,
    state_equal,
    value_order_key,
    visible_values,
    with_view_ts,
    write_ts,
)

TOKEN = 42
KEY = ("p", 1)
SMALL_TS = st.integers(min_value=0, max_value=12)  # a narrow range so ties are common
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, math.nan, -math.nan, math.inf]),
    st.text(max_size=3),
    st.sampled_from(["B", "a", "é", "\U0001f600", "\uffff"]),
)
CELLS = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.builds(Cell, VALUES, SMALL_TS), max_size=3)
ROWS = st.builds(
    Row,
    token=st.just(TOKEN),
    key=st.just(KEY),
    marker_ts=st.none() | SMALL_TS,
    tomb_ts=st.none() | SMALL_TS,
    cells=CELLS,
    view_ts=st.none() | st.integers(min_value=0, max_value=100),
)


def merge_all(rows: list[Row]) -> Row:
    return reduce(merge, rows)


def row(marker_ts=None, tomb_ts=None, view_ts=None, **cells: Cell) -> Row:
    return Row(TOKEN, KEY, marker_ts=marker_ts, tomb_ts=tomb_ts, cells=cells, view_ts=view_ts)


# --- algebra ---------------------------------------------------------------------------------------------


@given(ROWS, ROWS)
def test_merge_is_commutative(a, b):
    assert state_equal(merge(a, b), merge(b, a))


@given(ROWS, ROWS, ROWS)
def test_merge_is_associative(a, b, c):
    assert state_equal(merge(merge(a, b), c), merge(a, merge(b, c)))


@given(ROWS)
def test_merge_is_idempotent(a):
    assert state_equal(merge(a, a), a)


@given(st.lists(ROWS, min_size=1, max_size=6), st.randoms(use_true_random=False), st.data())
def test_any_order_with_duplicates_gives_the_same_state(rows, random, data):
    duplicated = rows + data.draw(st.lists(st.sampled_from(rows), max_size=4))
    random.shuffle(duplicated)
    assert state_equal(merge_all(duplicated), merge_all(rows))


@given(ROWS, ROWS)
def test_changes_state_agrees_with_merge(old, mutation):
    assert changes_state(old, mutation) == (not state_equal(merge(old, mutation), old))


@given(ROWS, ROWS)
def test_merge_keeps_the_first_rows_view_ts(a, b):
    assert merge(a, b).view_ts == a.view_ts


def test_merge_rejects_different_keys():
    with pytest.raises(ValueError):
        merge(row(marker_ts=1), Row(TOKEN, ("p", 2), marker_ts=1))
    with pytest.raises(ValueError):
        merge(row(marker_ts=1), Row(TOKEN + 1, KEY, marker_ts=1))


def test_nan_key_components_merge():
    a = Row(TOKEN, (math.nan,), marker_ts=1)
    assert merge(a, Row(TOKEN, (float("nan"),), marker_ts=2)).marker_ts == 2


# --- tie rules -------------------------------------------------------------------------------------------


def winner(a: Cell, b: Cell) -> Cell:
    merged = merge(row(x=a), row(x=b)).cells["x"]
    assert state_equal(row(x=merged), merge(row(x=b), row(x=a)))
    return merged


def test_higher_timestamp_wins_whatever_the_value():
    assert winner(Cell("zzz", 5), Cell("a", 6)) == Cell("a", 6)
    assert winner(Cell(None, 5), Cell(1, 6)) == Cell(1, 6)


def test_deletion_wins_a_timestamp_tie():
    assert winner(Cell("zzz", 5), Cell(None, 5)) == Cell(None, 5)


def test_greater_value_wins_a_timestamp_tie():
    assert winner(Cell(3, 5), Cell(7, 5)) == Cell(7, 5)
    assert winner(Cell(False, 5), Cell(True, 5)) == Cell(True, 5)
    assert winner(Cell(-1.5, 5), Cell(2.5, 5)) == Cell(2.5, 5)


def test_text_ties_compare_code_points():
    assert winner(Cell("B", 5), Cell("a", 5)).value == "a"
    assert winner(Cell("a", 5), Cell("é", 5)).value == "é"
    assert winner(Cell("\uffff", 5), Cell("\U0001f600", 5)).value == "\U0001f600"


def test_double_ties_use_ieee_total_order():
    assert math.isnan(winner(Cell(math.inf, 5), Cell(math.nan, 5)).value)
    assert math.copysign(1, winner(Cell(-0.0, 5), Cell(0.0, 5)).value) == 1
    assert winner(Cell(-math.nan, 5), Cell(-math.inf, 5)).value == -math.inf


def test_type_rank_orders_mixed_values():
    ranked = [False, True, -5, 10, -math.inf, 1.5, "", "a"]
    assert sorted(ranked, key=value_order_key) == ranked


def test_row_marker_and_tombstone_keep_the_maximum():
    merged = merge(row(marker_ts=3, tomb_ts=None), row(marker_ts=1, tomb_ts=2))
    assert (merged.marker_ts, merged.tomb_ts) == (3, 2)


# --- visibility ------------------------------------------------------------------------------------------


def test_reinsert_after_delete_is_live_and_hides_older_cells():
    written = row(marker_ts=5, a=Cell(1, 5), b=Cell(2, 10))
    deleted = merge(written, row(tomb_ts=10))
    assert not is_live(deleted)
    reinserted = merge(deleted, row(marker_ts=11, c=Cell(3, 11)))
    assert is_live(reinserted)
    assert visible_values(reinserted) == {"c": 3}


def test_delete_and_insert_at_the_same_timestamp_is_a_delete():
    assert not is_live(merge(row(marker_ts=10), row(tomb_ts=10)))


def test_row_without_marker_is_not_live():
    assert not is_live(row(a=Cell(1, 3)))


def test_deleted_cells_are_not_visible():
    assert visible_values(row(marker_ts=1, a=Cell(None, 2), b=Cell(0, 2))) == {"b": 0}


@given(ROWS)
def test_visible_values_never_include_cells_at_or_before_the_tombstone(r):
    for name in visible_values(r):
        assert r.tomb_ts is None or r.cells[name].ts > r.tomb_ts


# --- timestamps and view versions ------------------------------------------------------------------------


def test_write_ts_is_the_highest_timestamp_anywhere():
    assert write_ts(row(marker_ts=3, tomb_ts=9, a=Cell(1, 4))) == 9
    assert write_ts(row(a=Cell(None, 12), b=Cell(1, 2))) == 12
    with pytest.raises(ValueError):
        write_ts(row())


def test_next_view_ts_is_the_write_timestamp_in_the_normal_case():
    assert next_view_ts(None, row(marker_ts=7)) == 7
    assert next_view_ts(row(marker_ts=7, view_ts=7), row(marker_ts=9)) == 9


def test_next_view_ts_exceeds_the_previous_version_for_late_writes():
    assert next_view_ts(row(marker_ts=7, view_ts=7), row(a=Cell(1, 3))) == 8


@given(st.lists(ROWS, min_size=1, max_size=12))
def test_view_ts_strictly_increases_along_any_apply_sequence(mutations):
    stored: Row | None = None
    for mutation in mutations:
        merged = mutation if stored is None else merge(stored, mutation)
        if stored is not None and state_equal(merged, stored):
            continue
        try:
            version = next_view_ts(stored, mutation)
        except ValueError:  # an empty mutation on a new key: nothing to store
            continue
        assert stored is None or version > stored.view_ts
        assert version >= write_ts(mutation)
        stored = with_view_ts(merged, version)


# --- value objects ---------------------------------------------------------------------------------------


def test_rows_are_hashable_and_equal_by_value():
    a = row(marker_ts=1, view_ts=4, a=Cell("x", 1), b=Cell(2, 1))
    b = Row(TOKEN, list(KEY), marker_ts=1, view_ts=4, cells={"b": Cell(2, 1), "a": Cell("x", 1)})
    assert a == b and hash(a) == hash(b)
    assert list(a.cells) == ["a", "b"]


def test_state_equal_ignores_view_ts():
    assert state_equal(row(marker_ts=1, view_ts=1), row(marker_ts=1, view_ts=9))
    assert not state_equal(row(marker_ts=1), row(marker_ts=2))


def test_table_spec_helpers_and_validation():
    spec = TableSpec(
        "0123456789abcdef0123456789abcdef",
        (ColumnSpec("p", "text"),),
        (ColumnSpec("c", "int"),),
        (ColumnSpec("v", "double"),),
    )
    assert [c.name for c in spec.key_columns] == ["p", "c"]
    assert [c.name for c in spec.columns] == ["p", "c", "v"]
    assert spec.column("v") == ColumnSpec("v", "double")
    with pytest.raises(KeyError):
        spec.column("missing")
    with pytest.raises(ValueError):
        TableSpec("NOT-HEX", (ColumnSpec("p", "text"),), (), ())
    with pytest.raises(ValueError):
        TableSpec(spec.table_id, (), (), ())
    with pytest.raises(ValueError):
        TableSpec(spec.table_id, (ColumnSpec("p", "text"),), (), (ColumnSpec("p", "int"),))
    with pytest.raises(ValueError):
        ColumnSpec("x", "varchar")
