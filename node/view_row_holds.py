"""A node's view rows for unreachable view replicas: kept in its outbox, held in group0 until delivered."""
from __future__ import annotations

import logging
import uuid

import pyarrow as pa

from coordinator.core.commands import HoldViewRows, ReleaseViewRows
from coordinator.core.schema import Replica, Table
from replica.local import LocalData
from storage.store import NodeStore

log = logging.getLogger(__name__)

PROPOSE_TIMEOUT = 5.0


class ViewRowHolds:
    """`worker.build_job.UnreachableReplicas` of a node, and the release of its holds once its outbox delivered
    their rows (`release_delivered`, after each outbox flush)."""

    def __init__(self, node_id: str, group0, local: LocalData, store: NodeStore):
        self._node_id = node_id
        self._group0 = group0
        self._local = local
        self._store = store

    def keep(self, replica: Replica, view: Table, schema_version: int, rows: pa.Table) -> None:
        self._local.queue_view_rows(replica.node, view.id, replica.shard, schema_version, rows)

    def hold(self, view_id: str, targets: tuple[str, ...]) -> None:
        outcome = self._group0.propose(HoldViewRows(cmd_id=uuid.uuid4().hex, view_id=view_id, holder=self._node_id,
                                                    targets=targets), timeout=PROPOSE_TIMEOUT)
        if not outcome.ok:
            raise outcome.error

    def release_delivered(self) -> int:
        """Release each hold of this node whose rows its outbox no longer holds; the holds released. The holds are
        read before the outbox, so rows queued after the look belong to a newer hold, which the release leaves."""
        holds = self._group0.read(lambda s: [(key, number) for key, number in s.held_view_rows.items()
                                             if key[1] == self._node_id])
        released = 0
        for (view_id, holder, target), number in holds:
            if self._store.outbox_holds_view(view_id, target):
                continue
            command = ReleaseViewRows(cmd_id=uuid.uuid4().hex, view_id=view_id, holder=holder, target=target,
                                      hold=number)
            try:
                outcome = self._group0.propose(command, timeout=PROPOSE_TIMEOUT)
            except Exception as error:  # noqa: BLE001 - no leader now: the next flush tries again
                log.info("releasing hold %d of view %s for node %s failed (retried): %s", number, view_id, target,
                         error)
                return released
            if outcome.value:
                log.info("view rows of view %s for node %s delivered: hold %d released", view_id, target, number)
                released += 1
        return released
