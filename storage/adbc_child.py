"""The ADBC work of `storage.bulk` that runs in a child process of `storage.adbc_pool`: reads, staging and merges.

A child imports this module alone (`CHILD_FUNCTIONS`, `CHILD_WARM_UP`), so it loads only the ADBC drivers, pyarrow
and the standard library: never SQLAlchemy nor the store. Everything a call passes (`Backend`, `WindowStatements`,
SQL text, Arrow IPC bytes) unpickles without `storage.bulk`. PostgreSQL's reads and staging run the same functions
in the calling process (`connect`, `read_snapshot`, `stage_snapshot`).
"""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import adbc_driver_postgresql.dbapi
import adbc_driver_sqlite.dbapi
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .sqlite_settings import SQLITE_CHECKPOINT_PAGES

# Row groups of a staged range: Spark splits a file only between row groups, so a 125,000-row range in two runs as
# two tasks, on both cores when the other shard leaves one idle (view job on 125,000 rows: 0.24-0.28 s against
# 0.25-0.35 s in one row group).
STAGED_ROW_GROUP_ROWS = 65_536
SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_MERGE_CACHE_KIB = 65_536
NAN_FLAG = "{}__is_nan"  # SQLite reads: a double column's NaN flag (SQLite stores NaN as the text 'NaN')


@dataclass(frozen=True)
class Backend:
    """Which database engine the store uses and where ADBC finds it (a SQLite file path or a libpq URI)."""

    sqlite: bool
    target: str

    def param(self, position: int) -> str:
        """The placeholder of the bound column at `position` (0-based), reusable in one statement."""
        return f"?{position + 1}" if self.sqlite else f"${position + 1}"


@dataclass(frozen=True)
class WindowStatements:
    """The SQLite statements of a window's merge: the range probe, the plain INSERT and the last-write-wins upsert."""

    probe: str
    insert: str
    upsert: str


# --- connections -----------------------------------------------------------------------------------------


@contextmanager
def connect(backend: Backend) -> Iterator:
    """An ADBC connection in autocommit mode (transactions are explicit: BEGIN/COMMIT statements)."""
    if backend.sqlite:
        conn = adbc_driver_sqlite.dbapi.connect(backend.target, autocommit=True)
    else:
        conn = adbc_driver_postgresql.dbapi.connect(backend.target, autocommit=True)
    try:
        if backend.sqlite:
            execute(conn.cursor(), f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        yield conn
    finally:
        conn.close()


# A child process keeps its last SQLite connections open between calls: a new connection per window cost a
# stream's merge 28 ms and its first statement 13 ms (1M rows: ~0.6 of 1.9 s, measured beside a node holding the
# database open). A kept connection is used only while the file at its path is still the one it opened.
KEPT_SQLITE_CONNECTIONS = 4
_KEPT: dict[str, tuple[tuple[int, int], object]] = {}


def _file_identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_dev, status.st_ino)


def _take_kept(path: str):
    """The kept connection to `path` (removed from the keep), if it still opens the file at that path."""
    identity, conn = _KEPT.pop(path, (None, None))
    if conn is not None and identity != _file_identity(path):
        conn.close()
        return None
    return conn


def _keep(path: str, conn) -> None:
    identity = _file_identity(path)
    if identity is None:
        conn.close()
        return
    _KEPT[path] = (identity, conn)
    while len(_KEPT) > KEPT_SQLITE_CONNECTIONS:  # the least recently used first (a taken one is put back last)
        _KEPT.pop(next(iter(_KEPT)))[1].close()


@contextmanager
def _kept_sqlite_connection(backend: Backend) -> Iterator:
    """(In a child process) an ADBC SQLite connection, kept open for the next call to the same file; closed
    instead when the call fails."""
    conn = _take_kept(backend.target)
    if conn is None:
        conn = adbc_driver_sqlite.dbapi.connect(backend.target, autocommit=True)
        execute(conn.cursor(), f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    try:
        yield conn
    except BaseException:
        conn.close()
        raise
    _keep(backend.target, conn)


def execute(cursor, sql: str, params: tuple = ()) -> None:
    cursor.execute(sql, params) if params else cursor.execute(sql)


def scalar(cursor, sql: str, params: tuple = ()) -> object:
    execute(cursor, sql, params)
    return cursor.fetchone()[0]


@contextmanager
def transaction(cursor, begin: str) -> Iterator[None]:
    execute(cursor, begin)
    try:
        yield
    except BaseException:
        execute(cursor, "ROLLBACK")
        raise
    execute(cursor, "COMMIT")


def to_ipc(data: pa.Table | pa.RecordBatch) -> bytes:
    """Arrow IPC stream bytes: only the rows of a slice travel (pickling a slice copies its whole buffers)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


# --- reading ---------------------------------------------------------------------------------------------


def _batch_option(backend: Backend, batch_rows: int) -> dict[str, str]:
    if backend.sqlite:
        return {"adbc.sqlite.query.batch_rows": str(batch_rows)}
    return {"adbc.postgresql.batch_size_hint_bytes": str(max(1, batch_rows) * 256)}


def read_snapshot(backend: Backend, sql: str, params: tuple, batch_rows: int) -> pa.Table:
    """Run the range query in one read transaction (REPEATABLE READ on PostgreSQL); the raw ADBC result."""
    begin = "BEGIN" if backend.sqlite else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
    with (_kept_sqlite_connection if backend.sqlite else connect)(backend) as conn, conn.cursor() as cursor:
        cursor.adbc_statement.set_options(**_batch_option(backend, batch_rows))
        with transaction(cursor, begin):
            cursor.execute(sql, params)
            table = cursor.fetch_arrow_table()
    if not backend.sqlite:
        return table
    if table.num_rows == 0 or table.column("write_ts")[0].is_valid:
        raise RuntimeError("SQLite did not return the type witness row first; cannot fix the column types")
    return table.slice(1)


def as_storage_schema(raw: pa.Table, schema: pa.Schema) -> pa.Table:
    """The raw ADBC result with the spec's types: NaN flags applied, 0/1 integers as booleans."""
    arrays = []
    for field in schema:
        column = raw.column(field.name)
        flag = NAN_FLAG.format(field.name)
        if flag in raw.column_names:
            column = pc.if_else(pc.not_equal(raw.column(flag), 0), math.nan, column.cast(pa.float64()))
        elif pa.types.is_boolean(field.type) and not pa.types.is_boolean(column.type):
            column = pc.not_equal(column, 0)
        arrays.append(column.cast(field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def stage_snapshot(backend: Backend, sql: str, params: tuple, batch_rows: int, schema: pa.Schema, path: str) -> int:
    """Read the range (`read_snapshot`) and write it to `path` as an uncompressed Parquet file in the storage
    layout; the number of rows written."""
    rows = as_storage_schema(read_snapshot(backend, sql, params, batch_rows), schema)
    pq.write_table(rows, path, compression="none", use_dictionary=False, write_statistics=False,
                   row_group_size=STAGED_ROW_GROUP_ROWS)
    return rows.num_rows


# --- merging (SQLite) ------------------------------------------------------------------------------------


def _merge_settings(cursor, durable: bool) -> None:
    """A merge connection's settings: its commits synced (or not), a big page cache, the store writer's checkpoint."""
    execute(cursor, f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
    execute(cursor, f"PRAGMA cache_size=-{SQLITE_MERGE_CACHE_KIB}")
    execute(cursor, f"PRAGMA wal_autocheckpoint={SQLITE_CHECKPOINT_PAGES}")


def _changes(cursor, sql: str, params: pa.Table) -> int:
    """Run the bound statement for every row; the rows it changed."""
    before = scalar(cursor, "SELECT total_changes()")
    cursor.executemany(sql, params)
    return int(scalar(cursor, "SELECT total_changes()")) - int(before)


def _merge_sqlite(backend: Backend, sql: str, params: pa.Table) -> int:
    """One chunk in one BEGIN IMMEDIATE transaction, synchronous commit; rows changed."""
    with _kept_sqlite_connection(backend) as conn, conn.cursor() as cursor:
        _merge_settings(cursor, durable=True)
        with transaction(cursor, "BEGIN IMMEDIATE"):
            return _changes(cursor, sql, params)


def _insert_or_merge(cursor, statements: WindowStatements, tokens: tuple[int, int], params: pa.Table) -> int:
    """(In a transaction holding the writer lock) the plain INSERT when the token range holds no row, else the merge."""
    if scalar(cursor, statements.probe, tokens):
        return _changes(cursor, statements.upsert, params)
    return _changes(cursor, statements.insert, params)


def _merge_sqlite_window(backend: Backend, statements: WindowStatements, tokens: tuple[int, int],
                         params: pa.Table, durable: bool) -> int:
    """One chunk of a window in one BEGIN IMMEDIATE transaction, its commit synced when `durable`; rows changed.
    A key repeated in the chunk makes the plain INSERT fail: the chunk is then merged instead."""
    with _kept_sqlite_connection(backend) as conn, conn.cursor() as cursor:
        _merge_settings(cursor, durable)
        try:
            with transaction(cursor, "BEGIN IMMEDIATE"):
                return _insert_or_merge(cursor, statements, tokens, params)
        except adbc_driver_sqlite.dbapi.IntegrityError:
            with transaction(cursor, "BEGIN IMMEDIATE"):
                return _changes(cursor, statements.upsert, params)


# --- the child's calls -----------------------------------------------------------------------------------


def _child_warm_up() -> int:
    """Load the ADBC driver and the Parquet writer on an in-memory database (never the node's files): a child's
    first range read and staging took 0.2 s against 0.11 s for the next ones."""
    with connect(Backend(True, ":memory:")) as conn:
        cursor = conn.cursor()
        cursor.execute("SELECT 1 AS one")
        rows = cursor.fetch_arrow_table()
    pq.write_table(rows, pa.BufferOutputStream(), compression="none", use_dictionary=False, write_statistics=False)
    return rows.num_rows


def _child_read(backend: Backend, sql: str, params: tuple, batch_rows: int) -> bytes:
    return to_ipc(read_snapshot(backend, sql, params, batch_rows))


def _child_merge(backend: Backend, sql: str, params: bytes) -> int:
    return _merge_sqlite(backend, sql, from_ipc(params))


def _child_merge_window(backend: Backend, statements: WindowStatements, tokens: tuple[int, int],
                        params: bytes, durable: bool) -> int:
    return _merge_sqlite_window(backend, statements, tokens, from_ipc(params), durable)


def _child_modules() -> list[str]:
    """The names of the modules this child process has imported."""
    return sorted(sys.modules)


CHILD_FUNCTIONS = {"read": _child_read, "stage": stage_snapshot, "merge": _child_merge,
                   "merge_window": _child_merge_window, "modules": _child_modules}
CHILD_WARM_UP = _child_warm_up  # what a child process answers (storage.adbc_pool)
