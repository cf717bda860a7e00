"""One build_range batch: scan the base tablet replica once, compute every view's rows in Spark, merge them at their
paired view replicas (through `merge_view_rows`: the node merges locally without an RPC), so a retried batch changes
nothing. A batch with repair tasks also reads those view replicas first and deletes the rows its base rows no longer
imply (`worker.view_repair`).

With `Chunking`, a batch reads its tablet replica in token order in chunks of about the cluster's `chunk_rows` rows
(`storage.bulk.chunk_end`), one Spark job and one set of merges each, so its memory does not grow with the tablet;
after each chunk it records its tasks' checkpoints in the ledger (`worker.build_progress`) and reports their rows to
group0, and a batch of the same tasks started again resumes at the checkpoint. Each chunk is a snapshot of its own:
a base row written after the batch began is in a later chunk's snapshot or sends its own view update, as for one
snapshot. A repair batch reads its whole range at once (its deletions need the whole snapshot).

A view replica that cannot be reached does not fail the batch: its rows wait in this node's durable outbox
(`UnreachableReplicas`), and group0 hears of it before the batch's tasks finish, so the view is built only once the
outbox has delivered them."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Protocol

import pyarrow as pa
from pyspark.sql import DataFrame

from common.injection import Injections
from coordinator.core.errors import NotFound, RangeMoved, Unavailable
from coordinator.core.migrations import (
    TabletTransition,
    feeding_count,
    position_of,
    transition_of,
    transitions_of_table,
    view_position_missing,
    view_replica_missing,
)
from coordinator.core.schema import Replica, Table, Task
from coordinator.core.tokens import tablet_range
from replica.rows import storage_spec
from storage.arrow_layouts import value_column_name
from storage import bulk
from storage.cells import Row
from storage.ledger import TaskCheckpoint
from storage.store import NodeStore

from worker.build_progress import after_chunk, checkpoint_of, resume_token
from worker.executor import BatchCancelled, BatchControl, BatchStopped
from worker.spark_session import NodeSpark
from worker.spark_views import compute_view_rows, staged_token_range
from worker.tasks import BatchRows, StartBatch
from worker.throttle import Throttle
from worker.view_repair import BaseRow, repair_floors, stale_deletes, stale_view_rows, view_keys_of
from worker.view_routing import by_destination, paired_targets_by_tablet

log = logging.getLogger(__name__)

MergeViewRows = Callable[[Replica, Table, int, pa.Table], object]  # (view replica, view, schema version, rows)
ReadViewRows = Callable[[Replica, Table, int, int, int], pa.Table]  # (view replica, view, version, first, last token)
DeleteViewRows = Callable[[Replica, Table, int, list[Row]], object]  # (view replica, view, schema version, deletions)


class Checkpoints(Protocol):
    """Where running tasks resume (`storage.ledger.FinishedTaskLedger`)."""

    def progress(self, task_ids: Iterable[str]) -> dict[str, TaskCheckpoint]: ...

    def record_progress(self, progress: Mapping[str, TaskCheckpoint]) -> None: ...


class UnreachableReplicas(Protocol):
    """Where a batch keeps the view rows for a view replica it cannot reach (the node's durable outbox), and how it
    tells group0 that it does (`HoldViewRows`) before its tasks finish."""

    def keep(self, replica: Replica, view: Table, schema_version: int, rows: pa.Table) -> None: ...

    def hold(self, view_id: str, targets: tuple[str, ...]) -> None: ...


@dataclass(frozen=True)
class Chunking:
    """How batches go chunk by chunk: the checkpoints, the most rows a chunk holds (read before each chunk:
    `build_settings.chunk_limit`), where the rows each task has scanned so far are reported (group0's
    `RecordTaskProgress`; a failed report is logged), the node's rate limit, and which views are paused."""

    checkpoints: Checkpoints
    chunk_rows: Callable[[], int]
    report: Callable[[Mapping[str, int]], object] = lambda rows: None
    throttle: Throttle | None = None
    paused: Callable[[], frozenset[str]] = frozenset


class BatchPaused(BatchStopped):
    """A chunked batch stopped at a checkpoint because a view of it is paused."""


@dataclass(frozen=True)
class BuildPlan:
    """What one batch reads and where its view rows go, taken from one group0 snapshot."""

    base: Table
    views: tuple[Table, ...]
    first_token: int
    last_token: int
    pair: int  # this replica's position among the base tablet's replicas: view replica `pair` is its partner
    view_replicas: dict[str, tuple[tuple[Replica, ...], ...]]
    schema_version: int
    view_moves: dict[str, dict[int, TabletTransition]] = field(default_factory=dict)  # view id -> tablet -> move
    base_count: int = 1  # the base tablet's replicas that feed views (`migrations.feeding_count`, `paired_positions`)
    tablet_id: int = 0


def build_plan(state, tasks: list[Task], node_id: str) -> BuildPlan:
    """The plan of a batch of tasks sharing base, tablet and replica; NotFound when the base or a view is gone."""
    if not tasks:
        raise NotFound("no task is left in this batch")
    base = state.tables.get(tasks[0].base_id)
    base_map = state.tablets.get(tasks[0].base_id)
    views = tuple(state.tables[t.view_id] for t in tasks if t.view_id in state.tables)
    if base is None or base_map is None or not views:
        raise NotFound(f"the base table or views of tasks {', '.join(t.id for t in tasks)} were dropped")
    tablet = tasks[0].tablet_id
    if all(t.id not in state.tasks for t in tasks) or tablet >= base_map.tablet_count:
        raise NotFound(f"tasks {', '.join(t.id for t in tasks)} are gone (their tablet was split or merged, or their "
                       "view dropped)")
    first, last = tablet_range(tablet, base_map.tablet_count)
    pair = position_of(state, base.id, tablet, node_id)
    if pair is None:
        raise NotFound(f"node {node_id} no longer holds tablet {tablet} of {base.qualified_name}")
    for task in tasks:
        waiting = view_replica_missing(state, task)
        if waiting is not None:
            raise Unavailable(f"task {task.id} cannot be finished yet: {waiting}")
    view_replicas = {v.id: state.tablets[v.id].replicas for v in views}
    view_moves = {v.id: transitions_of_table(state, v.id) for v in views}
    return BuildPlan(base, views, first, last, pair, view_replicas, state.schema_version, view_moves,
                     _feeding_count(state, base.id, tablet), tablet)


def _feeding_count(state, base_id: str, tablet: int) -> int:
    return feeding_count(state.tablets[base_id].replicas[tablet], transition_of(state, base_id, tablet))


def routed_now(state, plan: BuildPlan, node_id: str) -> BuildPlan:
    """The plan with the destinations as group0 has them now (a view tablet may have started to move, or split, an
    RF change may have changed the pairing since the batch began); views dropped meanwhile are left out. NotFound
    once this node no longer holds the base tablet (its task was aborted or handed over)."""
    views = tuple(v for v in plan.views if v.id in state.tablets)
    tablet = plan.tablet_id
    base_map = state.tablets.get(plan.base.id)
    if base_map is None or tablet_range(tablet, base_map.tablet_count) != (plan.first_token, plan.last_token):
        raise NotFound(f"tablet {tablet} of {plan.base.qualified_name} was split, merged or dropped: its tasks are "
                       "others now")
    pair = position_of(state, plan.base.id, tablet, node_id)
    if pair is None:
        raise NotFound(f"node {node_id} no longer holds tablet {tablet} of {plan.base.qualified_name}")
    own = (next((r for r in base_map.replicas[tablet] if r.node == node_id), None)
           or transition_of(state, plan.base.id, tablet).pending)  # a pending replica is in no position of the map
    for view in views:  # an RF increase may have begun since the batch was planned
        waiting = view_position_missing(state, view.id, pair, own)
        if waiting is not None:
            raise Unavailable(f"the batch on tablet {tablet} of {plan.base.qualified_name} cannot be finished yet: "
                              f"{waiting}")
    return replace(plan, views=views, view_replicas={v.id: state.tablets[v.id].replicas for v in views},
                   view_moves={v.id: transitions_of_table(state, v.id) for v in views},
                   schema_version=state.schema_version, pair=pair,
                   base_count=_feeding_count(state, plan.base.id, tablet))


@dataclass(frozen=True)
class Repair:
    """What a repair batch read before its snapshot: per view, the rows (key columns, `write_ts`, `tombstone`) its
    view replicas held; and the view_ts of its base rows once raised above them."""

    held: dict[str, pa.Table]
    view_ts: dict[BaseRow, int]


@dataclass
class BuildStats:
    """Counters of the build jobs of one node (for the status RPC and metrics)."""

    spark_jobs: int = 0
    tablet_scans: int = 0
    rows_scanned: int = 0
    read_seconds: float = 0.0  # reading base tablet replicas into Arrow
    spark_seconds: float = 0.0  # hand-over to Spark, the view job, hand-back
    merge_seconds: float = 0.0  # merging view rows at their replicas
    view_rows_repaired: int = 0  # stale view rows deleted by repair batches
    throttled_seconds: float = 0.0  # waiting out the build rate limit
    view_rows_kept: int = 0  # view rows left in the outbox for view replicas that could not be reached

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, **counts: float) -> None:
        with self._lock:
            for name, count in counts.items():
                setattr(self, name, getattr(self, name) + count)


class BuildJob:
    """`run_batch` of the worker executor: the batch's scan, Spark job and merges; returns the rows scanned."""

    def __init__(self, node_id: str, store: NodeStore, spark: NodeSpark, read_state: Callable,
                 wait_writes_before: Callable[[int], None], merge_view_rows: MergeViewRows, injections: Injections,
                 track_write: Callable[[], AbstractContextManager] = nullcontext,
                 read_view_rows: ReadViewRows | None = None, delete_view_rows: DeleteViewRows | None = None,
                 chunking: Chunking | None = None, unreachable: UnreachableReplicas | None = None):
        self._node_id = node_id
        self._store = store
        self._spark = spark
        self._read_state = read_state
        self._wait_writes_before = wait_writes_before
        self._merge_view_rows = merge_view_rows
        self._read_view_rows = read_view_rows
        self._delete_view_rows = delete_view_rows
        self._injections = injections
        # the merges of a batch's view rows count as a write routed under the version they read their destinations
        # at: a tablet migration's barrier waits for them (replica.write_path does the same for base writes)
        self._track_write = track_write
        self._chunking = chunking
        self._unreachable = unreachable
        self.stats = BuildStats()

    def __call__(self, start: StartBatch, control: BatchControl) -> int | BatchRows:
        self._injections.hit("worker_pause_build_range")
        self._injections.hit("worker_fail_build_range")
        if control.cancelled.is_set():
            raise BatchCancelled()  # its tasks went (a split or merge renamed them, say) while it waited
        plan = self._read_state(lambda s: build_plan(s, control.live_tasks(), self._node_id))
        self._wait_writes_before(plan.schema_version)
        repair = self._prepare_repair(plan, control)
        self.stats.add(tablet_scans=1)
        if repair is not None or self._chunking is None:
            rows = self._build_range(start, plan, control, plan.first_token, plan.last_token, repair)
        else:
            rows = self._build_chunks(start, plan, control, self._chunking)
        self._injections.hit("worker_pause_before_finish")
        return rows

    def _build_chunks(self, start: StartBatch, plan: BuildPlan, control: BatchControl,
                      chunking: Chunking) -> BatchRows:
        """The batch chunk by chunk from where its tasks' checkpoints say (see the module's docstring)."""
        task_ids = [t.id for t in control.live_tasks()]
        checkpoints = chunking.checkpoints.progress(task_ids)
        first = resume_token(plan.first_token, checkpoints, task_ids)
        if first > plan.first_token:
            log.info("batch %d: %s tablet %d resumes at token %d (its checkpoint)", start.batch_id,
                     plan.base.qualified_name, plan.tablet_id, first)
        scanned = 0
        while True:
            self._before_chunk(chunking, control)
            started = chunking.throttle.now() if chunking.throttle else 0.0
            last = bulk.chunk_end(self._store, storage_spec(plan.base), first, plan.last_token, chunking.chunk_rows())
            rows = self._build_range(start, plan, control, first, last, None)
            if chunking.throttle:
                chunking.throttle.charge(started, rows)
            scanned += rows
            live = [t.id for t in control.live_tasks()]
            checkpoints = after_chunk(checkpoints, live, plan.first_token, last, rows)
            if last < plan.last_token:  # the last chunk's rows go with the tasks' finish
                chunking.checkpoints.record_progress({t: checkpoints[t] for t in live})
                self._report(chunking, {t: checkpoints[t].rows_scanned for t in live})
            self._injections.hit("worker_pause_after_chunk")
            if last == plan.last_token:
                per_task = {t: checkpoint_of(checkpoints, t, plan.first_token).rows_scanned for t in task_ids}
                return BatchRows(scanned, per_task)
            first = last + 1

    def _before_chunk(self, chunking: Chunking, control: BatchControl) -> None:
        """Stop if the batch was cancelled or a view of it paused; wait out the node's rate limit."""
        if control.cancelled.is_set():
            raise BatchCancelled()
        paused = {t.view_id for t in control.live_tasks()} & chunking.paused()
        if paused:
            raise BatchPaused(f"the build of view(s) {', '.join(sorted(paused))} is paused (`vbc view resume`)")
        if chunking.throttle:
            waited = chunking.throttle.wait(control.cancelled)
            self.stats.add(throttled_seconds=waited)

    @staticmethod
    def _report(chunking: Chunking, rows: Mapping[str, int]) -> None:
        try:
            chunking.report(rows)
        except Exception as error:  # noqa: BLE001 - progress shown later; the checkpoint is what resumes
            log.warning("reporting the progress of tasks %s failed: %s", ", ".join(rows), error)

    def _build_range(self, start: StartBatch, plan: BuildPlan, control: BatchControl, first: int, last: int,
                     repair: Repair | None) -> int:
        """Read the replica's rows of tokens first..last, compute and deliver their view rows (and a repair's
        deletions); the rows read."""
        started = time.perf_counter()
        with staged_token_range(self._spark, self._store, storage_spec(plan.base), first, last) as (rows, frame):
            read = time.perf_counter() - started
            self.stats.add(rows_scanned=rows, read_seconds=read)
            if rows or repair is not None:
                spark, merge = self._build(plan, frame if rows else None, control, repair)
                self.stats.add(spark_seconds=spark, merge_seconds=merge)
                whole = (first, last) == (plan.first_token, plan.last_token)
                log.info("batch %d: %s tablet %d%s, %d rows for %d view(s): read %.2fs, spark %.2fs, merge %.2fs",
                         start.batch_id, plan.base.qualified_name, plan.tablet_id,
                         "" if whole else f" chunk {first}..{last}", rows, len(plan.views), read, spark, merge)
        return rows

    def _build(self, plan: BuildPlan, frame: Callable[[], DataFrame] | None, control: BatchControl,
               repair: Repair | None) -> tuple[float, float]:
        """Compute and deliver every view's rows (none from an empty snapshot), and a repair's deletions; (seconds in
        Spark, seconds merging)."""
        started = time.perf_counter()
        per_view = {} if frame is None else compute_view_rows(frame(), plan.base, plan.views)
        self.stats.add(spark_jobs=0 if frame is None else 1)
        computed = time.perf_counter()
        with self._track_write():
            plan = self._read_state(lambda s: routed_now(s, plan, self._node_id))
            for view in plan.views:
                if control.cancelled.is_set():
                    raise BatchCancelled()
                if not any(t.view_id == view.id for t in control.live_tasks()):
                    continue
                if view.id in per_view:
                    self._deliver(plan, view, per_view[view.id])
                if repair is not None and view.id in repair.held:
                    self._delete_stale(plan, view, per_view.get(view.id), repair)
        return computed - started, time.perf_counter() - computed

    def _prepare_repair(self, plan: BuildPlan, control: BatchControl) -> Repair | None:
        """For a batch with repair tasks: read what their view replicas hold, and raise the base rows' view_ts above
        it, before the snapshot (`worker.view_repair`); None for a plain batch."""
        views = {t.view_id for t in control.live_tasks() if t.repair}
        if not views:
            return None
        if self._read_view_rows is None or self._delete_view_rows is None:
            raise Unavailable(f"node {self._node_id} cannot repair views: its build job reads no view replica")
        held = {view.id: self._held_rows(plan, view) for view in plan.views if view.id in views}
        return Repair(held, self._store.raise_view_ts(plan.base.id, batch_floors(plan, held)))

    def _held_rows(self, plan: BuildPlan, view: Table) -> pa.Table:
        """Every row (deleted ones too) the view replicas this batch feeds hold, as key columns, write_ts and
        tombstone."""
        columns = [value_column_name(c) for c in view.primary_key] + ["write_ts", "tombstone"]
        replicas = plan.view_replicas[view.id]
        parts = [self._read_view_rows(target, view, plan.schema_version, *tablet_range(tablet, len(replicas)))
                 .select(columns)
                 for tablet, targets in enumerate(view_tablet_targets(plan, view)) for target in targets]
        return pa.concat_tables(parts) if parts else pa.table({c: [] for c in columns})

    def _delete_stale(self, plan: BuildPlan, view: Table, rows: pa.Table | None, repair: Repair) -> None:
        """Delete the view rows read before the snapshot that the snapshot does not imply."""
        implied = set() if rows is None else set(view_keys_of(view, rows))
        deletes = repair_deletes(plan, view, repair, implied)
        for replica, part in deletes.items():
            self._delete_view_rows(replica, view, plan.schema_version, part)
        self.stats.add(view_rows_repaired=sum(len(part) for part in deletes.values()))

    def _deliver(self, plan: BuildPlan, view: Table, view_rows: pa.Table) -> None:
        """Merge the view's rows at every destination replica, the destinations at once (each merge mostly waits:
        on a peer, or on this node's merging child process); the first error once all of them ended. The rows of
        replicas that cannot be reached are kept in the outbox, and group0 told."""
        parts = by_destination(view_rows, plan.view_replicas[view.id], plan.pair, plan.view_moves.get(view.id, {}),
                               plan.base_count)
        if len(parts) <= 1:
            kept = [self._merge_or_keep(plan, view, replica, part) for replica, part in parts.items()]
        else:
            with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="view-rows") as pool:
                merges = [pool.submit(self._merge_or_keep, plan, view, replica, part)
                          for replica, part in parts.items()]
            kept = [merge.result() for merge in merges]
        unreached = tuple(sorted({node for node in kept if node is not None}))
        if unreached:
            self._unreachable.hold(view.id, unreached)

    def _merge_or_keep(self, plan: BuildPlan, view: Table, replica: Replica, rows: pa.Table) -> str | None:
        """Merge the rows at `replica`; if it cannot be reached, keep them in the outbox and name its node."""
        try:
            self._merge_view_rows(replica, view, plan.schema_version, rows)
            return None
        except RangeMoved:
            raise  # the view tablet moved on: the batch is routed again
        except Unavailable as error:
            if self._unreachable is None or replica.node == self._node_id:
                raise
            self._unreachable.keep(replica, view, plan.schema_version, rows)
            self.stats.add(view_rows_kept=rows.num_rows)
            log.warning("view replica %s of %s cannot be reached (%s): its %d view rows wait in this node's outbox",
                        replica, view.qualified_name, error, rows.num_rows)
            return replica.node


def view_tablet_targets(plan: BuildPlan, view: Table) -> list[tuple[Replica, ...]]:
    """Per view tablet, the view replicas this batch's base replica feeds there."""
    return paired_targets_by_tablet(plan.view_replicas[view.id], plan.pair, plan.view_moves.get(view.id, {}),
                                    plan.base_count)


def batch_floors(plan: BuildPlan, held: dict[str, pa.Table]) -> dict[BaseRow, int]:
    """The view_ts floor of each base row of the batch, over every view it repairs (`view_repair.repair_floors`)."""
    floors: dict[BaseRow, int] = {}
    for rows in held.values():
        for base_row, floor in repair_floors(plan.base, rows, plan.first_token, plan.last_token).items():
            floors[base_row] = max(floors.get(base_row, 0), floor)
    return floors


def repair_deletes(plan: BuildPlan, view: Table, repair: Repair, implied: set[tuple]) -> dict[Replica, list[Row]]:
    """A repair's deletions of `view`'s stale rows (those `implied` lacks), by destination replica."""
    stale = stale_view_rows(plan.base, view, repair.held[view.id], plan.first_token, plan.last_token, implied)
    return deletes_by_destination(plan, view, stale_deletes(view, stale, repair.view_ts))


def deletes_by_destination(plan: BuildPlan, view: Table, deletes: list[Row]) -> dict[Replica, list[Row]]:
    """A repair's view row deletions grouped by the view replicas this batch's base replica feeds."""
    if not deletes:
        return {}
    tokens = pa.table({"token": pa.array([row.token for row in deletes], pa.int64()),
                       "i": pa.array(range(len(deletes)), pa.int64())})
    parts = by_destination(tokens, plan.view_replicas[view.id], plan.pair, plan.view_moves.get(view.id, {}),
                           plan.base_count)
    return {replica: [deletes[i] for i in part.column("i").to_pylist()] for replica, part in parts.items()}
