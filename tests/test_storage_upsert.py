"""The set-based SQL upsert (storage.upsert) against the Python merge of storage.cells, on SQLite and PostgreSQL.

A store merges a batch set-based when no `derive` is given (a table without views) and fetches and merges in
Python when one is; both must leave the same rows (cells, marker, tombstone, view_ts) and count the same
changes, for random histories applied in any order and any batching, ties, deletions and NaN included.
"""
from __future__ import annotations

import math
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.arrow_layouts import mutation_table, state_schema
from storage.cells import Cell, ColumnSpec, Row, TableSpec
from storage.upsert import UpsertBindings, upsert_sql
from tests.storage_states import state_tuple
from tests.strength import fast_and_deep

MIN_TOKEN, MAX_TOKEN = -(2**63), 2**63 - 1

REGULAR = (
    ColumnSpec("i", "int"),
    ColumnSpec("t", "text"),
    ColumnSpec("flag", "boolean"),
    ColumnSpec("d", "double"),
)
VALUES = {
    "i": st.integers(-(2**31), 2**31 - 1) | st.sampled_from([0, 1, -1, -(2**31), 2**31 - 1]),
    "t": st.sampled_from(["", "B", "a", "é", "😀", "ab"]),  # PostgreSQL text holds no NUL
    "flag": st.booleans(),
    "d": st.sampled_from([math.nan, math.inf, -math.inf, 1.5, -2.0, 5e-324, 0.0, -0.0]),
}
STAMPS = st.integers(1, 5)  # few timestamps: many ties
# Built once: hypothesis validates a strategy object the first time it draws from it
KEYS = st.sampled_from([("a", 1), ("a", 2), ("b", 1)])
COLUMN_SETS = st.lists(st.sampled_from([c.name for c in REGULAR]), unique=True, max_size=4)
MAYBE_VALUES = {column: st.none() | values for column, values in VALUES.items()}
MAYBE_STAMPS = st.none() | STAMPS


@st.composite
def mutations(draw) -> Row:
    key = draw(KEYS)
    cells = {}
    for column in draw(COLUMN_SETS):
        value = draw(MAYBE_VALUES[column])
        cells[column] = Cell(value, draw(STAMPS))
    marker_ts = draw(MAYBE_STAMPS)
    tomb_ts = draw(MAYBE_STAMPS)
    if marker_ts is None and tomb_ts is None and not cells:
        marker_ts = draw(STAMPS)
    return Row(hash(key[0]) % 1000, key, marker_ts, tomb_ts, cells)


def fresh_table(store) -> TableSpec:
    spec = TableSpec(uuid.uuid4().hex, (ColumnSpec("p", "text"),), (ColumnSpec("c", "bigint"),), REGULAR)
    store.ensure_table(spec)
    return spec


def python_merge(_changes):
    return []  # a derive makes the store fetch and merge in Python (and queue nothing)


def stored(store, spec: TableSpec) -> list[tuple]:
    def comparable(value):
        return "NaN" if isinstance(value, float) and math.isnan(value) else value

    return [(row.token, row.key, row.marker_ts, row.tomb_ts, row.view_ts,
             sorted((name, comparable(cell.value), cell.ts) for name, cell in row.cells.items()))
            for row in store.scan(spec.table_id, MIN_TOKEN, MAX_TOKEN, include_tombstones=True)]


def the_sql_upsert_leaves_what_the_python_merge_leaves(store, history, batch):
    in_sql, in_arrow, in_python = fresh_table(store), fresh_table(store), fresh_table(store)
    try:
        for start in range(0, len(history), batch):
            chunk = history[start:start + batch]
            by_sql = store.apply(in_sql.table_id, chunk).changed
            by_arrow = store.apply_columns(in_arrow.table_id, mutation_table(in_arrow, chunk)).changed
            by_python = store.apply(in_python.table_id, chunk, python_merge).changed
            assert by_sql == by_arrow == by_python, chunk
        assert stored(store, in_sql) == stored(store, in_arrow) == stored(store, in_python)
        assert store.apply(in_sql.table_id, history).changed == 0, "the same mutations again change nothing"
    finally:
        for spec in (in_sql, in_arrow, in_python):
            store.drop_table(spec.table_id)


test_the_sql_upsert_leaves_what_the_python_merge_leaves, \
    test_the_sql_upsert_leaves_what_the_python_merge_leaves_in_60_examples = fast_and_deep(
        the_sql_upsert_leaves_what_the_python_merge_leaves, 20, 60,
        given(history=st.lists(mutations(), min_size=1, max_size=12), batch=st.integers(1, 5)),
        deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_a_mutation_that_writes_no_column_leaves_the_other_cells_alone(store):
    spec = fresh_table(store)
    store.apply(spec.table_id, [Row(1, ("a", 1), 5, None, {"i": Cell(7, 5), "t": Cell("x", 5)})])
    assert store.apply(spec.table_id, [Row(1, ("a", 1), None, 3, {})]).changed == 1  # an older row tombstone
    [row] = store.scan(spec.table_id, MIN_TOKEN, MAX_TOKEN)
    assert (row.marker_ts, row.tomb_ts, dict(row.cells)) == (5, 3, {"i": Cell(7, 5), "t": Cell("x", 5)})
    assert row.view_ts == 6, "a change bumps view_ts past the last one"


def test_the_statement_binds_one_placeholder_per_column_for_each_driver():
    spec = TableSpec(uuid.uuid4().hex, (ColumnSpec("p", "text"),), (), REGULAR)
    columns = 1 + 1 + 2 * len(REGULAR) + 5
    assert upsert_sql(spec, sqlite=True).count("?") == columns
    assert upsert_sql(spec, sqlite=False).count("%s") == columns


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow, HealthCheck.data_too_large])
@given(history=st.lists(mutations(), min_size=60, max_size=200))
def test_many_mutations_with_repeated_keys_in_one_batch_apply_in_order(store, history):
    """Past `rows_per_statement`, SQLite takes several mutations per statement: a key repeated inside one
    statement must still merge as if applied one by one."""
    assert_columns_merge_like_python(store, [], history)


def assert_columns_merge_like_python(store, earlier: list[Row], chunk: list[Row]) -> None:
    """Over the state `earlier` leaves, `chunk` applied as columns (SQL upsert) and as rows merged in Python
    changes as many rows and leaves the same rows."""
    in_sql, in_python = fresh_table(store), fresh_table(store)
    try:
        for spec in (in_sql, in_python):
            store.apply(spec.table_id, earlier, python_merge)
        by_sql = store.apply_columns(in_sql.table_id, mutation_table(in_sql, chunk)).changed
        by_python = store.apply(in_python.table_id, chunk, python_merge).changed
        assert by_sql == by_python
        assert stored(store, in_sql) == stored(store, in_python)
    finally:
        store.drop_table(in_sql.table_id)
        store.drop_table(in_python.table_id)


def at_one_timestamp(mutation: Row, stamp: int) -> Row:
    """The mutation as one execution of an INSERT or UPDATE writes it: every timestamp the same, no tombstone."""
    cells = {name: Cell(cell.value, stamp) for name, cell in mutation.cells.items()}
    return Row(mutation.token, mutation.key, stamp if mutation.marker_ts or not cells else None, None, cells)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow, HealthCheck.data_too_large])
@given(earlier=st.lists(mutations(), max_size=12), history=st.lists(mutations(), min_size=65, max_size=150),
       stamp=STAMPS)
def test_a_chunk_at_one_timestamp_binds_its_stamps_once_and_merges_like_python(store, earlier, history, stamp):
    """Columns holding one value for the whole chunk (an execution's timestamp, no tombstone) are bound once per
    statement; over any earlier state, with keys repeated inside a statement, the rows are still those of the
    Python merge."""
    assert_columns_merge_like_python(store, earlier, [at_one_timestamp(mutation, stamp) for mutation in history])


def test_constant_columns_are_numbered_after_every_row_of_the_statement():
    spec = TableSpec(uuid.uuid4().hex, (ColumnSpec("p", "text"),), (), (ColumnSpec("i", "int"),))
    sql = upsert_sql(spec, sqlite=True, rows=2, constants=(3, 4))  # ts_i and marker_ts
    values = sql[sql.index(" VALUES ") + len(" VALUES "):sql.index(" ON CONFLICT")]
    assert values == "(?1, ?2, ?3, ?15, ?16, ?4, ?5, ?6, ?7), (?8, ?9, ?10, ?15, ?16, ?11, ?12, ?13, ?14)"
    with pytest.raises(ValueError, match="SQLite only"):
        upsert_sql(spec, sqlite=False, constants=(3,))


def test_the_row_path_refuses_an_int_beyond_32_bits_as_the_arrow_layouts_do(store):
    spec = fresh_table(store)
    with pytest.raises(TypeError, match="cannot hold 2147483648"):
        store.apply(spec.table_id, [Row(1, ("a", 1), 5, None, {"i": Cell(2**31, 5)})])
    assert store.apply(spec.table_id, [Row(1, ("a", 1), 5, None, {"i": Cell(2**31 - 1, 5)})]).changed == 1


def comparable_state(state: tuple) -> tuple:
    return tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in state)


@pytest.mark.parametrize("doubles", [True, False])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(mutations(), min_size=1, max_size=12), batch=st.integers(1, 6), nan_key=st.booleans())
def test_the_columnar_derive_sees_each_changed_row_once_before_and_after(store, history, batch, nan_key, doubles):
    """`apply_columns(derive=...)` hands over, for every row the batch changed, its state before the batch and after
    it (found by a join with the batch's keys, a double key holding NaN included; without a double column, rows new
    to the store as the batch gave them); unchanged rows are left out."""
    if doubles:
        spec = TableSpec(uuid.uuid4().hex, (ColumnSpec("p", "text"),), (ColumnSpec("c", "double"),), REGULAR)
        keys = {("a", 1): ("a", math.nan if nan_key else 1.0), ("a", 2): ("a", 2.0), ("b", 1): ("b", -0.0)}
    else:
        spec = TableSpec(uuid.uuid4().hex, (ColumnSpec("p", "text"),), (ColumnSpec("c", "int"),),
                         tuple(c for c in REGULAR if c.type != "double"))
        keys = {("a", 1): ("a", 1), ("a", 2): ("a", 2), ("b", 1): ("b", 0)}
    store.ensure_table(spec)
    names = {c.name for c in spec.regular}
    history = [Row(m.token, keys[m.key], m.marker_ts if m.marker_ts or m.tomb_ts or names & set(m.cells) else 1,
                   m.tomb_ts, {c: cell for c, cell in m.cells.items() if c in names}) for m in history]
    seen = []

    def derive(before, after):
        seen.append((before.to_pylist(), after.to_pylist()))
        return []

    def states() -> dict:
        rows = store.scan(spec.table_id, MIN_TOKEN, MAX_TOKEN, include_tombstones=True)
        return {comparable_state((r.token, *r.key)): comparable_state(state_tuple(spec, r)) for r in rows}

    names = state_schema(spec).names
    try:
        for start in range(0, len(history), batch):
            old, seen[:] = states(), []
            result = store.apply_columns(spec.table_id, mutation_table(spec, history[start:start + batch]), derive)
            new = states()
            changed = {key for key in new if old.get(key) != new[key]}
            if not result.changed:
                assert not seen and not changed
                continue
            [(before, after)] = seen
            by_key = {}
            for was, now in zip(before, after):
                state = comparable_state(tuple(now[n] for n in names))
                by_key[state[:3]] = (comparable_state(tuple(was[n] for n in names)), state)
            assert set(by_key) == changed
            for key, (was, now) in by_key.items():
                assert now == new[key]
                assert was == old.get(key, comparable_state(state_tuple(spec, None)))
    finally:
        store.drop_table(spec.table_id)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(), st.text(max_size=3), st.none() | st.floats(allow_nan=False)),
                     max_size=40),
       per_statement=st.integers(1, 9), constants=st.lists(st.none() | st.integers(0, 9), max_size=3))
def test_statement_parameters_hold_every_row_in_order_grouped_then_one_by_one(rows, per_statement, constants):
    bindings = UpsertBindings((0, 1, 2), [list(column) for column in zip(*rows)] if rows else [[], [], []],
                              tuple((3 + i, value) for i, value in enumerate(constants)))
    grouped, single = bindings.statement_params(per_statement)
    tail = tuple(constants)
    assert all(params[len(params) - len(tail):] == tail for params in grouped + single)
    flattened = [value for params in grouped for value in params[:len(params) - len(tail)]]
    whole = 0 if len(rows) < per_statement or per_statement == 1 else len(rows) // per_statement * per_statement
    assert all(len(params) == per_statement * 3 + len(tail) for params in grouped)
    assert flattened == [value for row in rows[:whole] for value in row]
    assert [params[:3] for params in single] == rows[whole:]
