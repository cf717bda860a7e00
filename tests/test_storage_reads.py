"""storage.reads on SQLite and PostgreSQL: visible values as Arrow pages, keyset resumption, filters with CQL's NaN
and null rules, partial aggregates, and COUNT(*) through the tombstone index."""
from __future__ import annotations

import math
import uuid

import pytest

from coordinator.core.schema import Filter
from storage.cells import Cell, ColumnSpec, Row, TableSpec
from storage.reads import Aggregate, RangeRead, aggregate, count_live, live_pages

EVERY_TOKEN = (-(2**63), 2**63 - 1)


@pytest.fixture
def table(store):
    spec = TableSpec(uuid.uuid4().hex, (ColumnSpec("k", "int"),), (ColumnSpec("c", "text"),),
                     (ColumnSpec("d", "double"), ColumnSpec("t", "text"), ColumnSpec("b", "boolean")))
    store.ensure_table(spec)
    doubles = [0.5, math.nan, None, -2.0, 7.25, math.nan]
    rows = [Row(token=i * 10, key=(i, f"c{i}"), marker_ts=5,
                cells={"d": Cell(doubles[i], 5), "t": Cell(["é", "a", "B", None, "zz", "a"][i], 5),
                       "b": Cell(i % 2 == 0, 5)})
            for i in range(6)]
    store.apply(spec.table_id, rows)
    store.apply(spec.table_id, [Row(token=50, key=(5, "c5"), tomb_ts=9),  # row 5 deleted
                                Row(token=40, key=(4, "c4"), cells={"t": Cell(None, 6)})])  # cell t of row 4 deleted
    return spec


def _rows(store, spec, names=("k", "d", "t", "b"), page_rows=2, **read) -> list[dict]:
    request = RangeRead(spec.table_id, *EVERY_TOKEN, **read)
    return [r for page in live_pages(store, request, names, page_rows) for r in page.to_pylist()]


def test_pages_hold_visible_values_in_token_order_and_resume_after_a_key(store, table):
    rows = _rows(store, table)
    assert [r["k"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[4] == {"token": 40, "k": 4, "d": 7.25, "t": None, "b": True}
    assert math.isnan(rows[1]["d"]) and rows[2]["d"] is None and rows[3]["t"] is None
    assert [r["k"] for r in _rows(store, table, after=(20, (2, "c2")))] == [3, 4]
    assert [r["k"] for r in _rows(store, table, after=(20, ()))] == [3, 4]
    assert [r["k"] for r in _rows(store, table, partition_key=(3,))] == [3]


@pytest.mark.parametrize("term, keys", [
    (Filter("d", ">", 0.0), [0, 4]),                      # NaN and null fail a comparison
    (Filter("d", "!=", 0.5), [1, 3, 4]),                  # a NaN passes '!=', a null does not
    (Filter("d", "=", math.nan), []),
    (Filter("d", "IN", (math.nan, -2.0)), [3]),
    (Filter("t", "<", "a"), [2]),                         # code point order: 'B' < 'a' < 'é'
    (Filter("t", ">", "a"), [0]),
    (Filter("t", "IN", ("a", "zz")), [1]),                # row 4's t was deleted
    (Filter("t", "IS NOT NULL", None), [0, 1, 2]),
    (Filter("b", "=", True), [0, 2, 4]),
    (Filter("c", ">=", "c3"), [3, 4]),
])
def test_filters_follow_cql_rules_on_either_engine(store, table, term, keys):
    assert [r["k"] for r in _rows(store, table, conditions=(term,))] == keys


def test_partial_aggregates_and_the_live_count(store, table):
    read = RangeRead(table.table_id, *EVERY_TOKEN)
    partials = aggregate(store, read, [Aggregate("count"), Aggregate("count", "t"), Aggregate("max", "d"),
                                       Aggregate("sum", "d"), Aggregate("min", "t"), Aggregate("sum", "k")])
    assert partials == [[5], [3], [7.25, 1, 3], [5.75, 3, 1], ["B", 0, 3], [10, 5, 0]]
    assert aggregate(store, read, [Aggregate("count")]) == [[5]]
    from storage.reads import _columns
    assert count_live(store, _columns(store, table.table_id), RangeRead(table.table_id, 15, 45)) == 3
