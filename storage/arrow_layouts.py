"""The Arrow layouts of a table's rows (storage, mutation, state, view rows) and the Row <-> mutation conversions.

One mapping of CQL types to Arrow types serves every layout (`ARROW_TYPES`): int -> int32 (CQL's 32-bit int,
the Spark INT the token rule hashes as 4 bytes), bigint/timestamp -> int64, double -> float64, text -> string,
boolean -> bool; every timestamp column (cell, marker, tombstone, view, write) is int64 and `token` is int64.
Columns are named as in the store's SQL table: `c_<name>` for a value, `ts_<name>` for a cell's timestamp.

* **storage layout** (`storage_schema`): the SQL table's columns in table order: `token`, `c_<k>` per key column,
  `c_<r>` and `ts_<r>` per regular column (a NULL `ts_<r>` is a cell never written, a NULL value with a
  timestamp a deleted cell), `marker_ts`, `tomb_ts`, `view_ts`, `write_ts`, `tombstone`.
* **mutation layout** (`mutation_schema`): mutations of the table: `token`, `c_<k>` per key column, `c_<r>` and
  `ts_<r>` per regular column (a NULL `ts_<r>`: the mutation does not write that column), `marker_ts`,
  `tomb_ts`. `mutation_table` builds one from `storage.cells.Row`s, `rows_of_mutations` turns one back.
* **state layout** (`state_schema`): stored row states, the mutation layout with every column nullable (a row
  that does not exist is all NULL) plus the row's `view_ts`.
* **view rows layout** (`view_rows_schema`): rows computed for a view table, each an upsert at `ts` of the row
  marker and every regular column: `token`, `c_<k>` per key column, `c_<r>` per regular column, `ts`.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .cells import Cell, Row, TableSpec

ARROW_TYPES = {
    "int": pa.int32(),
    "bigint": pa.int64(),
    "timestamp": pa.int64(),
    "double": pa.float64(),
    "text": pa.string(),
    "boolean": pa.bool_(),
}
TS = "ts"  # the view rows layout's upsert timestamp (the base row's view_ts)
MUTATION_STATE_COLUMNS = ("marker_ts", "tomb_ts")
ROW_STATE_COLUMNS = MUTATION_STATE_COLUMNS + ("view_ts", "write_ts", "tombstone")


def arrow_type(column_type: str) -> pa.DataType:
    """The Arrow type of a value of a column of `column_type`, in every layout."""
    return ARROW_TYPES[column_type]


def value_column_name(name: str) -> str:
    return f"c_{name}"


def ts_column_name(name: str) -> str:
    return f"ts_{name}"


def key_column_names(spec: TableSpec) -> list[str]:
    """The primary key, in the SQL table and in every layout: the token, then the key columns."""
    return ["token"] + [value_column_name(c.name) for c in spec.key_columns]


def storage_column_names(spec: TableSpec) -> list[str]:
    """Every SQL column of the table, in table order (the names of `storage_schema`)."""
    names = key_column_names(spec)
    for column in spec.regular:
        names += [value_column_name(column.name), ts_column_name(column.name)]
    return names + list(ROW_STATE_COLUMNS)


def _key_fields(spec: TableSpec) -> list[pa.Field]:
    fields = [pa.field("token", pa.int64(), nullable=False)]
    return fields + [pa.field(value_column_name(c.name), arrow_type(c.type), nullable=False) for c in spec.key_columns]


def _cell_fields(spec: TableSpec) -> list[pa.Field]:
    """The value and the timestamp field of every regular column."""
    fields = []
    for c in spec.regular:
        fields += [pa.field(value_column_name(c.name), arrow_type(c.type)),
                   pa.field(ts_column_name(c.name), pa.int64())]
    return fields


def mutation_schema(spec: TableSpec) -> pa.Schema:
    """The Arrow schema of mutations of `spec`'s table (see the module docstring)."""
    stamps = [pa.field(name, pa.int64()) for name in MUTATION_STATE_COLUMNS]
    return pa.schema(_key_fields(spec) + _cell_fields(spec) + stamps)


def storage_schema(spec: TableSpec) -> pa.Schema:
    """The Arrow schema of stored rows as the SQL table holds them, in table order."""
    row_state = [pa.field("view_ts", pa.int64()), pa.field("write_ts", pa.int64(), nullable=False),
                 pa.field("tombstone", pa.bool_(), nullable=False)]
    return pa.schema(list(mutation_schema(spec)) + row_state)


def state_schema(spec: TableSpec) -> pa.Schema:
    """The Arrow schema of stored row states: the mutation layout (every column nullable, so a missing row is
    all NULL) plus the row's `view_ts`."""
    fields = [field.with_nullable(True) for field in mutation_schema(spec)]
    return pa.schema(fields + [pa.field("view_ts", pa.int64())])


def view_rows_schema(spec: TableSpec) -> pa.Schema:
    """The Arrow schema of computed view rows: token, key and regular values, and the upsert's `ts`."""
    values = [pa.field(value_column_name(c.name), arrow_type(c.type)) for c in spec.regular]
    return pa.schema(_key_fields(spec) + values + [pa.field(TS, pa.int64(), nullable=False)])


def state_table(spec: TableSpec, rows: list[tuple]) -> pa.Table:
    """Stored row states, each a tuple of values in `state_schema` order (None for every value of a missing row)."""
    schema = state_schema(spec)
    columns = list(zip(*rows)) if rows else [()] * len(schema)
    return pa.Table.from_arrays([pa.array(values, field.type) for values, field in zip(columns, schema)],
                                schema=schema)


def missing_states(spec: TableSpec, count: int) -> pa.Table:
    """The states of `count` rows that do not exist: every value NULL."""
    schema = state_schema(spec)
    return pa.Table.from_arrays([pa.nulls(count, field.type) for field in schema], schema=schema)


def inserted_states(spec: TableSpec, mutations: pa.Table, zero_negative: bool) -> pa.Table:
    """The states conformed `mutations` of distinct rows that did not exist leave (what an upsert stores): the
    mutations themselves, each with view_ts its write_ts (`storage.cells.next_view_ts` of a new row), and with
    `zero_negative` (SQLite keeps -0.0 as 0.0) each double -0.0 as 0.0."""
    schema = state_schema(spec)
    stamps = [mutations.column(name) for name in MUTATION_STATE_COLUMNS]
    stamps += [mutations.column(ts_column_name(column.name)) for column in spec.regular]
    view_ts = pc.max_element_wise(*stamps, skip_nulls=True)
    doubles = {value_column_name(c.name) for c in spec.key_columns + spec.regular if c.type == "double"}
    columns = [_positive_zero(mutations.column(name)) if zero_negative and name in doubles else mutations.column(name)
               for name in schema.names[:-1]]
    return pa.Table.from_arrays(columns + [view_ts], schema=schema)


def _positive_zero(values: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.if_else(pc.equal(values, 0.0), pa.scalar(0.0, values.type), values)


def rows_of_mutations(spec: TableSpec, mutations: pa.Table) -> list[Row]:
    """The mutations of a mutation-layout table as Rows (for the merge in Python of a table with views)."""
    mutations = conformed(spec, mutations)
    tokens = mutations.column("token").to_pylist()
    keys = list(zip(*(mutations.column(value_column_name(c.name)).to_pylist() for c in spec.key_columns)))
    regular = [(c.name, mutations.column(value_column_name(c.name)).to_pylist(),
                mutations.column(ts_column_name(c.name)).to_pylist()) for c in spec.regular]
    markers, tombs = mutations.column("marker_ts").to_pylist(), mutations.column("tomb_ts").to_pylist()
    rows = []
    for i, token in enumerate(tokens):
        cells = {name: Cell(values[i], stamps[i]) for name, values, stamps in regular if stamps[i] is not None}
        rows.append(Row(token, keys[i], markers[i], tombs[i], cells))
    return rows


def mutation_table(spec: TableSpec, rows: list[Row]) -> pa.Table:
    """Rows as a mutation-layout table (the inverse of `rows_of_mutations`)."""
    columns = {"token": [row.token for row in rows]}
    for position, c in enumerate(spec.key_columns):
        columns[value_column_name(c.name)] = [row.key[position] for row in rows]
    for c in spec.regular:
        cells = [row.cells.get(c.name) for row in rows]
        columns[value_column_name(c.name)] = [None if cell is None else cell.value for cell in cells]
        columns[ts_column_name(c.name)] = [None if cell is None else cell.ts for cell in cells]
    columns["marker_ts"] = [row.marker_ts for row in rows]
    columns["tomb_ts"] = [row.tomb_ts for row in rows]
    return pa.Table.from_pydict(columns, schema=mutation_schema(spec))


def conformed(spec: TableSpec, mutations: pa.Table) -> pa.Table:
    """The mutations with exactly the columns and types of `mutation_schema(spec)` (ValueError naming a problem).

    A regular column the mutations lack (they were built with an older version of the table) is not written by
    them: its value and timestamp columns are added as NULLs. Columns the table does not have are dropped. A
    value out of its type's range (an int beyond 32 bits) is refused, never wrapped."""
    schema = mutation_schema(spec)
    if mutations.schema.equals(schema):
        return mutations
    regular = {name for c in spec.regular for name in (value_column_name(c.name), ts_column_name(c.name))}
    missing = [name for name in schema.names if name not in mutations.column_names]
    if any(name not in regular for name in missing):
        raise ValueError(f"mutations of table {spec.table_id} lack columns {[n for n in missing if n not in regular]}")
    for name in missing:
        mutations = mutations.append_column(name, pa.nulls(mutations.num_rows, schema.field(name).type))
    try:
        return mutations.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as error:
        raise ValueError(f"mutations of table {spec.table_id} do not fit its columns: {error}") from None
