"""The store's staging area: base mutations a bulk load stored for later, invisible to reads until moved in.

Each entry is one Arrow IPC stream of mutations (the mutation layout of `storage.arrow_layouts`) of one table, all in
one token range (a tablet's, when it was staged), numbered in staging order. A `process_staging` task moves the
entries of its tablet into the table (through the write path's merge, so their view updates are derived exactly as
a write's) and then deletes them; entries found at start-up are registered again.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import sqlalchemy as sa

from .engine import StoreEngine

MAX_PARAMS_PER_STATEMENT = 4000


@dataclass(frozen=True)
class StagedEntry:
    """One staged Arrow stream: its number, table, token range, row count and (when read) mutations."""

    seq: int
    table_id: str
    first_token: int
    last_token: int
    rows: int
    mutations: pa.Table | None = None


def staging_table(metadata: sa.MetaData) -> sa.Table:
    return sa.Table(
        "storage_staging",
        metadata,
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("table_id", sa.Text, nullable=False),
        sa.Column("first_token", sa.BigInteger, nullable=False),
        sa.Column("last_token", sa.BigInteger, nullable=False),
        sa.Column("row_count", sa.BigInteger, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sqlite_autoincrement=True,
    )


def encode_mutations(mutations: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, mutations.schema) as writer:
        writer.write_table(mutations)
    return sink.getvalue().to_pybytes()


def decode_mutations(payload: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(payload)).read_all()


class StoreStaging(StoreEngine):
    """The staging part of `NodeStore`."""

    _staging: sa.Table  # made by NodeStore.__init__

    def stage(self, table_id: str, first_token: int, last_token: int, mutations: pa.Table) -> int:
        """Store mutations of tokens first_token..last_token of a table, durable when this returns; their number."""
        row = {"table_id": table_id, "first_token": first_token, "last_token": last_token,
               "row_count": mutations.num_rows, "payload": encode_mutations(mutations)}
        with self._write_transaction() as conn:
            return conn.execute(self._staging.insert().returning(self._staging.c.seq), [row]).scalar_one()

    def staged_entries(self, table_id: str | None = None, first_token: int | None = None,
                       last_token: int | None = None, through: int | None = None,
                       with_mutations: bool = False) -> list[StagedEntry]:
        """The staged entries, in staging order: of one table, within a token range, numbered up to `through`."""
        staging = self._staging
        columns = [staging.c.seq, staging.c.table_id, staging.c.first_token, staging.c.last_token,
                   staging.c.row_count]
        statement = sa.select(*columns, *([staging.c.payload] if with_mutations else []))
        if table_id is not None:
            statement = statement.where(staging.c.table_id == table_id)
        if first_token is not None:
            statement = statement.where(staging.c.first_token >= first_token)
        if last_token is not None:
            statement = statement.where(staging.c.last_token <= last_token)
        if through is not None:
            statement = statement.where(staging.c.seq <= through)
        with self._read() as conn:
            rows = conn.execute(statement.order_by(staging.c.seq)).all()
        return [StagedEntry(*row[:5], decode_mutations(bytes(row[5])) if with_mutations else None) for row in rows]

    def staged_mutations(self, seqs: Sequence[int]) -> list[pa.Table]:
        """The mutations of the staged entries numbered `seqs` that are left, in staging order."""
        staging = self._staging
        tables = []
        with self._read() as conn:
            for start in range(0, len(seqs), MAX_PARAMS_PER_STATEMENT):
                chunk = list(seqs[start:start + MAX_PARAMS_PER_STATEMENT])
                statement = sa.select(staging.c.payload).where(staging.c.seq.in_(chunk)).order_by(staging.c.seq)
                tables += [decode_mutations(bytes(payload)) for payload in conn.execute(statement).scalars()]
        return tables

    def unstage(self, seqs: Sequence[int]) -> int:
        """Delete staged entries by number; how many there were."""
        deleted = 0
        seqs = list(seqs)
        with self._write_transaction() as conn:
            for start in range(0, len(seqs), MAX_PARAMS_PER_STATEMENT):
                chunk = seqs[start:start + MAX_PARAMS_PER_STATEMENT]
                deleted += conn.execute(self._staging.delete().where(self._staging.c.seq.in_(chunk))).rowcount
        return deleted

    def unstage_table(self, table_id: str) -> int:
        """Delete every staged entry of a (dropped) table; how many there were."""
        with self._write_transaction() as conn:
            return conn.execute(self._staging.delete().where(self._staging.c.table_id == table_id)).rowcount
