"""The last-write-wins merge of storage.cells written in SQL, and the set-based upsert of base mutations with it.

The rule (`last_write_wins_sql`) is one `INSERT INTO t AS cur (...) <rows> ON CONFLICT (token, key) DO UPDATE SET
... WHERE ...` over the table's columns in table order (`storage.arrow_layouts.storage_column_names`), for two
statement shapes: the upsert of base mutations here (`upsert_sql`) and the merge of computed view rows
(`storage.bulk`). On a conflict, as `storage.cells.merge` does:

* each written cell replaces the stored one when it is newer, or at the same timestamp when it is a deletion
  over a value, or the greater value in the canonical order (text by UTF-8 bytes, doubles by totalOrder);
* the marker and the row tombstone keep the highest timestamp, and the row is a tombstone unless its
  marker is newer than its tombstone;
* `write_ts` keeps the highest timestamp, and `view_ts` becomes `storage.cells.next_view_ts`;
* `WHERE`: only when something wins (`storage.cells.changes_state`), so the database's count of changed rows
  is the number of incoming rows that changed the stored state, and applying one again changes nothing.

A mutation may leave any cell, the marker and the tombstone unwritten (NULL timestamps); a view row
(`full_rows`) writes the marker and every cell and never a tombstone, so the statement leaves out the checks
that cannot matter for it (the same rule, a shorter expression per row).

The upsert of mutations: one statement executed for every mutation of a chunk (`executemany`: the database's own
loop, no Python per cell). Bound per mutation, in table column order: `token`, the key values, per regular
column the value and its timestamp (a NULL timestamp: the mutation does not write that column; a NULL value
with a timestamp: a deletion), `marker_ts`, `tomb_ts`, and the values a new row gets: `view_ts` (= `write_ts`),
`write_ts` (the mutation's highest timestamp) and `tombstone` (not live). Mutations of one key in one chunk apply
in order (statements run in order, and on SQLite a statement's several VALUES rows apply one after the other).
An empty mutation (no marker, tombstone or cell) must be left out by the caller: as a new row it would store
nothing. `arrow_bindings` turns a table in the mutation layout (`storage.arrow_layouts`) into the bound values
(empty mutations left out).
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from .arrow_layouts import (
    MUTATION_STATE_COLUMNS,
    key_column_names,
    storage_column_names,
    ts_column_name,
    value_column_name,
)
from .cells import ColumnSpec, TableSpec

MAX_ROWS_PER_STATEMENT = 64  # measured: 64 VALUES rows per statement upsert ~12% more rows/s than one
MAX_BOUND_VALUES = 999  # SQLite's smallest compiled-in limit of bound values per statement
SQLITE_NAN = "NaN"  # how the store keeps a NaN double on SQLite (SQLite would turn a NaN REAL into NULL)


def physical_table_name(table_id: str) -> str:
    return f"t_{table_id}"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


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


# --- the last-write-wins rule ----------------------------------------------------------------------------


def last_write_wins_sql(spec: TableSpec, sqlite: bool, rows: str, *, full_rows: bool) -> str:
    """`INSERT INTO t AS cur (every column) <rows> ON CONFLICT (pk) DO UPDATE SET <winners> WHERE <anything wins>`.

    `rows`: the SQL giving the incoming rows (`VALUES ...` or `SELECT ...`), in `storage_column_names` order.
    `full_rows`: every incoming row writes the marker and every cell, and no tombstone (see the module docstring).
    """
    columns = ", ".join(quote(n) for n in storage_column_names(spec))
    keys = ", ".join(quote(n) for n in key_column_names(spec))
    changed = " OR ".join([_newer(name, full_rows) for name in _incoming_stamps(full_rows)]
                          + [_cell_wins(c, sqlite, full_rows) for c in spec.regular])
    return (f"INSERT INTO {quote(physical_table_name(spec.table_id))} AS cur ({columns}) {rows} "
            f"ON CONFLICT ({keys}) DO UPDATE SET {', '.join(_assignments(spec, sqlite, full_rows))} WHERE {changed}")


def _incoming_stamps(full_rows: bool) -> tuple[str, ...]:
    """The row stamps an incoming row may write: a view row never writes a tombstone."""
    return ("marker_ts",) if full_rows else MUTATION_STATE_COLUMNS


def _if_written(name: str, condition: str, full_rows: bool) -> str:
    """`condition`, for a part that a mutation may leave unwritten (NULL `excluded.<name>`) only where written."""
    return condition if full_rows else f"(excluded.{name} IS NOT NULL AND {condition})"


def _cell_wins(column: ColumnSpec, sqlite: bool, full_rows: bool) -> str:
    """Whether the incoming cell beats the stored one (no stored cell, newer, or the tie rule of storage.cells)."""
    value, ts = quote(value_column_name(column.name)), quote(ts_column_name(column.name))
    greater = greater_sql(column, f"excluded.{value}", f"cur.{value}", sqlite)
    wins = (f"(cur.{ts} IS NULL OR excluded.{ts} > cur.{ts} OR "
            f"(excluded.{ts} = cur.{ts} AND cur.{value} IS NOT NULL AND (excluded.{value} IS NULL OR {greater})))")
    return _if_written(ts, wins, full_rows)


def _newer(name: str, full_rows: bool) -> str:
    return _if_written(name, f"(cur.{name} IS NULL OR excluded.{name} > cur.{name})", full_rows)


def _highest(name: str, full_rows: bool) -> str:
    return f"CASE WHEN {_newer(name, full_rows)} THEN excluded.{name} ELSE cur.{name} END"


def _assignments(spec: TableSpec, sqlite: bool, full_rows: bool) -> list[str]:
    assignments = []
    for column in spec.regular:
        wins = _cell_wins(column, sqlite, full_rows)
        for name in (quote(value_column_name(column.name)), quote(ts_column_name(column.name))):
            assignments.append(f"{name} = CASE WHEN {wins} THEN excluded.{name} ELSE cur.{name} END")
    marker = _highest("marker_ts", full_rows)  # SET sees the old row: the new values inline
    return assignments + [f"marker_ts = {marker}"] + _tombstone_assignments(marker, full_rows) + [
        "write_ts = CASE WHEN excluded.write_ts > cur.write_ts THEN excluded.write_ts ELSE cur.write_ts END",
        "view_ts = CASE WHEN cur.view_ts IS NULL OR excluded.write_ts > cur.view_ts + 1 "
        "THEN excluded.write_ts ELSE cur.view_ts + 1 END",
    ]


def _tombstone_assignments(marker: str, full_rows: bool) -> list[str]:
    """The row tombstone's timestamp and the tombstone flag: a tombstone unless the marker is newer."""
    if full_rows:  # the marker is written, the stored tombstone stays
        return [f"tombstone = CASE WHEN cur.tomb_ts IS NULL OR {marker} > cur.tomb_ts THEN false ELSE true END"]
    tomb = _highest("tomb_ts", full_rows)
    return [f"tomb_ts = {tomb}",
            f"tombstone = CASE WHEN ({marker}) IS NOT NULL AND (({tomb}) IS NULL OR ({marker}) > ({tomb})) "
            "THEN false ELSE true END"]


# --- the upsert of mutations -----------------------------------------------------------------------------


def rows_per_statement(spec: TableSpec, sqlite: bool, constants: int = 0) -> int:
    """Mutations one upsert statement takes on SQLite (its VALUES rows apply one after the other, a repeated key
    included), `constants` of its columns bound once for all of them; 1 on PostgreSQL, which refuses a statement
    that would update one row twice."""
    if not sqlite:
        return 1
    varying = len(storage_column_names(spec)) - constants
    return max(1, min(MAX_ROWS_PER_STATEMENT, (MAX_BOUND_VALUES - constants) // varying))


def upsert_sql(spec: TableSpec, sqlite: bool, rows: int = 1, constants: tuple[int, ...] = ()) -> str:
    """The statement for `rows` mutations, with DB-API positional placeholders (`?` sqlite3, `%s` psycopg).

    `constants` (SQLite only): positions in `storage_column_names` whose one value serves every row of the
    statement. The statement then numbers its parameters: each row's own values first, row after row, then the
    constants."""
    values = ", ".join(_values_rows(len(storage_column_names(spec)), sqlite, rows, constants))
    return last_write_wins_sql(spec, sqlite, f"VALUES {values}", full_rows=False)


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
    columns = storage_column_names(spec)
    keys = key_column_names(spec)
    placeholders = ", ".join(["?" if sqlite else "%s"] * len(columns))
    assignments = ", ".join(f"{quote(n)} = excluded.{quote(n)}" for n in columns if n not in keys)
    return (f"INSERT INTO {quote(physical_table_name(spec.table_id))} ({', '.join(quote(n) for n in columns)}) "
            f"VALUES ({placeholders}) ON CONFLICT ({', '.join(quote(n) for n in keys)}) DO UPDATE SET {assignments}")


# --- binding a mutation-layout table ---------------------------------------------------------------


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
    """What `upsert_sql` binds for a chunk of mutations, by position in `storage_column_names`: for each position of
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
