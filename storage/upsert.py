"""The set-based last-write-wins upsert of base mutations: the merge rule of storage.cells written in SQL.

One statement, `INSERT INTO t AS cur (...) VALUES (...) ON CONFLICT (token, key) DO UPDATE SET ... WHERE ...`,
executed for every mutation of a chunk (`executemany`: the database's own loop, no Python per cell). Bound
per mutation, in table column order (`upsert_columns`): `token`, the key values, per regular column the value
and its timestamp (a NULL timestamp: the mutation does not write that column; a NULL value with a timestamp:
a deletion), `marker_ts`, `tomb_ts`, and the values a new row gets: `view_ts` (= `write_ts`), `write_ts` (the
mutation's highest timestamp) and `tombstone` (not live). On a conflict, as `storage.cells.merge` does:

* each written cell replaces the stored one when it is newer, or at the same timestamp when it is a deletion
  over a value, or the greater value in the canonical order (text by UTF-8 bytes, doubles by totalOrder);
* the marker and the row tombstone keep the highest timestamp, and the row is a tombstone unless its
  marker is newer than its tombstone;
* `write_ts` keeps the highest timestamp, and `view_ts` becomes `storage.cells.next_view_ts`;
* `WHERE`: only when something wins (`storage.cells.changes_state`), so the database's count of changed rows
  is the number of mutations that changed the stored state, and applying a mutation again changes nothing.

Mutations of one key in one chunk apply in order (statements run in order, and on SQLite a statement's several
VALUES rows apply one after the other). An empty mutation (no
marker, tombstone or cell) must be left out by the caller: as a new row it would store nothing.

Mutations also travel as Arrow tables in the **mutation layout** (`mutation_schema`): `token`, `c_<k>` per key
column, `c_<r>` and `ts_<r>` per regular column, `marker_ts`, `tomb_ts`, with the types of `MUTATION_TYPES`.
`arrow_bindings` turns such a table into the bound values (empty mutations left out), `rows_of_mutations` into
`storage.cells.Row`s.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from .cells import Cell, ColumnSpec, Row, TableSpec

ROW_STATE_COLUMNS = ("marker_ts", "tomb_ts", "view_ts", "write_ts", "tombstone")
MUTATION_STATE_COLUMNS = ("marker_ts", "tomb_ts")
ARROW_TYPES = {
    "int": pa.int32(),
    "bigint": pa.int64(),
    "timestamp": pa.int64(),
    "double": pa.float64(),
    "text": pa.string(),
    "boolean": pa.bool_(),
}
MAX_ROWS_PER_STATEMENT = 64  # measured: 64 VALUES rows per statement upsert ~12% more rows/s than one
MAX_BOUND_VALUES = 999  # SQLite's smallest compiled-in limit of bound values per statement
MUTATION_TYPES = dict(ARROW_TYPES, int=pa.int64())  # every integer as stored: a BIGINT column
SQLITE_NAN = "NaN"  # how the store keeps a NaN double on SQLite (SQLite would turn a NaN REAL into NULL)


def value_column_name(name: str) -> str:
    return f"c_{name}"


def ts_column_name(name: str) -> str:
    return f"ts_{name}"


def physical_table_name(table_id: str) -> str:
    return f"t_{table_id}"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def key_column_names(spec: TableSpec) -> list[str]:
    """The SQL primary key: the token, then the key columns."""
    return ["token"] + [value_column_name(c.name) for c in spec.key_columns]


def upsert_columns(spec: TableSpec) -> list[str]:
    """Every SQL column of the table, in table order: the order values are bound in."""
    names = key_column_names(spec)
    for column in spec.regular:
        names += [value_column_name(column.name), ts_column_name(column.name)]
    return names + list(ROW_STATE_COLUMNS)


def greater_sql(column: ColumnSpec, incoming: str, stored: str, sqlite: bool) -> str:
    """SQL for `incoming > stored` in the canonical value order of storage.cells (both non-NULL, same type)."""
    if sqlite:
        return f"{incoming} > {stored}"  # BINARY text = UTF-8 bytes; the text 'NaN' sorts above every REAL
    if column.type == "text":
        return f'{incoming} COLLATE "C" > {stored} COLLATE "C"'
    if column.type == "double":  # PostgreSQL orders NaN above all and -0 = 0; totalOrder puts -0.0 below 0.0
        return (f"({incoming} > {stored} OR ({incoming} = 0 AND {stored} = 0 "
                f"AND CAST({incoming} AS text) = '0' AND CAST({stored} AS text) = '-0'))")
    return f"{incoming} > {stored}"


def _cell_wins(column: ColumnSpec, sqlite: bool) -> str:
    value, ts = quote(value_column_name(column.name)), quote(ts_column_name(column.name))
    greater = greater_sql(column, f"excluded.{value}", f"cur.{value}", sqlite)
    return (f"(excluded.{ts} IS NOT NULL AND (cur.{ts} IS NULL OR excluded.{ts} > cur.{ts} OR "
            f"(excluded.{ts} = cur.{ts} AND cur.{value} IS NOT NULL AND (excluded.{value} IS NULL OR {greater}))))")


def _newer(name: str) -> str:
    return f"(excluded.{name} IS NOT NULL AND (cur.{name} IS NULL OR excluded.{name} > cur.{name}))"


def _highest(name: str) -> str:
    return f"CASE WHEN {_newer(name)} THEN excluded.{name} ELSE cur.{name} END"


def _assignments(spec: TableSpec, sqlite: bool) -> list[str]:
    assignments = []
    for column in spec.regular:
        wins = _cell_wins(column, sqlite)
        for name in (quote(value_column_name(column.name)), quote(ts_column_name(column.name))):
            assignments.append(f"{name} = CASE WHEN {wins} THEN excluded.{name} ELSE cur.{name} END")
    marker, tomb = _highest("marker_ts"), _highest("tomb_ts")  # SET sees the old row: the new values inline
    return assignments + [
        f"marker_ts = {marker}",
        f"tomb_ts = {tomb}",
        f"tombstone = CASE WHEN ({marker}) IS NOT NULL AND (({tomb}) IS NULL OR ({marker}) > ({tomb})) "
        "THEN false ELSE true END",
        "write_ts = CASE WHEN excluded.write_ts > cur.write_ts THEN excluded.write_ts ELSE cur.write_ts END",
        "view_ts = CASE WHEN cur.view_ts IS NULL OR excluded.write_ts > cur.view_ts + 1 "
        "THEN excluded.write_ts ELSE cur.view_ts + 1 END",
    ]


def rows_per_statement(spec: TableSpec, sqlite: bool, constants: int = 0) -> int:
    """Mutations one upsert statement takes on SQLite (its VALUES rows apply one after the other, a repeated key
    included), `constants` of its columns bound once for all of them; 1 on PostgreSQL, which refuses a statement
    that would update one row twice."""
    if not sqlite:
        return 1
    varying = len(upsert_columns(spec)) - constants
    return max(1, min(MAX_ROWS_PER_STATEMENT, (MAX_BOUND_VALUES - constants) // varying))


def upsert_sql(spec: TableSpec, sqlite: bool, rows: int = 1, constants: tuple[int, ...] = ()) -> str:
    """The statement for `rows` mutations, with DB-API positional placeholders (`?` sqlite3, `%s` psycopg).

    `constants` (SQLite only): positions in `upsert_columns` whose one value serves every row of the statement.
    The statement then numbers its parameters: each row's own values first, row after row, then the constants."""
    return _upsert_statement(spec, sqlite, ", ".join(_values_rows(len(upsert_columns(spec)), sqlite, rows, constants)))


def _upsert_statement(spec: TableSpec, sqlite: bool, values: str) -> str:
    columns = upsert_columns(spec)
    changed = " OR ".join([_newer("marker_ts"), _newer("tomb_ts")] + [_cell_wins(c, sqlite) for c in spec.regular])
    return (f"INSERT INTO {quote(physical_table_name(spec.table_id))} AS cur "
            f"({', '.join(quote(n) for n in columns)}) VALUES {values} "
            f"ON CONFLICT ({', '.join(quote(n) for n in key_column_names(spec))}) DO UPDATE SET "
            f"{', '.join(_assignments(spec, sqlite))} WHERE {changed}")


def _values_rows(width: int, sqlite: bool, rows: int, constants: tuple[int, ...]) -> list[str]:
    if not constants:
        return ["(" + ", ".join(["?" if sqlite else "%s"] * width) + ")"] * rows
    if not sqlite:
        raise ValueError("constant columns are bound once per statement on SQLite only")
    varying = [position for position in range(width) if position not in constants]
    numbers = {position: rows * len(varying) + i + 1 for i, position in enumerate(constants)}
    statement_rows = []
    for row in range(rows):
        numbers.update({position: row * len(varying) + i + 1 for i, position in enumerate(varying)})
        statement_rows.append("(" + ", ".join(f"?{numbers[position]}" for position in range(width)) + ")")
    return statement_rows


def replace_sql(spec: TableSpec, sqlite: bool) -> str:
    """Store whole rows already merged (by the caller, under the writer lock): insert, or overwrite every column."""
    columns = upsert_columns(spec)
    keys = key_column_names(spec)
    placeholders = ", ".join(["?" if sqlite else "%s"] * len(columns))
    assignments = ", ".join(f"{quote(n)} = excluded.{quote(n)}" for n in columns if n not in keys)
    return (f"INSERT INTO {quote(physical_table_name(spec.table_id))} ({', '.join(quote(n) for n in columns)}) "
            f"VALUES ({placeholders}) ON CONFLICT ({', '.join(quote(n) for n in keys)}) DO UPDATE SET {assignments}")


# --- the mutation layout in Arrow ------------------------------------------------------------------------


def mutation_schema(spec: TableSpec) -> pa.Schema:
    """The Arrow schema of mutations of `spec`'s table (see the module docstring)."""
    fields = [pa.field("token", pa.int64(), nullable=False)]
    fields += [pa.field(value_column_name(c.name), MUTATION_TYPES[c.type], nullable=False) for c in spec.key_columns]
    for c in spec.regular:
        fields += [pa.field(value_column_name(c.name), MUTATION_TYPES[c.type]),
                   pa.field(ts_column_name(c.name), pa.int64())]
    return pa.schema(fields + [pa.field(name, pa.int64()) for name in MUTATION_STATE_COLUMNS])


def state_schema(spec: TableSpec) -> pa.Schema:
    """The Arrow schema of stored row states: the mutation layout (every column nullable, so a missing row is
    all NULL) plus the row's `view_ts`."""
    fields = [field.with_nullable(True) for field in mutation_schema(spec)]
    return pa.schema(fields + [pa.field("view_ts", pa.int64())])


def state_table(spec: TableSpec, rows: list[tuple]) -> pa.Table:
    """Stored row states, each a tuple of values in `state_schema` order (None for every value of a missing row)."""
    schema = state_schema(spec)
    columns = list(zip(*rows)) if rows else [()] * len(schema)
    return pa.Table.from_arrays([pa.array(values, field.type) for values, field in zip(columns, schema)],
                                schema=schema)


def _stamp_columns(spec: TableSpec, mutations: pa.Table) -> list:
    return [mutations.column(ts_column_name(c.name)) for c in spec.regular] + \
        [mutations.column(name) for name in MUTATION_STATE_COLUMNS]


def _write_ts(spec: TableSpec, mutations: pa.Table) -> pa.ChunkedArray:
    """Each mutation's highest timestamp (NULL for an empty mutation)."""
    stamps = _stamp_columns(spec, mutations)
    return stamps[0] if len(stamps) == 1 else pc.max_element_wise(*stamps, skip_nulls=True)


def _live(mutations: pa.Table) -> pa.ChunkedArray:
    marker, tomb = mutations.column("marker_ts"), mutations.column("tomb_ts")
    newer = pc.or_kleene(pc.is_null(tomb), pc.greater(marker, tomb))
    return pc.fill_null(pc.and_kleene(pc.is_valid(marker), newer), False)


def _bindable(column: pa.ChunkedArray, sqlite: bool) -> list:
    values = column.to_pylist()
    if sqlite and _has_nan(column):
        values = [SQLITE_NAN if v is not None and v != v else v for v in values]
    return values


def _has_nan(column: pa.ChunkedArray) -> bool:
    return pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py()


@dataclass(frozen=True)
class UpsertBindings:
    """What `upsert_sql` binds for a chunk of mutations, by position in `upsert_columns`: for each position of
    `varying`, a value per mutation (`columns`, aligned with `varying`); for each (position, value) of
    `constants`, one value that serves every mutation of the chunk."""

    varying: tuple[int, ...]
    columns: list[list]
    constants: tuple[tuple[int, object], ...] = ()

    @classmethod
    def of_rows(cls, params: list[tuple]) -> UpsertBindings:
        """Bindings of one tuple of values per mutation, every column varying."""
        columns = [list(values) for values in zip(*params)]
        return cls(tuple(range(len(columns))), columns)

    def __len__(self) -> int:
        return len(self.columns[0]) if self.columns else 0

    def statement_params(self, per_statement: int) -> tuple[list[tuple], list[tuple]]:
        """The parameters of the statements for `per_statement` mutations (each row's values then the constants),
        and those of the one-mutation statements for the rest."""
        constants = tuple(value for _, value in self.constants)
        if len(self) < per_statement or per_statement == 1:
            return [], [values + constants for values in zip(*self.columns)]
        width = len(self.columns)
        flat = [None] * (len(self) * width)  # row after row, each row's values in `varying` order
        for position, values in enumerate(self.columns):
            flat[position::width] = values
        whole, step = len(self) // per_statement * per_statement * width, per_statement * width
        return ([tuple(flat[start:start + step]) + constants for start in range(0, whole, step)],
                [tuple(flat[start:start + width]) + constants for start in range(whole, len(flat), width)])


def _constant_value(column: pa.ChunkedArray) -> tuple[bool, object]:
    """(True, the value) when every value of an integer or boolean column is the same (or NULL), else (False, None)."""
    if column.null_count == len(column):
        return True, None
    if column.null_count:
        return False, None
    low, high = pc.min_max(column).values()
    return (True, low.as_py()) if low.as_py() == high.as_py() else (False, None)


def arrow_bindings(spec: TableSpec, mutations: pa.Table, sqlite: bool) -> UpsertBindings:
    """The values `upsert_sql` binds for the non-empty mutations of a mutation-layout table, in token order (a
    stable sort: the mutations of one key keep their order; neighbouring keys make neighbouring B-tree writes).
    On SQLite, timestamp and state columns holding one value for the whole table (the timestamp of one
    statement's execution, the NULL of a row tombstone nobody wrote) are bound once per statement."""
    stamp = _write_ts(spec, mutations)
    if stamp.null_count:
        keep = pc.is_valid(stamp)
        mutations, stamp = mutations.filter(keep), stamp.filter(keep)
    order = pc.sort_indices(mutations.column("token"))
    tombstone = pc.invert(_live(mutations))
    columns = [mutations.column(name) for name in key_column_names(spec)]
    for c in spec.regular:
        columns += [mutations.column(value_column_name(c.name)), mutations.column(ts_column_name(c.name))]
    columns += [mutations.column(name) for name in MUTATION_STATE_COLUMNS] + [stamp, stamp, tombstone]
    first_state = len(key_column_names(spec))
    varying, values, constants = [], [], []
    for position, column in enumerate(columns):
        stamps_or_state = position >= first_state and (pa.types.is_integer(column.type)
                                                        or pa.types.is_boolean(column.type))
        is_constant, constant = _constant_value(column) if sqlite and stamps_or_state else (False, None)
        if is_constant:
            constants.append((position, constant))
            continue
        varying.append(position)
        values.append(_bindable(pc.take(column, order), sqlite))
    return UpsertBindings(tuple(varying), values, tuple(constants))


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
    them: its value and timestamp columns are added as NULLs. Columns the table does not have are dropped."""
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
