"""Deterministic simulation of view building: the real leader loop, worker core and group0 state machine, under faults.

No processes, threads or clocks. Every node runs the real `LeaderLoop` (coordinator/core/leader_loop.py), the
real worker core `WorkerTasks` (worker/tasks.py: term fence, batches, ledger) and applies the log with the real
`Group0State.apply`; the simulation only plays the network, Raft and the disks. Each schedule is one seeded
`random.Random` choosing, step by step, which message to deliver (or lose, duplicate, or mangle: an answer missing
some ids, or naming ids of other tasks), which proposal to commit (late, twice, after its proposer gave up, or
never), which batch to finish (or fail), which node replicates, installs a snapshot, crashes (also between
recording finished ids and answering) or restarts, when the leader changes and when views are created or dropped.
A deposed leader's loop keeps running on its lagging state until it notices. After the faults stop, a fair
schedule must build every view. 2,000 schedules: the first 200 (the coverage test) with 80 steps of faults, the
others with 40 in `make test-fast` and again with 80 in `make test` (marked `deep`). Checked at every step:

- `apply` refuses a loop command from a term older than the newest loop term it has seen, with a typed `StaleTerm`;
- a FinishViewBuildingTasks removes only tasks some worker recorded in its durable ledger, each with the rows
  its batch recorded;
- a view is BUILT only when none of its tasks remain and every task created for it was recorded;
- a node's build status is SUCCESS only when it holds no task of the view;
- a view's rows done and tasks done never go down;
- a worker starts a batch only under its node's current Raft term, never for a task it holds as finished, never on
  a shard already running a batch, never twice for one task at once;
- every batch a loop sends shares type, base, replica and tablet, one task per view, none it holds as finished;
- `LeaderLoop.validate()` after every event it handles;
- tablets move meanwhile (`coordinator.core.migrations`): migrations start, the leader's driver (the real `stage_actions`
  and `AdvanceTabletMigration`) advances them, streams fail and roll back, stale drivers' commands are refused;
  tables split, and merge after the driver's co-locating moves (`coordinator.core.resize`);
  when a view is BUILT, every pairing position of every tablet of its base had a finished task of the view (view
  replicas are fed by position, and a base replica streamed to a new node keeps its position).
"""
from __future__ import annotations

import dataclasses
import pickle
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from coordinator.core.commands import (
    ColumnSpec,
    Command,
    CreateKeyspace,
    CreateTable,
    CreateView,
    DropView,
    AdvanceTabletMigration,
    FinishViewBuildingTasks,
    MergeTablets,
    RegisterNode,
    RequestTabletMerge,
    SplitTablets,
    StartTabletMigration,
    WhereTerm,
)
from coordinator.core.errors import CoreError, StaleTerm, Unavailable
from coordinator.core.leader_loop import (
    Applied,
    BatchAnswered,
    BatchFailed,
    BatchReply,
    Event,
    LeaderLoop,
    LeadershipChanged,
    LoopConfig,
    ProposalDone,
    ProposeCommand,
    SendBatch,
    Tick,
)
from coordinator.core import migrations, resize
from coordinator.core.migration_loop import BARRIER, STREAM, stage_actions
from coordinator.core.planner import Backoff
from coordinator.core.schema import BUILD_SUCCESS
from coordinator.core.state import Group0State
from worker.tasks import Answer, CancelBatch, PruneLedger, RecordFinished, StartBatch, TasksLeftBatch, WorkerTasks

pytestmark = pytest.mark.long

CHUNKS = 20
SEEDS = 2000  # schedules: the coverage test runs the first ones, the chunks share the others
FAULT_STEPS = 80  # a schedule's steps of faults at full length (the coverage test; `make test`, marked `deep`)
SHORT_FAULT_STEPS = 40  # the chunks' schedules in `make test-fast`
SETTLE_ROUNDS = 60
STEP_SECONDS = 0.05
COLUMNS = (ColumnSpec("k", "int"), ColumnSpec("c", "int"), ColumnSpec("v", "text"))
VIEW_WHERE = (WhereTerm("c", "IS NOT NULL", None), WhereTerm("k", "IS NOT NULL", None))
MAX_VIEWS = 5
LOOP_CONFIG = LoopConfig(backoff=Backoff(initial=0.1, maximum=1.0))


# ----------------------------------------------------------------- what the simulation plays: processes and messages


@dataclass(eq=False)
class Node:
    """One node: its process (loop, worker core, running batches) and what survives a restart (ledger, Raft term)."""

    id: str
    shards: int
    state: Group0State = field(default_factory=Group0State)
    applied: int = 0
    raft_term: int = 1  # durable: the newest Raft term this node has heard of
    leading: bool = False  # believes it leads raft_term
    up: bool = True
    incarnation: int = 0  # bumped by every restart: answers to an older process's loop are lost with it
    ledger: dict[str, int] = field(default_factory=dict)  # durable: finished id -> rows its batch scanned
    loop: LeaderLoop = field(default_factory=lambda: LeaderLoop(LOOP_CONFIG))
    worker: WorkerTasks | None = None
    running: dict[int, StartBatch] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.worker = WorkerTasks(self.id, self.ledger)


@dataclass(frozen=True, eq=False)
class Request:
    """A WorkOnViewBuildingTasks call from the loop of `node` (its process `incarnation`); also the worker's caller."""

    node: str
    incarnation: int
    send: SendBatch


@dataclass(frozen=True, eq=False)
class Reply:
    request: Request
    reply: BatchReply | None = None
    error: str | None = None


@dataclass(eq=False)
class Proposal:
    node: str
    incarnation: int
    epoch: int
    command: Command  # as the loop asked for it; committed with `cmd_id`, as the shell gives each proposal its own
    cmd_id: str
    answered: bool = False


# ----------------------------------------------------------------- the simulated cluster


class Simulation:
    def __init__(self, seed: int, stats: Counter):
        self.rng = random.Random(seed)
        self.stats = stats
        rng = self.rng
        count = rng.choice((2, 3, 3))
        shards = rng.choice((1, 2))
        self.nodes = {f"n{i}": Node(f"n{i}", shards) for i in range(1, count + 1)}
        self.log: list[Command] = []
        self.truth = Group0State()
        self.recorded: dict[str, int] = {}  # every id any worker wrote to its durable ledger, with its rows
        self.created: dict[str, set[str]] = {}
        self.progress: dict[str, tuple[int, int]] = {}  # view -> the most (rows done, tasks done) seen
        self.network: list[Request | Reply] = []
        self.proposals: list[Proposal] = []
        self.now = 0.0
        self.views_made = 0
        self.cmd_ids = 0
        self.cmd_ids_applied: set[str | None] = set()
        # (view, base, tablet, position): the view replicas that base position of the tablet feeds hold its rows
        self.covered: set[tuple[str, str, int, int]] = set()
        for node in self.nodes.values():
            self.append(RegisterNode(node_id=node.id, grpc="g", raft="r", shards=shards, cmd_id=None))
        self.append(CreateKeyspace(name="ks", rf=rng.randint(1, count), initial_tablets=rng.choice((1, 2, 4)),
                                   cmd_id=None))
        for t in (1, 2):
            self.append(CreateTable(id=f"{t:032x}", keyspace="ks", name=f"t{t}", columns=COLUMNS, partition_key=("k",),
                                    clustering_key=("c",), cmd_id=None))
        for _ in range(rng.randint(1, 2)):
            self.create_view()
        self.snapshot = (pickle.dumps(self.truth), len(self.log))  # what a node restores before replaying the rest
        for node in self.nodes.values():
            self.restore(node)
        self.term = 1
        self.leader = "n1"
        self.nodes["n1"].leading = True

    # ------------------------------------------------------------- group0

    def append(self, command: Command, proposer_term: int | None = None) -> CoreError | None:
        """Commit `command` to the log; check what applying it did. The refusal, if any."""
        before_tasks = dict(self.truth.tasks)
        before_term = self.truth.view_building_term
        outcome = self.truth.apply(command)
        self.log.append(command)
        first_time = command.cmd_id is None or command.cmd_id not in self.cmd_ids_applied
        self.cmd_ids_applied.add(command.cmd_id)
        if proposer_term is not None and proposer_term < before_term and first_time:  # a repeat: its first outcome
            assert isinstance(outcome.error, StaleTerm), outcome
            self.stats["stale commands refused"] += 1
        assert self.truth.view_building_term >= before_term
        removed = set(before_tasks) - set(self.truth.tasks)
        if isinstance(command, FinishViewBuildingTasks):
            assert removed <= set(self.recorded), f"removed tasks nobody recorded: {removed - set(self.recorded)}"
            rows = dict(zip(command.task_ids, command.rows_scanned or (0,) * len(command.task_ids)))
            assert all(rows[i] == self.recorded[i] for i in removed), "a task removed with another batch's rows"
            self.covered |= {(t.view_id, t.base_id, t.tablet_id, self.position(t)) for t in map(before_tasks.get, removed)}
        if isinstance(command, SplitTablets) and outcome.ok:
            self.covered = {(v, b, t * 2 + half if b == command.table_id else t, r)
                            for v, b, t, r in self.covered for half in (0, 1)}
        if isinstance(command, MergeTablets) and outcome.ok:
            halves = {(v, b, t, r) for v, b, t, r in self.covered if b == command.table_id}
            self.covered = {c for c in self.covered if c[1] != command.table_id} | {
                (v, b, t // 2, r) for v, b, t, r in halves if (v, b, t ^ 1, r) in halves}
        if isinstance(command, CreateView) and outcome.ok:
            self.created[command.id] = set(self.truth.tasks) - set(before_tasks)
        self.check_state()  # group0's invariants were checked by apply (tests/conftest.py)
        return outcome.error

    def check_state(self) -> None:
        truth = self.truth
        holding = {(t.view_id, t.replica.node) for t in truth.tasks.values()}
        for key, status in truth.build_status.items():
            assert status != BUILD_SUCCESS or key not in holding, f"SUCCESS with tasks left: {key}"
        for view_id in self.created:
            if view_id not in truth.tables:
                continue
            if truth.view_is_built(view_id):
                assert not any(True for _ in truth.tasks_of_view(view_id))
                self.check_covered(view_id)
            progress = truth.view_progress(view_id)
            now = (progress["rows_done"], progress["tasks_done"])
            before = self.progress.get(view_id, (0, 0))
            assert now[0] >= before[0] and now[1] >= before[1], f"progress of {view_id} went back: {before} -> {now}"
            self.progress[view_id] = now

    def position(self, task) -> int:
        """The pairing position of a task's replica (a migration's pending replica takes the leaving one's)."""
        position = migrations.position_of(self.truth, task.base_id, task.tablet_id, task.replica.node)
        assert position is not None, f"a finished task on {task.replica}, which holds no replica of its tablet"
        return position

    def check_covered(self, view_id: str) -> None:
        base = self.truth.tables[view_id].view.base_id
        for tablet, replicas in enumerate(self.truth.tablets[base].replicas):
            for position in range(len(replicas)):
                assert (view_id, base, tablet, position) in self.covered, \
                    f"BUILT, but the view replicas position {position} of base tablet {tablet} feeds never got its rows"

    # ------------------------------------------------------------- tablet migrations

    def migration_step(self) -> None:
        roll = self.rng.random()
        if roll < 0.08:
            self.split_or_merge()
        elif self.truth.merge_requests and roll < 0.3:
            self.prepare_merge(self.rng.choice(sorted(self.truth.merge_requests)))
        elif roll < 0.4 or not self.truth.transitions:
            self.start_migration()
        else:
            moving = sorted(self.truth.transitions.values(), key=lambda t: t.migration_id)
            self.drive_migration(self.rng.choice(moving), faults=True)

    def split_or_merge(self) -> None:
        base = self.rng.choice((f"{1:032x}", f"{2:032x}"))
        count = self.truth.tablets[base].tablet_count
        if self.rng.random() < 0.5 and count < 8:
            outcome = self.append(SplitTablets(table_id=base, id_seed=f"{self.rng.getrandbits(128):032x}",
                                               cmd_id=None))
            self.stats["splits" if outcome is None else "splits refused"] += 1
        elif count > 1:
            self.append(RequestTabletMerge(table_id=base, cmd_id=None))

    def prepare_merge(self, table_id: str) -> None:
        """The driver's part of a merge: the co-locating moves, or the merge once the pairs share replicas."""
        moving = {t for (table, t) in self.truth.transitions if table == table_id}
        moves = resize.merge_moves(self.truth, table_id)
        if not moves and not moving:
            outcome = self.append(MergeTablets(term=self.nodes[self.leader].raft_term, table_id=table_id,
                                               id_seed=f"{self.rng.getrandbits(128):032x}", cmd_id=None))
            self.stats["merges" if outcome is None else "merges refused"] += 1
            return
        for tablet, leaving, pending in moves:
            if tablet not in moving:
                moving.add(tablet)
                self.append(StartTabletMigration(
                    migration_id=f"{self.rng.getrandbits(128):032x}", table_id=table_id, tablet_id=tablet,
                    leaving_node=leaving.node, leaving_shard=leaving.shard, pending_node=pending.node,
                    pending_shard=pending.shard, cmd_id=None))

    def start_migration(self) -> None:
        rng, truth = self.rng, self.truth
        base = rng.choice((f"{1:032x}", f"{2:032x}"))
        tablet_map = truth.tablets[base]
        tablet = rng.randrange(tablet_map.tablet_count)
        replicas = tablet_map.replicas[tablet]
        leaving = rng.choice(replicas)
        free = sorted(n for n in self.nodes if n not in {r.node for r in replicas})
        pending_node = rng.choice(free) if free else leaving.node
        pending_shard = rng.randrange(self.nodes[pending_node].shards)
        if (pending_node, pending_shard) == (leaving.node, leaving.shard):
            return
        outcome = self.append(StartTabletMigration(
            migration_id=f"{rng.getrandbits(128):032x}", table_id=base, tablet_id=tablet, leaving_node=leaving.node,
            leaving_shard=leaving.shard, pending_node=pending_node, pending_shard=pending_shard, cmd_id=None))
        self.stats["migrations started" if outcome is None else "migrations refused"] += 1

    def drive_migration(self, transition, faults: bool) -> None:
        """One step of the leader's driver (or of a deposed leader's one, believing it still leads)."""
        rng = self.rng
        drivers = [n for n in self.nodes.values() if n.up and n.leading]
        if not drivers:
            return
        driver = rng.choice(drivers) if faults else self.nodes[self.leader]
        actions = stage_actions(transition, lambda node: False)
        to_stage, reason = migrations.NEXT_STAGE[transition.stage], ""
        if faults and BARRIER in actions and rng.random() < 0.2:
            self.stats["migration barriers retried"] += 1
            return
        if faults and STREAM in actions and rng.random() < 0.3:
            to_stage, reason = migrations.CLEANUP_TARGET, "stream failed"
            self.stats["migrations rolled back"] += 1
        newest = self.truth._migration_term
        refusal = self.append(AdvanceTabletMigration(
            term=driver.raft_term, migration_id=transition.migration_id, table_id=transition.table_id,
            tablet_id=transition.tablet_id, from_stage=transition.stage, to_stage=to_stage, reason=reason,
            cmd_id=None))
        if driver.raft_term < newest:
            assert isinstance(refusal, StaleTerm), refusal
            self.stats["stale migration commands refused"] += 1
        elif refusal is None and to_stage == migrations.END_MIGRATION:
            self.stats["migrations done"] += 1

    def finish_migrations(self) -> None:
        while self.truth.transitions or self.truth.merge_requests:
            for transition in sorted(self.truth.transitions.values(), key=lambda t: t.migration_id):
                self.drive_migration(transition, faults=False)
            for table_id in sorted(self.truth.merge_requests):
                self.prepare_merge(table_id)

    def catch_up(self, node: Node, index: int) -> None:
        """Apply the log on `node` up to `index` (replication, or the worker's read barrier)."""
        index = min(index, len(self.log))
        if node.applied >= index:
            return
        while node.applied < index:
            node.state.apply(self.log[node.applied])
            node.applied += 1
        self.after_apply(node)

    def after_apply(self, node: Node) -> None:
        """What a node's schema watch does after group0 changed: tasks leave batches; prune once caught up."""
        if node.up:
            self.run_worker(node, node.worker.tasks_changed(node.state.tasks))
            if node.applied == len(self.log):
                self.run_worker(node, node.worker.prune(node.state.tasks))

    def install_snapshot(self, node: Node) -> None:
        """The leader sends `node` its state instead of the log entries it lacks: the state is replaced."""
        node.state, node.applied = pickle.loads(pickle.dumps(self.truth)), len(self.log)
        self.stats["snapshot installs"] += 1
        self.after_apply(node)

    def create_view(self) -> None:
        self.views_made += 1
        view_id = f"{self.rng.getrandbits(128):032x}"
        self.append(CreateView(id=view_id, keyspace="ks", name=f"v{self.views_made}",
                               base=self.rng.choice(("t1", "t2")), partition_key=("c",), clustering_key=("k",),
                               where=VIEW_WHERE, cmd_id=None))

    def drop_view(self) -> None:
        views = [t for t in self.truth.tables.values() if t.view is not None]
        if views:
            self.append(DropView(keyspace="ks", name=self.rng.choice(views).name, cmd_id=None))
            self.stats["views dropped"] += 1

    def commit(self, proposal: Proposal) -> None:
        refusal = self.append(dataclasses.replace(proposal.command, cmd_id=proposal.cmd_id), proposal.command.term)
        self.answer_proposal(proposal, refusal)

    def answer_proposal(self, proposal: Proposal, refusal: CoreError | None) -> None:
        """The proposer learns the outcome (once; nobody hears it if its process is gone)."""
        node = self.nodes[proposal.node]
        if proposal.answered or not node.up or node.incarnation != proposal.incarnation:
            return
        proposal.answered = True
        self.step_loop(node, ProposalDone(proposal.epoch, proposal.command, refusal))

    # ------------------------------------------------------------- the leader loops

    def step_loop(self, node: Node, *events: Event) -> None:
        """Feed a node's loop its leadership, the time and what it applied, then `events`; carry out its answer."""
        if node.id == self.leader and node.leading:
            self.catch_up(node, len(self.log))  # a leader has applied everything committed
        loop = node.loop
        was_deposed = loop.deposed
        instructions = loop.handle(node.state, LeadershipChanged(node.leading, node.raft_term), Tick(self.now),
                                   Applied(node.applied), *events)
        loop.validate()
        if loop.deposed and not was_deposed:
            self.stats["loops that noticed they were deposed"] += 1
        sent = set()
        for instruction in instructions:
            if isinstance(instruction, SendBatch):
                check_batch(node.state, instruction, loop, sent)
                self.network.append(Request(node.id, node.incarnation, instruction))
            elif isinstance(instruction, ProposeCommand):
                self.cmd_ids += 1
                self.proposals.append(Proposal(node.id, node.incarnation, instruction.epoch, instruction.command,
                                               f"c{self.cmd_ids}"))

    def receive(self, reply: Reply) -> None:
        request = reply.request
        node = self.nodes[request.node]
        if not node.up or node.incarnation != request.incarnation:
            return  # the calling process is gone
        send = request.send
        if reply.error is not None:
            self.step_loop(node, BatchFailed(send.epoch, send.batch, reply.error, self.rng.random()))
        else:
            self.step_loop(node, BatchAnswered(send.epoch, send.batch, reply.reply))

    def change_leader(self) -> None:
        self.term += 1
        self.leader = self.rng.choice(sorted(n.id for n in self.nodes.values() if n.up))
        new = self.nodes[self.leader]
        new.raft_term, new.leading = self.term, True
        for node in self.nodes.values():
            if node is not new and (self.rng.random() < 0.5 or not node.up):
                self.learn_term(node)  # the old leader may go on believing it leads until it hears of the new term
        self.stats["leader changes"] += 1

    def learn_term(self, node: Node) -> None:
        if node.raft_term < self.term or node.id != self.leader:
            node.leading = node.leading and node.id == self.leader
        node.raft_term = self.term

    # ------------------------------------------------------------- workers

    def serve(self, request: Request) -> None:
        """The worker servicer's part: catch up with the caller's group0 index, then the worker core decides."""
        node = self.nodes[request.send.batch.node]
        if not node.up:
            self.network.append(Reply(request, error="UNAVAILABLE: connection refused"))
            return
        self.catch_up(node, request.send.applied_index)
        batch = request.send.batch
        try:
            instructions = node.worker.work(request, request.send.term, batch.shard, batch.task_ids,
                                            node.state.tasks, raft_term=node.raft_term)
        except CoreError as error:
            self.stats[f"worker refused: {error.code}"] += 1
            self.network.append(Reply(request, error=f"{error.code}: {error.message}"))
            return
        if not instructions:
            self.stats["calls attached to a running batch"] += 1
        elif isinstance(instructions[0], Answer) and instructions[0].finished:
            self.stats["calls answered from the ledger"] += 1
        self.run_worker(node, instructions)

    def run_worker(self, node: Node, instructions: list, may_crash: bool = False) -> None:
        for position, instruction in enumerate(instructions):
            if may_crash and position and self.rng.random() < 0.05 and sum(n.up for n in self.nodes.values()) > 1:
                if isinstance(instructions[position - 1], RecordFinished):
                    self.stats["worker crashes between recording and answering"] += 1
                self.crash(node, [a.caller for a in instructions[position:] if isinstance(a, Answer)])
                return
            if isinstance(instruction, StartBatch):
                self.check_start(node, instruction)
                node.running[instruction.batch_id] = instruction
            elif isinstance(instruction, CancelBatch):
                node.running.pop(instruction.batch_id, None)
                self.stats["batches cancelled"] += 1
            elif isinstance(instruction, RecordFinished):
                rows = dict(zip(instruction.task_ids, instruction.rows_scanned))
                node.ledger.update(rows)
                self.recorded.update(rows)
            elif isinstance(instruction, PruneLedger):
                for task_id in instruction.task_ids:
                    node.ledger.pop(task_id, None)
                self.stats["ledger prunes"] += 1
            elif isinstance(instruction, Answer):
                self.answer(instruction)
            else:
                assert isinstance(instruction, TasksLeftBatch)
                self.stats["tasks that left a running batch"] += 1

    def answer(self, answer: Answer) -> None:
        if answer.error is not None:
            self.network.append(Reply(answer.caller, error=answer.error))
        else:
            self.network.append(Reply(answer.caller, BatchReply(answer.finished, answer.rows_scanned)))

    def check_start(self, node: Node, start: StartBatch) -> None:
        assert start.term == node.raft_term == node.worker.newest_term, "a batch started under a stale term"
        assert all(b.shard != start.shard for b in node.running.values()), "two batches on one shard"
        running = {i for b in node.running.values() for i in b.task_ids}
        assert not running & set(start.task_ids), "a task executed twice concurrently"
        assert not set(node.ledger) & set(start.task_ids), "a finished task executed again"
        assert all(t.replica.node == node.id and t.replica.shard == start.shard for t in start.tasks)

    def finish_batch(self, node: Node, batch_id: int, fail: bool, may_crash: bool = False) -> None:
        del node.running[batch_id]
        if fail:
            self.stats["batches failed"] += 1
            self.run_worker(node, node.worker.batch_failed(batch_id, "injected failure"))
            return
        rows = self.rng.randint(0, 1000)
        self.run_worker(node, node.worker.batch_succeeded(batch_id, node.state.tasks, rows_scanned=rows), may_crash)

    def crash(self, node: Node, unanswered: list[Request] = ()) -> None:
        """The process dies: its loop, running batches and waiting callers (their calls fail) go; the ledger and Raft
        term stay."""
        callers = [*unanswered, *(caller for batch in node.worker.batches() for caller in batch.callers)]
        for caller in callers:
            self.network.append(Reply(caller, error="UNAVAILABLE: the worker's node went down"))
        node.up, node.running, node.leading = False, {}, False
        self.stats["worker crashes"] += 1
        if node.id == self.leader:
            self.change_leader()

    def restart(self, node: Node) -> None:
        """A new process: group0 restores its snapshot and replays the journal after it; the ledger survives."""
        node.up = True
        node.incarnation += 1
        self.restore(node)
        node.loop, node.worker = LeaderLoop(LOOP_CONFIG), WorkerTasks(node.id, node.ledger)

    def restore(self, node: Node) -> None:
        snapshot, index = self.snapshot
        node.state, node.applied = pickle.loads(snapshot), index

    # ------------------------------------------------------------- faults

    def fault_step(self) -> None:
        rng = self.rng
        self.now += STEP_SECONDS
        roll = rng.random()
        if roll < 0.30 and self.network:
            self.deliver_with_faults(self.network.pop(rng.randrange(len(self.network))))  # any order
        elif roll < 0.42 and self.proposals:
            self.commit_with_faults(self.proposals.pop(rng.randrange(len(self.proposals))))
        elif roll < 0.62:
            node = rng.choice([n for n in self.nodes.values() if n.up])
            self.step_loop(node)
        elif roll < 0.78:
            running = [(n, b) for n in self.nodes.values() if n.up for b in n.running]
            if running:
                node, batch_id = rng.choice(running)
                self.finish_batch(node, batch_id, fail=rng.random() < 0.15, may_crash=True)
        elif roll < 0.90:
            self.replicate(rng.choice(list(self.nodes.values())))
        elif roll < 0.93:
            if not self.nodes[self.leader].up or rng.random() < 0.5:
                self.change_leader()
        elif roll < 0.96:
            self.node_fault()
        elif roll < 0.975 and self.views_made < MAX_VIEWS:
            self.create_view()
        elif roll < 0.985:
            self.drop_view()
        if rng.random() < 0.15:
            self.migration_step()

    def replicate(self, node: Node) -> None:
        if not node.up:
            return
        if self.rng.random() < 0.1:
            self.install_snapshot(node)
        else:
            self.catch_up(node, self.rng.randint(node.applied, len(self.log)))
        self.learn_term(node)

    def deliver_with_faults(self, message: Request | Reply) -> None:
        fate = self.rng.random()
        if fate < 0.08:
            self.stats["messages lost"] += 1
            request = message if isinstance(message, Request) else message.request
            self.network.append(Reply(request, error="DEADLINE_EXCEEDED"))  # the caller's deadline
            return
        if fate < 0.14:
            self.network.append(message)
            self.stats["messages duplicated"] += 1
        if isinstance(message, Reply) and message.reply is not None and fate > 0.85:
            message = self.mangle(message)
        self.deliver(message)

    def mangle(self, reply: Reply) -> Reply:
        """An answer the loop must not trust beyond its batch: some finished ids missing, or ids of other tasks."""
        finished, rows = list(reply.reply.finished), list(reply.reply.rows_scanned)
        if finished and self.rng.random() < 0.5:
            keep = self.rng.randrange(len(finished))
            finished, rows = finished[:keep], rows[:keep]
            self.stats["partial answers"] += 1
        else:
            own = set(reply.request.send.batch.task_ids)  # a worker never claims an unfinished task of its own batch
            foreign = sorted(set(self.truth.tasks) - set(self.recorded) - own)
            if not foreign:
                return reply
            extra = self.rng.sample(foreign, min(2, len(foreign)))
            finished, rows = finished + extra, rows + [self.rng.randint(0, 1000) for _ in extra]
            self.stats["foreign ids in answers"] += 1
        return Reply(reply.request, BatchReply(tuple(finished), tuple(rows)))

    def commit_with_faults(self, proposal: Proposal) -> None:
        fate = self.rng.random()
        if fate < 0.05:
            self.answer_proposal(proposal, Unavailable("the proposal timed out"))
            self.stats["proposals lost"] += 1
            return
        if fate < 0.10:
            self.answer_proposal(proposal, Unavailable("the proposal timed out"))
            self.proposals.append(proposal)  # committed after all, later: its proposer gave up on it
            self.stats["proposals committed after their proposer gave up"] += 1
            return
        if fate < 0.15:
            self.proposals.append(proposal)  # the Raft adapter's retry commits it again
        self.commit(proposal)

    def node_fault(self) -> None:
        node = self.rng.choice(list(self.nodes.values()))
        if not node.up:
            self.restart(node)
        elif sum(n.up for n in self.nodes.values()) > 1:
            self.crash(node)
            if self.rng.random() < 0.5:
                self.restart(node)  # a worker restart

    def deliver(self, message: Request | Reply) -> None:
        if isinstance(message, Request):
            self.serve(message)
        else:
            self.receive(message)

    # ------------------------------------------------------------- settling

    def settle(self) -> int:
        """Faults stop: every node up and caught up with the term, a fair schedule. The rounds it took."""
        for node in self.nodes.values():
            if not node.up:
                self.restart(node)
        if not self.nodes[self.leader].leading:
            self.change_leader()
        for node in self.nodes.values():
            self.learn_term(node)
        for round_number in range(SETTLE_ROUNDS):
            if self.done():
                return round_number
            self.fair_round()
        raise AssertionError(f"not built after {SETTLE_ROUNDS} fair rounds: {len(self.truth.tasks)} tasks left, "
                             f"processing bases {self.truth.processing_bases}")

    def fair_round(self) -> None:
        leader = self.nodes[self.leader]
        self.finish_migrations()
        self.step_loop(leader)
        self.drain_network()
        for node in self.nodes.values():
            for batch_id in sorted(node.running):
                self.finish_batch(node, batch_id, fail=False)
        self.drain_network()
        self.now += 10.0
        self.step_loop(leader)
        while self.proposals:
            self.commit(self.proposals.pop(0))
        for node in self.nodes.values():
            self.catch_up(node, len(self.log))

    def drain_network(self) -> None:
        while self.network:
            self.deliver(self.network.pop(0))

    def done(self) -> bool:
        truth = self.truth
        views = [t.id for t in truth.tables.values() if t.view is not None]
        return (not truth.tasks and not truth.transitions and truth.processing_bases == ()
                and all(truth.view_is_built(v) for v in views)
                and all(s == BUILD_SUCCESS for s in truth.build_status.values()))


def check_batch(state: Group0State, send: SendBatch, loop: LeaderLoop, sent: set) -> None:
    """A batch the loop sends: one per replica per answer, one tablet of the processing base, one task per view."""
    batch = send.batch
    assert batch.replica not in sent, "two batches for one replica"
    sent.add(batch.replica)
    tasks = [state.tasks[i] for i in batch.task_ids]
    assert len({(t.type, t.base_id, t.replica, t.tablet_id) for t in tasks}) == 1
    assert len({t.view_id for t in tasks}) == len(tasks) and not set(loop.pending) & set(batch.task_ids)
    assert tasks[0].replica == batch.replica and tasks[0].base_id in state.processing_bases
    assert send.term == loop.term and send.epoch == loop.epoch


def run_schedule(seed: int, stats: Counter, fault_steps: int = FAULT_STEPS) -> None:
    simulation = Simulation(seed, stats)
    for _ in range(fault_steps):
        simulation.fault_step()
    stats["settle rounds"] += simulation.settle()
    stats["schedules"] += 1


COVERAGE = ("stale commands refused", "leader changes", "messages lost", "messages duplicated", "batches failed",
            "worker crashes", "views dropped", "calls attached to a running batch", "calls answered from the ledger",
            "worker refused: FAILED_PRECONDITION", "worker refused: UNAVAILABLE", "batches cancelled",
            "tasks that left a running batch", "ledger prunes", "loops that noticed they were deposed",
            "partial answers", "foreign ids in answers", "worker crashes between recording and answering",
            "snapshot installs", "proposals lost", "proposals committed after their proposer gave up",
            "migrations started", "migrations done", "migrations rolled back", "stale migration commands refused",
            "splits", "merges")
COVERAGE_SEEDS = range(200)


def run_seeds(seeds: range, stats: Counter, fault_steps: int = FAULT_STEPS) -> None:
    for seed in seeds:
        try:
            run_schedule(seed, stats, fault_steps)
        except AssertionError as error:
            raise AssertionError(f"schedule seed {seed}: {error}") from error


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_schedules_build_every_view_and_keep_the_invariants(chunk):
    run_seeds(range(COVERAGE_SEEDS.stop + chunk, SEEDS, CHUNKS), Counter(), SHORT_FAULT_STEPS)


@pytest.mark.deep
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_schedules_at_full_length_build_every_view_and_keep_the_invariants(chunk):
    run_seeds(range(COVERAGE_SEEDS.stop + chunk, SEEDS, CHUNKS), Counter())


def test_the_schedules_exercise_every_kind_of_fault():
    """The first schedules, checked as every other, exercise every kind of fault between them."""
    totals: Counter = Counter()
    run_seeds(COVERAGE_SEEDS, totals)
    missing = [what for what in COVERAGE if not totals[what]]
    assert not missing, f"the first {len(COVERAGE_SEEDS)} schedules never exercised: {missing} ({dict(totals)})"


def test_a_schedule_is_reproducible_from_its_seed():
    first, second = Counter(), Counter()
    run_schedule(7, first)
    run_schedule(7, second)
    assert first == second
