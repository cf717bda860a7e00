"""Deterministic simulation of view building: planner-driven leader loops, fenced workers and group0, under faults.

No processes, threads or clocks: each schedule is one seeded `random.Random` choosing, step by step, which
message to deliver (or lose, or duplicate), which proposal to commit (late, twice, or never), which batch to
finish (or fail), which node replicates, crashes or restarts, when the leader changes and when views are
created or dropped. The deposed leader's loop keeps running on its lagging state until it notices. After the
faults stop, a fair schedule must build every view. Checked at every step:

- `apply` refuses a loop command from a term older than the newest loop term it has seen;
- a FinishViewBuildingTasks removes only tasks some worker executed (and recorded in its ledger);
- a view is BUILT only when none of its tasks remain and every task created for it was executed;
- a node's build status is SUCCESS only when it holds no task of the view;
- a worker starts a batch only for a term at least the highest it admitted and its node's Raft term, never for
  a task it holds as finished, never on a shard already running a batch, never twice for one task at once;
- every plan has one batch per (node, shard), sharing type, base, replica and tablet, one task per view.
"""
from __future__ import annotations

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
    FinishViewBuildingTasks,
    RegisterNode,
    WhereTerm,
)
from coordinator.core.errors import CoreError
from coordinator.core.planner import Backoff, Plan, RetrySchedule, pending_finished, plan_dispatch, plan_flush
from coordinator.core.schema import BUILD_SUCCESS, Replica
from coordinator.core.state import Group0State
from worker.service import TermFence
from worker.tasks import (
    Answer,
    CancelBatch,
    PruneLedger,
    RecordFinished,
    StartBatch,
    TasksLeftBatch,
    WorkerTasks,
)

CHUNKS = 20
SEEDS_PER_CHUNK = 100  # 2,000 schedules
FAULT_STEPS = 80
SETTLE_ROUNDS = 60
STEP_SECONDS = 0.05
COLUMNS = (ColumnSpec("k", "int"), ColumnSpec("c", "int"), ColumnSpec("v", "text"))
VIEW_WHERE = (WhereTerm("c", "IS NOT NULL", None), WhereTerm("k", "IS NOT NULL", None))
MAX_VIEWS = 5


# ----------------------------------------------------------------- actors


@dataclass(eq=False)
class Loop:
    """The view building loop of one leader term, as coordinator/view_building.py runs it."""

    term: int
    node: str
    in_flight: dict[Replica, int] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    retry: RetrySchedule = field(default_factory=lambda: RetrySchedule(Backoff(initial=0.1, maximum=1.0)))
    outstanding: set[Command] = field(default_factory=set)
    next_call: int = 0
    stopped: bool = False


@dataclass(eq=False)
class Node:
    id: str
    shards: int
    state: Group0State = field(default_factory=Group0State)
    applied: int = 0
    raft_term: int = 1  # durable
    up: bool = True
    ledger: set[str] = field(default_factory=set)  # durable
    fence: TermFence = field(default_factory=TermFence)
    worker: WorkerTasks | None = None
    running: dict[int, StartBatch] = field(default_factory=dict)
    max_admitted: int = 0  # of this worker process, tracked by the simulation

    def __post_init__(self) -> None:
        self.worker = WorkerTasks(self.id)


@dataclass(frozen=True, eq=False)
class Request:
    loop: Loop
    call: int
    node: str
    shard: int
    term: int
    task_ids: tuple[str, ...]
    applied_index: int


@dataclass(frozen=True, eq=False)
class Reply:
    loop: Loop
    call: int
    replica: Replica
    finished: tuple[str, ...] = ()
    error: str | None = None


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
        self.executed: set[str] = set()
        self.created: dict[str, set[str]] = {}
        self.network: list[Request | Reply] = []
        self.proposals: list[tuple[Loop, Command]] = []
        self.now = 0.0
        self.views_made = 0
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
        self.loops = [Loop(1, "n1")]

    # ------------------------------------------------------------- group0

    def append(self, command: Command, loop: Loop | None = None) -> None:
        """Commit `command` to the log; check what applying it did."""
        before_tasks = set(self.truth.tasks)
        before_term = self.truth.view_building_term
        outcome = self.truth.apply(command)
        self.log.append(command)
        if loop is not None and loop.term < before_term:
            assert outcome.error_code == "FAILED_PRECONDITION" and "stale term" in outcome.error_message
            self.stats["stale commands refused"] += 1
        assert self.truth.view_building_term >= before_term
        removed = before_tasks - set(self.truth.tasks)
        if isinstance(command, FinishViewBuildingTasks):
            assert removed <= self.executed, f"removed tasks nobody executed: {removed - self.executed}"
        if isinstance(command, CreateView) and outcome.ok:
            self.created[command.id] = set(self.truth.tasks) - before_tasks
        self.check_state()

    def check_state(self) -> None:
        truth = self.truth
        holding = {(t.view_id, t.replica.node) for t in truth.tasks.values()}
        for key, status in truth.build_status.items():
            assert status != BUILD_SUCCESS or key not in holding, f"SUCCESS with tasks left: {key}"
        for view_id in self.created:
            if view_id in truth.tables and truth.view_is_built(view_id):
                assert not any(True for _ in truth.tasks_of_view(view_id))
                assert self.created[view_id] <= self.executed, "BUILT with tasks never executed"

    def catch_up(self, node: Node, index: int) -> None:
        """Apply the log on `node` up to `index` (replication, or the worker's read barrier)."""
        index = min(index, len(self.log))
        if node.applied >= index:
            return
        while node.applied < index:
            node.state.apply(self.log[node.applied])
            node.applied += 1
        if node.up:
            self.run_worker(node, node.worker.tasks_changed(node.state.tasks))
            if node.applied == len(self.log):
                self.run_worker(node, node.worker.prune(node.state.tasks))

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

    # ------------------------------------------------------------- the leader loop

    @property
    def loop(self) -> Loop:
        return self.loops[-1]

    def live_nodes(self) -> frozenset[str]:
        return frozenset(n.id for n in self.nodes.values() if n.up)

    def dispatch(self, loop: Loop) -> None:
        node = self.nodes[loop.node]
        if loop is self.loop:
            self.catch_up(node, len(self.log))  # a leader has applied everything committed
        busy = set(loop.in_flight) | loop.retry.waiting(self.now)
        plan = plan_dispatch(node.state, loop.term, busy, self.live_nodes(), loop.finished)
        if plan.deposed:
            loop.stopped = True
            self.stats["loops that noticed they were deposed"] += 1
            return
        check_plan(node.state, plan, busy, loop.finished)
        for batch in plan.batches:
            loop.next_call += 1
            loop.in_flight[batch.replica] = loop.next_call
            self.send(Request(loop, loop.next_call, batch.node, batch.shard, loop.term, batch.task_ids, node.applied))
        for command in plan.commands:
            self.propose(loop, command)

    def flush(self, loop: Loop) -> None:
        state = self.nodes[loop.node].state
        loop.finished = set(pending_finished(state, loop.finished))
        command = plan_flush(state, loop.term, loop.finished)
        if command is not None:
            self.propose(loop, command)

    def propose(self, loop: Loop, command: Command) -> None:
        if command not in loop.outstanding:
            loop.outstanding.add(command)
            self.proposals.append((loop, command))

    def time_out(self, loop: Loop, replica: Replica) -> None:
        del loop.in_flight[replica]
        loop.retry.failed(replica, self.now)

    def receive(self, reply: Reply) -> None:
        loop = reply.loop
        if loop.stopped:
            return
        if loop.in_flight.get(reply.replica) == reply.call:
            del loop.in_flight[reply.replica]
            if reply.error is None:
                loop.retry.succeeded(reply.replica)
            else:
                loop.retry.failed(reply.replica, self.now)
        if reply.error is None:
            loop.finished.update(reply.finished)

    def change_leader(self) -> None:
        self.term += 1
        leader = self.rng.choice(sorted(self.live_nodes()))
        self.nodes[leader].raft_term = self.term
        for old in self.loops:
            if self.rng.random() < 0.5 or not self.nodes[old.node].up:
                old.stopped = True
        self.loops.append(Loop(self.term, leader))
        self.stats["leader changes"] += 1

    # ------------------------------------------------------------- workers

    def send(self, message: Request | Reply) -> None:
        self.network.append(message)

    def serve(self, request: Request) -> None:
        """The worker servicer: fence, read barrier, admit, then the pure batch logic."""
        node = self.nodes[request.node]
        if not node.up:
            return
        replica = Replica(request.node, request.shard)
        try:
            node.fence.check(request.term, node.raft_term)
            self.catch_up(node, request.applied_index)
            node.fence.admit(request.term, node.raft_term)
            node.max_admitted = max(node.max_admitted, request.term)
            instructions = node.worker.work((request.loop, request.call, replica), request.term, request.shard,
                                            request.task_ids, node.state.tasks)
        except CoreError as error:
            self.stats[f"worker refused: {error.code}"] += 1
            self.send(Reply(request.loop, request.call, replica, error=error.code))
            return
        if not instructions:
            self.stats["calls attached to a running batch"] += 1
        elif isinstance(instructions[0], Answer) and instructions[0].finished:
            self.stats["calls answered from the ledger"] += 1
        self.run_worker(node, instructions)

    def run_worker(self, node: Node, instructions: list) -> None:
        for instruction in instructions:
            if isinstance(instruction, StartBatch):
                self.check_start(node, instruction)
                node.running[instruction.batch_id] = instruction
            elif isinstance(instruction, CancelBatch):
                del node.running[instruction.batch_id]
                self.stats["batches cancelled"] += 1
            elif isinstance(instruction, RecordFinished):
                node.ledger.update(instruction.task_ids)
            elif isinstance(instruction, PruneLedger):
                node.ledger.difference_update(instruction.task_ids)
                self.stats["ledger prunes"] += 1
            elif isinstance(instruction, Answer):
                loop, call, replica = instruction.caller
                self.send(Reply(loop, call, replica, instruction.finished, instruction.error))
            else:
                assert isinstance(instruction, TasksLeftBatch)
                self.stats["tasks that left a running batch"] += 1

    def check_start(self, node: Node, start: StartBatch) -> None:
        assert start.term >= node.max_admitted and start.term >= node.raft_term, "a batch started under a stale term"
        assert all(b.shard != start.shard for b in node.running.values()), "two batches on one shard"
        running = {i for b in node.running.values() for i in b.task_ids}
        assert not running & set(start.task_ids), "a task executed twice concurrently"
        assert not node.ledger & set(start.task_ids), "a finished task executed again"
        assert all(t.replica == Replica(node.id, start.shard) for t in start.tasks)

    def finish_batch(self, node: Node, batch_id: int, fail: bool) -> None:
        del node.running[batch_id]
        if fail:
            self.stats["batches failed"] += 1
            self.run_worker(node, node.worker.batch_failed(batch_id, "injected failure"))
            return
        instructions = node.worker.batch_succeeded(batch_id, node.state.tasks)
        for instruction in instructions:
            if isinstance(instruction, RecordFinished):
                self.executed.update(instruction.task_ids)
        self.run_worker(node, instructions)

    def crash(self, node: Node) -> None:
        node.up = False
        node.running = {}
        self.stats["worker crashes"] += 1

    def restart(self, node: Node) -> None:
        """A new process: group0 restores its snapshot and replays the journal after it; the ledger survives,
        running batches and the fence do not."""
        node.up = True
        self.restore(node)
        node.fence, node.worker, node.max_admitted = TermFence(), WorkerTasks(node.id, node.ledger), 0

    def restore(self, node: Node) -> None:
        snapshot, index = self.snapshot
        node.state, node.applied = pickle.loads(snapshot), index

    # ------------------------------------------------------------- schedules

    def fault_step(self) -> None:
        rng = self.rng
        self.now += STEP_SECONDS
        roll = rng.random()
        if roll < 0.30 and self.network:
            message = self.network.pop(rng.randrange(len(self.network)))  # any order: delays and reordering
            fate = rng.random()
            if fate < 0.08:
                self.stats["messages lost"] += 1
                return
            if fate < 0.14:
                self.network.append(message)
                self.stats["messages duplicated"] += 1
            self.deliver(message)
        elif roll < 0.42 and self.proposals:
            loop, command = self.proposals.pop(rng.randrange(len(self.proposals)))
            fate = rng.random()
            if fate < 0.05:
                loop.outstanding.discard(command)
                return
            if fate < 0.10:
                self.proposals.append((loop, command))  # the Raft adapter's retry commits it again
            else:
                loop.outstanding.discard(command)
            self.append(command, loop)
        elif roll < 0.62:
            active = [loop for loop in self.loops if not loop.stopped]
            if active:
                loop = rng.choice(active)
                action = rng.random()
                if action < 0.6:
                    self.dispatch(loop)
                elif action < 0.9:
                    self.flush(loop)
                elif loop.in_flight:
                    self.time_out(loop, rng.choice(sorted(loop.in_flight)))
        elif roll < 0.78:
            running = [(n, b) for n in self.nodes.values() if n.up for b in n.running]
            if running:
                node, batch_id = rng.choice(running)
                self.finish_batch(node, batch_id, fail=rng.random() < 0.15)
        elif roll < 0.90:
            node = rng.choice(list(self.nodes.values()))
            if node.up:
                self.catch_up(node, rng.randint(node.applied, len(self.log)))
                node.raft_term = self.term
        elif roll < 0.93:
            if not self.nodes[self.loop.node].up or rng.random() < 0.5:
                self.change_leader()
        elif roll < 0.96:
            self.node_fault()
        elif roll < 0.975 and self.views_made < MAX_VIEWS:
            self.create_view()
        elif roll < 0.985:
            self.drop_view()

    def node_fault(self) -> None:
        node = self.rng.choice(list(self.nodes.values()))
        if not node.up:
            self.restart(node)
        elif len(self.live_nodes()) > 1:
            self.crash(node)
            if self.rng.random() < 0.5:
                self.restart(node)  # a worker restart
            if node.id == self.loop.node and not node.up:
                self.change_leader()

    def deliver(self, message: Request | Reply) -> None:
        if isinstance(message, Request):
            self.serve(message)
        else:
            self.receive(message)

    def settle(self) -> int:
        """Faults stop: every node up, old loops gone, a fair schedule. The rounds it took to build everything."""
        for node in self.nodes.values():
            if not node.up:
                self.restart(node)
        for old in self.loops[:-1]:
            old.stopped = True
        if self.loop.stopped:
            self.change_leader()
        for round_number in range(SETTLE_ROUNDS):
            if self.done():
                return round_number
            self.fair_round()
        raise AssertionError(f"not built after {SETTLE_ROUNDS} fair rounds: {len(self.truth.tasks)} tasks left, "
                             f"processing base {self.truth.processing_base}")

    def fair_round(self) -> None:
        loop = self.loop
        self.dispatch(loop)
        self.drain_network()
        for node in self.nodes.values():
            for batch_id in sorted(node.running):
                self.finish_batch(node, batch_id, fail=False)
        self.drain_network()
        self.flush(loop)
        while self.proposals:
            proposer, command = self.proposals.pop(0)
            proposer.outstanding.discard(command)
            self.append(command, proposer)
        for node in self.nodes.values():
            self.catch_up(node, len(self.log))
            node.raft_term = self.term
        for replica in sorted(loop.in_flight):  # calls whose request, reply or batch was lost
            self.time_out(loop, replica)
        self.now += 10.0

    def drain_network(self) -> None:
        while self.network:
            self.deliver(self.network.pop(0))

    def done(self) -> bool:
        truth = self.truth
        views = [t.id for t in truth.tables.values() if t.view is not None]
        return (not truth.tasks and truth.processing_base is None and all(truth.view_is_built(v) for v in views)
                and all(s == BUILD_SUCCESS for s in truth.build_status.values()))


def check_plan(state: Group0State, plan: Plan, busy: set[Replica], finished: set[str]) -> None:
    replicas = [b.replica for b in plan.batches]
    assert len(replicas) == len(set(replicas)) and not set(replicas) & busy
    for batch in plan.batches:
        tasks = [state.tasks[i] for i in batch.task_ids]
        assert len({(t.type, t.base_id, t.replica, t.tablet_id) for t in tasks}) == 1
        assert len({t.view_id for t in tasks}) == len(tasks) and not finished & set(batch.task_ids)
        assert tasks[0].replica == batch.replica and tasks[0].base_id == state.processing_base


def run_schedule(seed: int, stats: Counter) -> None:
    simulation = Simulation(seed, stats)
    for _ in range(FAULT_STEPS):
        simulation.fault_step()
    stats["settle rounds"] += simulation.settle()
    stats["schedules"] += 1


COVERAGE = ("stale commands refused", "leader changes", "messages lost", "messages duplicated", "batches failed",
            "worker crashes", "views dropped", "calls attached to a running batch", "calls answered from the ledger",
            "worker refused: FAILED_PRECONDITION", "worker refused: UNAVAILABLE", "batches cancelled",
            "tasks that left a running batch", "ledger prunes", "loops that noticed they were deposed")
COVERAGE_SEEDS = range(400)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_schedules_build_every_view_and_keep_the_invariants(chunk):
    stats: Counter = Counter()
    for seed in range(chunk * SEEDS_PER_CHUNK, (chunk + 1) * SEEDS_PER_CHUNK):
        try:
            run_schedule(seed, stats)
        except AssertionError as error:
            raise AssertionError(f"schedule seed {seed}: {error}") from error


def test_the_schedules_exercise_every_kind_of_fault():
    totals: Counter = Counter()
    for seed in COVERAGE_SEEDS:
        run_schedule(seed, totals)
    missing = [what for what in COVERAGE if not totals[what]]
    assert not missing, f"the first {len(COVERAGE_SEEDS)} schedules never exercised: {missing} ({dict(totals)})"


def test_a_schedule_is_reproducible_from_its_seed():
    first, second = Counter(), Counter()
    run_schedule(7, first)
    run_schedule(7, second)
    assert first == second
