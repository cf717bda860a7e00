"""The durable outbox of view updates: delivers them to their view replicas and retries until acknowledged."""
from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass

import pyarrow as pa

from common.metrics import NodeMetrics
from common.replica_messages import RowBatch
from coordinator.core.errors import CoreError
from storage.store import NodeStore
from storage.store_types import OutboxEntry

from replica.outbox_payload import decode_payload
from replica.transport import describe

log = logging.getLogger(__name__)

OUTBOX_BATCH = 500

SendViewUpdate = Callable[[str, RowBatch], None]


@dataclass(frozen=True)
class QueuedViewUpdate:
    """A view-update batch stored in the outbox under `id`, waiting to be applied on node `target`."""

    id: int
    target: str
    batch: RowBatch


class ViewUpdateOutbox:
    """Delivers queued view updates through `send(target, batch)` and acknowledges (deletes) what arrived.

    The entries themselves are written by the base write, in the same store transaction as the base rows
    (`NodeStore.apply` with a `derive` function); this class only reads, delivers and acknowledges them.
    """

    def __init__(self, store: NodeStore, send: SendViewUpdate, metrics: NodeMetrics,
                 read_version_1: Callable[[bytes], RowBatch] | None = None,
                 removed_nodes: Callable[[], Collection[str]] = frozenset):
        self._store = store
        self._send = send
        self._removed_nodes = removed_nodes
        self._metrics = metrics
        self._read_version_1 = read_version_1
        self._delivering: set[int] = set()
        self._delivering_lock = threading.Lock()

    def deliver(self, updates: list[QueuedViewUpdate]) -> set[str]:
        """Send updates grouped per (node, view, shard); acknowledge what was delivered.

        Returns the targets that could not be reached; their updates stay in the outbox for a retry. An update
        another thread is already delivering is skipped.
        """
        claimed = self._claim(updates)
        try:
            groups = _grouped(claimed).items()
            return {target for (target, *_), group in groups if not self._deliver_group(target, group)}
        finally:
            self._release(claimed)

    def flush(self, max_pages: int = 20) -> None:
        """Retry pending view updates target by target, oldest first; an unreachable target is left at once.

        Paging per target means entries queued for a node that is down never hold up the others. Entries for a
        node removed from the cluster are dropped (`drop_removed_targets`).
        """
        targets = self._store.outbox_targets()
        for target in sorted(targets - self.drop_removed_targets(targets)):
            after_id = 0
            for _ in range(max_pages):
                page = self._store.outbox_pending(OUTBOX_BATCH, after_id=after_id, target=target)
                if not page:
                    break
                after_id = page[-1].id
                unclaimed = self._unclaimed(page)  # a write delivering its own entries right now needs no help
                if unclaimed and self.deliver(self._readable(unclaimed)):
                    break

    def drop_removed_targets(self, targets: set[str]) -> set[str]:
        """Delete the entries addressed to those of `targets` removed from the cluster; which they were.

        Such a node never comes back, and the view replicas it held were rebuilt from the base on their new nodes
        (a build reads the base rows these updates came from), so nothing else can ever take them.
        """
        gone = set(self._removed_nodes()) & targets
        dropped = 0
        for target in sorted(gone):
            count = self._store.outbox_drop_target(target)
            dropped += count
            log.warning("dropped %d view update(s) queued for node %s, which was removed from the cluster "
                        "(its view replicas were rebuilt elsewhere)", count, target)
        if dropped:
            self._metrics.view_updates_dropped.inc(dropped)
        return gone

    def _deliver_group(self, target: str, group: list[QueuedViewUpdate]) -> bool:
        try:
            self._send(target, _merged_batch(group))
        except CoreError as error:
            log.info("view update to %s deferred (kept in outbox): %s", target, describe(error))
            self._metrics.view_updates_deferred.inc(len(group))
            return False
        except Exception:  # noqa: BLE001 - unexpected: keep the entries, retry, and say so loudly
            log.warning("view update to %s failed unexpectedly (kept in outbox)", target, exc_info=True)
            self._metrics.view_updates_deferred.inc(len(group))
            return False
        self._store.outbox_ack([update.id for update in group])
        self._metrics.view_updates_sent.inc(len(group))
        return True

    def _readable(self, entries: list[OutboxEntry]) -> list[QueuedViewUpdate]:
        """The entries as queued updates; one this node cannot read is logged and stays in the outbox."""
        updates = []
        for entry in entries:
            try:
                batch = decode_payload(entry.payload, self._read_version_1)
            except Exception as error:  # noqa: BLE001 - whatever the reader raises, the other entries go on
                log.error("outbox entry %d for %s cannot be read and stays queued: %s", entry.id, entry.target, error)
                continue
            updates.append(QueuedViewUpdate(entry.id, entry.target, batch))
        return updates

    def _unclaimed(self, entries: list[OutboxEntry]) -> list[OutboxEntry]:
        with self._delivering_lock:
            return [entry for entry in entries if entry.id not in self._delivering]

    def _claim(self, updates: list[QueuedViewUpdate]) -> list[QueuedViewUpdate]:
        with self._delivering_lock:
            free = [u for u in updates if u.id not in self._delivering]
            self._delivering.update(u.id for u in free)
            return free

    def _release(self, updates: list[QueuedViewUpdate]) -> None:
        with self._delivering_lock:
            self._delivering.difference_update(u.id for u in updates)


def _grouped(updates: list[QueuedViewUpdate]) -> dict[tuple, list[QueuedViewUpdate]]:
    groups: dict = defaultdict(list)
    for update in updates:
        groups[(update.target, *_joinable(update.batch))].append(update)
    return groups


def _joinable(batch: RowBatch) -> tuple:
    """What batches must share to be sent as one: view, shard and form (rows, columns of one schema, or view rows)."""
    return batch.table_id, batch.shard, batch.view_rows, None if batch.columns is None else batch.columns.schema


def _merged_batch(group: list[QueuedViewUpdate]) -> RowBatch:
    """One batch with the rows of every update of a group, in outbox order, at the newest schema version."""
    return _joined([update.batch for update in group])


def _joined(batches: list[RowBatch]) -> RowBatch:
    first = batches[0]
    columns = None if first.columns is None else pa.concat_tables([b.columns for b in batches])
    return RowBatch(table_id=first.table_id, shard=first.shard, rows=tuple(row for b in batches for row in b.rows),
                    schema_version=max(b.schema_version for b in batches), columns=columns, view_rows=first.view_rows)


def grouped_updates(updates: list[tuple[str, RowBatch]]) -> list[tuple[str, RowBatch]]:
    """View updates joined per (target node, view, shard), each group's rows in their order (first seen first)."""
    groups: dict[tuple, list[RowBatch]] = defaultdict(list)
    for target, batch in updates:
        groups[(target, *_joinable(batch))].append(batch)
    return [(target, _joined(batches)) for (target, *_), batches in groups.items()]
