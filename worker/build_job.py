"""One build_range batch as one Spark job: scan the base tablet replica once, compute every view's rows, merge them
at their paired view replicas (through `merge_view_rows`: the node merges locally without an RPC), so a retried
batch changes nothing."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from common.injection import Injections
from coordinator.core.errors import NotFound, Unavailable
from coordinator.core.migrations import (
    TabletTransition,
    feeding_count,
    paired_targets,
    position_of,
    transition_of,
    transitions_of_table,
    view_position_missing,
    view_replica_missing,
)
from coordinator.core.schema import Replica, Table, Task
from coordinator.core.tokens import tablet_range
from replica.rows import storage_spec
from storage.store import NodeStore

from worker.executor import BatchCancelled, BatchControl
from worker.spark_session import NodeSpark
from worker.spark_views import compute_view_rows, staged_token_range
from worker.tasks import StartBatch

log = logging.getLogger(__name__)

MergeViewRows = Callable[[Replica, Table, int, pa.Table], object]  # (view replica, view, schema version, rows)


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
    for view in views:  # an RF increase may have begun since the batch was planned
        waiting = view_position_missing(state, view.id, pair, base_map.replicas[tablet][pair])
        if waiting is not None:
            raise Unavailable(f"the batch on tablet {tablet} of {plan.base.qualified_name} cannot be finished yet: "
                              f"{waiting}")
    return replace(plan, views=views, view_replicas={v.id: state.tablets[v.id].replicas for v in views},
                   view_moves={v.id: transitions_of_table(state, v.id) for v in views},
                   schema_version=state.schema_version, pair=pair,
                   base_count=_feeding_count(state, plan.base.id, tablet))


@dataclass
class BuildStats:
    """Counters of the build jobs of one node (for the status RPC and metrics)."""

    spark_jobs: int = 0
    tablet_scans: int = 0
    rows_scanned: int = 0
    read_seconds: float = 0.0  # reading base tablet replicas into Arrow
    spark_seconds: float = 0.0  # hand-over to Spark, the view job, hand-back
    merge_seconds: float = 0.0  # merging view rows at their replicas

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
                 track_write: Callable[[], AbstractContextManager] = nullcontext):
        self._node_id = node_id
        self._store = store
        self._spark = spark
        self._read_state = read_state
        self._wait_writes_before = wait_writes_before
        self._merge_view_rows = merge_view_rows
        self._injections = injections
        # the merges of a batch's view rows count as a write routed under the version they read their destinations
        # at: a tablet migration's barrier waits for them (replica.write_path does the same for base writes)
        self._track_write = track_write
        self.stats = BuildStats()

    def __call__(self, start: StartBatch, control: BatchControl) -> int:
        self._injections.hit("worker_pause_build_range")
        self._injections.hit("worker_fail_build_range")
        if control.cancelled.is_set():
            raise BatchCancelled()  # its tasks went (a split or merge renamed them, say) while it waited
        plan = self._read_state(lambda s: build_plan(s, control.live_tasks(), self._node_id))
        self._wait_writes_before(plan.schema_version)
        started = time.perf_counter()
        with staged_token_range(self._spark, self._store, storage_spec(plan.base), plan.first_token,
                                plan.last_token) as (rows, frame):
            read = time.perf_counter() - started
            self.stats.add(tablet_scans=1, rows_scanned=rows, read_seconds=read)
            if rows:
                spark, merge = self._build(plan, frame, control)
                self.stats.add(spark_seconds=spark, merge_seconds=merge)
                log.info("batch %d: %s tablet %d, %d rows for %d view(s): read %.2fs, spark %.2fs, merge %.2fs",
                         start.batch_id, plan.base.qualified_name, start.tasks[0].tablet_id, rows,
                         len(plan.views), read, spark, merge)
        self._injections.hit("worker_pause_before_finish")
        return rows

    def _build(self, plan: BuildPlan, frame: Callable[[], DataFrame], control: BatchControl) -> tuple[float, float]:
        """Compute and deliver every view's rows; (seconds in Spark, seconds merging)."""
        started = time.perf_counter()
        per_view = compute_view_rows(frame(), plan.base, plan.views)
        self.stats.add(spark_jobs=1)
        computed = time.perf_counter()
        with self._track_write():
            plan = self._read_state(lambda s: routed_now(s, plan, self._node_id))
            for view in plan.views:
                if control.cancelled.is_set():
                    raise BatchCancelled()
                if any(t.view_id == view.id for t in control.live_tasks()):
                    self._deliver(plan, view, per_view[view.id])
        return computed - started, time.perf_counter() - computed

    def _deliver(self, plan: BuildPlan, view: Table, view_rows: pa.Table) -> None:
        """Merge the view's rows at every destination replica, the destinations at once (each merge mostly waits:
        on a peer, or on this node's merging child process); the first error once all of them ended."""
        parts = by_destination(view_rows, plan.view_replicas[view.id], plan.pair, plan.view_moves.get(view.id, {}),
                               plan.base_count)
        if not parts:
            return  # no base row of the batch has a row in this view
        if len(parts) == 1:
            (replica, part), = parts.items()
            self._merge_view_rows(replica, view, plan.schema_version, part)
            return
        with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="view-rows") as pool:
            merges = [pool.submit(self._merge_view_rows, replica, view, plan.schema_version, part)
                      for replica, part in parts.items()]
        for merge in merges:
            merge.result()


def by_destination(view_rows: pa.Table, replicas: tuple[tuple[Replica, ...], ...], pair: int,
                   moves: dict[int, TabletTransition] | None = None, base_count: int | None = None
                   ) -> dict[Replica, pa.Table]:
    """View rows grouped by the view replicas paired with this base replica in the view tablet owning each row
    (`migrations.paired_positions`; while that view tablet moves, its pending replica too)."""
    if view_rows.num_rows == 0:
        return {}

    def targets_of(tablet: int) -> tuple[Replica, ...]:
        count = len(replicas[tablet]) if base_count is None else base_count
        return paired_targets(replicas[tablet], (moves or {}).get(tablet), pair, count)

    targets = {targets_of(tablet) for tablet in range(len(replicas))}
    if len(targets) == 1:  # every view tablet's rows go to the same replicas (RF = nodes, or one node): no split
        return {replica: view_rows for replica in targets.pop()}
    tablets = tablet_indices(view_rows.column("token"), len(replicas))
    groups: dict[Replica, list[pa.Table]] = {}
    for tablet in pc.unique(tablets).to_pylist():
        rows = view_rows.filter(pc.equal(tablets, tablet))
        for destination in targets_of(tablet):
            groups.setdefault(destination, []).append(rows)
    return {replica: pa.concat_tables(parts) for replica, parts in groups.items()}


def tablet_indices(tokens: pa.ChunkedArray, tablet_count: int) -> pa.ChunkedArray:
    """`tokens.tablet_of` for a column of tokens: the high bits of the token, shifted into 0..count-1."""
    bits = tablet_count.bit_length() - 1
    if bits == 0:
        return pc.multiply(tokens, 0)
    high = pc.shift_right(pc.shift_right(tokens, 63 - bits), 1)  # pyarrow leaves a shift by 63 undone
    return pc.add(high, 1 << (bits - 1))
