"""The view builder's columnar data plane: token-range snapshots into Arrow and set-based view-row merges, over ADBC.

Reading. `read_token_range(store, spec, first, last)` returns one replica's rows of an inclusive token range as
a `pyarrow.Table` in the **storage layout**, read in one read transaction (a snapshot: SQLite WAL read
transaction, PostgreSQL REPEATABLE READ), in (token, primary key) order, with the columns and Arrow types of
`storage.arrow_layouts.storage_schema` (types from the table spec, never from the data; doubles exact, NaN
included; SQLite keeps -0.0 as 0.0, PostgreSQL keeps it). A row is live when `tombstone` is false; a live row's
visible cells are those with a non-NULL value and `ts_<r>` > `tomb_ts` (or no `tomb_ts`), as in
`storage.cells.visible_values`.

Tombstoned rows are left out by default (`include_tombstones=False`): a deleted base row has no view row, and
a view being built starts empty, so the builder has nothing to do for it; deletions that happen while the
view builds reach the view through the write path's view updates, whose timestamps are newer than the
snapshot's. `include_tombstones=True` returns the full replica (the storage layout as stored).

Merging. `merge_view_rows(store, view_spec, rows)` merges computed view rows into a view table exactly as if
each row had been applied through `NodeStore.apply` as the view update the write path sends for it
(`replica.rows.upsert_row(view, values, ts)`): an upsert at `ts` of the row marker and of every regular
column (a NULL value is a cell deletion at `ts`). Input columns (`storage.arrow_layouts.view_rows_schema`):
`token`, `c_<k>` per key column, `c_<r>` per regular column, and `ts`, the base row's `view_ts`; extra columns
are ignored.
Per cell the newer timestamp wins; on a tie a deletion wins over a value, and between two values the
greater by the canonical order of `storage.cells` (False < True, integers numerically, doubles by IEEE-754
totalOrder, text by UTF-8 bytes); the marker keeps the highest timestamp; a row that changes gets
`view_ts = ts` when new, else `max(ts, view_ts + 1)`, as `storage.cells.next_view_ts`. Rows of one key apply
in input order. So a newer live write always wins, and merging the same rows again changes nothing.
Every NaN is stored as the canonical NaN (as the store does), so a negative NaN orders like a positive one.

The rows are sorted by primary key in pyarrow, then merged in chunks of `chunk_rows`, each chunk in one
transaction holding the store's writer lock (its in-process lock, then `BEGIN IMMEDIATE` on SQLite or the
store's advisory lock on PostgreSQL), so live writes interleave between chunks and never race one, and
committed synchronously (SQLite `synchronous=FULL`), so merged rows are durable when the call returns.
The statement is the last-write-wins rule of `storage.upsert` (`last_write_wins_sql`, for rows that write the
marker and every cell). SQLite: one bound `INSERT ... VALUES (?...) ON CONFLICT ...` executed for every row of
the chunk (ADBC binds the Arrow columns; measured faster than a staging table + `INSERT ... SELECT`, see
bench/bulk.py). PostgreSQL: the chunk is copied into a temporary table
(ADBC ingest, COPY) and merged by the same statement as `INSERT ... SELECT` (a bound statement per row costs a
round trip each). Returns the number of rows whose stored state changed (inserted or updated), exact on
both engines.

Tablet streaming. `read_token_window(store, spec, first, last, max_rows)` reads the first rows of a range cut at a
token boundary, so a reader resumes exactly at the last token it got + 1. `merge_stored_rows(store, spec, rows)`
merges rows in the storage layout (tombstones and per-cell timestamps included, as another replica stores them)
with the write path's rule (`last_write_wins_sql`, `full_rows=False`), set-based in chunks as `merge_view_rows`;
a row new here keeps the sender's `view_ts`. A retried merge changes nothing. `merge_stored_window` is the same
merge for a stream's window, whose rows come in key order and are not sorted again: on SQLite, a chunk whose token
span holds no row here (tombstones included), probed in the chunk's own transaction under the writer lock, is
inserted with a plain `INSERT`, which stores exactly what the merge would; otherwise (or when a key repeats in the
chunk) the merge runs. A stream syncs only its last window's commit (`durable`), which syncs the WAL with the
earlier ones. `prepare_stored_window` does the part that needs no lock, so a stream runs it on its reading thread.

Processes. On SQLite the ADBC work runs in child processes (`storage.adbc_pool`): ADBC's SQLite driver carries its
own copy of the SQLite library, and two copies in one process corrupt each other's WAL locking. A child serves
`storage.adbc_child` (the reads, staging and merges themselves), which imports neither SQLAlchemy nor the store, so
a child starts quickly. A child keeps its last SQLite connections open between calls
(`adbc_child.KEPT_SQLITE_CONNECTIONS`); merges have a child of their own, whose connection keeps its page cache
from one merge to the next.
PostgreSQL is reached over the network and runs in the calling thread.
"""
from __future__ import annotations

import atexit
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa

from . import adbc_child
from .adbc_child import (
    NAN_FLAG,
    Backend,
    WindowStatements,
    as_storage_schema,
    connect,
    execute,
    from_ipc,
    read_snapshot,
    scalar,
    stage_snapshot,
    to_ipc,
    transaction,
)
from .adbc_pool import ChildPool
from .arrow_layouts import (
    TS,
    key_column_names,
    storage_column_names,
    storage_schema,
    ts_column_name,
    value_column_name,
    view_rows_schema,
)
from .cells import TableSpec
from .engine import PG_WRITER_LOCK_ID
from .store import NodeStore
from .upsert import last_write_wins_sql, physical_table_name, quote

DEFAULT_BATCH_ROWS = 65_536
DEFAULT_CHUNK_ROWS = 100_000
SQLITE_IDLE_CHILDREN = 2  # idle child processes kept for the ADBC SQLite work (see storage.adbc_pool)

_STORED_KIND = {"int": "int", "bigint": "int", "timestamp": "int", "double": "double", "text": "text",
                "boolean": "boolean"}
_SQLITE_WITNESS = {"int": "0", "double": "0.0", "text": "''", "boolean": "0"}


def _stored_columns(spec: TableSpec) -> list[tuple[str, str]]:
    """(SQL column name, stored kind: int | double | text | boolean) of every column, in table order."""
    kinds = {value_column_name(c.name): _STORED_KIND[c.type] for c in spec.columns}
    kinds["tombstone"] = "boolean"
    return [(name, kinds.get(name, "int")) for name in storage_column_names(spec)]


# --- connections -----------------------------------------------------------------------------------------


def _backend(store: NodeStore) -> Backend:
    url = store.url
    name = url.get_backend_name()
    if name == "sqlite":
        if not url.database or url.database == ":memory:":
            raise ValueError("storage.bulk needs a file-backed SQLite store (ADBC opens its own connection)")
        return Backend(True, url.database)
    if name == "postgresql":
        return Backend(False, url.set(drivername="postgresql").render_as_string(hide_password=False))
    raise ValueError(f"storage.bulk supports SQLite and PostgreSQL stores, not {name!r}")


_SQLITE_CHILDREN = ChildPool(SQLITE_IDLE_CHILDREN, adbc_child.__name__)  # reads and staging
# Merges go to children of their own: a store takes one merge at a time, so one child keeps serving them, and its
# kept connection keeps its page cache (SQLite drops a connection's cache when another connection committed since).
_SQLITE_WRITERS = ChildPool(1, adbc_child.__name__)
atexit.register(_SQLITE_CHILDREN.shutdown)
atexit.register(_SQLITE_WRITERS.shutdown)


def prestart_children(store: NodeStore, count: int) -> None:
    """Start `count` idle child processes for a SQLite store's data plane now (PostgreSQL's work runs in the
    calling thread: nothing to start; each child warms up as it starts, `storage.adbc_child`); a node calls it at
    start with the number of batches it runs at once."""
    if store.url.get_backend_name() == "sqlite":
        _SQLITE_CHILDREN.prestart(count)
        _SQLITE_WRITERS.prestart(1)


def shutdown() -> None:
    """Stop the idle child processes of the SQLite data plane (new ones start on the next call)."""
    _SQLITE_CHILDREN.shutdown()
    _SQLITE_WRITERS.shutdown()


# --- reading ---------------------------------------------------------------------------------------------


def _range_filter(backend: Backend, include_tombstones: bool) -> str:
    condition = f"token >= {backend.param(0)} AND token <= {backend.param(1)}"
    if not include_tombstones:
        condition += " AND tombstone = 0" if backend.sqlite else " AND NOT tombstone"
    return condition


def count_in_range(store: NodeStore, spec: TableSpec, first_token: int, last_token: int, *,
                   include_tombstones: bool = False) -> int:
    """The number of rows (live only unless `include_tombstones`) with first_token <= token <= last_token.

    One indexed count through the store's own connection (no ADBC, no child process); 0 when the store
    has no table `spec.table_id` (this replica never stored a row of it).
    """
    try:
        return store.count(spec.table_id, first_token, last_token, include_tombstones=include_tombstones)
    except KeyError:
        return 0


def _limit_clause(limit: int | None) -> str:
    return "" if limit is None else f" LIMIT {int(limit)}"


def _sqlite_read_sql(spec: TableSpec, include_tombstones: bool, limit: int | None = None) -> str:
    """The range query for SQLite, its first row a typed 'witness' row (write_ts NULL) that fixes ADBC's types.

    ADBC's SQLite driver infers each column's type from the first batch of values (all NULL -> int64, and a
    later string fails), and a double column holds the text 'NaN': doubles are read as the REAL value plus a
    NaN flag, and the witness row makes the first batch carry a value of the right type in every column.
    """
    projection, witness = [], []
    for name, kind in _stored_columns(spec):
        quoted = quote(name)
        if kind == "double":
            flag = quote(NAN_FLAG.format(name))
            projection += [f"CASE WHEN typeof({quoted}) = 'text' THEN NULL ELSE {quoted} END AS {quoted}",
                           f"typeof({quoted}) = 'text' AS {flag}"]
            witness += [f"0.0 AS {quoted}", f"0 AS {flag}"]
        else:
            projection.append(quoted)
            witness.append(f"{'NULL' if name == 'write_ts' else _SQLITE_WITNESS[kind]} AS {quoted}")
    table = quote(physical_table_name(spec.table_id))
    order = ", ".join(f"{table}.{quote(name)}" for name in key_column_names(spec))  # the stored values, not the aliases
    return (f"SELECT {', '.join(witness)} UNION ALL SELECT * FROM (SELECT {', '.join(projection)} FROM {table} "
            f"WHERE {_range_filter(Backend(True, ''), include_tombstones)} ORDER BY {order}{_limit_clause(limit)})")


def _postgres_read_sql(spec: TableSpec, include_tombstones: bool, limit: int | None = None) -> str:
    columns = ", ".join(quote(name) for name, _ in _stored_columns(spec))
    table = quote(physical_table_name(spec.table_id))
    order = ", ".join(quote(name) for name in key_column_names(spec))
    return (f"SELECT {columns} FROM {table} WHERE {_range_filter(Backend(False, ''), include_tombstones)} "
            f"ORDER BY {order}{_limit_clause(limit)}")


def _any_row(store: NodeStore, spec: TableSpec, first_token: int, last_token: int, include_tombstones: bool) -> bool:
    """Whether the range holds a row: one index probe through the store's own connection."""
    try:
        return bool(store.scan(spec.table_id, first_token, last_token, limit=1, include_tombstones=include_tombstones))
    except KeyError:
        return False


def read_token_range(store: NodeStore, spec: TableSpec, first_token: int, last_token: int, *,
                     include_tombstones: bool = False, batch_rows: int = DEFAULT_BATCH_ROWS,
                     limit: int | None = None) -> pa.Table:
    """The rows with first_token <= token <= last_token in the storage layout, from one read snapshot.

    Live rows only unless `include_tombstones` (see the module docstring); record batches of about
    `batch_rows` rows; only the first `limit` rows (in (token, key) order) when given. A range without rows (or a
    store without the table) costs one index probe on the store's own connection and returns an empty table of
    `storage_schema(spec)`: no ADBC, no child process.
    """
    schema = storage_schema(spec)
    if not _any_row(store, spec, first_token, last_token, include_tombstones):
        return schema.empty_table()
    backend = _backend(store)
    params = (first_token, last_token)
    if backend.sqlite:
        sql = _sqlite_read_sql(spec, include_tombstones, limit)
        raw = from_ipc(_SQLITE_CHILDREN.run("read", backend, sql, params, batch_rows))
    else:
        raw = read_snapshot(backend, _postgres_read_sql(spec, include_tombstones, limit), params, batch_rows)
    return as_storage_schema(raw, schema)


def chunk_end(store: NodeStore, spec: TableSpec, first_token: int, last_token: int, max_rows: int) -> int:
    """The last token of a chunk of the range beginning at `first_token` that holds about `max_rows` rows (deleted
    ones counted): `last_token` when the rest of the range holds no more; otherwise a token boundary, so no token's
    rows are split (a chunk is larger only when its first token alone holds more). Two index probes, no rows read."""
    if max_rows < 1:
        raise ValueError(f"a chunk holds at least one row, not {max_rows}")
    try:
        token = store.physical_table(spec.table_id).table.c.token
    except KeyError:
        return last_token
    in_range = sa.select(token).where(token >= first_token, token <= last_token).order_by(token).limit(1)
    with store.reading() as conn:
        cut = conn.execute(in_range.offset(max_rows)).scalar()
        if cut is None:
            return last_token
        first_held = conn.execute(in_range).scalar()
    return cut - 1 if first_held < cut else cut


def read_token_window(store: NodeStore, spec: TableSpec, first_token: int, last_token: int, max_rows: int, *,
                      include_tombstones: bool = True) -> pa.Table:
    """The first rows of the range in (token, key) order, ending at a token boundary: every row of each token it
    holds, about `max_rows` rows (fewer when the next token would cut the window; more when the first token alone
    has more rows). Empty when the range holds no row. So a reader that goes on at the last token it got + 1 reads
    every row of the range once (tablet streaming resumes that way); each window is one read snapshot."""
    if max_rows < 1:
        raise ValueError(f"a token window holds at least one row, not {max_rows}")
    rows = read_token_range(store, spec, first_token, last_token, include_tombstones=include_tombstones,
                            limit=max_rows + 1)
    if rows.num_rows <= max_rows:
        return rows
    cut_token = rows.column("token")[max_rows].as_py()
    first_cut = pc.index(rows.column("token"), cut_token).as_py()  # tokens ascend: the cut token's rows end it
    if first_cut > 0:
        return rows.slice(0, first_cut)
    return read_token_range(store, spec, cut_token, cut_token, include_tombstones=include_tombstones)


def stage_token_range(store: NodeStore, spec: TableSpec, first_token: int, last_token: int, path: str | Path, *,
                      include_tombstones: bool = False, batch_rows: int = DEFAULT_BATCH_ROWS) -> int:
    """`read_token_range` written to `path` as an uncompressed Parquet file (the storage layout and its types)
    instead of returned; the number of rows. No file is written when the range has no row (0).

    On SQLite the child process that reads also writes the file, so the rows never cross into this process
    (measured on 125,000 rows: ~0.1-0.15 s of this process's time saved per range, decoding and writing).
    """
    if not _any_row(store, spec, first_token, last_token, include_tombstones):
        return 0
    backend = _backend(store)
    params, schema = (first_token, last_token), storage_schema(spec)
    if backend.sqlite:
        sql = _sqlite_read_sql(spec, include_tombstones)
        return _SQLITE_CHILDREN.run("stage", backend, sql, params, batch_rows, schema, str(path))
    sql = _postgres_read_sql(spec, include_tombstones)
    return stage_snapshot(backend, sql, params, batch_rows, schema, str(path))


# --- merging ---------------------------------------------------------------------------------------------


def _checked_column(rows: pa.Table, name: str, arrow: pa.DataType, nullable: bool,
                    what: str = "view rows") -> pa.ChunkedArray:
    if name not in rows.column_names:
        layout = "view_rows_schema" if what == "view rows" else "storage_schema"
        raise ValueError(f"{what} lack column {name!r}; expected the columns of {layout}")
    column = rows.column(name)
    if not nullable and column.null_count:
        raise ValueError(f"{what} have NULL in column {name!r}, which cannot be null")
    try:
        return column.cast(arrow)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise TypeError(f"{what} column {name!r} ({column.type}) cannot be read as {arrow}: {error}") from None


def _bound_field(field: pa.Field) -> pa.Field:
    """The field as its values are bound: every integer as int64 (the stored BIGINT)."""
    return field.with_type(pa.int64()) if pa.types.is_integer(field.type) else field


def prepare_view_rows(spec: TableSpec, rows: pa.Table) -> pa.Table:
    """The view rows checked, cast to the bound types and sorted by primary key (stable: equal keys keep order)."""
    fields = [_bound_field(field) for field in view_rows_schema(spec)]
    arrays = [_checked_column(rows, field.name, field.type, field.nullable) for field in fields]
    table = pa.Table.from_arrays(arrays, names=[field.name for field in fields])
    return table.sort_by([(name, "ascending") for name in key_column_names(spec)])


# The statement: INSERT the row as the upsert makes it; ON CONFLICT the rule of storage.upsert.last_write_wins_sql.


def _inserted_values(spec: TableSpec, value) -> list[str]:
    """The inserted row's SQL values, `value(input column name)` giving an input value (upsert_row's layout)."""
    ts = value(TS)
    values = [value(name) for name in key_column_names(spec)]
    for column in spec.regular:
        values += [value(value_column_name(column.name)), ts]
    return values + [ts, "NULL", ts, ts, "false"]  # marker_ts, tomb_ts, view_ts, write_ts, tombstone


# SQLite: one bound statement executed for every row (ADBC binds Arrow). SQLite binds a NaN as NULL, so a
# double is bound with a NaN flag and stored as the text 'NaN', as the store does.


@dataclass(frozen=True)
class _Bound:
    """One bound parameter: the input column it comes from and whether it is that column's NaN flag."""

    column: str
    nan_flag: bool = False


def _sqlite_parameters(spec: TableSpec) -> list[_Bound]:
    bound = [_Bound("token")]
    for c in spec.key_columns + spec.regular:
        bound.append(_Bound(value_column_name(c.name)))
        if c.type == "double":
            bound.append(_Bound(value_column_name(c.name), nan_flag=True))
    return bound + [_Bound(TS)]


def sqlite_upsert_sql(spec: TableSpec) -> str:
    """The bound last-write-wins upsert of one view row (placeholders in `_sqlite_parameters` order)."""
    bound = _sqlite_parameters(spec)
    doubles = {value_column_name(c.name) for c in spec.columns if c.type == "double"}

    def value(name: str) -> str:
        placeholder = f"?{bound.index(_Bound(name)) + 1}"
        if name not in doubles:
            return placeholder
        return f"CASE WHEN ?{bound.index(_Bound(name, True)) + 1} THEN 'NaN' ELSE {placeholder} END"

    values = ", ".join(_inserted_values(spec, value))
    return last_write_wins_sql(spec, True, f"VALUES ({values})", full_rows=True)


def _sqlite_bind_table(chunk: pa.RecordBatch, bound: list[_Bound]) -> pa.RecordBatch:
    arrays = []
    for parameter in bound:
        column = chunk.column(parameter.column)
        arrays.append(pc.fill_null(pc.is_nan(column), False) if parameter.nan_flag else column)
    return pa.RecordBatch.from_arrays(arrays, names=[f"p{i}" for i in range(len(arrays))])


# PostgreSQL: a bound statement per row costs a round trip (100k rows: 10.8 s measured), so the chunk is
# copied into a temporary table (ADBC ingest = COPY) and merged with INSERT ... SELECT. One statement may not
# touch a row twice, so rows repeating a key go in later rounds (round = occurrence of the key in the chunk).

_STAGE = "vbc_merge_stage"
_ROUND = "merge_round"


def postgres_merge_sql(spec: TableSpec, merge_round: int | None = None) -> str:
    """INSERT ... SELECT from the staging table (only `merge_round` if given) ... ON CONFLICT merge."""
    values = ", ".join(_inserted_values(spec, quote))
    where = "" if merge_round is None else f" WHERE {_ROUND} = {int(merge_round)}"
    return last_write_wins_sql(spec, False, f"SELECT {values} FROM {_STAGE}{where}", full_rows=True)


def _same_as_previous(column: pa.Array) -> pa.Array:
    """Row i (from 1) equals row i-1 (NaN equal to NaN, as PostgreSQL compares keys)."""
    current, previous = column.slice(1), column.slice(0, len(column) - 1)
    same = pc.equal(current, previous)
    if pa.types.is_floating(column.type):
        same = pc.or_(same, pc.and_(pc.is_nan(current), pc.is_nan(previous)))
    return same


def key_occurrences(chunk: pa.RecordBatch, spec: TableSpec) -> pa.Array | None:
    """For rows sorted by key: how many earlier rows of the chunk have the same key; None if every key is unique."""
    if chunk.num_rows < 2:
        return None
    same = None
    for name in key_column_names(spec):
        equal = _same_as_previous(chunk.column(name))
        same = equal if same is None else pc.and_(same, equal)
    if not pc.any(same).as_py():
        return None
    starts = pa.concat_arrays([pa.array([True]), pc.invert(same)])
    index = pa.array(range(chunk.num_rows), pa.int64())
    return pc.subtract(index, pc.cumulative_max(pc.if_else(starts, index, 0)))


def _merge_postgres(backend: Backend, spec: TableSpec, chunk: pa.RecordBatch,
                    merge_sql: Callable[[TableSpec, int | None], str] = postgres_merge_sql) -> int:
    """One chunk in one transaction under the store's advisory lock, synchronous commit; rows changed."""
    occurrences = key_occurrences(chunk, spec)
    stage = chunk if occurrences is None else chunk.append_column(_ROUND, occurrences)
    rounds = 1 if occurrences is None else pc.max(occurrences).as_py() + 1
    changed = 0
    with connect(backend) as conn:
        cursor = conn.cursor()
        with transaction(cursor, "BEGIN"):
            scalar(cursor, f"SELECT 1 FROM (SELECT pg_advisory_xact_lock({PG_WRITER_LOCK_ID})) AS locked")
            execute(cursor, "SET LOCAL synchronous_commit = on")
            cursor.adbc_ingest(_STAGE, stage, mode="create", temporary=True)
            for number in range(rounds):
                execute(cursor, merge_sql(spec, None if occurrences is None else number))
                changed += max(cursor.rowcount, 0)  # a statement with bound parameters would report -1
            execute(cursor, f"DROP TABLE {_STAGE}")
    return changed


def _chunk_merger(spec: TableSpec, backend: Backend):
    """(prepare, merge): prepare(chunk) runs before the writer lock is taken, merge(prepared) under it."""
    if not backend.sqlite:
        return (lambda chunk: chunk), (lambda chunk: _merge_postgres(backend, spec, chunk))
    sql, bound = sqlite_upsert_sql(spec), _sqlite_parameters(spec)
    return ((lambda chunk: to_ipc(_sqlite_bind_table(chunk, bound))),
            (lambda params: _SQLITE_WRITERS.run("merge", backend, sql, params)))


def merge_view_rows(store: NodeStore, view_spec: TableSpec, rows: pa.Table, *,
                    chunk_rows: int = DEFAULT_CHUNK_ROWS) -> int:
    """Merge computed view rows (`view_rows_schema`) into the view's table; the number of rows changed.

    See the module docstring for the semantics. The view's table must exist (KeyError otherwise: the caller
    creates it, so a dropped view is never brought back). ValueError for a missing column or a NULL token,
    key or `ts`; TypeError for a column that cannot be cast to its type.
    """
    store.table_spec(view_spec.table_id)
    if rows.num_rows == 0:
        return 0
    prepared = prepare_view_rows(view_spec, rows)
    return _merge_in_chunks(store, prepared, *_chunk_merger(view_spec, _backend(store)), chunk_rows)


def _merge_in_chunks(store: NodeStore, prepared: pa.Table, prepare_chunk, merge_chunk, chunk_rows: int) -> int:
    """Merge sorted rows chunk after chunk in the store's bulk merge turn, each chunk under the writer lock."""
    payloads = [prepare_chunk(chunk) for chunk in prepared.to_batches(max_chunksize=max(1, chunk_rows))]
    changed = 0
    with store.bulk_merge_turn():  # prepared while another merge has the turn
        for payload in payloads:
            with store.writer_lock():
                changed += merge_chunk(payload)
    return changed


# Stored rows (tablet streaming): rows in the storage layout, as another replica stores them, merged by the rule
# of the write path (`last_write_wins_sql` with `full_rows=False`): each cell, the marker and the row tombstone
# win or lose on their own timestamps. A row new here is inserted as it was stored there (its view_ts included,
# so the view updates this replica sends next keep ordering after the ones the other sent).


def _checked_stored_rows(spec: TableSpec, rows: pa.Table) -> pa.Table:
    """Rows in the storage layout checked and cast to the bound types, in their order. A regular column the
    rows lack (a sender with an older definition of the table) holds no cell in them: added as NULLs."""
    regular = {name for c in spec.regular for name in (value_column_name(c.name), ts_column_name(c.name))}
    for field in storage_schema(spec):
        if field.name in regular and field.name not in rows.column_names:
            rows = rows.append_column(field.name, pa.nulls(rows.num_rows, field.type))
    fields = [_bound_field(field) for field in storage_schema(spec)]
    arrays = [_checked_column(rows, field.name, field.type, field.nullable, "stored rows") for field in fields]
    return pa.Table.from_arrays(arrays, names=[field.name for field in fields])


def prepare_stored_rows(spec: TableSpec, rows: pa.Table) -> pa.Table:
    """`_checked_stored_rows` sorted by primary key (stable: equal keys keep their order)."""
    table = _checked_stored_rows(spec, rows)
    return table.sort_by([(name, "ascending") for name in key_column_names(spec)])


def _sqlite_stored_parameters(spec: TableSpec) -> list[_Bound]:
    doubles = {value_column_name(c.name) for c in spec.columns if c.type == "double"}
    bound = []
    for name in storage_column_names(spec):
        bound.append(_Bound(name))
        if name in doubles:
            bound.append(_Bound(name, nan_flag=True))
    return bound


def _sqlite_stored_values(spec: TableSpec) -> str:
    """`VALUES (...)` of one bound stored row (placeholders in `_sqlite_stored_parameters` order)."""
    bound = _sqlite_stored_parameters(spec)

    def value(name: str) -> str:
        placeholder = f"?{bound.index(_Bound(name)) + 1}"
        if _Bound(name, True) not in bound:
            return placeholder
        return f"CASE WHEN ?{bound.index(_Bound(name, True)) + 1} THEN 'NaN' ELSE {placeholder} END"

    return f"VALUES ({', '.join(value(name) for name in storage_column_names(spec))})"


def sqlite_stored_upsert_sql(spec: TableSpec) -> str:
    """The bound last-write-wins upsert of one stored row (placeholders in `_sqlite_stored_parameters` order)."""
    return last_write_wins_sql(spec, True, _sqlite_stored_values(spec), full_rows=False)


def sqlite_stored_insert_sql(spec: TableSpec) -> str:
    """The bound plain INSERT of one stored row (no conflict rule), for a token range that holds no row here."""
    columns = ", ".join(quote(name) for name in storage_column_names(spec))
    return f"INSERT INTO {quote(physical_table_name(spec.table_id))} ({columns}) {_sqlite_stored_values(spec)}"


def sqlite_range_probe_sql(spec: TableSpec) -> str:
    """Whether the table holds a row (tombstones too) with ?1 <= token <= ?2: one index probe."""
    table = quote(physical_table_name(spec.table_id))
    return f"SELECT EXISTS (SELECT 1 FROM {table} WHERE token >= ?1 AND token <= ?2) AS found"


def postgres_stored_merge_sql(spec: TableSpec, merge_round: int | None = None) -> str:
    """INSERT ... SELECT every stored column from the staging table (only `merge_round` if given) ... ON CONFLICT."""
    values = ", ".join(quote(name) for name in storage_column_names(spec))
    where = "" if merge_round is None else f" WHERE {_ROUND} = {int(merge_round)}"
    return last_write_wins_sql(spec, False, f"SELECT {values} FROM {_STAGE}{where}", full_rows=False)


def _stored_chunk_merger(spec: TableSpec, backend: Backend):
    """(prepare, merge) of stored-row chunks, as `_chunk_merger` is for view rows."""
    if not backend.sqlite:
        return ((lambda chunk: chunk),
                (lambda chunk: _merge_postgres(backend, spec, chunk, postgres_stored_merge_sql)))
    sql, bound = sqlite_stored_upsert_sql(spec), _sqlite_stored_parameters(spec)
    return ((lambda chunk: to_ipc(_sqlite_bind_table(chunk, bound))),
            (lambda params: _SQLITE_WRITERS.run("merge", backend, sql, params)))


def merge_stored_rows(store: NodeStore, spec: TableSpec, rows: pa.Table, *,
                      chunk_rows: int = DEFAULT_CHUNK_ROWS) -> int:
    """Merge rows in the storage layout (as `read_token_range(..., include_tombstones=True)` returns them from
    another replica) into the table, per cell last-write-wins; the number of rows whose stored state changed.

    Row markers, row tombstones and deleted cells travel and win or lose by timestamp, as on the write path; merging
    the same rows again changes nothing. No view updates are generated. Chunks of `chunk_rows`, each in one
    transaction under the writer lock, as `merge_view_rows`. KeyError when the table does not exist here (the caller
    creates it); ValueError for a missing column or a NULL key, `write_ts` or `tombstone`; TypeError for a column
    that cannot be cast to its type.
    """
    store.table_spec(spec.table_id)
    if rows.num_rows == 0:
        return 0
    prepared = prepare_stored_rows(spec, rows)
    return _merge_in_chunks(store, prepared, *_stored_chunk_merger(spec, _backend(store)), chunk_rows)


# A stream's window (`merge_stored_window`): when the destination holds no row in the window's token range, the
# merge would insert every row as it is, so a plain INSERT (no conflict rule to evaluate) gives the same table.
# The range is probed inside the insert's transaction, under the writer lock, so a live write that landed first
# sends the window down the merge path and keeps whatever is newer.


def _window_statements(spec: TableSpec) -> WindowStatements:
    return WindowStatements(sqlite_range_probe_sql(spec), sqlite_stored_insert_sql(spec),
                             sqlite_stored_upsert_sql(spec))


def _token_span(chunk: pa.RecordBatch) -> tuple[int, int]:
    span = pc.min_max(chunk.column("token"))
    return (span["min"].as_py(), span["max"].as_py())


def _window_chunk_payload(chunk: pa.RecordBatch, bound: list[_Bound]) -> tuple[tuple[int, int], bytes]:
    """A window's chunk as the merge child takes it: its token span and its bound rows as Arrow IPC."""
    return (_token_span(chunk), to_ipc(_sqlite_bind_table(chunk, bound)))


@dataclass(frozen=True)
class PreparedWindow:
    """A stream's window ready to merge (`prepare_stored_window`): its rows, last token and merge payloads."""

    table_id: str
    rows: int
    last_token: int
    payloads: tuple = ()  # SQLite: per chunk (token span, bound rows as IPC)
    table: pa.Table | None = None  # PostgreSQL: the rows, merged by `merge_stored_rows`


def prepare_stored_window(store: NodeStore, spec: TableSpec, rows: pa.Table, *,
                          chunk_rows: int = DEFAULT_CHUNK_ROWS) -> PreparedWindow:
    """The work of `merge_stored_window` that needs no lock: checks, casts and the bound rows (a stream runs it on
    its reading thread, beside the merge of the window before). ValueError/TypeError for bad rows, as
    `merge_stored_rows`."""
    last_token = rows.column("token")[-1].as_py() if rows.num_rows and "token" in rows.column_names else 0
    if rows.num_rows == 0:
        return PreparedWindow(spec.table_id, 0, last_token)
    if not _backend(store).sqlite:
        return PreparedWindow(spec.table_id, rows.num_rows, last_token, table=rows)
    bound = _sqlite_stored_parameters(spec)
    chunks = _checked_stored_rows(spec, rows).to_batches(max_chunksize=max(1, chunk_rows))
    return PreparedWindow(spec.table_id, rows.num_rows, last_token,
                          tuple(_window_chunk_payload(chunk, bound) for chunk in chunks))


def merge_prepared_window(store: NodeStore, spec: TableSpec, window: PreparedWindow, *, durable: bool = True) -> int:
    """Merge a prepared window (see `merge_stored_window`); the number of rows whose stored state changed."""
    store.table_spec(spec.table_id)
    if window.rows == 0:
        return 0
    if window.table is not None:
        return merge_stored_rows(store, spec, window.table)
    backend, statements = _backend(store), _window_statements(spec)
    changed = 0
    with store.bulk_merge_turn():
        for tokens, params in window.payloads:
            with store.writer_lock():
                changed += _SQLITE_WRITERS.run("merge_window", backend, statements, tokens, params, durable)
    return changed


def merge_stored_window(store: NodeStore, spec: TableSpec, rows: pa.Table, *, durable: bool = True,
                        chunk_rows: int = DEFAULT_CHUNK_ROWS) -> int:
    """`merge_stored_rows` for a window of a tablet stream: rows expected in primary key order (as
    `read_token_window` returns them; another order is merged as well, only slower), not sorted again. On SQLite a
    chunk whose token span holds no row here at the moment of its transaction is inserted with a plain INSERT;
    the result and the returned count are those of `merge_stored_rows`. `durable=False` (SQLite): the commits are
    not synced (atomic all the same; a later synced commit, e.g. the stream's last window, makes them durable)."""
    store.table_spec(spec.table_id)
    prepared = prepare_stored_window(store, spec, rows, chunk_rows=chunk_rows)
    return merge_prepared_window(store, spec, prepared, durable=durable)


