"""The node's database of tablet replicas: one SQL table per TableSpec, a table catalog, a durable outbox and a
staging area."""
from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from .engine import StoreEngine, catalog_table, outbox_table
from .outbox import StoreOutbox
from .physical import PhysicalTable
from .rows import StoreRows
from .schema import StoreSchema
from .staging import StoreStaging, staging_table
from .writes import StoreWrites


class NodeStore(StoreWrites, StoreRows, StoreSchema, StoreOutbox, StoreStaging, StoreEngine):
    """The node's store, built on SQLAlchemy Core: SQLite (WAL mode) by default; any SQLAlchemy URL, e.g. PostgreSQL,
    by configuration. One NodeStore owns its database: writers are serialised inside the store (and, on PostgreSQL,
    by a transaction-level advisory lock), readers run concurrently with the writer.

    Composed of its parts, one module each: connections, writer lock and checkpoints (storage.engine), tables and
    their catalog (storage.schema), writes (storage.writes), reads by key and token range (storage.rows) and the
    outbox (storage.outbox) and the staging area of bulk loads (storage.staging).
    """

    def __init__(self, url: str | sa.URL) -> None:
        super().__init__(url)
        self._tables: dict[str, PhysicalTable] = {}
        metadata = sa.MetaData()
        self._outbox = outbox_table(metadata)
        self._catalog = catalog_table(metadata)
        self._staging = staging_table(metadata)
        with self._write_transaction() as conn:
            metadata.create_all(conn)
            self._add_outbox_view_column(conn)

    @classmethod
    def for_data_dir(cls, data_dir: str | Path) -> NodeStore:
        directory = Path(data_dir).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        return cls(sa.URL.create("sqlite", database=str(directory / "storage.db")))

    def __enter__(self) -> NodeStore:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
