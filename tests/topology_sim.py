"""A seeded simulation of a cluster with data through every kind of topology change (used by test_topology_sim.py).

No processes, threads or clocks. group0 is a log applied by the real `Group0State.apply` on every node, each node at
its own pace (a lagging node routes with the state it has). The rows are real `storage.cells.Row`s merged by the
store's own rule (`NodeStore._merged`), one dict per (node, table): a node keeps a table's rows by token whatever
its tablets, as the store does. What runs is the product's code:

- writes: routed by `replica.write_path.route` from a random, possibly lagging, coordinator; each replica's part is
  delivered on its own step, checked with `pair_index` (a replica refuses a write routed with a stale map, and the
  client retries it), merged, and its view updates computed by `replica.view_updates.view_updates` into the node's
  outbox, delivered later in any order;
- builds: batches chosen by the planner (`replica_queues`, `next_batch`), planned by the worker's `build_plan`,
  scanned on one step and delivered on a later one through `routed_now` and `by_destination`, then finished by
  `FinishViewBuildingTasks`; a view replica the batch cannot reach gets its rows through the node's outbox, held in
  group0 (`HoldViewRows`) until the node sees them delivered (`ReleaseViewRows`); a repair batch (after a node died) first reads its view replicas and raises its base
  rows' view_ts, then deletes the stale view rows (`worker.view_repair`, `deletes_by_destination`);
- tablet operations: the leader's `MigrationLoop` decides every migration, merge, RF change, drain, removal and
  balancer move; the simulation carries out its barriers (every node catches up, writes and view updates begun
  before are delivered), streams (which may fail) and cleanups;
- reads: planned on a coordinator's state and served range by range on later steps, each replica checking with
  `moved_away` that it still serves the range it is asked for, the coordinator re-planning a refused range;
- staged loads (unless `staging=False`): a bulk load's write goes to the staging area of every replica of a table with
  views whose tablet is not in transition (as `route_columns` routes it); each replica checks what
  `replica.staging.StagingArea.stage` checks, keeps the rows and registers them (`RegisterStagedRows`, the real
  refusals: the rows are then written directly); a later step runs the replica's `process_staging` tasks of one
  tablet as the worker does (its entries up to the tasks' number applied as a write, then deleted, the tasks
  finished). A node that dies loses its staged rows.

After every command `Group0State.validate()` runs (the conftest fixture) and `MigrationLoop.validate()` after every
event. At the end of a schedule every base replica holds the base rows of its tablets and every view replica the
view rows of its tablets, as computed from the client's own model of the base (`coordinator.core.views.view_row`);
every read returned exactly the rows the model held for the keys nobody wrote while it ran.

Between a node's death and the end of the repairs it causes, a view replica may hold rows its lost updates would have
deleted or replaced: the checks at barriers skip built views once a node died; the final check does not.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace

import pyarrow as pa

from common.replica_messages import RowBatch
from coordinator.core import migrations as core_migrations
from coordinator.core.commands import (
    AlterKeyspace,
    ColumnSpec,
    Command,
    CreateKeyspace,
    CreateTable,
    CreateView,
    DecommissionNode,
    FinishViewBuildingTasks,
    HoldViewRows,
    RegisterNode,
    RegisterStagedRows,
    ReleaseViewRows,
    RequestTabletMerge,
    SplitTablets,
    StartTabletMigration,
    WhereTerm,
)
from coordinator.core.errors import CoreError, Unavailable
from coordinator.core.migration_loop import (
    CLEANUP_PENDING,
    BarrierFailure,
    CallError,
    CleanupFailure,
    Fenced,
    HitPausePoint,
    InjectedFault,
    LeadershipChanged,
    Leave,
    MemberRemoved,
    MigrationConfig,
    MigrationLoop,
    Propose,
    ProposalDone,
    RemoveMember,
    RunBarrier,
    RunCleanup,
    RunStream,
    StepDone,
    StepFailed,
    StreamFailure,
    Tick,
)
from coordinator.core.planner import next_batch, replica_queues
from coordinator.core.schema import TASK_PROCESS_STAGING
from coordinator.core.state import Group0State
from coordinator.core.tokens import tablet_of, tablet_range
from coordinator.core.views import view_row
from replica.local import moved_away
from replica.rows import upsert_row, visible_row
from replica.view_updates import pair_index, view_updates, write_context
from replica.write_path import route
from storage.arrow_layouts import value_column_name
from storage.cells import Cell, Row, fed_after_stream, is_live, with_view_ts, write_ts
from storage.store import NodeStore
from worker.build_job import (
    Repair,
    batch_floors,
    build_plan,
    by_destination,
    repair_deletes,
    routed_now,
    view_tablet_targets,
)

BASE = f"{1:032x}"
COLUMNS = (ColumnSpec("k", "int"), ColumnSpec("a", "int"), ColumnSpec("b", "int"))
KEYS = 64
# Client timestamps advance by TICK per write (microseconds of a clock, in effect), so the +1 bumps of view_ts that
# late writes cause stay below the next write's timestamp, as they do in a cluster. With ticks of 1, two base
# replicas' view_ts of one row could be compared across a change of feeder and a stale image win a tie.
TICK = 1000
VALUES = 6
merged_row = NodeStore._merged  # the store's own merge of a mutation into a stored row
# The nodes' own copies of group0 apply the log the truth already applied (and validated, in the tests)
apply_replicated = Group0State.apply


@dataclass(eq=False)
class SimNode:
    """One node: its group0 state (applied at its own pace), its rows, and its outbox of view updates."""

    id: str
    shards: int
    state: Group0State = field(default_factory=Group0State)
    applied: int = 0
    rows: dict[str, dict[tuple, Row]] = field(default_factory=dict)  # table id -> key -> stored row
    outbox: list = field(default_factory=list)  # (target node, RowBatch) of view updates not yet delivered
    staged: list = field(default_factory=list)  # StagedEntry of bulk-loaded rows not yet in the base
    staged_seq: int = 0
    up: bool = True

    def table_rows(self, table_id: str) -> dict[tuple, Row]:
        return self.rows.setdefault(table_id, {})


@dataclass(frozen=True)
class StagedEntry:
    """Rows a replica keeps in its staging area (`storage.staging`): number, token range staged for, rows."""

    seq: int
    first_token: int
    last_token: int
    rows: tuple


@dataclass(eq=False)
class Write:
    """A client's write: its mutation, and the replica deliveries still to make."""

    row: Row
    deliveries: list  # (node, RowBatch)
    failed: bool = False


@dataclass(eq=False)
class Read:
    """A full scan of a table in flight: ranges planned at a version, served one per step."""

    coordinator: str
    table_id: str
    version: int
    ranges: list  # (first, last, replica)
    rows: dict = field(default_factory=dict)  # key -> visible values
    dirty: set = field(default_factory=set)  # keys written while it ran: not checked
    replans: int = 0


@dataclass(eq=False)
class Batch:
    """A build batch whose base rows were scanned, waiting to deliver its view rows."""

    node: str
    task_ids: tuple[str, ...]
    plan: object
    rows: list
    repair: Repair | None = None


class Simulation:
    """One seeded schedule."""

    def __init__(self, seed: int, stats: Counter, faults: bool = True, staging: bool = True, restarts: bool = True):
        self.rng = random.Random(seed)
        self.stats = stats
        self.faults = faults
        self.staging = staging
        self.restarts = restarts
        self.restarting: set[str] = set()  # nodes down for a restart: back later with what they stored
        self.log: list[Command] = []
        self.truth = Group0State()
        self.model: dict[tuple, Row] = {}  # the client's base rows: every write it made, merged
        self.shown: dict[int, tuple[Row, dict | None]] = {}  # id(row) -> the row and what a read shows of it
        self.clock = 100
        self.writes: list[Write] = []
        self.retries: list[Row] = []
        self.reads: list[Read] = []
        self.batches: list[Batch] = []
        self.views_made = 0
        self.deaths = 0
        self.ids = 0
        count = self.rng.choice((3, 3, 4))
        self.nodes = {f"n{i}": SimNode(f"n{i}", self.rng.choice((1, 2))) for i in range(1, count + 1)}
        for node in self.nodes.values():
            self.append(RegisterNode(node_id=node.id, grpc="g", raft=f"r{node.id}", shards=node.shards, cmd_id=None))
        self.append(CreateKeyspace(name="ks", rf=self.rng.randint(1, min(3, count)),
                                   initial_tablets=self.rng.choice((1, 2, 4, 8)), cmd_id=None))
        self.append(CreateTable(id=BASE, keyspace="ks", name="t", columns=COLUMNS, partition_key=("k",),
                                clustering_key=(), cmd_id=None))
        self.table = self.truth.tables[BASE]
        self.now = 0.0
        self.parallel = self.rng.choice((1, 2, 4))  # migrations at once: one at a time spreads an RF change out
        self.leader = "n1"
        self.term = 1
        self.events: list = []  # (loop, event) waiting to be handled
        self.steps: list = []  # (loop, step) under way
        self.loop = self.new_loop(self.leader)
        self.events.append((self.loop, LeadershipChanged(True, self.term)))
        if self.rng.random() < 0.7:
            self.create_view()
        for node in self.nodes.values():
            self.catch_up(node)

    # ------------------------------------------------------------- group0

    def new_id(self) -> str:
        self.ids += 1
        return f"{self.ids:032x}"

    def append(self, command: Command) -> CoreError | None:
        outcome = self.truth.apply(command)
        self.log.append(command)
        return outcome.error

    def catch_up(self, node: SimNode, index: int | None = None) -> None:
        index = len(self.log) if index is None else min(index, len(self.log))
        while node.applied < index:
            apply_replicated(node.state, self.log[node.applied])
            node.applied += 1

    def lag(self, node: SimNode) -> None:
        """Replication: the node applies part of what it misses."""
        self.catch_up(node, node.applied + self.rng.randint(1, 4))

    def catch_up_to_version(self, node: SimNode, version: int) -> None:
        while node.state.schema_version < version and node.applied < len(self.log):
            self.catch_up(node, node.applied + 1)

    def up_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.up]

    def visible(self, table, row: Row) -> dict | None:
        """`visible_row`, once per stored row (rows are values: a write stores a new one)."""
        shown = self.shown.get(id(row))
        if shown is None or shown[0] is not row:
            shown = self.shown[id(row)] = (row, visible_row(table, row))
        return shown[1]

    # ------------------------------------------------------------- writes

    def write(self) -> None:
        key = (self.rng.randrange(KEYS),)
        late = self.rng.random() < 0.1  # a write that arrives after newer ones: replicas bump its view_ts by one
        ts = self.clock - self.rng.randint(1, 5 * TICK) if late else self.clock + TICK
        self.clock = max(self.clock, ts)
        self.stats["late writes" if late else "writes"] += 1
        row = self.mutation(key, ts)
        self.model[key] = merged_row(self.model.get(key), row) or self.model.get(key) or row
        for read in self.reads:
            read.dirty.add(key)
        coordinator = self.rng.choice(self.up_nodes())
        if self.staging and self.rng.random() < 0.3:
            self.route_staged(row, coordinator)
        else:
            self.route(row, coordinator)

    def mutation(self, key: tuple, ts: int) -> Row:
        token = upsert_row(self.table, {"k": key[0]}, ts).token
        kind = self.rng.random()
        if kind < 0.15:
            self.stats["deletes"] += 1
            return Row(token, key, tomb_ts=ts)
        cells = {}
        if kind < 0.6:
            cells["a"] = Cell(self.rng.randrange(VALUES) if self.rng.random() < 0.9 else None, ts)
        if kind > 0.4:
            cells["b"] = Cell(self.rng.randrange(VALUES), ts)
        return Row(token, key, marker_ts=ts, cells=cells)

    def route(self, row: Row, coordinator: SimNode) -> None:
        deliveries = route(coordinator.state, [(self.table, row)], row.marker_ts or row.tomb_ts)
        self.writes.append(Write(row, list(deliveries)))

    def route_staged(self, row: Row, coordinator: SimNode) -> None:
        """A bulk load's row: staged on every replica when the coordinator sees views and its tablet at rest (as
        `route_columns` with `staged` decides), else written directly."""
        state = coordinator.state
        deliveries = route(state, [(self.table, row)], row.marker_ts or row.tomb_ts)
        tablet = tablet_of(row.token, state.tablets[BASE].tablet_count)
        if any(True for _ in state.views_of(BASE)) and (BASE, tablet) not in state.transitions:
            deliveries = [(node, replace(batch, staged=True)) for node, batch in deliveries]
            self.stats["staged writes"] += 1
        self.writes.append(Write(row, list(deliveries)))

    def deliver_write(self, write: Write) -> None:
        node_id, batch = write.deliveries.pop(self.rng.randrange(len(write.deliveries)))
        node = self.nodes[node_id]
        if not node.up:
            write.failed = True
        else:
            self.catch_up_to_version(node, batch.schema_version)
            applied = self.stage(node, batch) if batch.staged else self.apply_base_write(node, batch)
            write.failed |= not applied
        if not write.deliveries:
            self.writes.remove(write)
            if write.failed:
                self.stats["writes retried"] += 1
                self.retries.append(write.row)

    def apply_base_write(self, node: SimNode, batch) -> bool:
        context = write_context(node.state, batch.table_id)
        try:
            for row in batch.rows:
                pair_index(context, node.id, row.token)
        except CoreError:
            self.stats["writes refused by a replica"] += 1
            return False
        stored = node.table_rows(batch.table_id)
        for row in batch.rows:
            old = stored.get(row.key)
            new = merged_row(old, row)
            if new is not None:
                stored[row.key] = new
                node.outbox.extend(view_updates(context, node.id, old, new))
        return True

    def stage(self, node: SimNode, batch) -> bool:
        """`StagingArea.stage`: refused (False, the client writes the row directly) without views, for a tablet in
        transition or of another replica; else kept and registered, and refused if group0 refuses the registration."""
        context = write_context(node.state, batch.table_id)
        if context is None or not context.views:
            self.stats["staged writes refused"] += 1
            return False
        count = len(context.base_replicas)
        tablet = tablet_of(batch.rows[0].token, count)
        try:
            pair_index(context, node.id, batch.rows[0].token)
        except CoreError:
            self.stats["staged writes refused"] += 1
            return False
        if tablet in context.base_moves:
            self.stats["staged writes refused"] += 1
            return False
        node.staged_seq += 1
        entry = StagedEntry(node.staged_seq, *tablet_range(tablet, count), batch.rows)
        node.staged.append(entry)
        error = self.append(RegisterStagedRows(base_id=BASE, node=node.id, shard=batch.shard, tablet_id=tablet,
                                               tablet_count=count, through=entry.seq, rows=len(entry.rows),
                                               cmd_id=self.new_id()))
        if error is not None:
            node.staged.remove(entry)
            self.stats["staged registrations refused"] += 1
            return False
        return True

    def process_staging(self, task=None) -> None:
        """A process_staging batch (`replica.staging.StagingArea.process`): every task of one tablet replica, its
        entries up to their highest number applied as a write on the node's state, deleted, the tasks finished."""
        tasks = [t for t in self.truth.tasks.values()
                 if t.type == TASK_PROCESS_STAGING and self.nodes[t.replica.node].up]
        if task is None:
            if not tasks:
                return
            task = self.rng.choice(tasks)
        group = [t for t in tasks
                 if (t.base_id, t.tablet_id, t.replica) == (task.base_id, task.tablet_id, task.replica)]
        node = self.nodes[task.replica.node]
        self.catch_up(node)
        first, last = tablet_range(task.tablet_id, node.state.tablets[BASE].tablet_count)
        through = max(t.staged_through for t in group)
        for entry in [e for e in node.staged if (e.first_token, e.last_token) == (first, last) and e.seq <= through]:
            batch = RowBatch(BASE, task.replica.shard, entry.rows, node.state.schema_version)
            assert self.apply_base_write(node, batch), \
                f"{node.id} refused its own staged rows of tablet {task.tablet_id}"
            node.staged.remove(entry)
            self.stats["staged entries processed"] += 1
        self.append(FinishViewBuildingTasks(term=1, task_ids=tuple(t.id for t in group), cmd_id=None))

    def retry(self) -> None:
        row = self.retries.pop(0)
        coordinator = self.rng.choice(self.up_nodes())
        self.catch_up(coordinator)
        self.route(row, coordinator)

    def deliver_view_update(self, node: SimNode, index: int) -> None:
        target_id, batch = node.outbox[index]
        target = self.nodes[target_id]
        if not target.up:
            return
        node.outbox.pop(index)
        self.catch_up_to_version(target, batch.schema_version)
        stored = target.table_rows(batch.table_id)
        for row in batch.rows:
            new = merged_row(stored.get(row.key), row)
            if new is not None:
                stored[row.key] = new

    # ------------------------------------------------------------- views and builds

    def create_view(self) -> None:
        self.views_made += 1
        view_id = f"{0xabc000 + self.views_made:032x}"
        columns = ("k", "a", "b") if self.rng.random() < 0.5 else None
        where = (WhereTerm("a", "IS NOT NULL", None),) if self.rng.random() < 0.5 else (
            WhereTerm("a", ">", self.rng.randrange(VALUES)),)
        assert self.append(CreateView(id=view_id, keyspace="ks", name=f"v{self.views_made}", base="t",
                                      partition_key=("a",), clustering_key=("k",), columns=columns, where=where,
                                      cmd_id=None)) is None
        self.stats["views created"] += 1

    def start_batch(self) -> None:
        queues = replica_queues(self.truth, (BASE,))
        candidates = [r for r in sorted(queues) if self.nodes[r.node].up and BASE in queues[r]]
        if not candidates:
            return
        replica = self.rng.choice(candidates)
        ids = next_batch(queues[replica][BASE])
        node = self.nodes[replica.node]
        self.catch_up(node)
        tasks = [node.state.tasks[i] for i in ids]
        try:
            plan = build_plan(node.state, tasks, node.id)
            repair = self.prepare_repair(node, plan, tasks)
        except CoreError:
            self.stats["batches refused"] += 1
            return
        rows = [r for r in node.table_rows(BASE).values() if plan.first_token <= r.token <= plan.last_token]
        self.batches.append(Batch(node.id, ids, plan, rows, repair))
        self.stats["batches scanned"] += 1

    def prepare_repair(self, node: SimNode, plan, tasks) -> Repair | None:
        """`BuildJob._prepare_repair`: read the view replicas a repair batch feeds, raise the base rows' view_ts above
        their rows (as `NodeStore.raise_view_ts` does), before the snapshot."""
        views = {t.view_id for t in tasks if t.repair}
        if not views:
            return None
        held = {view.id: self.held_rows(plan, view) for view in plan.views if view.id in views}
        stored, view_ts = node.table_rows(BASE), {}
        for (token, key), floor in batch_floors(plan, held).items():
            row = stored.get(key)
            if row is not None:
                if row.view_ts is None or row.view_ts < floor:
                    row = stored[key] = with_view_ts(row, floor)
                view_ts[(token, key)] = row.view_ts
        self.stats["repair batches scanned"] += 1
        return Repair(held, view_ts)

    def held_rows(self, plan, view) -> pa.Table:
        """What `BuildJob._held_rows` reads: every row the fed view replicas hold, as key columns, write_ts and
        tombstone; Unavailable (the batch fails) when one of them is down."""
        replicas, held = plan.view_replicas[view.id], []
        for tablet, targets in enumerate(view_tablet_targets(plan, view)):
            first, last = tablet_range(tablet, len(replicas))
            for target in targets:
                if not self.nodes[target.node].up:
                    raise Unavailable(f"{target} is down")
                held += [row for row in self.nodes[target.node].table_rows(view.id).values()
                         if first <= row.token <= last]
        columns = {value_column_name(c): [row.key[i] for row in held] for i, c in enumerate(view.primary_key)}
        return pa.table({**columns, "write_ts": pa.array([write_ts(row) for row in held], pa.int64()),
                         "tombstone": pa.array([not is_live(row) for row in held], pa.bool_())})

    def deliver_batch(self, batch: Batch, fail: bool) -> None:
        self.batches.remove(batch)
        node = self.nodes[batch.node]
        if fail or not node.up:
            self.stats["batches failed"] += 1
            return
        try:
            plan = routed_now(node.state, batch.plan, node.id)
        except CoreError:
            self.stats["batches cancelled"] += 1
            return
        live = [i for i in batch.task_ids if i in node.state.tasks and not node.state.tasks[i].aborted]
        for view in plan.views:
            if any(node.state.tasks[i].view_id == view.id for i in live):
                implied, kept = self.merge_view_rows(node, plan, view, batch.rows)
                if kept:
                    self.append(HoldViewRows(view_id=view.id, holder=node.id, targets=tuple(sorted(kept)),
                                             cmd_id=None))
                if batch.repair is not None and view.id in batch.repair.held:
                    self.delete_stale(plan, view, implied, batch.repair)
        self.append(FinishViewBuildingTasks(term=1, task_ids=tuple(live), cmd_id=None))
        self.stats["batches finished"] += 1

    def merge_view_rows(self, node: SimNode, plan, view, base_rows: list[Row]) -> tuple[set[tuple], set[str]]:
        """Deliver the batch's view rows to their destinations, keeping in the node's outbox the rows of one it cannot
        reach (`BuildJob._merge_or_keep`); the view keys the batch's base rows imply, and the nodes rows were kept
        for."""
        view_rows = []
        for row in base_rows:
            mapped = view_row(view, self.visible(self.table, row))
            if mapped is not None:
                view_rows.append(upsert_row(view, mapped[1], row.view_ts or write_ts(row)))
        table = pa.table({"token": pa.array([r.token for r in view_rows], pa.int64()),
                          "i": pa.array(range(len(view_rows)), pa.int64())})
        kept = set()
        for replica, part in by_destination(table, plan.view_replicas[view.id], plan.pair,
                                            plan.view_moves.get(view.id, {}), plan.base_count).items():
            target = self.nodes[replica.node]
            rows = [view_rows[i] for i in part.column("i").to_pylist()]
            if not target.up and target.id not in self.restarting:
                continue  # a dead node's view replicas are rebuilt elsewhere
            if not target.up or (self.faults and target is not node and self.rng.random() < 0.1):
                node.outbox.append((target.id, RowBatch(view.id, replica.shard, tuple(rows), plan.schema_version,
                                                        view_rows=True)))
                kept.add(target.id)
                self.stats["view rows kept for an unreachable replica"] += 1
                continue
            self.merge_rows(target, view.id, rows)
        return {row.key for row in view_rows}, kept

    def release_holds(self, node: SimNode) -> None:
        """`ViewRowHolds.release_delivered`: the node's holds as its state shows them, then its outbox."""
        holds = [(key, number) for key, number in node.state.held_view_rows.items() if key[1] == node.id]
        for (view_id, holder, target), number in holds:
            if any(batch.view_rows and batch.table_id == view_id and to == target for to, batch in node.outbox):
                continue
            self.append(ReleaseViewRows(view_id=view_id, holder=holder, target=target, hold=number, cmd_id=None))
            released = (view_id, holder, target) not in self.truth.held_view_rows
            self.stats["holds released" if released else "hold releases refused (held again since)"] += 1

    def delete_stale(self, plan, view, implied: set[tuple], repair: Repair) -> None:
        """`BuildJob._delete_stale`."""
        for replica, rows in repair_deletes(plan, view, repair, implied).items():
            if self.nodes[replica.node].up:
                self.merge_rows(self.nodes[replica.node], view.id, rows)
            self.stats["stale view rows deleted by repairs"] += len(rows)

    @staticmethod
    def merge_rows(target: SimNode, table_id: str, rows: list[Row]) -> None:
        stored = target.table_rows(table_id)
        for row in rows:
            new = merged_row(stored.get(row.key), row)
            if new is not None:
                stored[row.key] = new

    # ------------------------------------------------------------- tablet operations (the leader's MigrationLoop)

    def new_loop(self, node_id: str) -> MigrationLoop:
        return MigrationLoop(MigrationConfig(down_after=5.0, retry_delay=1.0, max_parallel=self.parallel),
                             node_id=node_id, new_id=self.new_id)

    def loop_handle(self, loop: MigrationLoop, *events) -> None:
        instructions = loop.handle(self.truth, *events)
        loop.validate()
        for instruction in instructions:
            self.carry_out(loop, instruction)

    def carry_out(self, loop: MigrationLoop, instruction) -> None:
        if isinstance(instruction, Propose):
            refusal = self.append(instruction.command)
            self.stats[f"proposed {type(instruction.command).__name__}"] += 1
            if refusal is None and isinstance(instruction.command, StartTabletMigration):
                self.stats[f"migrations started ({instruction.command.kind})"] += 1
            self.events.append((loop, ProposalDone(instruction.epoch, instruction.command, refusal)))
        elif isinstance(instruction, HitPausePoint):
            if self.faults and self.rng.random() < 0.02:
                self.stats["pause point failed"] += 1
                self.events.append((loop, StepFailed(instruction, InjectedFault("injected"))))
            else:
                self.events.append((loop, StepDone(instruction)))
        elif isinstance(instruction, (RunBarrier, RunStream, RunCleanup)):
            self.steps.append((loop, instruction))
        elif isinstance(instruction, RemoveMember):
            self.stats["members removed"] += 1
            self.events.append((loop, MemberRemoved(instruction.epoch, instruction.node_id)))
        elif isinstance(instruction, Leave):
            self.stats["drained leaders left"] += 1
            self.change_leader(avoid=loop.node_id)

    def change_leader(self, avoid: str | None = None) -> None:
        """A new Raft term: another node's loop leads; the old one learns it late (its steps may still finish)."""
        candidates = [n.id for n in self.up_nodes() if n.id != avoid and self.truth.nodes.get(n.id) is not None
                      and self.truth.nodes[n.id].state == "normal"]
        if not candidates:
            return
        old = self.loop
        self.term += 1
        self.leader = self.rng.choice(candidates)
        self.loop = self.new_loop(self.leader)
        self.catch_up(self.nodes[self.leader])
        self.events.append((self.loop, LeadershipChanged(True, self.term)))
        self.events.append((old, LeadershipChanged(False, self.term)))
        self.stats["leader changes"] += 1

    def run_step(self, loop: MigrationLoop, step) -> None:
        """Carry out one of a loop's I/O instructions and tell that loop how it went."""
        if getattr(step, "term", self.term) < self.term:
            self.stats["stale steps fenced"] += 1
            event = StepFailed(step, Fenced(getattr(step, "node", None) or step.pending_node, "stale term"))
        elif isinstance(step, RunBarrier):
            event = self.barrier(step)
        elif isinstance(step, RunStream):
            event = self.stream(step)
        else:
            event = self.cleanup(step)
        self.events.append((loop, event))

    def barrier(self, step: RunBarrier):
        down = [n for n in step.nodes if not self.nodes[n].up]
        if down or (self.faults and self.rng.random() < 0.1):
            self.stats["barriers not confirmed"] += 1
            return StepFailed(step, BarrierFailure({(down or step.nodes)[0]: "did not confirm in time"}))
        for node in self.up_nodes():
            self.catch_up(node)
        while self.writes:
            self.deliver_write(self.writes[0])
        for node in self.up_nodes():
            while deliverable := [i for i, (t, _) in enumerate(node.outbox) if self.nodes[t].up]:
                self.deliver_view_update(node, deliverable[0])
        self.stats["barriers"] += 1
        self.check_built_views()
        return StepDone(step)

    def stream(self, step: RunStream):
        source, pending = self.nodes[step.source_node], self.nodes[step.pending_node]
        if not source.up or not pending.up or (self.faults and self.rng.random() < 0.1):
            self.stats["streams failed"] += 1
            return StepFailed(step, StreamFailure("injected" if source.up else f"{source.id} is down"))
        self.catch_up(pending)
        stored = pending.table_rows(step.table_id)
        streamed = {key: row for key, row in source.table_rows(step.table_id).items()
                    if step.first_token <= row.token <= step.last_token}
        written_here = {key: row for key, row in stored.items() if step.first_token <= row.token <= step.last_token}
        for row in streamed.values():
            new = merged_row(stored.get(row.key), row)
            if new is not None:
                stored[row.key] = new
        self.feed_writes_the_source_missed(pending, step.table_id, streamed, written_here)
        self.stats["streams"] += 1
        return StepDone(step)

    def feed_writes_the_source_missed(self, pending: SimNode, table_id: str, streamed: dict, written_here: dict):
        """`LocalData.feed_streamed` (`NodeStore.feed_streamed`): for the rows the pending replica held before the
        stream (its double writes), the view updates from the source's row to the merged one where they differ (a
        write the source missed made none), at a view_ts above the source's."""
        context = write_context(pending.state, table_id)
        if context is None or not context.views:
            return
        stored = pending.table_rows(table_id)
        for key in written_here:
            fed = fed_after_stream(streamed.get(key), stored[key])
            if fed is not None:
                stored[key] = fed
                updates = view_updates(context, pending.id, streamed.get(key), fed, filled=True)
                pending.outbox.extend(updates)
                self.stats["view updates of writes a stream's source missed"] += len(updates)

    def cleanup(self, step: RunCleanup):
        node = self.nodes[step.node]
        if not node.up:
            return StepFailed(step, CleanupFailure(node.id, "down"))
        self.catch_up(node)
        stored = node.table_rows(step.table_id)
        for key in [k for k, r in stored.items() if step.first_token <= r.token <= step.last_token]:
            del stored[key]
        self.stats["cleanups of a pending replica" if step.action == CLEANUP_PENDING else "cleanups"] += 1
        return StepDone(step)

    def drive(self) -> None:
        """The leader's driver makes progress: a step finishes, or the loops take their events and a tick."""
        if self.steps and self.rng.random() < 0.6:
            loop, step = self.steps.pop(self.rng.randrange(len(self.steps)))
            if self.faults and self.rng.random() < 0.03:
                self.stats["step answers lost"] += 1
                self.events.append((loop, StepFailed(step, CallError("the answer was lost"))))
                return
            self.run_step(loop, step)
            return
        self.drive_tick()

    def drive_tick(self) -> None:
        """A second passes: every loop takes the events waiting for it, and the leader's a tick."""
        self.now += 1.0
        self.handle_events()
        self.loop_handle(self.loop, Tick(self.now))

    def handle_events(self) -> None:
        events, self.events = self.events, []
        for loop in dict.fromkeys(loop for loop, _ in events):
            self.loop_handle(loop, *[event for owner, event in events if owner is loop])

    def topology_change(self) -> None:
        roll = self.rng.random()
        free = [t for t in self.truth.tablets if t not in self.truth.merge_requests]
        if roll < 0.15:
            table_id = self.rng.choice(sorted(self.truth.tablets))
            if self.truth.tablets[table_id].tablet_count < 8:
                self.note(self.append(SplitTablets(table_id=table_id, id_seed=self.new_id(), cmd_id=None)), "splits")
        elif roll < 0.3 and free:
            table_id = self.rng.choice(sorted(free))
            if self.truth.tablets[table_id].tablet_count > 1:
                self.note(self.append(RequestTabletMerge(table_id=table_id, cmd_id=None)), "merges requested")
        elif roll < 0.45:
            rf = self.rng.randint(1, min(3, self.normal_nodes()))
            self.note(self.append(AlterKeyspace(name="ks", rf=rf, id_seed=self.new_id(), cmd_id=None)), "rf changes")
        elif roll < 0.6:
            self.move_one()
        elif roll < 0.7 and self.normal_nodes() < 5:
            node = SimNode(f"n{len(self.nodes) + 1}", self.rng.choice((1, 2)))  # ids are never reused
            self.nodes[node.id] = node
            self.note(self.append(RegisterNode(node_id=node.id, grpc="g", raft=f"r{node.id}", shards=node.shards,
                                               cmd_id=None)), "nodes added")
            self.catch_up(node)  # a joining node starts from the members' log
        elif roll < 0.8 and self.normal_nodes() > 2:
            victim = self.rng.choice(sorted(n.id for n in self.up_nodes() if n.id != self.leader
                                            and n.id in self.truth.nodes and self.truth.nodes[n.id].state == "normal"))
            dead = self.rng.random() < 0.5
            error = self.append(DecommissionNode(node_id=victim, dead=dead, cmd_id=None))
            self.note(error, "nodes removed (dead)" if dead else "nodes decommissioned")
            if error is None and dead:
                self.deaths += 1
                self.nodes[victim].up = False
                self.nodes[victim].rows.clear()
                self.nodes[victim].outbox.clear()
                self.nodes[victim].staged.clear()
        elif self.rng.random() < 0.5:
            self.create_view() if self.views_made < 3 else None

    def note(self, error: CoreError | None, what: str) -> None:
        self.stats[what if error is None else f"{what} refused"] += 1

    def normal_nodes(self) -> int:
        return sum(1 for n in self.truth.nodes.values() if n.state == "normal")

    def move_one(self) -> None:
        """An operator's `vbc tablet move` of a random replica of a random tablet (base or view)."""
        table_id = self.rng.choice(sorted(self.truth.tablets))
        tablet = self.rng.randrange(self.truth.tablets[table_id].tablet_count)
        replicas = self.truth.tablets[table_id].replicas[tablet]
        leaving = self.rng.choice(replicas)
        normal = sorted(n for n, node in self.truth.nodes.items() if node.state == "normal")
        pending_node = self.rng.choice(normal)
        error = self.append(StartTabletMigration(
            migration_id=self.new_id(), table_id=table_id, tablet_id=tablet, leaving_node=leaving.node,
            leaving_shard=leaving.shard, pending_node=pending_node,
            pending_shard=self.rng.randrange(self.truth.nodes[pending_node].shards), cmd_id=None))
        self.note(error, "operator moves")

    # ------------------------------------------------------------- reads

    def start_read(self) -> None:
        coordinator = self.rng.choice(self.up_nodes())
        tables = [BASE] + [v.id for v in coordinator.state.views_of(BASE)]
        table_id = self.rng.choice(tables)
        if table_id != BASE:
            return
        read = Read(coordinator.id, table_id, coordinator.state.schema_version,
                    self.plan_ranges(coordinator, table_id, None))
        read.dirty |= {w.row.key for w in self.writes} | {row.key for row in self.retries}  # not acknowledged yet
        read.dirty |= self.staged_keys()
        self.reads.append(read)
        self.stats["reads"] += 1

    def plan_ranges(self, coordinator: SimNode, table_id: str, within: tuple[int, int] | None) -> list:
        state = coordinator.state
        count = state.tablets[table_id].tablet_count
        ranges = []
        for tablet in range(count):
            first, last = tablet_range(tablet, count)
            if within is not None:
                first, last = max(first, within[0]), min(last, within[1])
                if first > last:
                    continue
            replicas = core_migrations.read_replicas(state, table_id, tablet)
            ranges.append((first, last, self.rng.choice(replicas)))
        return ranges

    def serve_read(self, read: Read) -> None:
        first, last, replica = read.ranges.pop(0)
        node = self.nodes[replica.node]
        coordinator = self.nodes[read.coordinator]
        refused = not node.up
        if not refused:
            self.catch_up_to_version(node, read.version)
            refused = moved_away(node.state, read.table_id, node.id, first, last) is not None
        if refused:
            read.replans += 1
            self.stats["read ranges re-planned"] += 1
            if read.replans > 10:  # the coordinator gives up with UNAVAILABLE: a clear error, not a short result
                self.reads.remove(read)
                self.stats["reads failed with an error"] += 1
                return
            self.catch_up(coordinator)
            read.version = coordinator.state.schema_version
            read.ranges[:0] = self.plan_ranges(coordinator, read.table_id, (first, last))
            return
        for key, row in node.table_rows(read.table_id).items():
            if first <= row.token <= last and is_live(row):
                read.rows[key] = self.visible(self.table, row)
        if not read.ranges:
            self.reads.remove(read)
            self.check_read(read)

    def check_read(self, read: Read) -> None:
        expected = {key: self.visible(self.table, row) for key, row in self.model.items()
                    if key not in read.dirty and is_live(row)}
        got = {key: values for key, values in read.rows.items() if key not in read.dirty}
        assert got == expected, f"a read returned {sorted(got.items())}, the model holds {sorted(expected.items())}"
        self.stats["reads checked"] += 1

    # ------------------------------------------------------------- the schedule

    def restart(self) -> None:
        """A node restarts: down for a while (a write to it fails and is retried later, half applied meanwhile; what
        others queue for it waits), then back with what it stored, its outbox and staged entries included."""
        if self.restarting:
            node = self.nodes[self.restarting.pop()]
            node.up = True
            return
        candidates = [n.id for n in self.up_nodes() if self.truth.nodes.get(n.id) is not None
                      and self.truth.nodes[n.id].state == "normal"]
        if len(candidates) < 2:
            return
        victim = self.rng.choice(candidates)
        if victim == self.leader:
            self.change_leader(avoid=victim)  # the leader's restart: another node leads the next term
        self.nodes[victim].up = False
        self.restarting.add(victim)
        self.stats["node restarts"] += 1

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.25:
            self.write()
        elif roll < 0.35 and self.writes:
            self.deliver_write(rng.choice(self.writes))
        elif roll < 0.42:
            node = rng.choice(self.up_nodes())
            if node.outbox:
                self.deliver_view_update(node, rng.randrange(len(node.outbox)))
            self.release_holds(node)
        elif roll < 0.5:
            self.lag(rng.choice(self.up_nodes()))
        elif roll < 0.56:
            if self.staging and rng.random() < 0.4:
                self.process_staging()
            else:
                self.start_batch()
        elif roll < 0.62 and self.batches:
            self.deliver_batch(rng.choice(self.batches), fail=self.faults and rng.random() < 0.1)
        elif roll < 0.7:
            self.topology_change()
        elif roll < 0.82:
            self.drive()
        elif roll < 0.83 and self.faults:
            self.change_leader()
        elif roll < 0.86 and self.retries:
            self.retry()
        elif roll < 0.87 and self.faults and self.restarts:
            self.restart()
        elif roll < 0.89:
            self.start_read()
        elif self.reads and rng.random() < 0.5:  # a read spans many steps: migrations overtake it
            self.serve_read(rng.choice(self.reads))

    # ------------------------------------------------------------- the end of a schedule

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
        self.settle()
        self.check_replicas()

    def settle(self, rounds: int = 400) -> None:
        """No more faults: every write, view update, read, migration and build runs to its end."""
        self.faults = False
        while self.restarting:
            self.restart()
        for _ in range(rounds):
            if self.quiet():
                return
            while self.retries:
                self.retry()
            while self.writes:
                self.deliver_write(self.writes[0])
            for node in self.up_nodes():
                self.catch_up(node)
                while deliverable := [i for i, (t, _) in enumerate(node.outbox) if self.nodes[t].up]:
                    self.deliver_view_update(node, deliverable[0])
                self.release_holds(node)
            while self.reads:
                self.serve_read(self.reads[0])
            for _ in range(100):
                while self.steps:
                    self.run_step(*self.steps.pop(0))
                if not self.events:
                    break
                self.handle_events()
            self.drive_tick()
            while self.batches:
                self.deliver_batch(self.batches[0], fail=False)
            while staging := [t for t in self.truth.tasks.values()
                              if t.type == TASK_PROCESS_STAGING and self.nodes[t.replica.node].up]:
                self.process_staging(staging[0])
            self.start_batch()
        raise AssertionError(f"the schedule did not settle: {self.unsettled()}")

    def quiet(self) -> bool:
        return not self.unsettled()

    def unsettled(self) -> list[str]:
        truth = self.truth
        left = []
        if truth.transitions or truth.merge_requests:
            left.append(f"migrations {sorted(t.stage for t in truth.transitions.values())}, "
                        f"merges {sorted(truth.merge_requests)}")
        if core_migrations.replication_moves(truth, 1) or core_migrations.drain_moves(truth, 1):
            left.append("tablets not at their RF or on departing nodes")
        if core_migrations.removable_nodes(truth):
            left.append(f"drained nodes not removed: {core_migrations.removable_nodes(truth)}")
        if truth.tasks:
            left.append(f"{len(truth.tasks)} build tasks")
        if truth.held_view_rows:
            left.append(f"holds of kept view rows {sorted(truth.held_view_rows)}")
        if self.writes or self.retries or self.batches or self.reads or self.steps or self.events:
            left.append("work in flight")
        if any(self.nodes[target].up for node in self.up_nodes() for target, _ in node.outbox):
            left.append("view updates in outboxes")
        if any(node.staged for node in self.up_nodes()):
            left.append(f"staged rows on {sorted(n.id for n in self.up_nodes() if n.staged)}")
        return left

    def staged_keys(self) -> set[tuple]:
        """The keys of rows some replica keeps staged: visible nowhere, or on some replicas only, until processed."""
        return {row.key for node in self.nodes.values() for entry in node.staged for row in entry.rows}

    def check_built_views(self) -> None:
        """At a barrier every write and view update so far has been delivered: each replica a read of a BUILT view
        may use holds exactly its view rows, but for keys a failed write left half applied (retried later) or a load
        left staged. Once a node died, a view stays stale where its lost updates went until the repairs end, and while a
        node restarts, where its own and the updates queued for it go: not
        checked here."""
        if self.deaths or self.restarting:
            return
        dirty = {row.key for row in self.retries} | self.staged_keys()  # staged rows: not visible until processed
        live = {key: self.visible(self.table, row) for key, row in self.model.items()
                if is_live(row) and key not in dirty}
        for view in self.truth.views_of(BASE):
            if not self.truth.view_is_built(view.id):
                continue
            expected, tokens = self.view_rows(view, live)
            self.check_table(view.id, expected, tokens.__getitem__, read_replicas_only=True,
                             skip=lambda key, view=view: (key[view.primary_key.index("k")],) in dirty)
            self.stats["built views checked at barriers"] += 1

    def view_rows(self, view, live: dict) -> tuple[dict, dict]:
        """The view rows the live base rows imply, and their tokens."""
        expected, tokens = {}, {}
        for values in live.values():
            mapped = view_row(view, values)
            if mapped is not None:
                key, columns = mapped
                expected[key] = {**dict(zip(view.primary_key, key)),
                                 **{c: v for c, v in columns.items() if v is not None}}
                tokens[key] = upsert_row(view, columns, 0).token
        return expected, tokens

    def check_replicas(self) -> None:
        """Every replica of the base and of every view holds exactly the rows the client's model implies."""
        for node in self.up_nodes():
            self.catch_up(node)
        live = {key: self.visible(self.table, row) for key, row in self.model.items() if is_live(row)}
        self.check_table(BASE, {key: values for key, values in live.items()}, lambda key: self.model[key].token)
        for view in self.truth.views_of(BASE):
            assert self.truth.view_is_built(view.id), f"view {view.name} is not built at the end"
            expected, tokens = self.view_rows(view, live)
            self.check_table(view.id, expected, tokens.__getitem__)
        self.stats["schedules checked"] += 1

    def check_table(self, table_id: str, expected: dict, token_of, read_replicas_only: bool = False,
                    skip=lambda key: False) -> None:
        table = self.truth.tables[table_id]
        tablet_map = self.truth.tablets[table_id]
        for tablet, replicas in enumerate(tablet_map.replicas):
            first, last = tablet_range(tablet, tablet_map.tablet_count)
            wanted = {k: v for k, v in expected.items() if first <= token_of(k) <= last and not skip(k)}
            if read_replicas_only:
                replicas = core_migrations.read_replicas(self.truth, table_id, tablet)
            for replica in replicas:
                stored = self.nodes[replica.node].table_rows(table_id)
                held = {key: self.visible(table, row) for key, row in stored.items()
                        if first <= row.token <= last and is_live(row) and not skip(key)}
                assert held == wanted, (
                    f"{table.name} tablet {tablet} on {replica}: missing {sorted(set(wanted) - set(held))}, "
                    f"extra {sorted(set(held) - set(wanted))}, different "
                    f"{sorted(k for k in set(held) & set(wanted) if held[k] != wanted[k])}")
