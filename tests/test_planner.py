"""The view building planner: processing base, batches per replica, flushes, retry backoff and log rate (pure)."""
from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.commands import (
    ColumnSpec,
    CreateKeyspace,
    CreateTable,
    CreateView,
    DropView,
    FinishViewBuildingTasks,
    RegisterNode,
    SetBuildSettings,
    SetProcessingBases,
    SetViewPaused,
    WhereTerm,
)
from coordinator.core.planner import (
    Backoff,
    LogLimiter,
    Plan,
    RetrySchedule,
    SendBatch,
    choose_processing_bases,
    pending_finished,
    plan_dispatch,
    plan_flush,
    replica_queues,
)
from coordinator.core.schema import Replica
from coordinator.core.state import Group0State

COLUMNS = (ColumnSpec("k", "int"), ColumnSpec("c", "int"), ColumnSpec("v", "text"))
VIEW_WHERE = (WhereTerm("c", "IS NOT NULL", None), WhereTerm("k", "IS NOT NULL", None))


def table_id(n: int) -> str:
    return f"{n:032x}"


def view_id(n: int) -> str:
    return f"{0xF00 + n:032x}"


def apply(state: Group0State, command) -> None:
    outcome = state.apply(command)
    assert outcome.ok, outcome


def cluster(nodes: int = 3, shards: int = 2, rf: int = 2, tablets: int = 2, tables: int = 1) -> Group0State:
    state = Group0State()
    for i in range(1, nodes + 1):
        apply(state, RegisterNode(node_id=f"n{i}", grpc="g", raft="r", shards=shards, cmd_id=None))
    apply(state, CreateKeyspace(name="ks", rf=rf, initial_tablets=tablets, cmd_id=None))
    for t in range(1, tables + 1):
        apply(state, CreateTable(id=table_id(t), keyspace="ks", name=f"t{t}", columns=COLUMNS, partition_key=("k",),
                                 clustering_key=("c",), cmd_id=None))
    return state


def add_view(state: Group0State, n: int, base: int = 1) -> str:
    apply(state, CreateView(id=view_id(n), keyspace="ks", name=f"mv{n}", base=f"t{base}", partition_key=("c",),
                            clustering_key=("k",), where=VIEW_WHERE, cmd_id=None))
    return view_id(n)


def all_live(state: Group0State) -> frozenset[str]:
    return frozenset(state.nodes)


def dispatch(state: Group0State, term: int = 1, busy=frozenset(), live=None, finished=frozenset()) -> Plan:
    return plan_dispatch(state, term, busy, all_live(state) if live is None else live, finished)


def claim(state: Group0State, term: int = 1) -> None:
    """Apply the processing-base command a loop of `term` proposes first."""
    for command in dispatch(state, term).commands:
        apply(state, command)


# ----------------------------------------------------------------- processing base


def test_a_new_loop_first_claims_its_term_with_the_processing_base_and_sends_nothing_yet():
    state = cluster()
    add_view(state, 1)
    plan = dispatch(state, term=3)
    assert plan == Plan(commands=(SetProcessingBases(term=3, base_ids=(table_id(1),), cmd_id=None),))
    claim(state, 3)
    assert state.processing_bases == (table_id(1),) and state.view_building_term == 3
    assert dispatch(state, term=3).commands == ()


def test_an_idle_cluster_only_claims_the_term():
    state = cluster()
    assert dispatch(state, term=2).commands == (SetProcessingBases(term=2, base_ids=(), cmd_id=None),)
    claim(state, 2)
    assert dispatch(state, term=2) == Plan()


def test_the_processing_bases_are_the_bases_of_the_oldest_live_tasks_up_to_the_setting():
    state = cluster(tables=3)
    add_view(state, 1, base=2)
    add_view(state, 2, base=1)
    add_view(state, 3, base=3)
    assert choose_processing_bases(state) == (table_id(2), table_id(1))
    apply(state, SetBuildSettings(parallel_bases=3, cmd_id=None))
    assert choose_processing_bases(state) == (table_id(2), table_id(1), table_id(3))


def one_base_at_a_time(state: Group0State) -> Group0State:
    apply(state, SetBuildSettings(parallel_bases=1, cmd_id=None))
    return state


def test_the_processing_base_advances_when_its_tasks_are_gone_and_is_cleared_at_the_end():
    state = one_base_at_a_time(cluster(tables=2))
    add_view(state, 1, base=1)
    add_view(state, 2, base=2)
    claim(state)
    assert state.processing_bases == (table_id(1),)
    apply(state, DropView(keyspace="ks", name="mv1", cmd_id=None))
    assert dispatch(state).commands == (SetProcessingBases(term=1, base_ids=(table_id(2),), cmd_id=None),)
    claim(state)
    apply(state, FinishViewBuildingTasks(term=1, task_ids=tuple(state.tasks), cmd_id=None))
    assert dispatch(state).commands == (SetProcessingBases(term=1, base_ids=(), cmd_id=None),)


def test_a_paused_view_gets_no_batch_and_holds_no_other_table_back():
    state = one_base_at_a_time(cluster(tables=2))
    add_view(state, 1, base=1)
    add_view(state, 2, base=2)
    claim(state)
    apply(state, SetViewPaused(keyspace="ks", name="mv1", paused=True, cmd_id=None))
    assert dispatch(state).commands == (SetProcessingBases(term=1, base_ids=(table_id(2),), cmd_id=None),)
    claim(state)
    sent = {task_id for batch in dispatch(state).batches for task_id in batch.task_ids}
    assert sent and all(state.tasks[i].view_id == view_id(2) for i in sent)
    apply(state, SetViewPaused(keyspace="ks", name="mv1", paused=False, cmd_id=None))
    apply(state, FinishViewBuildingTasks(term=1, task_ids=tuple(i for i, t in state.tasks.items()
                                                                if t.view_id == view_id(2)), cmd_id=None))
    assert dispatch(state).commands == (SetProcessingBases(term=1, base_ids=(table_id(1),), cmd_id=None),)
    refused = state.apply(SetViewPaused(keyspace="ks", name="nope", paused=True, cmd_id=None))
    assert refused.error_code == "NOT_FOUND"


def test_a_new_view_on_another_base_waits_while_every_place_is_taken():
    state = one_base_at_a_time(cluster(tables=2))
    add_view(state, 1, base=1)
    claim(state)
    add_view(state, 2, base=2)
    plan = dispatch(state)
    assert plan.commands == ()
    assert {state.tasks[i].base_id for b in plan.batches for i in b.task_ids} == {table_id(1)}


def test_two_bases_built_at_once_take_turns_on_a_replica_that_holds_both():
    state = cluster(nodes=1, shards=1, rf=1, tablets=2, tables=2)
    add_view(state, 1, base=1)
    claim(state)
    add_view(state, 2, base=2)
    assert dispatch(state).commands == (SetProcessingBases(term=1, base_ids=(table_id(1), table_id(2)),
                                                           cmd_id=None),)
    claim(state)
    last: dict = {}
    finished: set[str] = set()
    bases = []
    for _ in range(4):
        (batch,) = plan_dispatch(state, 1, frozenset(), all_live(state), frozenset(finished), last_base=last).batches
        base = state.tasks[batch.task_ids[0]].base_id
        bases.append(base)
        last[batch.replica] = base
        finished |= set(batch.task_ids)
    assert bases == [table_id(1), table_id(2), table_id(1), table_id(2)]


# ----------------------------------------------------------------- batches


def test_every_replica_gets_one_batch_of_its_lowest_tablet_with_one_task_per_view():
    state = cluster(nodes=3, shards=2, rf=2, tablets=4)
    add_view(state, 1)
    add_view(state, 2)
    claim(state)
    plan = dispatch(state)
    replicas = {r for rs in state.tablets[table_id(1)].replicas for r in rs}
    assert {b.replica for b in plan.batches} == replicas
    for batch in plan.batches:
        tasks = [state.tasks[i] for i in batch.task_ids]
        lowest = min(i for i, rs in enumerate(state.tablets[table_id(1)].replicas) if batch.replica in rs)
        assert {t.tablet_id for t in tasks} == {lowest}
        assert sorted(t.view_id for t in tasks) == [view_id(1), view_id(2)]
        assert list(batch.task_ids) == sorted(batch.task_ids)


def test_busy_replicas_and_dead_nodes_get_nothing():
    state = cluster(nodes=3, shards=1, rf=3, tablets=1)
    add_view(state, 1)
    claim(state)
    plan = dispatch(state, busy={Replica("n1", 0)}, live={"n1", "n2"})
    assert [b.replica for b in plan.batches] == [Replica("n2", 0)]


def test_finished_tasks_are_not_sent_again_and_the_next_tablet_follows():
    state = cluster(nodes=1, shards=1, rf=1, tablets=2)
    add_view(state, 1)
    claim(state)
    (first,) = dispatch(state).batches
    (second,) = dispatch(state, finished=frozenset(first.task_ids)).batches
    assert state.tasks[first.task_ids[0]].tablet_id == 0 and state.tasks[second.task_ids[0]].tablet_id == 1
    assert dispatch(state, finished=frozenset(first.task_ids + second.task_ids)).batches == ()


def test_aborted_tasks_are_never_sent():
    state = cluster(nodes=1, shards=1, rf=1, tablets=1)
    add_view(state, 1)
    claim(state)
    for task in list(state.tasks.values()):
        state.tasks[task.id] = dataclasses.replace(task, aborted=True)
    plan = dispatch(state)
    assert plan.batches == () and plan.commands == (SetProcessingBases(term=1, base_ids=(), cmd_id=None),)


def test_a_deposed_loop_plans_nothing():
    state = cluster()
    add_view(state, 1)
    claim(state, term=4)
    assert dispatch(state, term=3) == Plan()
    assert plan_flush(state, 3, frozenset(state.tasks)) is None


# ----------------------------------------------------------------- flush


def test_a_flush_removes_the_finished_tasks_group0_still_holds_in_one_command():
    state = cluster()
    add_view(state, 1)
    claim(state)
    ids = sorted(state.tasks)[:3]
    command = plan_flush(state, 1, frozenset(ids + ["gone"]))
    assert command == FinishViewBuildingTasks(term=1, task_ids=tuple(ids), cmd_id=None)
    apply(state, command)
    assert pending_finished(state, ids + ["gone"]) == frozenset()
    assert plan_flush(state, 1, frozenset(ids)) is None


def test_a_flush_settles_a_status_left_started_without_tasks():
    state = cluster(nodes=1, shards=1, rf=1, tablets=1)
    add_view(state, 1)
    claim(state)
    state.tasks.clear()  # as an RF change may leave a node
    assert plan_flush(state, 1, frozenset()) == FinishViewBuildingTasks(term=1, task_ids=(), cmd_id=None)


# ----------------------------------------------------------------- backoff and log rate


def test_backoff_doubles_up_to_the_maximum_and_jitter_takes_off_at_most_half():
    policy = Backoff(initial=0.1, factor=2.0, maximum=1.0)
    assert [round(policy.delay(a), 3) for a in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert policy.delay(10_000) == 1.0
    assert policy.delay(1, jitter=0.999) > 0.05 and policy.delay(1, jitter=0.5) == pytest.approx(0.075)


def test_a_retry_schedule_holds_a_key_back_until_its_delay_passed():
    schedule = RetrySchedule(Backoff(initial=1.0, factor=2.0, maximum=10.0))
    key = Replica("n1", 0)
    assert schedule.failed(key, now=100.0) == 1.0 and schedule.failed(key, now=101.0) == 2.0
    assert schedule.waiting(102.0) == {key} and schedule.waiting(103.0) == frozenset()
    assert schedule.next_wakeup(102.0) == 103.0 and schedule.attempts(key) == 2
    schedule.succeeded(key)
    assert schedule.attempts(key) == 0 and schedule.next_wakeup(0.0) is None


def test_at_most_one_warning_a_second_counting_those_held_back():
    limiter = LogLimiter(interval=1.0)
    decisions = [limiter.decide(t) for t in (0.0, 0.2, 0.5, 0.99, 1.0, 1.5, 3.0)]
    assert [d.emit for d in decisions] == [True, False, False, False, True, False, True]
    assert decisions[4].suppressed == 3 and decisions[6].suppressed == 1


# ----------------------------------------------------------------- properties


@st.composite
def planner_inputs(draw):
    nodes, shards = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    state = cluster(nodes=nodes, shards=shards, rf=draw(st.integers(1, nodes)),
                    tablets=draw(st.sampled_from([1, 2, 4])), tables=2)
    views = draw(st.lists(st.integers(1, 2), min_size=0, max_size=4))
    for n, base in enumerate(views, start=1):
        add_view(state, n, base)
    for n in draw(st.lists(st.integers(1, len(views)), max_size=2, unique=True)) if views else ():
        apply(state, DropView(keyspace="ks", name=f"mv{n}", cmd_id=None))
    if draw(st.booleans()):
        claim(state)
    ids = sorted(state.tasks)
    finished = frozenset(draw(st.lists(st.sampled_from(ids), unique=True)) if ids else ())
    replicas = sorted({t.replica for t in state.tasks.values()})
    busy = frozenset(draw(st.lists(st.sampled_from(replicas), unique=True)) if replicas else ())
    live = frozenset(draw(st.lists(st.sampled_from(sorted(state.nodes)), unique=True)))
    return state, busy, live, finished


@settings(max_examples=150, deadline=None)
@given(planner_inputs())
def test_planner_batches_are_one_per_idle_replica_of_one_tablet_and_one_task_per_view(inputs):
    state, busy, live, finished = inputs
    plan = plan_dispatch(state, 1, busy, live, finished)
    replicas = [b.replica for b in plan.batches]
    assert len(replicas) == len(set(replicas)), "one batch per (node, shard)"
    bases = state.processing_bases
    sendable = {t.replica for t in state.tasks.values()
                if t.base_id in bases and not t.aborted and t.id not in finished}
    assert set(replicas) == {r for r in sendable if r not in busy and r.node in live}
    for batch in plan.batches:
        tasks = [state.tasks[i] for i in batch.task_ids]
        assert batch.task_ids and len({(t.type, t.base_id, t.replica, t.tablet_id) for t in tasks}) == 1
        base = next(b for b in bases if any(t.replica == batch.replica and t.base_id == b and not t.aborted
                                            and t.id not in finished for t in state.tasks.values()))
        assert tasks[0].base_id == base and tasks[0].replica == batch.replica, "the first base with tasks there"
        assert len({t.view_id for t in tasks}) == len(tasks), "one task per view"
        assert not set(batch.task_ids) & finished
        lowest = min(t.tablet_id for t in state.tasks.values() if t.replica == batch.replica
                     and t.base_id == base and t.id not in finished)
        assert tasks[0].tablet_id == lowest
        views = {t.view_id for t in state.tasks.values() if t.replica == batch.replica
                 and t.base_id == base and t.tablet_id == lowest and t.id not in finished}
        assert {t.view_id for t in tasks} == views, "every view of the tablet in the one batch"


@settings(max_examples=100, deadline=None)
@given(planner_inputs())
def test_planner_output_is_deterministic(inputs):
    state, busy, live, finished = inputs
    copy = pickle.loads(pickle.dumps(state))
    first = (plan_dispatch(state, 2, busy, live, finished), plan_flush(state, 2, finished))
    again = (plan_dispatch(copy, 2, set(reversed(sorted(busy))), set(live), set(finished)),
             plan_flush(copy, 2, set(finished)))
    assert first == again


@settings(max_examples=100, deadline=None)
@given(planner_inputs())
def test_planned_commands_apply_and_a_plan_then_asks_for_no_more_base_changes(inputs):
    state, busy, live, finished = inputs
    for command in plan_dispatch(state, 2, busy, live, finished).commands:
        apply(state, command)
    assert plan_dispatch(state, 2, busy, live, finished).commands == ()
    assert (state.processing_bases == ()) == (not any(not t.aborted for t in state.tasks.values()))


@settings(max_examples=100, deadline=None)
@given(planner_inputs(), st.data())
def test_queues_computed_once_plan_what_a_fresh_plan_would_while_only_calls_finish(inputs, data):
    state, busy, live, finished = inputs
    queues = replica_queues(state, state.processing_bases)  # what the loop keeps while the applied index stays
    ids = sorted(state.tasks)
    later = finished | frozenset(data.draw(st.lists(st.sampled_from(ids), unique=True)) if ids else ())
    for done in (finished, later):
        assert plan_dispatch(state, 1, busy, live, done, queues) == plan_dispatch(state, 1, busy, live, done)


def test_send_batch_names_its_replica():
    assert SendBatch("n1", 2, ("a",)).replica == Replica("n1", 2)
