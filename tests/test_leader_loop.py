"""The view building leader loop's pure state machine (coordinator/core/leader_loop.py): events in, instructions out."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

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
from coordinator.core.errors import StaleTerm, Unavailable
from coordinator.core.leader_loop import (
    Applied,
    BatchAnswered,
    BatchFailed,
    BatchReply,
    DispatchPaused,
    LeaderLoop,
    LeadershipChanged,
    Log,
    LoopConfig,
    ProposalDone,
    ProposeCommand,
    SendBatch,
    Tick,
    WakeAt,
)
from coordinator.core.planner import Backoff
from coordinator.core.state import Group0State

COLUMNS = (ColumnSpec("k", "int"), ColumnSpec("c", "int"), ColumnSpec("v", "text"))
VIEW_WHERE = (WhereTerm("c", "IS NOT NULL", None), WhereTerm("k", "IS NOT NULL", None))
TABLE = f"{1:032x}"
CONFIG = LoopConfig(backoff=Backoff(initial=1.0, factor=2.0, maximum=8.0), flush_interval=0.2)


def cluster(views: int = 2) -> Group0State:
    """2 nodes × 2 shards, rf 2, 4 tablets, one table with `views` views: 16 build_range tasks per view."""
    state = Group0State()
    for n in (1, 2):
        assert state.apply(RegisterNode(node_id=f"n{n}", grpc="g", raft="r", shards=2, cmd_id=None)).ok
    assert state.apply(CreateKeyspace(name="ks", rf=2, initial_tablets=4, cmd_id=None)).ok
    assert state.apply(CreateTable(id=TABLE, keyspace="ks", name="t", columns=COLUMNS, partition_key=("k",),
                                   clustering_key=("c",), cmd_id=None)).ok
    for v in range(views):
        assert state.apply(CreateView(id=f"{0xF00 + v:032x}", keyspace="ks", name=f"mv{v}", base="t",
                                      partition_key=("c",), clustering_key=("k",), where=VIEW_WHERE, cmd_id=None)).ok
    return state


class Driver:
    """Feeds one loop and carries out its proposals against a real Group0State, as the shell does."""

    def __init__(self, state: Group0State, term: int = 1, config: LoopConfig = CONFIG):
        self.state = state
        self.loop = LeaderLoop(config)
        self.term = term
        self.now = 0.0
        self.index = 0
        self.proposed: list = []

    def handle(self, *events, apply: bool = True) -> list:
        """One round: leadership, time and applied index, then `events`; proposals are applied at once (their
        outcomes fed back like the shell does) unless `apply` is False."""
        out = self.loop.handle(self.state, LeadershipChanged(True, self.term), Tick(self.now), Applied(self.index),
                               *events)
        self.loop.validate()
        proposals = [i for i in out if isinstance(i, ProposeCommand)]
        if not apply or not proposals:
            return out
        done = []
        for proposal in proposals:
            self.proposed.append(proposal.command)
            outcome = self.state.apply(dataclasses.replace(proposal.command, cmd_id=f"c{len(self.proposed)}"))
            self.index += 1
            done.append(ProposalDone(proposal.epoch, proposal.command, outcome.error))
        return out + self.handle(*done)

    def sends(self, out) -> list[SendBatch]:
        return [i for i in out if isinstance(i, SendBatch)]

    def answer(self, send: SendBatch, finished=None, rows: int = 10) -> BatchAnswered:
        ids = send.batch.task_ids if finished is None else finished
        return BatchAnswered(send.epoch, send.batch, BatchReply(tuple(ids), (rows,) * len(ids)))

    def flushes(self) -> list[FinishViewBuildingTasks]:
        return [c for c in self.proposed if isinstance(c, FinishViewBuildingTasks)]


def test_a_new_term_claims_the_processing_base_first_then_sends_one_batch_per_replica():
    driver = Driver(cluster())
    out = driver.handle()
    assert driver.proposed == [SetProcessingBases(term=1, base_ids=(TABLE,), cmd_id=None)]
    sends = driver.sends(out)
    assert sorted((s.batch.node, s.batch.shard) for s in sends) == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]
    assert all(len(s.batch.task_ids) == 2 and s.term == 1 and s.epoch == driver.loop.epoch for s in sends)
    assert driver.sends(driver.handle()) == [], "every replica is busy"


def test_a_batch_waits_while_the_processing_base_command_is_outstanding():
    driver = Driver(cluster())
    out = driver.handle(apply=False)
    assert [type(i) for i in out if not isinstance(i, (Log, WakeAt))] == [ProposeCommand]
    assert driver.sends(driver.handle(apply=False)) == [] and len(driver.loop.proposing) == 1, "not proposed twice"


def test_answers_arriving_together_make_one_flush_per_batch_of_finished_ids_not_one_per_task():
    driver = Driver(cluster())
    sends = driver.sends(driver.handle())
    driver.handle(*(driver.answer(s) for s in sends))
    (flush,) = driver.flushes()  # no call is out (until the next dispatch): nothing more to wait for
    assert sorted(flush.task_ids) == sorted(i for s in sends for i in s.batch.task_ids)
    assert flush.rows_scanned == (10,) * 8 and flush.term == 1
    assert driver.loop.counters.flushes == 1 and driver.loop.counters.tasks_finished == 8
    assert driver.loop.pending == {}, "the flushed ids are gone from group0"


def test_while_calls_are_out_finished_ids_wait_for_the_flush_interval():
    driver = Driver(cluster())
    sends = driver.sends(driver.handle())
    driver.handle(driver.answer(sends[0]))
    assert driver.loop.in_flight and driver.flushes() == [], "more answers are coming: they wait to share a command"
    driver.now += CONFIG.flush_interval
    driver.handle()
    (flush,) = driver.flushes()
    assert sorted(flush.task_ids) == sorted(sends[0].batch.task_ids)


def test_an_answer_is_trusted_only_for_the_ids_of_its_batch():
    driver = Driver(cluster())
    first, second = driver.sends(driver.handle())[:2]
    foreign = second.batch.task_ids[0]
    driver.handle(driver.answer(first, finished=(first.batch.task_ids[0], foreign)))
    assert set(driver.loop.pending) == {first.batch.task_ids[0]}, "a foreign id is not taken, a missing one waits"


def test_a_late_answer_of_an_older_epoch_is_ignored():
    driver = Driver(cluster())
    send = driver.sends(driver.handle())[0]
    driver.term = 2
    driver.handle()  # a new term: a new epoch
    driver.handle(driver.answer(send))
    assert not any(i in driver.loop.pending for i in send.batch.task_ids)


def test_failing_replicas_back_off_and_their_warnings_are_rate_limited_by_the_event_times():
    driver = Driver(cluster())
    sends = driver.sends(driver.handle())
    warnings = []
    for attempt in range(3):
        out = driver.handle(*(BatchFailed(s.epoch, s.batch, "UNAVAILABLE: down", jitter=0.0) for s in sends))
        warnings.append([i.message for i in out if isinstance(i, Log) and i.level == "warning"])
        assert driver.sends(out) == [] and [i.time for i in out if isinstance(i, WakeAt)] == [driver.now + 2 ** attempt]
        driver.now += 2 ** attempt - 0.01
        assert driver.sends(driver.handle()) == [], "still waiting out the backoff"
        driver.now += 0.01
        sends = driver.sends(driver.handle())
        assert len(sends) == 4
    assert [len(w) for w in warnings] == [1, 1, 1], "four failures at one time warn once"
    assert "(3 similar warnings suppressed)" in warnings[1][0]
    assert driver.loop.counters.batch_failures == 12


def test_a_newer_loop_term_in_group0_deposes_the_loop_until_the_term_changes():
    driver = Driver(cluster())
    sends = driver.sends(driver.handle())
    assert driver.state.apply(SetProcessingBase(term=2, base_id=TABLE, cmd_id="newer")).ok
    driver.index += 1
    out = driver.handle(*(driver.answer(s) for s in sends))
    assert driver.loop.deposed and not driver.loop.active
    assert driver.sends(out) == [] and driver.loop.pending == {}
    driver.term = 3
    assert driver.sends(driver.handle()) and driver.loop.active


def test_a_refused_command_is_read_by_its_type_not_its_message():
    driver = Driver(cluster())
    driver.handle(apply=False)
    (command,) = driver.loop.proposing
    driver.loop.handle(driver.state, ProposalDone(driver.loop.epoch, command, StaleTerm("whatever the text says")))
    assert driver.loop.deposed
    other = Driver(cluster())
    other.handle(apply=False)
    (command,) = other.loop.proposing
    out = other.loop.handle(other.state, ProposalDone(other.loop.epoch, command, Unavailable("stale term 1")))
    assert not other.loop.deposed and any(isinstance(i, Log) and i.level == "warning" for i in out)


def test_a_refused_command_holds_proposals_back_for_a_while_instead_of_proposing_again_at_once():
    driver = Driver(cluster())
    driver.handle(apply=False)
    (command,) = driver.loop.proposing
    out = driver.loop.handle(driver.state, ProposalDone(driver.loop.epoch, command, Unavailable("no quorum")))
    assert not any(isinstance(i, ProposeCommand) for i in out) and not driver.loop.proposing
    assert [i.time for i in out if isinstance(i, WakeAt)] == [driver.now + CONFIG.leader_recheck]
    driver.now += CONFIG.leader_recheck
    assert driver.sends(driver.handle()), "proposed again once the hold is over, then the batches follow"


def test_losing_leadership_forgets_every_call_and_finished_id():
    driver = Driver(cluster())
    sends = driver.sends(driver.handle())
    driver.handle(driver.answer(sends[0]))
    out = driver.loop.handle(driver.state, LeadershipChanged(False, 2))
    assert not driver.loop.in_flight and not driver.loop.pending and driver.loop.term is None
    assert [i.time for i in out if isinstance(i, WakeAt)] == [driver.now + CONFIG.leader_recheck]


def test_the_pause_point_holds_dispatch_back_but_flushes_go_on():
    driver = Driver(cluster())
    sends = driver.sends(driver.handle())
    driver.loop.handle(driver.state, Tick(driver.now, dispatch_paused=True), *(driver.answer(s) for s in sends[:-1]))
    driver.now += 1.0
    out = driver.loop.handle(driver.state, Tick(driver.now, dispatch_paused=True), Applied(driver.index))
    assert any(isinstance(i, DispatchPaused) for i in out) and driver.sends(out) == []
    assert any(isinstance(i, ProposeCommand) and isinstance(i.command, FinishViewBuildingTasks) for i in out)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.integers(0, 2)), min_size=1, max_size=40))
def test_any_order_of_answers_and_failures_builds_everything_and_keeps_the_invariants(script):
    """Answers, failures and partial answers in any order, then a fair finish: every task gets removed."""
    driver = Driver(cluster(views=1))
    in_flight = driver.sends(driver.handle())
    for pick, fails, keep in script:
        if not in_flight:
            break
        send = in_flight.pop(pick % len(in_flight))
        event = (BatchFailed(send.epoch, send.batch, "down") if fails else
                 driver.answer(send, finished=send.batch.task_ids[:keep]))
        driver.now += 0.3
        in_flight += driver.sends(driver.handle(event))
    for _ in range(200):
        if not driver.state.tasks:
            break
        driver.now += 10.0
        in_flight += driver.sends(driver.handle(*(driver.answer(s) for s in in_flight)))
        in_flight = [s for s in in_flight if driver.loop.in_flight.get(s.batch.replica) == s.batch]
    assert driver.state.tasks == {} and driver.state.view_is_built(f"{0xF00:032x}")
