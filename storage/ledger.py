"""The worker's durable ledger of finished view building task ids, and of the progress of running ones: its own
SQLite file in the node's data directory.

A task id is recorded once its view rows are durably applied at every destination, with the base rows its
batch scanned; a call naming only recorded tasks is answered at once (rows included, so the view's
rows_done stays exact), also after a restart. A ledger written before the row counts existed gets the
column (0 rows). `record` returns after a synchronous commit
(WAL, `synchronous=FULL`: the WAL is fsynced at every commit), so an id it returned for survives a crash of
the process or of the machine. The worker prunes ids group0 no longer holds (`prune(keep)`), so the ledger
stays as small as the task table.

A running task's checkpoint (`record_progress`): the first token its batch has not done yet, and the base rows it
scanned before it, written once a chunk's view rows are applied at every destination; a batch of the task started
again (after a restart, or for a new leader) resumes there. A task id stands for one base replica, tablet and view
pairing (any change of them makes new tasks), so a checkpoint never outlives what it was made for.

Why a file of its own rather than a table in the node store: the store may be PostgreSQL (the ledger is
local to the node's data directory whatever the storage URL), and the store's writer lock is held by live
writes and by view-row merges for seconds at a time, which must not delay answering from the ledger.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

FILE_NAME = "view_building_ledger.db"
CHUNK = 500  # ids per statement (SQLite allows 32766 bound parameters; keep statements small)


@dataclass(frozen=True)
class TaskCheckpoint:
    """Where a running task's batch goes on: the first token not done yet, and the base rows scanned before it."""

    next_token: int
    rows_scanned: int


def _configure(engine: sa.Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), CHUNK):
        yield ids[start:start + CHUNK]


def _checked(task_ids: Iterable[str]) -> list[str]:
    ids = sorted(set(task_ids))
    for task_id in ids:
        if not isinstance(task_id, str) or not task_id:
            raise ValueError(f"a task id must be a non-empty string, got {task_id!r}")
    return ids


class FinishedTaskLedger:
    """The set of finished task ids, kept in `path` (an SQLite file, created if missing). Thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._engine = sa.create_engine(sa.URL.create("sqlite", database=str(self.path)),
                                        connect_args={"check_same_thread": False})
        _configure(self._engine)
        self._table = sa.Table("finished_tasks", sa.MetaData(), sa.Column("task_id", sa.Text, primary_key=True),
                               sa.Column("rows_scanned", sa.BigInteger, nullable=False, server_default="0"))
        self._progress = sa.Table("task_progress", self._table.metadata,
                                  sa.Column("task_id", sa.Text, primary_key=True),
                                  sa.Column("next_token", sa.BigInteger, nullable=False),
                                  sa.Column("rows_scanned", sa.BigInteger, nullable=False))
        self._write_lock = threading.Lock()
        with self._engine.begin() as conn:
            self._table.metadata.create_all(conn)
            columns = {c["name"] for c in sa.inspect(conn).get_columns("finished_tasks")}
            if "rows_scanned" not in columns:
                conn.exec_driver_sql("ALTER TABLE finished_tasks ADD COLUMN rows_scanned BIGINT NOT NULL DEFAULT 0")

    @classmethod
    def for_data_dir(cls, data_dir: str | Path) -> FinishedTaskLedger:
        directory = Path(data_dir).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory / FILE_NAME)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> FinishedTaskLedger:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def record(self, task_ids: Iterable[str], rows_scanned: Iterable[int] = ()) -> None:
        """Add the ids, each with the base rows its batch scanned (parallel to `task_ids`; none given: 0), and drop
        their checkpoints; already recorded ids keep their rows; durable when this returns."""
        task_ids, rows = list(task_ids), list(rows_scanned)
        if rows and len(rows) != len(task_ids):
            raise ValueError(f"{len(rows)} row counts for {len(task_ids)} task ids")
        counts = dict(zip(task_ids, rows or [0] * len(task_ids)))
        ids = _checked(counts)
        if not ids:
            return
        statement = sqlite_insert(self._table).on_conflict_do_nothing(index_elements=["task_id"])
        with self._write_lock, self._engine.begin() as conn:
            conn.execute(statement, [{"task_id": i, "rows_scanned": int(counts[i])} for i in ids])
            self._delete(conn, [], ids)

    def finished(self, task_ids: Iterable[str]) -> set[str]:
        """The given ids that are recorded."""
        ids = _checked(task_ids)
        found: set[str] = set()
        with self._engine.connect() as conn:
            for chunk in _chunks(ids):
                column = self._table.c.task_id
                found.update(conn.execute(sa.select(column).where(column.in_(chunk))).scalars())
        return found

    def all(self) -> dict[str, int]:
        """Every recorded id with the base rows its batch scanned (what a worker loads when it starts)."""
        with self._engine.connect() as conn:
            rows = conn.execute(sa.select(self._table.c.task_id, self._table.c.rows_scanned))
            return {task_id: count for task_id, count in rows}

    def record_progress(self, progress: Mapping[str, TaskCheckpoint]) -> None:
        """Set the checkpoints of running tasks (task id -> where it goes on, rows before); durable on return."""
        ids = _checked(progress)
        if not ids:
            return
        statement = sqlite_insert(self._progress)
        statement = statement.on_conflict_do_update(
            index_elements=["task_id"],
            set_={"next_token": statement.excluded.next_token, "rows_scanned": statement.excluded.rows_scanned})
        rows = [{"task_id": i, "next_token": progress[i].next_token, "rows_scanned": progress[i].rows_scanned}
                for i in ids]
        with self._write_lock, self._engine.begin() as conn:
            conn.execute(statement, rows)

    def progress(self, task_ids: Iterable[str]) -> dict[str, TaskCheckpoint]:
        """The checkpoints recorded for the given ids (ids without one are absent)."""
        found: dict[str, TaskCheckpoint] = {}
        table = self._progress
        with self._engine.connect() as conn:
            for chunk in _chunks(_checked(task_ids)):
                query = sa.select(table.c.task_id, table.c.next_token, table.c.rows_scanned).where(
                    table.c.task_id.in_(chunk))
                found.update({task_id: TaskCheckpoint(token, rows) for task_id, token, rows in conn.execute(query)})
        return found

    def prune(self, keep: Iterable[str]) -> int:
        """Remove every id not in `keep` (the ids group0 still holds), and its checkpoint; the number of finished ids
        removed."""
        keep = set(keep)
        with self._write_lock, self._engine.begin() as conn:
            stale = sorted(set(conn.execute(sa.select(self._table.c.task_id)).scalars()) - keep)
            stale_progress = sorted(set(conn.execute(sa.select(self._progress.c.task_id)).scalars()) - keep)
            self._delete(conn, stale, stale_progress)
        return len(stale)

    def forget(self, task_ids: Iterable[str]) -> None:
        """Remove the given ids and their checkpoints (ids never recorded are ignored): `prune` when the caller
        computed the difference."""
        ids = _checked(task_ids)
        with self._write_lock, self._engine.begin() as conn:
            self._delete(conn, ids, ids)

    def _delete(self, conn: sa.Connection, finished: list[str], progress: list[str]) -> None:
        for table, ids in ((self._table, finished), (self._progress, progress)):
            for chunk in _chunks(ids):
                conn.execute(table.delete().where(table.c.task_id.in_(chunk)))
