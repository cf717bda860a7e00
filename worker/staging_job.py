"""`run_batch` of the worker for process_staging batches: move a tablet replica's staged rows into the base."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from common.injection import Injections
from replica.staging import StagingArea

from worker.executor import BatchCancelled, BatchControl
from worker.tasks import BatchRows, StartBatch

log = logging.getLogger(__name__)


class StagingJob:
    """One pass over the staged entries of the batch's tablet replica numbered up to its tasks' highest
    `staged_through` (`replica.staging.StagingArea.process`), in chunks of the cluster's chunk size."""

    def __init__(self, staging: StagingArea, chunk_rows: Callable[[], int], injections: Injections):
        self._staging = staging
        self._chunk_rows = chunk_rows
        self._injections = injections

    def __call__(self, start: StartBatch, control: BatchControl) -> BatchRows:
        tasks = control.live_tasks()
        if not tasks:
            raise BatchCancelled()
        self._injections.hit("worker_pause_process_staging")
        first, through, began = tasks[0], max(t.staged_through for t in tasks), time.monotonic()
        rows = self._staging.process(first.base_id, first.tablet_id, through, start.shard, self._chunk_rows(),
                                     control.cancelled.is_set)
        log.info("process_staging batch %s: table %s tablet %d shard %d: %d staged rows (entries up to %d) applied in "
                 "%.2f s", start.batch_id, first.base_id, first.tablet_id, start.shard, rows, through,
                 time.monotonic() - began)
        if control.cancelled.is_set():
            raise BatchCancelled()
        return BatchRows(rows, {task.id: rows for task in start.tasks})
