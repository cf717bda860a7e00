"""One table's SQL table (`PhysicalTable`: columns, Row <-> SQL rows, upserts, keyed fetches) and its spec as JSON."""
from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow as pa
import sqlalchemy as sa

from .arrow_layouts import ts_column_name, value_column_name
from .cells import Cell, CellMap, ColumnSpec, Row, TableSpec, is_live, write_ts
from .store_types import bindable, check_identifier, check_token, coerce_value, lookup_key, negative_zero, sql_type
from .upsert import (
    SQLITE_NAN,
    UpsertBindings,
    physical_table_name,
    quote,
    replace_sql,
    rows_per_statement,
    upsert_sql,
)


def deleted(table: sa.Table) -> sa.ColumnElement[bool]:
    """The condition of a deleted row, written exactly as the tombstone index's (so that the index serves it)."""
    return table.c.tombstone == sa.true()


def tombstone_index_name(table_id: str) -> str:
    return f"{physical_table_name(table_id)}_tombstones"


def spec_to_json(spec: TableSpec) -> str:
    def columns(cols: tuple[ColumnSpec, ...]) -> list[list[str]]:
        return [[c.name, c.type] for c in cols]

    return json.dumps({
        "table_id": spec.table_id,
        "partition_key": columns(spec.partition_key),
        "clustering_key": columns(spec.clustering_key),
        "regular": columns(spec.regular),
    })


def spec_from_json(text: str) -> TableSpec:
    data = json.loads(text)

    def columns(name: str) -> tuple[ColumnSpec, ...]:
        return tuple(ColumnSpec(n, t) for n, t in data[name])

    return TableSpec(data["table_id"], columns("partition_key"), columns("clustering_key"), columns("regular"))


class PhysicalTable:
    """The SQL table holding one TableSpec's rows, and the conversions between Row and SQL rows."""

    def __init__(self, spec: TableSpec) -> None:
        for column in spec.columns:
            check_identifier(ts_column_name(column.name))
        self.spec = spec
        self.regular_names = tuple(column.name for column in spec.regular)
        self.regular_columns = {column.name: column for column in spec.regular}
        self.table = self._build_table(spec)
        self.key_columns = [self.table.c.token] + [self.table.c[value_column_name(c.name)] for c in spec.key_columns]
        self._double_names = tuple(c.name for c in spec.regular if c.type == "double")
        self._double_key = any(c.type == "double" for c in spec.key_columns)
        self._keys_table = sa.Table(f"keys_{physical_table_name(spec.table_id)}", sa.MetaData(),
                                    *(sa.Column(c.name, c.type) for c in self.key_columns))
        self._upsert_sql: dict[tuple[bool, int, tuple[int, ...]], str] = {}
        self._replace_sql: dict[bool, str] = {}
        self._rows_per_statement: dict[tuple[bool, int], int] = {}

    @staticmethod
    def _build_table(spec: TableSpec) -> sa.Table:
        columns = [sa.Column("token", sa.BigInteger, primary_key=True, autoincrement=False)]
        columns += [
            sa.Column(value_column_name(c.name), sql_type(c.type, is_key=True), primary_key=True, autoincrement=False)
            for c in spec.key_columns
        ]
        for c in spec.regular:
            columns.append(sa.Column(value_column_name(c.name), sql_type(c.type, is_key=False)))
            columns.append(sa.Column(ts_column_name(c.name), sa.BigInteger))
        columns += [
            sa.Column("marker_ts", sa.BigInteger),
            sa.Column("tomb_ts", sa.BigInteger),
            sa.Column("view_ts", sa.BigInteger),
            sa.Column("write_ts", sa.BigInteger, nullable=False),
            sa.Column("tombstone", sa.Boolean, nullable=False),
        ]
        table = sa.Table(physical_table_name(spec.table_id), sa.MetaData(), *columns, sqlite_with_rowid=False)
        # Deleted rows alone, by token: a range's live rows are then its rows less these, counted without reading
        # a single row (storage.reads.count_live).
        sa.Index(tombstone_index_name(spec.table_id), table.c.token, sqlite_where=deleted(table),
                 postgresql_where=deleted(table))
        return table

    def normalise(self, mutation: Row) -> Row:
        """The mutation with type-checked key and cell values (the same object when nothing needed converting)."""
        check_token(mutation.token)
        key = self.full_key(mutation.key)
        cells = {name: self._normalised_cell(name, cell) for name, cell in mutation.cells.items()}
        unchanged_key = all(new is old for new, old in zip(key, mutation.key))
        if unchanged_key and all(cells[name] is cell for name, cell in mutation.cells.items()):
            return mutation
        return Row(mutation.token, key, mutation.marker_ts, mutation.tomb_ts, CellMap(cells), mutation.view_ts)

    def _normalised_cell(self, name: str, cell: Cell) -> Cell:
        column = self.regular_columns.get(name)
        if column is None:
            raise KeyError(f"table {self.spec.table_id} has no regular column {name!r}")
        value = coerce_value(column, cell.value)
        return cell if value is cell.value else Cell(value, cell.ts)

    def as_sqlite_stores(self, mutation: Row) -> Row:
        """The mutation with each -0.0 cell value as 0.0, what SQLite stores for it, so a merge in Python agrees with
        the SQL upsert on a tie between -0.0 and 0.0 (the same object when the table has no such value)."""
        if not self._double_names or not any(negative_zero(mutation.cells.get(n)) for n in self._double_names):
            return mutation
        cells = {name: Cell(0.0, cell.ts) if negative_zero(cell) else cell for name, cell in mutation.cells.items()}
        return Row(mutation.token, mutation.key, mutation.marker_ts, mutation.tomb_ts, cells, mutation.view_ts)

    def coerce_key(self, values: tuple, columns: tuple[ColumnSpec, ...]) -> tuple:
        values = tuple(values)
        if len(values) > len(columns):
            raise ValueError(f"key {values!r} has more components than columns {[c.name for c in columns]}")
        for column, value in zip(columns, values):
            if value is None:
                raise ValueError(f"key column {column.name!r} cannot be null")
        return tuple(coerce_value(column, value) for column, value in zip(columns, values))

    def full_key(self, values: tuple) -> tuple:
        key = self.coerce_key(values, self.spec.key_columns)
        if len(key) != len(self.spec.key_columns):
            raise ValueError(f"key {values!r} must have {len(self.spec.key_columns)} components")
        return key

    def to_params(self, row: Row) -> dict[str, object]:
        params: dict[str, object] = {"token": row.token}
        for column, value in zip(self.spec.key_columns, row.key):
            params[value_column_name(column.name)] = value
        for name in self.regular_names:
            cell = row.cells.get(name)
            params[value_column_name(name)] = None if cell is None else cell.value
            params[ts_column_name(name)] = None if cell is None else cell.ts
        params.update(
            marker_ts=row.marker_ts,
            tomb_ts=row.tomb_ts,
            view_ts=row.view_ts,
            write_ts=write_ts(row),
            tombstone=not is_live(row),
        )
        return params

    def upsert_sql(self, sqlite: bool, rows: int = 1, constants: tuple[int, ...] = ()) -> str:
        sql = self._upsert_sql.get((sqlite, rows, constants))
        if sql is None:
            sql = self._upsert_sql[(sqlite, rows, constants)] = upsert_sql(self.spec, sqlite, rows, constants)
        return sql

    def upsert_statements(self, bindings: UpsertBindings, sqlite: bool) -> list[tuple[str, list[tuple]]]:
        """The (statement, parameter sets) that upsert `bindings`: as many mutations per statement as it takes,
        then the rest one per statement (prepared before the write transaction, which they keep short)."""
        if not len(bindings):
            return []
        constants = tuple(position for position, _ in bindings.constants)
        per_statement = self._rows_per_statement.get((sqlite, len(constants)))
        if per_statement is None:
            per_statement = self._rows_per_statement[(sqlite, len(constants))] = \
                rows_per_statement(self.spec, sqlite, len(constants))
        grouped, single = bindings.statement_params(per_statement)
        statements = [(self.upsert_sql(sqlite, per_statement, constants), grouped)] if grouped else []
        return statements + ([(self.upsert_sql(sqlite, 1, constants), single)] if single else [])

    def replace_sql(self, sqlite: bool) -> str:
        sql = self._replace_sql.get(sqlite)
        if sql is None:
            sql = self._replace_sql[sqlite] = replace_sql(self.spec, sqlite)
        return sql

    def upsert_params(self, row: Row, sqlite: bool) -> tuple:
        """The values `upsert_sql` binds for a (normalised, non-empty) mutation, in table column order."""
        return self._bound(row, write_ts(row), sqlite)

    def replace_params(self, row: Row, sqlite: bool) -> tuple:
        """The values `replace_sql` binds for a merged row (its own view_ts), in table column order."""
        return self._bound(row, row.view_ts, sqlite)

    def _bound(self, row: Row, view_ts: int | None, sqlite: bool) -> tuple:
        nan = SQLITE_NAN if sqlite else None
        params = [row.token, *(bindable(v, nan) for v in row.key)]
        cells = row.cells
        for name in self.regular_names:
            cell = cells.get(name)
            params += (None, None) if cell is None else (bindable(cell.value, nan), cell.ts)
        params += (row.marker_ts, row.tomb_ts, view_ts, write_ts(row), not is_live(row))
        return tuple(params)

    def from_sql(self, values: Sequence[object]) -> Row:
        """A Row from a `select(self.table)` result row (columns in table order)."""
        key_end = len(self.key_columns)
        cells = {}
        position = key_end
        for name in self.regular_names:
            value, ts = values[position], values[position + 1]
            if ts is not None:
                cells[name] = Cell(value, ts)
            position += 2
        marker_ts, tomb_ts, view_ts = values[position:position + 3]
        return Row(values[0], tuple(values[1:key_end]), marker_ts, tomb_ts, CellMap(cells), view_ts)

    def key_equals(self, token: int, key: tuple) -> list[sa.ColumnElement[bool]]:
        return [column == value for column, value in zip(self.key_columns, (token, *key))]

    def fetch(self, conn: sa.Connection, keys: Sequence[tuple[int, tuple]]) -> dict[tuple, Row]:
        """The stored rows (tombstones included) for the given (token, key) pairs, by lookup key."""
        found: dict[tuple, Row] = {}
        for values in self._select_keyed(conn, list(self.table.columns), [(token, *key) for token, key in keys]):
            row = self.from_sql(values)
            found[lookup_key(row.token, row.key)] = row
        return found

    def _select_keyed(self, conn: sa.Connection, columns: list, keys: Sequence[tuple] | None) -> Sequence[sa.Row]:
        """`columns` of the stored rows whose (token, *key) is one of `keys`, in the caller's write transaction
        (None: the keys of this connection's previous call, still in its temporary table).

        The keys go into a temporary table of this connection with one bound executemany and the rows come from a
        join with it: one statement whatever the number of keys, compiled once (an IN list of 5,000 row values
        cost SQLAlchemy 40 ms of compiling per statement, 20 times the query itself).
        """
        if keys is not None:
            self._load_keys(conn, keys)
        keyed = self._keys_table
        joined = self.table.join(keyed, sa.and_(*(stored == wanted for stored, wanted
                                                  in zip(self.key_columns, keyed.columns))))
        return _plain_rows(conn, sa.select(*columns).select_from(joined), columns)

    def _load_keys(self, conn: sa.Connection, keys: Sequence[tuple]) -> None:
        sqlite = conn.dialect.name == "sqlite"
        keyed = self._keys_table
        names = ", ".join(quote(c.name) for c in keyed.columns)
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS {quote(keyed.name)} AS "
                             f"SELECT {names} FROM {quote(self.table.name)} WHERE 1 = 0")
        conn.exec_driver_sql(f"DELETE FROM {quote(keyed.name)}")
        if sqlite and self._double_key:
            keys = [tuple(bindable(v, SQLITE_NAN) for v in key) for key in keys]
        placeholders = ", ".join(["?" if sqlite else "%s"] * len(keyed.columns))
        conn.exec_driver_sql(f"INSERT INTO {quote(keyed.name)} ({names}) VALUES ({placeholders})", list(keys))

    def keys_of(self, mutations: pa.Table) -> list[tuple]:
        """The distinct (token, *key) tuples of a conformed mutation-layout table, in first-seen order."""
        names = ["token"] + [value_column_name(c.name) for c in self.spec.key_columns]
        rows = zip(*(mutations.column(name).to_pylist() for name in names))
        return list({self._state_lookup(row): row for row in rows}.values())

    def fetch_states(self, conn: sa.Connection, keys: Sequence[tuple] | None) -> dict[tuple, tuple]:
        """The stored state (`storage.arrow_layouts.state_schema` order) of each of the (token, *key) rows that exists,
        by lookup key (keys None: those of this connection's previous fetch, in the same transaction)."""
        key_end = len(self.key_columns)
        columns = list(self.table.columns)[:-2]  # up to view_ts: write_ts and tombstone follow from the rest
        rows = self._select_keyed(conn, columns, keys)
        return {self._state_lookup(values[:key_end]): tuple(values) for values in rows}

    def _state_lookup(self, key: tuple) -> tuple:
        """A dict key for a (token, *key) tuple: the tuple itself, NaN made equal to NaN where a key is a double."""
        return lookup_key(key[0], key[1:]) if self._double_key else tuple(key)

    def write(self, conn: sa.Connection, rows: list[Row], sqlite: bool) -> None:
        """Store merged rows (inserted or overwritten whole), in the caller's write transaction."""
        if rows:
            conn.exec_driver_sql(self.replace_sql(sqlite), [self.replace_params(row, sqlite) for row in rows])


def _plain_rows(conn: sa.Connection, statement: sa.Select, columns: list) -> list[tuple]:
    """The statement's rows as tuples, each value converted by its column type's own result processor (SQLAlchemy's
    hook): what `Result.all()` gives, without building a `Row` per row (half of a large fetch's time)."""
    compiled = statement.compile(dialect=conn.dialect)
    if compiled.params:
        return [tuple(row) for row in conn.execute(statement).all()]
    raw = conn.exec_driver_sql(str(compiled)).cursor.fetchall()
    processors = [(i, p) for i, column in enumerate(columns)
                  if (p := column.type.result_processor(conn.dialect, None)) is not None]
    if not processors:
        return raw
    rows = []
    for values in raw:
        values = list(values)
        for i, processor in processors:
            values[i] = processor(values[i])
        rows.append(tuple(values))
    return rows
