"""The store's durable outbox: entries queued with a write (`StoreWrites`) until their targets acknowledge them."""
from __future__ import annotations

from collections.abc import Collection, Sequence

import sqlalchemy as sa

from .engine import StoreEngine
from .store_types import OutboxEntry

MAX_PARAMS_PER_STATEMENT = 4000


class StoreOutbox(StoreEngine):
    """The outbox part of `NodeStore`."""

    _outbox: sa.Table  # made by NodeStore.__init__

    def _insert_outbox(self, conn: sa.Connection, rows: list[dict[str, object]]) -> tuple[int, ...]:
        if not rows:
            return ()
        # RETURNING order is unspecified, but writers are serialised so ids ascend in insertion order.
        statement = self._outbox.insert().returning(self._outbox.c.id)
        return tuple(sorted(conn.execute(statement, rows).scalars()))

    def _add_outbox_view_column(self, conn: sa.Connection) -> None:
        """Give an outbox made before entries named their view its `view_id` column."""
        if "view_id" not in {c["name"] for c in sa.inspect(conn).get_columns(self._outbox.name)}:
            conn.exec_driver_sql(f"ALTER TABLE {self._outbox.name} ADD COLUMN view_id TEXT")

    def outbox_queue(self, entries: Sequence[tuple[str, bytes]], view_id: str) -> tuple[int, ...]:
        """Queue (target, payload) entries of a view's rows on their own, durable when this returns; their ids."""
        with self._write_transaction() as conn:
            return self._insert_outbox(conn, [{"target": t, "payload": bytes(p), "view_id": view_id}
                                              for t, p in entries])

    def outbox_holds_view(self, view_id: str, target: str) -> bool:
        """Whether an entry of the view's rows queued by `outbox_queue` for `target` is left."""
        outbox = self._outbox
        statement = sa.select(outbox.c.id).where(outbox.c.view_id == view_id, outbox.c.target == target).limit(1)
        with self._read() as conn:
            return conn.execute(statement).first() is not None

    def outbox_pending(self, limit: int = 1000, after_id: int = 0, target: str | None = None) -> list[OutboxEntry]:
        """The oldest unacknowledged outbox entries with an id above `after_id` (only for `target` if given)."""
        outbox = self._outbox
        statement = sa.select(outbox.c.id, outbox.c.target, outbox.c.payload).where(outbox.c.id > after_id)
        if target is not None:
            statement = statement.where(outbox.c.target == target)
        statement = statement.order_by(outbox.c.id).limit(limit)
        with self._read() as conn:
            return [OutboxEntry(id, target, bytes(payload)) for id, target, payload in conn.execute(statement)]

    def outbox_ack(self, ids: Sequence[int]) -> None:
        ids = list(ids)
        if not ids:
            return
        with self._write_transaction() as conn:
            for start in range(0, len(ids), MAX_PARAMS_PER_STATEMENT):
                chunk = ids[start:start + MAX_PARAMS_PER_STATEMENT]
                conn.execute(self._outbox.delete().where(self._outbox.c.id.in_(chunk)))

    def outbox_drop_target(self, target: str) -> int:
        """Delete every entry addressed to `target`; how many there were."""
        with self._write_transaction() as conn:
            return conn.execute(self._outbox.delete().where(self._outbox.c.target == target)).rowcount

    def outbox_last_id(self) -> int:
        """The id of the newest outbox entry ever queued that is still there, 0 when the outbox is empty."""
        with self._read() as conn:
            return conn.execute(sa.select(sa.func.max(self._outbox.c.id))).scalar_one() or 0

    def outbox_holds_upto(self, upto_id: int, except_targets: Collection[str] = ()) -> bool:
        """Whether an unacknowledged entry with an id up to `upto_id` is left (not counting `except_targets`)."""
        statement = sa.select(self._outbox.c.id).where(self._outbox.c.id <= upto_id)
        if except_targets:
            statement = statement.where(self._outbox.c.target.notin_(list(except_targets)))
        statement = statement.limit(1)
        with self._read() as conn:
            return conn.execute(statement).first() is not None

    def outbox_size(self) -> int:
        with self._read() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(self._outbox)).scalar_one()

    def outbox_targets(self) -> set[str]:
        """The nodes that have unacknowledged outbox entries."""
        with self._read() as conn:
            return set(conn.execute(sa.select(self._outbox.c.target).distinct()).scalars())
