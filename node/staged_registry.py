"""A node's registrations of staged bulk-load rows in group0 (`RegisterStagedRows`), also after a restart."""
from __future__ import annotations

import logging
import threading
import uuid

from coordinator.core.commands import RegisterStagedRows
from coordinator.core.errors import Unavailable
from replica.staging import StagedTablet, StagingArea

log = logging.getLogger(__name__)

PROPOSE_TIMEOUT = 10.0


class StagedRegistry:
    """`replica.staging.Register` of a node: each staged entry becomes (or joins) a process_staging task."""

    def __init__(self, node_id: str, group0):
        self._node_id = node_id
        self._group0 = group0

    def __call__(self, entry: StagedTablet) -> None:
        command = RegisterStagedRows(cmd_id=uuid.uuid4().hex, base_id=entry.table_id, node=self._node_id,
                                     shard=entry.shard, tablet_id=entry.tablet_id, tablet_count=entry.tablet_count,
                                     through=entry.through, rows=entry.rows)
        try:
            outcome = self._group0.propose(command, timeout=PROPOSE_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - no leader now: the loader retries the batch
            raise Unavailable(f"registering staged rows in group0 failed: {error}; retry") from None
        if not outcome.ok:
            raise outcome.error

    def register_again(self, staging: StagingArea, stopping: threading.Event) -> None:
        """Register the staged entries found at start-up, retrying while group0 has no leader."""
        while not stopping.is_set():
            try:
                registered, deleted = staging.register_again(self._shard_of)
            except Unavailable as error:
                log.info("registering staged rows again failed (retried): %s", error)
                stopping.wait(1.0)
                continue
            if registered or deleted:
                log.info("staged rows found at start-up: %d entries registered again, %d never acknowledged deleted",
                         registered, deleted)
            return

    def _shard_of(self, table_id: str, tablet: int) -> int | None:
        def shard(state) -> int | None:
            tablet_map = state.tablets.get(table_id)
            if tablet_map is None or tablet >= tablet_map.tablet_count:
                return None
            return next((r.shard for r in tablet_map.replicas[tablet] if r.node == self._node_id), None)
        return self._group0.read(shard)
