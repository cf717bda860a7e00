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

Mutations of one key in one chunk apply in order (each is a statement of its own). An empty mutation (no
marker, tombstone or cell) must be left out by the caller: as a new row it would store nothing.
"""
from __future__ import annotations

from .cells import ColumnSpec, TableSpec

ROW_STATE_COLUMNS = ("marker_ts", "tomb_ts", "view_ts", "write_ts", "tombstone")


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


def upsert_sql(spec: TableSpec, sqlite: bool) -> str:
    """The statement, with DB-API positional placeholders (`?` for sqlite3, `%s` for psycopg)."""
    columns = upsert_columns(spec)
    placeholders = ", ".join(["?" if sqlite else "%s"] * len(columns))
    changed = " OR ".join([_newer("marker_ts"), _newer("tomb_ts")] + [_cell_wins(c, sqlite) for c in spec.regular])
    return (f"INSERT INTO {quote(physical_table_name(spec.table_id))} AS cur "
            f"({', '.join(quote(n) for n in columns)}) VALUES ({placeholders}) "
            f"ON CONFLICT ({', '.join(quote(n) for n in key_column_names(spec))}) DO UPDATE SET "
            f"{', '.join(_assignments(spec, sqlite))} WHERE {changed}")
