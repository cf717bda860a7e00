"""The Arrow layouts of storage.arrow_layouts: one type per CQL type in every layout, and Row <-> mutation <-> Arrow."""
from __future__ import annotations

import math
import uuid

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.arrow_layouts import (
    conformed,
    mutation_schema,
    mutation_table,
    rows_of_mutations,
    state_schema,
    state_table,
    storage_column_names,
    storage_schema,
    view_rows_schema,
)
from storage.cells import Cell, ColumnSpec, Row, TableSpec
from tests.storage_states import state_tuple

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
VALUES = {
    "int": st.integers(*INT32) | st.sampled_from(INT32),
    "bigint": st.integers(*INT64),
    "timestamp": st.integers(*INT64),
    "double": st.floats() | st.sampled_from([-0.0, math.nan, math.inf]),
    "text": st.text(max_size=4),
    "boolean": st.booleans(),
}
STAMPS = st.integers(*INT64)
KEYS = (ColumnSpec("p", "text"),), (ColumnSpec("k", "double"), ColumnSpec("n", "int"))
REGULAR = (ColumnSpec("i", "int"), ColumnSpec("big", "bigint"), ColumnSpec("t", "text"),
           ColumnSpec("flag", "boolean"), ColumnSpec("d", "double"), ColumnSpec("at", "timestamp"))


@st.composite
def table_specs(draw) -> TableSpec:
    types = st.sampled_from(sorted(VALUES))
    partition = tuple(ColumnSpec(f"p{i}", draw(types)) for i in range(draw(st.integers(1, 2))))
    clustering = tuple(ColumnSpec(f"c{i}", draw(types)) for i in range(draw(st.integers(0, 1))))
    regular = tuple(ColumnSpec(f"r{i}", draw(types)) for i in range(draw(st.integers(0, 4))))
    return TableSpec(uuid.uuid4().hex, partition, clustering, regular)


@st.composite
def mutations_of(draw, spec: TableSpec) -> Row:
    key = tuple(draw(VALUES[c.type]) for c in spec.key_columns)
    cells = {c.name: Cell(draw(st.none() | VALUES[c.type]), draw(STAMPS)) for c in spec.regular if draw(st.booleans())}
    return Row(draw(STAMPS), key, draw(st.none() | STAMPS), draw(st.none() | STAMPS), cells)


@st.composite
def specs_and_rows(draw) -> tuple[TableSpec, list[Row]]:
    spec = draw(table_specs())
    return spec, draw(st.lists(mutations_of(spec), max_size=8))


def comparable(rows: list[Row]) -> list[tuple]:
    """Rows as tuples that compare NaN equal to NaN and tell -0.0 from 0.0 (repr)."""
    return [(r.token, repr(r.key), r.marker_ts, r.tomb_ts, {n: (repr(c.value), c.ts) for n, c in r.cells.items()})
            for r in rows]


def same_table(a: pa.Table, b: pa.Table) -> bool:
    """Equal schemas and values, NaN equal to NaN (Table.equals counts NaN unequal)."""
    return a.schema == b.schema and repr(a.to_pylist()) == repr(b.to_pylist())


def through_ipc(table: pa.Table) -> pa.Table:
    """The table after an Arrow IPC stream, as it travels between nodes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return pa.ipc.open_stream(sink.getvalue()).read_all()


@settings(max_examples=150, deadline=None)
@given(spec_and_rows=specs_and_rows())
def test_rows_round_trip_through_the_mutation_layout_and_arrow_ipc(spec_and_rows):
    spec, rows = spec_and_rows
    table = mutation_table(spec, rows)
    assert table.schema == mutation_schema(spec)
    received = through_ipc(table)
    assert same_table(received, table)
    assert conformed(spec, received) is received, "a table of the layout's types passes as it is"
    assert comparable(rows_of_mutations(spec, received)) == comparable(rows)


@settings(max_examples=60, deadline=None)
@given(spec_and_rows=specs_and_rows())
def test_mutations_with_integers_as_int64_conform_to_the_same_table(spec_and_rows):
    """A sender that types every integer column int64 (as the mutation layout once did) loses nothing."""
    spec, rows = spec_and_rows
    table = mutation_table(spec, rows)
    widened = table.cast(pa.schema([f.with_type(pa.int64()) if pa.types.is_integer(f.type) else f
                                    for f in table.schema]))
    assert same_table(conformed(spec, widened), table)


@settings(max_examples=60, deadline=None)
@given(spec_and_rows=specs_and_rows())
def test_state_tables_hold_the_rows_states_in_the_state_layout(spec_and_rows):
    spec, rows = spec_and_rows
    table = state_table(spec, [state_tuple(spec, row) for row in rows] + [state_tuple(spec, None)])
    assert table.schema == state_schema(spec)
    held = [tuple(map(repr, state.values())) for state in table.to_pylist()]
    assert held == [tuple(map(repr, state_tuple(spec, row))) for row in rows] + [("None",) * len(table.schema)]


@given(spec=table_specs())
def test_every_layout_gives_a_column_the_same_type(spec):
    layouts = (storage_schema(spec), mutation_schema(spec), state_schema(spec), view_rows_schema(spec))
    for column in spec.columns:
        name = f"c_{column.name}"
        assert len({layout.field(name).type for layout in layouts}) == 1, (column, layouts)
    assert storage_schema(spec).names == storage_column_names(spec)
    assert state_schema(spec).names == mutation_schema(spec).names + ["view_ts"]
    assert storage_schema(spec).names[:len(mutation_schema(spec))] == mutation_schema(spec).names


def test_storage_schema_follows_the_spec():
    spec = TableSpec(uuid.uuid4().hex, KEYS[0], KEYS[1], REGULAR)
    schema = storage_schema(spec)
    assert schema.names == ["token", "c_p", "c_k", "c_n", "c_i", "ts_i", "c_big", "ts_big", "c_t", "ts_t",
                            "c_flag", "ts_flag", "c_d", "ts_d", "c_at", "ts_at",
                            "marker_ts", "tomb_ts", "view_ts", "write_ts", "tombstone"]
    types = {name: schema.field(name).type for name in schema.names}
    assert [types[n] for n in ("c_n", "c_i", "c_big", "c_at")] == [pa.int32(), pa.int32(), pa.int64(), pa.int64()]
    assert [types[n] for n in ("c_t", "c_flag", "c_d", "tombstone")] == [pa.string(), pa.bool_(), pa.float64(),
                                                                          pa.bool_()]
    assert view_rows_schema(spec).names == ["token", "c_p", "c_k", "c_n", "c_i", "c_big", "c_t", "c_flag", "c_d",
                                            "c_at", "ts"]


def test_mutations_built_before_a_column_was_added_leave_it_unwritten():
    old = TableSpec("0" * 32, (ColumnSpec("p", "text"),), (), (ColumnSpec("i", "int"),))
    new = TableSpec("0" * 32, (ColumnSpec("p", "text"),), (), (ColumnSpec("i", "int"), ColumnSpec("t", "text")))
    built = mutation_table(old, [Row(1, ("a",), 5, None, {"i": Cell(7, 5)})])
    [row] = rows_of_mutations(new, built)
    assert (row.key, row.marker_ts, dict(row.cells)) == (("a",), 5, {"i": Cell(7, 5)})
    with pytest.raises(ValueError, match=r"lack columns \['c_p'\]"):
        conformed(new, built.drop_columns(["c_p"]))


@pytest.mark.parametrize("value", [INT32[1] + 1, INT32[0] - 1, 2**40])
def test_an_int_beyond_32_bits_is_refused_never_wrapped(value):
    spec = TableSpec("0" * 32, (ColumnSpec("p", "text"),), (), (ColumnSpec("i", "int"),))
    with pytest.raises((OverflowError, pa.ArrowInvalid)):
        mutation_table(spec, [Row(1, ("a",), 5, None, {"i": Cell(value, 5)})])
    wide = pa.table({"token": [1], "c_p": ["a"], "c_i": pa.array([value], pa.int64()), "ts_i": [5],
                     "marker_ts": [5], "tomb_ts": pa.nulls(1, pa.int64())})
    with pytest.raises(ValueError, match="do not fit its columns"):
        conformed(spec, wide)
    with pytest.raises((OverflowError, pa.ArrowInvalid)):
        state_table(spec, [(1, "a", value, 5, 5, None, 6)])
