"""The store's connections: SQLAlchemy engines, its own tables, the one writer at a time and WAL checkpoints."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event

from .sqlite_settings import SQLITE_CHECKPOINT_PAGES
from .store_types import Checkpoint, StoreClosed

SQLITE_PAGE_BYTES = 16_384  # a bulk load of random keys runs ~10% faster than with 4 KiB pages (1M rows measured)
SQLITE_WRITER_CACHE_KIB = 262_144  # the writer's page cache, grown as used: random-key inserts touch most pages
PG_WRITER_LOCK_ID = 0x7662635F73746F72  # arbitrary constant naming the store's writer advisory lock
_IMMEDIATE = "storage_begin_immediate"


def outbox_table(metadata: sa.MetaData) -> sa.Table:
    """The outbox (storage.outbox): one row per entry not yet acknowledged, ids ascending in insertion order."""
    return sa.Table(
        "storage_outbox",
        metadata,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("view_id", sa.Text, nullable=True),  # set for a build's view rows (`StoreOutbox.outbox_queue`)
        sqlite_autoincrement=True,
    )


def catalog_table(metadata: sa.MetaData) -> sa.Table:
    """The catalog (storage.schema): the spec of every table the store holds, as JSON."""
    return sa.Table(
        "storage_catalog",
        metadata,
        sa.Column("table_id", sa.Text, primary_key=True),
        sa.Column("spec", sa.Text, nullable=False),
    )


def _configure_sqlite(engine: sa.Engine, writer: bool) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin (see on_begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA page_size={SQLITE_PAGE_BYTES}")  # takes effect only on a new database
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        if writer:
            cursor.execute(f"PRAGMA cache_size=-{SQLITE_WRITER_CACHE_KIB}")
            cursor.execute(f"PRAGMA wal_autocheckpoint={SQLITE_CHECKPOINT_PAGES}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(conn: sa.Connection) -> None:
        immediate = conn.get_execution_options().get(_IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def create_engine(url: str | sa.URL, writer: bool = False) -> sa.Engine:
    """An engine for readers, or (`writer`) for the one writer of a SQLite store: a single pooled connection
    whose page cache stays warm from one write to the next."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(parsed, pool_size=10, max_overflow=30)
    pool = {"pool_size": 1, "max_overflow": 0} if writer else {"pool_size": 10, "max_overflow": 30}
    engine = sa.create_engine(parsed, connect_args={"check_same_thread": False}, **pool)
    _configure_sqlite(engine, writer)
    return engine


def absolute_url(url: str | sa.URL) -> sa.URL:
    """`url` with a relative SQLite database file made absolute, so the store and its ADBC children find the
    same file whatever their working directory; any other URL as it is."""
    parsed = sa.make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:" or database.startswith("file:"):
        return parsed
    return parsed.set(database=str(Path(database).expanduser().resolve()))


class StoreEngine:
    """A store's engines: readers run concurrently, writers one at a time (`_write_transaction`), and on SQLite
    through one connection held from write to write, whose WAL the node checkpoints in the background."""

    def __init__(self, url: str | sa.URL) -> None:
        url = absolute_url(url)
        self._engine = create_engine(url)
        self._is_postgres = self._engine.dialect.name == "postgresql"
        self._write_engine = self._engine if self._is_postgres else create_engine(url, writer=True)
        self._write_lock = threading.Lock()
        self._bulk_merge_lock = threading.Lock()
        self._sqlite_writer: sa.Connection | None = None  # held between writes, under _write_lock
        self._writes_since_checkpoint = 0  # SQLite write transactions since the last `checkpoint`
        self._closed = False

    def close(self) -> None:
        with self._write_lock:
            self._closed = True
            if self._sqlite_writer is not None:
                self._sqlite_writer.close()
                self._sqlite_writer = None
        self._engine.dispose()
        self._write_engine.dispose()

    @property
    def url(self) -> sa.URL:
        """The database URL (storage.bulk opens its own ADBC connections to the same database)."""
        return self._engine.url

    @property
    def is_postgres(self) -> bool:
        return self._is_postgres

    @contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Hold the store's in-process writer lock, for a writer that uses a connection of its own.

        Such a writer must also lock the database as `_write_transaction` does: `BEGIN IMMEDIATE` on SQLite,
        `pg_advisory_xact_lock(PG_WRITER_LOCK_ID)` inside its transaction on PostgreSQL.
        """
        with self._write_lock:
            yield

    @contextmanager
    def bulk_merge_turn(self) -> Iterator[None]:
        """One bulk merge at a time, from its first chunk to its last (`storage.bulk.merge_view_rows`).

        Two batches merging at once would take the writer lock chunk by chunk in turn and both finish late;
        one after the other, the first finishes at once and its worker goes on with its next batch while the
        second merges. Live writes still interleave between chunks: the writer lock is taken per chunk."""
        with self._bulk_merge_lock:
            yield

    @contextmanager
    def _write_transaction(self) -> Iterator[sa.Connection]:
        if self._is_postgres:
            with self._write_lock, self._write_engine.connect() as conn, conn.begin():
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(PG_WRITER_LOCK_ID)))
                yield conn
            return
        with self._write_lock:
            conn = self._writer_connection()
            with conn.begin():
                yield conn
            self._writes_since_checkpoint += 1

    def _writer_connection(self) -> sa.Connection:
        """The SQLite writer connection (the caller holds `_write_lock`): one connection held from write to write,
        as a pool checkout and return per write cost more than a one-row write's own statements. A connection
        still inside a transaction (a ROLLBACK that failed) is dropped for a new one, as the pool would have."""
        if self._closed:
            raise StoreClosed("the node store is closed (the node is stopping)")
        conn = self._sqlite_writer
        if conn is not None and not (conn.closed or conn.invalidated) and (
                conn.in_transaction() or conn.connection.driver_connection.in_transaction):
            conn.invalidate()
        if conn is None or conn.closed or conn.invalidated:
            if conn is not None:
                conn.close()
            conn = self._sqlite_writer = self._write_engine.connect().execution_options(**{_IMMEDIATE: True})
        return conn

    @contextmanager
    def _sqlite_write_cursor(self) -> Iterator:
        """A cursor of the SQLite writer connection inside `BEGIN IMMEDIATE` ... `COMMIT`, under the writer lock:
        `_write_transaction` without SQLAlchemy's work around a transaction (measured: a one-row `apply` took
        144 µs with it, 63 µs with this)."""
        with self._write_lock:
            connection = self._writer_connection().connection.driver_connection
            cursor = connection.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                yield cursor
                cursor.execute("COMMIT")
                self._writes_since_checkpoint += 1
            except BaseException:
                if connection.in_transaction:
                    cursor.execute("ROLLBACK")
                raise

    def checkpoint(self, min_writes: int = 0) -> Checkpoint | None:
        """Copy the WAL's committed pages into the SQLite database file without blocking writers or readers
        (`PRAGMA wal_checkpoint(PASSIVE)`), if this store committed at least `min_writes` write transactions
        since the last one; None when it did not, and on PostgreSQL, which checkpoints by itself.

        Without it the writer checkpoints inside the write that reaches SQLITE_CHECKPOINT_PAGES, copying and
        syncing that many pages first (measured: 136-155 ms every ~12,000 one-row writes on one store, up to
        450 ms for a write on 3 nodes with a view). Run often, it leaves that write little to copy (measured, every
        half second: the slowest of 20,000 writes with a view's outbox 14.6 ms against 189.5 ms). Under steady
        writes the WAL still reaches that size: it starts over only at a write that finds it all copied, and
        writes land while a checkpoint runs; on an idle store the next write starts it over. A store writing
        big batches (a bulk load) commits rarely, so a `min_writes` of some hundreds leaves its WAL to its writer:
        checkpoints every half second copied its pages over and over (measured: 10-15% fewer Arrow rows/s on
        1 node)."""
        if self._is_postgres:
            return None
        with self._write_lock:
            if self._closed or self._writes_since_checkpoint < min_writes:
                return None
            writes = self._writes_since_checkpoint
        connection = self._engine.raw_connection()
        try:
            cursor = connection.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)")
            [(busy, frames, checkpointed)] = cursor.fetchall()
            cursor.close()
        finally:
            connection.close()
        with self._write_lock:
            self._writes_since_checkpoint -= writes  # the writes it saw; those landing meanwhile count for the next
        return Checkpoint(wal_frames=max(frames, 0), checkpointed=max(checkpointed, 0), busy=bool(busy))

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        with self._engine.connect() as conn:
            yield conn

    def reading(self):
        """A read connection (one short transaction), for readers built on this store (storage.reads)."""
        return self._read()
