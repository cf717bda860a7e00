"""Tests of storage.bulk: token-range snapshots into Arrow and the set-based view-row merge, on SQLite and PostgreSQL."""
from __future__ import annotations

import math
import struct
import threading
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import bulk
from storage.arrow_layouts import (mutation_table, storage_schema, ts_column_name, value_column_name,
                                    view_rows_schema)
from storage.cells import Cell, ColumnSpec, Row, TableSpec, is_live, same_key, state_equal
from storage.store import NodeStore


MIN_TOKEN, MAX_TOKEN = -(2**63), 2**63 - 1
INT32 = (-(2**31), 2**31 - 1)

REGULAR = (
    ColumnSpec("i", "int"),
    ColumnSpec("big", "bigint"),
    ColumnSpec("t", "text"),
    ColumnSpec("flag", "boolean"),
    ColumnSpec("d", "double"),
    ColumnSpec("at", "timestamp"),
)
KEYS = ((ColumnSpec("p", "text"),), (ColumnSpec("k", "double"), ColumnSpec("n", "int")))





def new_table(store: NodeStore, regular=REGULAR, keys=KEYS) -> TableSpec:
    spec = TableSpec(uuid.uuid4().hex, keys[0], keys[1], regular)
    store.ensure_table(spec)
    return spec


# --- values -------------------------------------------------------------------------------------------


def canonical(value: object) -> object:
    """A comparable stand-in: NaN equals NaN, -0.0 differs from 0.0, True differs from 1."""
    if isinstance(value, float):
        return ("double", "NaN") if math.isnan(value) else ("double", struct.pack(">d", value))
    return (type(value).__name__, value)


def canonical_row(layout: dict) -> dict:
    return {name: canonical(value) for name, value in layout.items()}


def layout_of(spec: TableSpec, row: Row) -> dict:
    """A stored Row in the storage layout of read_token_range."""
    values = {"token": row.token}
    values.update((value_column_name(c.name), v) for c, v in zip(spec.key_columns, row.key))
    for column in spec.regular:
        cell = row.cells.get(column.name)
        values[value_column_name(column.name)] = None if cell is None else cell.value
        values[ts_column_name(column.name)] = None if cell is None else cell.ts
    stamps = [c.ts for c in row.cells.values()] + [t for t in (row.marker_ts, row.tomb_ts) if t is not None]
    values.update(marker_ts=row.marker_ts, tomb_ts=row.tomb_ts, view_ts=row.view_ts, write_ts=max(stamps),
                  tombstone=not is_live(row))
    return values


def floats():
    """Doubles with the canonical NaN only (the store keeps no NaN sign or payload)."""
    return st.floats().map(lambda x: math.nan if math.isnan(x) else x)


TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=6)
VALUES = {
    "int": st.integers(*INT32),
    "bigint": st.integers(MIN_TOKEN, MAX_TOKEN),
    "timestamp": st.integers(MIN_TOKEN, MAX_TOKEN),
    "text": TEXT,
    "boolean": st.booleans(),
    "double": floats(),
}
# Few distinct keys so that rows collide; no -0.0 key (the statement layer stores -0.0 keys as 0.0).
PARTITIONS = st.sampled_from(["a", "é", "\U0001f600"])
CLUSTERINGS = st.tuples(st.sampled_from([0.0, 1.5, -math.inf, math.nan]), st.sampled_from([-1, 7]))
TIMESTAMPS = st.integers(1, 4)
# Built once: hypothesis validates a strategy object the first time it draws from it
MAYBE_TIMESTAMPS = st.none() | TIMESTAMPS
MAYBE_VALUES = {name: st.none() | values for name, values in VALUES.items()}


def token_for(partition: str) -> int:
    return {"a": -5, "é": 0, "\U0001f600": 2**62}[partition]


# --- reading ------------------------------------------------------------------------------------------


@st.composite
def stored_rows(draw) -> Row:
    partition = draw(PARTITIONS)
    cells = {}
    for column in REGULAR:
        if draw(st.booleans()):
            cells[column.name] = Cell(draw(MAYBE_VALUES[column.type]), draw(TIMESTAMPS))
    marker, tomb = draw(MAYBE_TIMESTAMPS), draw(MAYBE_TIMESTAMPS)
    if marker is None and tomb is None and not cells:
        marker = 1
    return Row(token_for(partition), (partition, *draw(CLUSTERINGS)), marker, tomb, cells)


def test_an_empty_range_and_a_missing_table_give_typed_empty_tables(store):
    spec = new_table(store)
    store.apply(spec.table_id, [Row(5, ("a", 1.0, 1), marker_ts=1)])
    for table in (bulk.read_token_range(store, spec, 6, 100),
                  bulk.read_token_range(store, TableSpec(uuid.uuid4().hex, KEYS[0], KEYS[1], REGULAR), MIN_TOKEN, MAX_TOKEN)):
        assert table.num_rows == 0 and table.schema == storage_schema(spec)
    assert bulk.count_in_range(store, spec, 6, 100) == 0
    assert bulk.count_in_range(store, spec, 5, 5) == 1


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(stored_rows(), max_size=12), bounds=st.sampled_from([(MIN_TOKEN, MAX_TOKEN), (-5, 0), (1, MAX_TOKEN), (-4, -1)]),
       include_tombstones=st.booleans())
def test_read_returns_exactly_the_rows_of_the_range_in_the_storage_layout(store, rows, bounds, include_tombstones):
    spec = new_table(store)
    try:
        for row in rows:
            store.apply(spec.table_id, [row])
        expected = store.scan(spec.table_id, *bounds, include_tombstones=include_tombstones)
        table = bulk.read_token_range(store, spec, *bounds, include_tombstones=include_tombstones)
        assert table.schema == storage_schema(spec)
        assert [canonical_row(r) for r in table.to_pylist()] == [canonical_row(layout_of(spec, r)) for r in expected]
        assert bulk.count_in_range(store, spec, *bounds, include_tombstones=include_tombstones) == len(expected)
    finally:
        store.drop_table(spec.table_id)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(stored_rows(), max_size=12), bounds=st.sampled_from([(MIN_TOKEN, MAX_TOKEN), (-5, 0), (-4, -1)]))
def test_a_staged_range_is_the_read_range_as_a_parquet_file(store, tmp_path_factory, rows, bounds):
    spec = new_table(store)
    path = tmp_path_factory.mktemp("staged") / "range.parquet"
    try:
        for row in rows:
            store.apply(spec.table_id, [row])
        expected = bulk.read_token_range(store, spec, *bounds)
        assert bulk.stage_token_range(store, spec, *bounds, path) == expected.num_rows
        if expected.num_rows == 0:
            assert not path.exists()
            return
        staged = pq.read_table(path)
        assert staged.schema == storage_schema(spec)
        assert [canonical_row(r) for r in staged.to_pylist()] == [canonical_row(r) for r in expected.to_pylist()]
    finally:
        store.drop_table(spec.table_id)


def test_null_heavy_columns_and_nan_keep_their_types_across_batches(store):
    spec = new_table(store)
    rows = [Row(1, ("a", float(n), n), marker_ts=1) for n in range(10)]
    rows += [Row(1, ("b", math.nan, 1), marker_ts=2, cells={"t": Cell("late", 2), "d": Cell(math.nan, 2),
                                                             "flag": Cell(False, 2), "i": Cell(INT32[0], 2)})]
    store.apply(spec.table_id, rows)
    table = bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN, batch_rows=3)
    assert table.schema == storage_schema(spec)
    last = table.to_pylist()[-1]
    assert (last["c_t"], last["c_flag"], last["c_i"]) == ("late", False, INT32[0])
    assert math.isnan(last["c_d"]) and math.isnan(last["c_k"])
    assert table.column("c_t").null_count == 10


def test_a_read_is_one_snapshot_while_a_writer_rewrites_the_range(store):
    """Every read sees all rows of one generation: a write committed during the read is not half seen."""
    spec = new_table(store, regular=(ColumnSpec("t", "text"),), keys=((ColumnSpec("p", "text"),), ()))
    size = 1500

    def generation(number: int) -> list[Row]:
        return [Row(n, (f"p{n}",), marker_ts=number, cells={"t": Cell(f"g{number}", number)}) for n in range(size)]

    store.apply(spec.table_id, generation(1))
    stop, committed = threading.Event(), []

    def write() -> None:
        while not stop.is_set():
            store.apply(spec.table_id, generation(len(committed) + 2))
            committed.append(True)

    writer = threading.Thread(target=write)
    writer.start()
    seen = []
    try:
        deadline = time.monotonic() + 60
        while (len(seen) < 3 or len(set().union(*seen)) < 2) and time.monotonic() < deadline:
            table = bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN, batch_rows=64)  # streamed in 24 batches
            seen.append(set(table.column("c_t").to_pylist()))
    finally:
        stop.set()
        writer.join()
    assert all(len(values) == 1 for values in seen), [v for v in seen if len(v) > 1]
    assert len(set().union(*seen)) > 1, "the writer never committed during the reads; the test proved nothing"


def test_reads_and_merges_leave_the_stores_own_connections_intact(store):
    """ADBC's SQLite runs in a child process: its connections must never delete the WAL under the store."""
    spec = new_table(store)
    for round_number in range(3):
        store.apply(spec.table_id, [Row(round_number, ("a", 1.0, round_number), marker_ts=1)])
        assert bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN).num_rows == round_number + 1
        view = new_table(store)
        bulk.merge_view_rows(store, view, view_rows(view, [view_row("a", (1.0, 1), 3)]))
        store.apply(view.table_id, [Row(9, ("é", 0.0, 2), marker_ts=1)])
        assert len(store.scan(view.table_id, MIN_TOKEN, MAX_TOKEN)) == 2
        assert store.has_table(spec.table_id) and store.has_table(view.table_id)


# --- merging ------------------------------------------------------------------------------------------


def view_row(partition: str, clustering: tuple, ts: int, **values) -> dict:
    row = {"token": token_for(partition), "c_p": partition, "c_k": clustering[0], "c_n": clustering[1], "ts": ts}
    row.update((value_column_name(c.name), values.get(c.name)) for c in REGULAR)
    return row


def view_rows(spec: TableSpec, rows: list[dict]) -> pa.Table:
    schema = view_rows_schema(spec)
    return pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()


def as_upsert(spec: TableSpec, row: dict) -> Row:
    """The view update the write path sends for a view row (replica.rows.upsert_row)."""
    key = tuple(row[value_column_name(c.name)] for c in spec.key_columns)
    cells = {c.name: Cell(row[value_column_name(c.name)], row["ts"]) for c in spec.regular}
    return Row(row["token"], key, marker_ts=row["ts"], cells=cells)


def apply_one_by_one(store: NodeStore, spec: TableSpec, rows: list[Row]) -> int:
    return sum(store.apply(spec.table_id, [row]).changed for row in rows)


def assert_same_tables(store: NodeStore, merged: TableSpec, applied: TableSpec) -> None:
    left = store.scan(merged.table_id, MIN_TOKEN, MAX_TOKEN, include_tombstones=True)
    right = store.scan(applied.table_id, MIN_TOKEN, MAX_TOKEN, include_tombstones=True)
    assert len(left) == len(right), (left, right)
    for a, b in zip(left, right):
        assert a.token == b.token and same_key(a.key, b.key) and state_equal(a, b), (a, b)
        assert a.view_ts == b.view_ts, (a, b)
        assert canonical_row(layout_of(merged, a)) == canonical_row(layout_of(applied, b))


@st.composite
def merge_rows(draw) -> dict:
    values = {c.name: draw(MAYBE_VALUES[c.type]) for c in REGULAR if draw(st.booleans())}
    return view_row(draw(PARTITIONS), draw(CLUSTERINGS), draw(TIMESTAMPS), **values)


MERGE_ROWS = merge_rows()


@st.composite
def live_rows(draw) -> dict | tuple:
    """A live view update: an upsert (a dict, like merge rows) or a delete ((partition, clustering, ts))."""
    if draw(st.booleans()):
        return draw(MERGE_ROWS)
    return (draw(PARTITIONS), draw(CLUSTERINGS), draw(TIMESTAMPS))


def live_row(spec: TableSpec, row: dict | tuple) -> Row:
    if isinstance(row, dict):
        return as_upsert(spec, row)
    partition, clustering, ts = row
    return Row(token_for(partition), (partition, *clustering), tomb_ts=ts)


OPERATIONS = st.lists(
    st.one_of(st.tuples(st.just("live"), st.lists(live_rows(), min_size=1, max_size=4)),
              st.tuples(st.just("merge"), st.lists(merge_rows(), max_size=8), st.integers(1, 5))),
    min_size=1, max_size=5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS)
def test_merge_equals_applying_the_view_updates_through_the_store(store, operations):
    merged, applied = new_table(store), new_table(store)
    try:
        for operation in operations:
            if operation[0] == "live":
                rows = [live_row(merged, r) for r in operation[1]]
                assert store.apply(merged.table_id, rows).changed == store.apply(applied.table_id, rows).changed
            else:
                _, rows, chunk_rows = operation
                expected = apply_one_by_one(store, applied, [as_upsert(applied, r) for r in rows])
                assert bulk.merge_view_rows(store, merged, view_rows(merged, rows), chunk_rows=chunk_rows) == expected
            assert_same_tables(store, merged, applied)
        everything = [r for o in operations if o[0] == "merge" for r in o[1]]
        assert bulk.merge_view_rows(store, merged, view_rows(merged, everything)) == 0
        assert_same_tables(store, merged, applied)
    finally:
        store.drop_table(merged.table_id)
        store.drop_table(applied.table_id)


WRITES = st.lists(
    st.one_of(st.tuples(st.just("deletes"), st.lists(live_rows().filter(lambda r: isinstance(r, tuple)), min_size=1,
                                                     max_size=3)),
              st.tuples(st.just("writes"), st.lists(merge_rows(), min_size=1, max_size=8))),
    min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=WRITES)
def test_both_statement_shapes_share_the_last_write_wins_rule(store, batches):
    """The same writes, with colliding timestamps, through the upsert of mutations (`apply_columns`) and through the
    merge of view rows leave the same table and count the same changes; row deletions in between."""
    by_mutations, by_view_rows = new_table(store), new_table(store)
    try:
        for kind, rows in batches:
            if kind == "deletes":
                deletes = [live_row(by_mutations, r) for r in rows]
                assert store.apply(by_mutations.table_id, deletes).changed == \
                    store.apply(by_view_rows.table_id, deletes).changed
                continue
            mutations = mutation_table(by_mutations, [as_upsert(by_mutations, r) for r in rows])
            assert store.apply_columns(by_mutations.table_id, mutations).changed == \
                bulk.merge_view_rows(store, by_view_rows, view_rows(by_view_rows, rows))
            assert_same_tables(store, by_view_rows, by_mutations)
    finally:
        store.drop_table(by_mutations.table_id)
        store.drop_table(by_view_rows.table_id)


def test_tie_rules_match_storage_cells(store):
    """Same timestamp: a deletion beats a value; between values the canonical order decides."""
    merged, applied = new_table(store), new_table(store)
    first = [view_row("a", (1.5, 7), 5, t="B", d=-0.0, flag=False, i=3, big=2**40),
             view_row("a", (0.0, 7), 5, t="x", d=1.0)]
    second = [view_row("a", (1.5, 7), 5, t="a", d=0.0, flag=True, i=-3, big=2**40 + 1),
              view_row("a", (0.0, 7), 5, t=None, d=math.nan)]
    for rows in (first, second):
        bulk.merge_view_rows(store, merged, view_rows(merged, rows))
        apply_one_by_one(store, applied, [as_upsert(applied, r) for r in rows])
    assert_same_tables(store, merged, applied)
    by_key = {r.key[1]: r for r in store.scan(merged.table_id, MIN_TOKEN, MAX_TOKEN)}
    assert {n: c.value for n, c in by_key[1.5].cells.items() if c.value is not None} == {
        "t": "a", "d": 0.0, "flag": True, "i": 3, "big": 2**40 + 1}
    assert by_key[0.0].cells["t"].value is None and math.isnan(by_key[0.0].cells["d"].value)


def test_a_newer_live_write_wins_over_the_backfill_and_a_retry_changes_nothing(store):
    view = new_table(store)
    store.apply(view.table_id, [as_upsert(view, view_row("a", (1.5, 7), 20, t="live"))])
    store.apply(view.table_id, [Row(token_for("é"), ("é", 0.0, -1), tomb_ts=20)])
    backfill = view_rows(view, [view_row("a", (1.5, 7), 10, t="old"), view_row("é", (0.0, -1), 10, t="deleted"),
                                view_row("\U0001f600", (1.5, 7), 10, t="new")])
    assert bulk.merge_view_rows(store, view, backfill) == 2  # the deleted row takes the older cells, stays deleted
    assert bulk.merge_view_rows(store, view, backfill) == 0
    live = {r.key[0]: r.cells["t"].value for r in store.scan(view.table_id, MIN_TOKEN, MAX_TOKEN)}
    assert live == {"a": "live", "\U0001f600": "new"}


@pytest.mark.parametrize("column, values", [
    ("i", [0, INT32[0], INT32[1], None]),
    ("big", [MIN_TOKEN, MAX_TOKEN, 0, None]),
    ("at", [MIN_TOKEN, 1_700_000_000_123, None]),
    ("t", ["", "héllo \U0001f600", "\uffff", "a" * 1000, None]),
    ("flag", [True, False, None]),
    ("d", [math.nan, -0.0, 0.0, math.inf, -math.inf, 5e-324, -1.25, 1e308, None]),
])
def test_values_of_every_type_round_trip_through_merge_and_read(store, column, values):
    view = new_table(store)
    rows = [view_row("a", (float(n), 0), 3, **{column: value}) for n, value in enumerate(values)]
    assert bulk.merge_view_rows(store, view, view_rows(view, rows)) == len(values)
    table = bulk.read_token_range(store, view, MIN_TOKEN, MAX_TOKEN)
    read = table.column(value_column_name(column)).to_pylist()
    through_store = [r.cells[column].value for r in store.scan(view.table_id, MIN_TOKEN, MAX_TOKEN)]
    assert [canonical(v) for v in read] == [canonical(v) for v in through_store]
    sqlite_zero = store.url.get_backend_name() == "sqlite"
    assert [canonical(v) for v in read] == [canonical(0.0 if sqlite_zero and v == 0.0 and isinstance(v, float) else v)
                                            for v in values]
    assert table.column(ts_column_name(column)).to_pylist() == [3] * len(values)


def test_large_merges_go_in_chunks_and_count_the_changed_rows(store):
    view = new_table(store, regular=(ColumnSpec("t", "text"),), keys=((ColumnSpec("p", "bigint"),), ()))
    size = 20_000
    rows = pa.table({"token": pa.array([n % 97 for n in range(size)], pa.int64()), "c_p": list(range(size)),
                     "c_t": [str(n) for n in range(size)], "ts": [5] * size})
    assert bulk.merge_view_rows(store, view, rows.slice(0, size // 2), chunk_rows=3_000) == size // 2
    assert bulk.merge_view_rows(store, view, rows, chunk_rows=7_000) == size - size // 2
    assert bulk.count_in_range(store, view, MIN_TOKEN, MAX_TOKEN) == size


def test_bad_input_is_refused(store):
    view = new_table(store)
    good = view_rows(view, [view_row("a", (1.5, 7), 5, t="x")])
    with pytest.raises(ValueError, match="c_t"):
        bulk.merge_view_rows(store, view, good.drop_columns(["c_t"]))
    with pytest.raises(ValueError, match="ts"):
        bulk.merge_view_rows(store, view, good.set_column(good.schema.get_field_index("ts"), "ts", pa.array([None], pa.int64())))
    with pytest.raises(TypeError, match="c_i"):
        bulk.merge_view_rows(store, view, good.set_column(good.schema.get_field_index("c_i"), "c_i", pa.array(["x"])))
    with pytest.raises(KeyError):
        bulk.merge_view_rows(store, TableSpec(uuid.uuid4().hex, KEYS[0], KEYS[1], REGULAR), good)
    assert bulk.merge_view_rows(store, view, good.slice(0, 0)) == 0
    assert store.scan(view.table_id, MIN_TOKEN, MAX_TOKEN, include_tombstones=True) == []


def test_rows_of_one_key_in_one_chunk_apply_in_input_order(store):
    """On PostgreSQL one statement may not touch a row twice: repeated keys go in later rounds."""
    merged, applied = new_table(store), new_table(store)
    rows = [view_row("a", (1.5, 7), ts, t=str(ts)) for ts in (3, 1, 4, 1, 5)] + [view_row("é", (0.0, 7), 2, t="x")]
    expected = apply_one_by_one(store, applied, [as_upsert(applied, r) for r in rows])
    assert bulk.merge_view_rows(store, merged, view_rows(merged, rows)) == expected == 4
    assert_same_tables(store, merged, applied)


def test_live_writes_during_a_merge_are_never_lost(store):
    """Chunks and live writes serialise on the store's writer lock: the newer live cells always win."""
    view = new_table(store, regular=(ColumnSpec("t", "text"),), keys=((ColumnSpec("p", "bigint"),), ()))
    size = 6_000
    backfill = pa.table({"token": [n % 13 for n in range(size)], "c_p": list(range(size)),
                         "c_t": ["backfill"] * size, "ts": [10] * size})
    live_keys = list(range(0, size, 7))

    def write_live() -> None:
        for start in range(0, len(live_keys), 50):
            rows = [Row(n % 13, (n,), marker_ts=20, cells={"t": Cell("live", 20)}) for n in live_keys[start:start + 50]]
            store.apply(view.table_id, rows)

    writer = threading.Thread(target=write_live)
    writer.start()
    bulk.merge_view_rows(store, view, backfill, chunk_rows=500)
    writer.join()
    values = {r.key[0]: r.cells["t"].value for r in store.scan(view.table_id, MIN_TOKEN, MAX_TOKEN)}
    assert values == {n: "live" if n % 7 == 0 else "backfill" for n in range(size)}
