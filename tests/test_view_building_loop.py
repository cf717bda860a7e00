"""The view building loop (coordinator/view_building.py) on real threads, with an in-process group0 and fake
workers: no processes, no sleeps as synchronisation (every wait is a condition with a timeout)."""
from __future__ import annotations

import logging
import random
import threading
from concurrent.futures import Future

import pytest

from common.injection import Injections
from common.metrics import NodeMetrics
from coordinator.core.commands import (
    ColumnSpec,
    CreateKeyspace,
    CreateTable,
    CreateView,
    FinishViewBuildingTasks,
    RegisterNode,
    SetProcessingBase,
    SetProcessingBases,
    WhereTerm,
)
from coordinator.core.errors import Unavailable
from coordinator.core.planner import Backoff
from coordinator.core.schema import BUILD_STARTED, BUILD_SUCCESS, Outcome, Replica
from coordinator.core.leader_loop import BatchReply, LoopConfig
from coordinator.view_building import PAUSE_POINT, ViewBuildingLoop

from .fakes import FakeGroup0

WAIT = 5.0
COLUMNS = (ColumnSpec("k", "int"), ColumnSpec("c", "int"), ColumnSpec("v", "text"))
VIEW_WHERE = (WhereTerm("c", "IS NOT NULL", None), WhereTerm("k", "IS NOT NULL", None))
TABLE = f"{1:032x}"
VIEWS = (f"{0xF01:032x}", f"{0xF02:032x}")


class LeaderGroup0(FakeGroup0):
    """FakeGroup0 that records proposals, tells the loops when a command applied, and lets tests wait."""

    def __init__(self):
        super().__init__()
        self.changed = threading.Condition()
        self.proposals: list[tuple[str, object]] = []  # (proposing thread, command)
        self.listeners: list = []

    def propose(self, command, timeout: float = 10.0):
        outcome = super().propose(command, timeout)
        with self.changed:
            self.proposals.append((threading.current_thread().name, command))
            self.changed.notify_all()
        for notify in list(self.listeners):
            notify(self.applied_index)
        return outcome

    def wait_for(self, predicate, timeout: float = WAIT) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.read(predicate), timeout)

    def commands_of(self, kind, thread: str | None = None) -> list:
        with self.changed:
            return [c for t, c in self.proposals if isinstance(c, kind) and (thread is None or t == thread)]


class FakeWorkers:
    """`send_batch` of every node: completes at once, or holds the futures until the test releases them; the
    nodes in `failing` answer UNAVAILABLE. Records every call and checks one call per replica at a time."""

    def __init__(self, hold: bool = False):
        self.hold = hold
        self.failing: set[str] = set()
        self.cond = threading.Condition()
        self.calls: list[tuple[str, int, tuple[str, ...], int]] = []
        self.held: dict[Replica, tuple[Future, tuple[str, ...]]] = {}
        self.outstanding: dict[Replica, int] = {}
        self.overlaps = 0  # a second call to a replica while one was outstanding

    def send_batch(self, node: str, shard: int, task_ids: tuple[str, ...], term: int, applied_index: int) -> Future:
        replica = Replica(node, shard)
        future: Future = Future()
        with self.cond:
            self.calls.append((node, shard, task_ids, term))
            if self.outstanding.get(replica, 0):
                self.overlaps += 1
            self.outstanding[replica] = self.outstanding.get(replica, 0) + 1
            self.cond.notify_all()
            if self.hold:
                self.held[replica] = (future, task_ids)
                return future
        self._complete(replica, future, task_ids)
        return future

    def _complete(self, replica: Replica, future: Future, task_ids) -> None:
        with self.cond:
            self.outstanding[replica] -= 1
            failing = replica.node in self.failing
            self.cond.notify_all()
        if failing:
            future.set_exception(Unavailable(f"node {replica.node} is down"))
        else:
            future.set_result(BatchReply(tuple(task_ids), tuple(rows_of(i) for i in task_ids)))

    def release(self, replicas=None) -> int:
        with self.cond:
            chosen = [r for r in self.held if replicas is None or r in replicas]
            items = [(r, *self.held.pop(r)) for r in chosen]
        for replica, future, task_ids in items:
            self._complete(replica, future, task_ids)
        return len(items)

    def wait_for(self, predicate, timeout: float = WAIT) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def poke(self, *_args) -> None:
        """Re-check waiters (hooked to group0 applies so waits may also look at the state)."""
        with self.cond:
            self.cond.notify_all()

    def calls_to(self, node: str) -> int:
        with self.cond:
            return sum(1 for c in self.calls if c[0] == node)


class ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def build_cluster(group0: LeaderGroup0 | None = None) -> LeaderGroup0:
    """2 nodes × 2 shards, rf 2, 4 tablets, one table with two views (16 build_range tasks), via typed commands."""
    group0 = group0 if group0 is not None else LeaderGroup0()
    for n in (1, 2):
        group0.propose(RegisterNode(node_id=f"n{n}", grpc="g", raft="r", shards=2, cmd_id=None))
    group0.propose(CreateKeyspace(name="ks", rf=2, initial_tablets=4, cmd_id=None))
    group0.propose(CreateTable(id=TABLE, keyspace="ks", name="t", columns=COLUMNS, partition_key=("k",),
                               clustering_key=("c",), cmd_id=None))
    for i, view in enumerate(VIEWS, 1):
        outcome = group0.propose(CreateView(id=view, keyspace="ks", name=f"mv{i}", base="t", partition_key=("c",),
                                            clustering_key=("k",), where=VIEW_WHERE, cmd_id=None))
        assert outcome.ok, outcome
    group0.proposals.clear()
    return group0


class Harness:
    def __init__(self, group0: LeaderGroup0, workers: FakeWorkers, name: str = "loop-a", term: int | None = None,
                 injections: Injections | None = None):
        self.group0 = group0
        self.workers = workers
        self.leader = True
        self.term = term if term is not None else group0.term
        self.metrics = NodeMetrics()
        self.injections = injections or Injections()
        self.log = ListHandler()
        logger = logging.getLogger(f"test.view_building.{name}")
        logger.addHandler(self.log)
        logger.propagate = False
        self.loop = ViewBuildingLoop(
            group0=group0, leadership=lambda: (self.leader, self.term), send_batch=workers.send_batch,
            applied_index=lambda: group0.applied_index, rng=random.Random(7), injections=self.injections,
            metrics=self.metrics, logger=logger, name=name,
            config=LoopConfig(backoff=Backoff(initial=0.01, factor=2.0, maximum=0.05), leader_recheck=0.05))
        group0.listeners.append(self.loop.notify_applied)

    def metric(self, name: str) -> float:
        return self.metrics.registry.get_sample_value(name) or 0.0

    def rounds(self) -> float:
        return self.metric("vbc_view_building_loop_rounds_total")

    def wait_rounds(self, count: int = 2) -> None:
        """Let the loop run `count` more full rounds (a round already running counts as none)."""
        assert self.loop.wait_rounds(count + 1, WAIT), "loop did not run"


def rows_of(task_id: str) -> int:
    """The base rows a fake worker says the batch of `task_id` scanned (different per task)."""
    return sum(map(ord, task_id))


def built(state) -> bool:
    return all(state.view_is_built(v) for v in VIEWS)


@pytest.fixture
def harnesses():
    started: list[Harness] = []
    yield started
    for h in started:
        h.loop.stop()
        h.injections.disable_all()


def start(harnesses, *args, **kwargs) -> Harness:
    h = Harness(*args, **kwargs)
    harnesses.append(h)
    h.loop.start()
    return h


# ------------------------------------------------------------------------------------------- tests


def test_the_view_becomes_built_with_few_finish_commands(harnesses):
    group0, workers = build_cluster(), FakeWorkers()
    tasks = group0.read(lambda s: len(s.tasks))
    assert tasks == 16 and not group0.read(built)
    h = start(harnesses, group0, workers)
    assert group0.wait_for(built), group0.read(lambda s: s.tasks)
    assert group0.read(lambda s: (s.tasks, set(s.build_status.values()))) == ({}, {BUILD_SUCCESS})
    h.wait_rounds()  # metrics are published at the end of a round
    flushes = group0.commands_of(FinishViewBuildingTasks)
    assert 1 <= len(flushes) <= len(workers.calls), flushes  # at most one per answered batch, not one per task
    assert sum(len(c.task_ids) for c in flushes) == tasks
    assert all(c.rows_scanned == tuple(rows_of(i) for i in c.task_ids) for c in flushes), "each task its own rows"
    assert all(c.cmd_id and c.term == 1 for c in flushes)
    assert group0.commands_of(SetProcessingBases)[0].term == 1
    assert workers.overlaps == 0
    assert h.metric("vbc_view_building_tasks_finished_total") == tasks
    assert h.metric("vbc_view_building_batches_sent_total") == len(workers.calls) == 8  # 2 views per batch
    assert h.metric("vbc_view_building_flush_commands_total") == len(flushes)
    assert h.metric("vbc_view_building_batch_failures_total") == 0


def test_one_batch_per_replica_is_in_flight_at_a_time(harnesses):
    group0, workers = build_cluster(), FakeWorkers(hold=True)
    replicas = group0.read(lambda s: {t.replica for t in s.tasks.values()})
    assert replicas == {Replica(n, s) for n in ("n1", "n2") for s in (0, 1)}
    h = start(harnesses, group0, workers)
    assert workers.wait_for(lambda: set(workers.held) == replicas)
    h.wait_rounds()  # more rounds with every replica busy send nothing
    assert len(workers.calls) == len(replicas) and h.loop.in_flight() == replicas
    group0.listeners.append(workers.poke)
    releases = 0
    while True:
        assert workers.wait_for(lambda: workers.held or group0.read(built)), "loop stalled"
        if group0.read(built):
            break
        # release one replica at a time: it alone gets its next batch while the others stay busy
        workers.release({next(iter(workers.held))})
        releases += 1
    assert releases == len(workers.calls) == 8
    assert workers.overlaps == 0
    assert all(len(ids) == 2 for _, _, ids, _ in workers.calls)  # one task per view in every batch


def test_a_failing_node_is_retried_with_backoff_and_the_view_waits_for_it(harnesses):
    group0, workers = build_cluster(), FakeWorkers()
    workers.failing.add("n2")
    h = start(harnesses, group0, workers)
    # n1 finishes its share; n2 keeps failing and is retried
    assert group0.wait_for(lambda s: not any(t.replica.node == "n1" for t in s.tasks.values()))
    assert workers.wait_for(lambda: sum(1 for c in workers.calls if c[0] == "n2") >= 8)
    status = group0.read(lambda s: dict(s.build_status))
    assert {k: v for k, v in status.items() if k[1] == "n1"} == {(v, "n1"): BUILD_SUCCESS for v in VIEWS}
    assert {k: v for k, v in status.items() if k[1] == "n2"} == {(v, "n2"): BUILD_STARTED for v in VIEWS}
    assert not group0.read(built)
    assert h.metric("vbc_view_building_batch_failures_total") >= 8
    assert any(r.levelno == logging.WARNING and "n2" in r.getMessage() for r in h.log.records)
    assert workers.overlaps == 0
    workers.failing.clear()
    assert group0.wait_for(built)


def test_the_pause_injection_stops_dispatch_and_resuming_continues(harnesses):
    group0, workers = build_cluster(), FakeWorkers()
    injections = Injections()
    injections.enable(PAUSE_POINT)  # its default, pause: the loop counts the hit and holds dispatch back
    h = start(harnesses, group0, workers, injections=injections)
    assert injections.wait_hit(PAUSE_POINT, WAIT)
    h.wait_rounds()
    assert workers.calls == [] and group0.proposals == []
    injections.disable(PAUSE_POINT)
    h.loop.wake()
    assert group0.wait_for(built)


def test_after_a_term_change_late_replies_are_ignored_and_a_new_loop_picks_up_from_state(harnesses):
    group0, workers = build_cluster(), FakeWorkers(hold=True)
    old = start(harnesses, group0, workers, name="loop-old")
    assert workers.wait_for(lambda: len(workers.held) == 4)
    old_calls = list(workers.calls)
    assert {term for *_, term in old_calls} == {1}
    # leadership moves to another node in term 2: the old loop forgets its calls
    old.leader = False
    group0.term = 2
    old.wait_rounds()
    assert not old.loop.in_flight()
    workers.release()  # the old term's late replies
    old.wait_rounds()
    assert old.loop.pending() == frozenset()
    assert old.metric("vbc_view_building_tasks_finished_total") == 0
    assert group0.commands_of(FinishViewBuildingTasks) == []
    assert group0.read(lambda s: len(s.tasks)) == 16  # nothing was finished on the old loop's word
    # the new leader's loop starts from the replicated state alone
    workers.hold = False
    new = start(harnesses, group0, workers, name="loop-new", term=2)
    assert group0.wait_for(built)
    assert group0.commands_of(SetProcessingBases, "loop-new")[0].term == 2
    assert {c.term for c in group0.commands_of(FinishViewBuildingTasks)} == {2}
    assert group0.commands_of(FinishViewBuildingTasks, "loop-old") == []
    assert {term for *_, term in workers.calls[len(old_calls):]} == {2}
    new.wait_rounds()  # metrics are published at the end of a round
    assert new.metric("vbc_view_building_tasks_finished_total") == 16


def test_a_deposed_loop_that_still_believes_it_leads_stops_at_the_stale_term(harnesses):
    group0, workers = build_cluster(), FakeWorkers(hold=True)
    old = start(harnesses, group0, workers, name="loop-old")
    assert workers.wait_for(lambda: len(workers.held) == 4)
    # a newer loop's command is applied (term 2); the old one still thinks it leads in term 1
    assert group0.propose(SetProcessingBase(term=2, base_id=TABLE, cmd_id="claim-2")).ok
    workers.release()
    old.wait_rounds()
    assert group0.commands_of(FinishViewBuildingTasks) == []
    assert len(workers.calls) == 4  # dispatched nothing more
    assert old.loop.pending() == frozenset() and not old.loop.in_flight()
    assert group0.read(lambda s: len(s.tasks)) == 16


class RefusingGroup0(LeaderGroup0):
    """Refuses the first `refusals` SetProcessingBases proposals as UNAVAILABLE (no quorum, say)."""

    def __init__(self, refusals: int):
        super().__init__()
        self.refusals = refusals

    def propose(self, command, timeout: float = 10.0):
        if isinstance(command, SetProcessingBases) and self.refusals > 0:
            self.refusals -= 1
            with self.changed:
                self.proposals.append((threading.current_thread().name, command))
            return Outcome(error_code="UNAVAILABLE", error_message="no quorum", error_kind="Unavailable")
        return super().propose(command, timeout)


def test_refused_commands_are_proposed_again_later_and_the_build_goes_on(harnesses):
    group0 = build_cluster(RefusingGroup0(refusals=6))
    h = start(harnesses, group0, FakeWorkers())
    assert group0.wait_for(built), "a refused claim must not stall the loop"
    claims = group0.commands_of(SetProcessingBases)
    assert len(claims) >= 7 and group0.refusals == 0
    assert h.loop.wait_rounds(2)
