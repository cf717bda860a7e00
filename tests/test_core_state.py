"""Unit and property tests of the pure group0 core: apply, placement, tokens, view functions."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from coordinator.core.commands import JOURNAL_VERSION, AlterKeyspace, encode
from coordinator.core.schema import BUILD_STARTED, Filter
from coordinator.core.ids import derived_id
from coordinator.core.state import Group0State
from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN, tablet_of, tablet_range, token_of
from coordinator.core.views import view_changes, view_row

# ----------------------------------------------------------------- helpers


def cmd(op: str, **fields) -> dict:
    return {"op": op, "cmd_id": uuid.uuid4().hex, **fields}


def new_id() -> str:
    return uuid.uuid4().hex


def cluster(nodes: int = 3, shards: int = 2) -> Group0State:
    state = Group0State()
    for i in range(1, nodes + 1):
        assert state.apply(cmd("register_node", node_id=f"n{i}", grpc=f"h:{i}", raft=f"h:{100 + i}", shards=shards)).ok
    return state


def make_table(state: Group0State, rf: int = 3, tablets: int = 4) -> str:
    assert state.apply(cmd("create_keyspace", name="ks", rf=rf, initial_tablets=tablets)).ok
    table_id = new_id()
    outcome = state.apply(cmd("create_table", id=table_id, keyspace="ks", name="t",
                              columns=[["key", "int"], ["c", "int"], ["v", "text"]],
                              partition_key=["key"], clustering_key=["c"]))
    assert outcome.ok, outcome
    return table_id


def make_view(state: Group0State, name: str = "mv", key=("c", "key"), where=None) -> str:
    view_id = new_id()
    where = where if where is not None else [[c, "IS NOT NULL", None] for c in key]
    outcome = state.apply(cmd("create_view", id=view_id, keyspace="ks", name=name, base="t", columns=None,
                              where=where, partition_key=[key[0]], clustering_key=list(key[1:])))
    assert outcome.ok, outcome
    return view_id


def error_of(state: Group0State, command: dict) -> tuple[str, str]:
    outcome = state.apply(command)
    assert not outcome.ok, f"expected an error, got {outcome}"
    return outcome.error_code, outcome.error_message


def invariant_violations(state: Group0State) -> list[str]:
    problems = []
    for table_id, table in state.tables.items():
        keyspace = state.keyspaces.get(table.keyspace)
        if keyspace is None:
            problems.append(f"{table_id} in missing keyspace")
            continue
        tablet_map = state.tablets.get(table_id)
        if tablet_map is None:
            problems.append(f"{table_id} has no tablet map")
            continue
        count = tablet_map.tablet_count
        if count & (count - 1):
            problems.append(f"{table_id} tablet count {count} not a power of two")
        for i, replicas in enumerate(tablet_map.replicas):
            nodes = [r.node for r in replicas]
            if len(replicas) != keyspace.rf or len(set(nodes)) != len(nodes):
                problems.append(f"{table_id} tablet {i} replicas {replicas} vs rf {keyspace.rf}")
            for r in replicas:
                if r.node not in state.nodes or not 0 <= r.shard < state.nodes[r.node].shards:
                    problems.append(f"{table_id} tablet {i} bad replica {r}")
        if table.view is not None and table.view.base_id not in state.tables:
            problems.append(f"view {table_id} without base")
    if set(state.tablets) != set(state.tables):
        problems.append("tablet maps and tables differ")
    for task in state.tasks.values():
        view = state.tables.get(task.view_id)
        if view is None or view.view is None or view.view.base_id != task.base_id:
            problems.append(f"task {task.id} refers to a missing view")
            continue
        base_map = state.tablets[task.base_id]
        if task.tablet_id >= base_map.tablet_count or task.replica not in base_map.replicas[task.tablet_id]:
            problems.append(f"task {task.id} refers to a missing replica {task.replica}")
    return problems


# ----------------------------------------------------------------- tokens


def test_tablet_ranges_cover_the_ring_exactly():
    for count in (1, 2, 4, 8, 1024):
        ranges = [tablet_range(i, count) for i in range(count)]
        assert ranges[0][0] == MIN_TOKEN and ranges[-1][1] == MAX_TOKEN
        for (_, last), (first, _) in zip(ranges, ranges[1:]):
            assert first == last + 1
        for i, (first, last) in enumerate(ranges):
            assert tablet_of(first, count) == i == tablet_of(last, count)


def test_split_and_merge_follow_the_id_rule():
    for n in range(8):
        first, last = tablet_range(n, 8)
        assert tablet_range(2 * n, 16)[0] == first and tablet_range(2 * n + 1, 16)[1] == last
        assert tablet_of(first, 4) == n // 2


@given(st.integers(-(2**31), 2**31 - 1), st.text())
def test_token_is_stable_and_in_range(number, text):
    token = token_of((number, text), ("int", "text"))
    assert MIN_TOKEN <= token <= MAX_TOKEN
    assert token == token_of((number, text), ("int", "text"))


def test_token_is_pinned():
    # Pinned so an accidental change of the hash (which would move every stored row) fails loudly.
    # Spark's xxhash64 values (more golden vectors in tests/token_vectors.py).
    assert token_of((1,), ("int",)) == -6698625589789238999
    assert token_of(("a",), ("text",)) == -8582455328737087284
    assert token_of((1, "x"), ("bigint", "text")) == 6158280145716684778


# ----------------------------------------------------------------- schema commands


def test_create_view_creates_one_task_per_base_replica_and_marks_nodes_started():
    state = cluster()
    table_id = make_table(state, rf=3, tablets=4)
    view_id = make_view(state)
    tasks = [t for t in state.tasks.values() if t.view_id == view_id]
    assert len(tasks) == 4 * 3
    assert {(t.tablet_id, t.replica) for t in tasks} == {
        (i, r) for i, rs in enumerate(state.tablets[table_id].replicas) for r in rs}
    assert all(t.type == "build_range" and t.base_id == table_id and not t.aborted for t in tasks)
    assert {n for (v, n), s in state.build_status.items() if v == view_id and s == BUILD_STARTED} == {"n1", "n2", "n3"}
    assert state.view_progress(view_id)["tasks_total"] == 12 and not state.view_is_built(view_id)


def test_task_ids_are_derived_deterministically():
    view_id = new_id()
    assert derived_id(view_id, "a", 1) == derived_id(view_id, "a", 1) != derived_id(view_id, "a", 2)


def test_replicas_are_balanced_across_nodes_and_shards():
    state = cluster(nodes=4, shards=2)
    table_id = make_table(state, rf=2, tablets=8)
    per_node = {}
    for replicas in state.tablets[table_id].replicas:
        for r in replicas:
            per_node[r.node] = per_node.get(r.node, 0) + 1
    assert sorted(per_node.values()) == [4, 4, 4, 4]


def test_index_is_a_view_keyed_by_the_column_then_the_base_key():
    state = cluster()
    make_table(state)
    index_id = new_id()
    assert state.apply(cmd("create_index", id=index_id, keyspace="ks", name="t_v_idx", base="t", column="v")).ok
    index = state.tables[index_id]
    assert index.partition_key == ("v",) and index.clustering_key == ("key", "c") and index.view.is_index


@pytest.mark.parametrize("command, code, words", [
    (dict(op="create_keyspace", name="ks", rf=4, initial_tablets=4), "INVALID_ARGUMENT", "exceeds the number of nodes"),
    (dict(op="create_keyspace", name="ks", rf=1, initial_tablets=6), "INVALID_ARGUMENT", "power of two"),
    (dict(op="create_keyspace", name="9ks", rf=1, initial_tablets=4), "INVALID_ARGUMENT", "invalid keyspace name"),
    (dict(op="create_table", id="0" * 32, keyspace="nope", name="t", columns=[["a", "int"]], partition_key=["a"],
          clustering_key=[]), "NOT_FOUND", "keyspace 'nope' does not exist"),
    (dict(op="no_such_op"), "INVALID_ARGUMENT", "unknown command"),
])
def test_bad_commands_get_typed_errors(command, code, words):
    state = cluster()
    got_code, message = error_of(state, {"cmd_id": new_id(), **command})
    assert got_code == code and words in message


def test_table_errors_name_the_problem():
    state = cluster()
    make_table(state)
    base = dict(keyspace="ks", clustering_key=[])
    assert error_of(state, cmd("create_table", id=new_id(), name="t", columns=[["a", "int"]], partition_key=["a"],
                               **base)) == ("ALREADY_EXISTS", "ks.t already exists (as a table)")
    code, message = error_of(state, cmd("create_table", id=new_id(), name="u", columns=[["a", "float"]],
                                        partition_key=["a"], **base))
    assert code == "INVALID_ARGUMENT" and "unknown type 'float'" in message
    code, message = error_of(state, cmd("create_table", id=new_id(), name="u", columns=[["a", "int"], ["a", "int"]],
                                        partition_key=["a"], **base))
    assert "listed twice" in message
    code, message = error_of(state, cmd("create_table", id=new_id(), name="u", columns=[["a", "int"]],
                                        partition_key=["b"], **base))
    assert "'b'" in message and "not a defined column" in message


def test_alter_table_appends_regular_columns_and_leaves_views_as_they_were():
    state = cluster()
    table_id = make_table(state)
    view_id = make_view(state)
    version = state.schema_version
    outcome = state.apply(cmd("alter_table", keyspace="ks", name="t", add=[["w", "double"], ["x", "text"]]))
    assert outcome.ok and outcome.value == "altered"
    table = state.tables[table_id]
    assert [(c.name, c.type) for c in table.columns[-2:]] == [("w", "double"), ("x", "text")]
    assert table.primary_key == ("key", "c") and state.schema_version == version + 1
    assert [c.name for c in state.tables[view_id].columns] == ["c", "key", "v"]


def test_alter_table_errors_name_the_problem():
    state = cluster()
    make_table(state)
    make_view(state)
    assert error_of(state, cmd("alter_table", keyspace="ks", name="nope", add=[["w", "int"]])) == \
        ("NOT_FOUND", "table ks.nope does not exist")
    assert error_of(state, cmd("alter_table", keyspace="ks", name="t", add=[["v", "int"]])) == \
        ("INVALID_ARGUMENT", "ks.t already has column 'v'")
    code, message = error_of(state, cmd("alter_table", keyspace="ks", name="mv", add=[["w", "int"]]))
    assert code == "INVALID_ARGUMENT" and "materialized view" in message
    code, message = error_of(state, cmd("alter_table", keyspace="ks", name="t", add=[["w", "float"]]))
    assert code == "INVALID_ARGUMENT" and "unknown type 'float'" in message
    code, message = error_of(state, cmd("alter_table", keyspace="ks", name="t", add=[["w", "int"], ["w", "int"]]))
    assert "listed twice" in message


def test_view_key_rules():
    state = cluster()
    state.apply(cmd("create_keyspace", name="ks", rf=1, initial_tablets=1))
    state.apply(cmd("create_table", id=new_id(), keyspace="ks", name="t",
                    columns=[["key", "int"], ["c", "int"], ["v", "text"], ["w", "int"]],
                    partition_key=["key"], clustering_key=["c"]))

    def view(pk, ck, where):
        return cmd("create_view", id=new_id(), keyspace="ks", name="mv", base="t", columns=None,
                   where=[[c, "IS NOT NULL", None] for c in where], partition_key=pk, clustering_key=ck)

    assert "missing: c" in error_of(state, view(["v"], ["key"], ["v", "key"]))[1]
    assert "at most one non-primary-key column" in error_of(state, view(["v"], ["w", "key", "c"], ["v", "w", "key", "c"]))[1]
    assert "IS NOT NULL" in error_of(state, view(["v"], ["key", "c"], ["key", "c"]))[1]
    assert state.apply(view(["v"], ["key", "c"], ["v", "key", "c"])).ok


def test_a_view_journaled_before_implied_not_null_replays_under_the_old_key_rule():
    """Journaled then, a view key column restricted otherwise than by IS NOT NULL was refused: it still is."""
    state = cluster()
    make_table(state)

    def view(name, **added):
        return {**cmd("create_view", id=new_id(), keyspace="ks", name=name, base="t", columns=None,
                      where=[["key", "IN", [1, 2]], ["c", "IS NOT NULL", None]], partition_key=["c"],
                      clustering_key=["key"]), "v": JOURNAL_VERSION, "if_not_exists": False, **added}

    assert error_of(state, view("old")) == ("INVALID_ARGUMENT",
                                            "Primary key column 'key' is required to be filtered by 'IS NOT NULL'")
    assert state.apply(view("new", implied_not_null=True)).ok


def test_drops_remove_tasks_and_dependent_state():
    state = cluster()
    make_table(state)
    view_id = make_view(state)
    assert error_of(state, cmd("drop_table", keyspace="ks", name="t"))[0] == "FAILED_PRECONDITION"
    assert error_of(state, cmd("drop_view", keyspace="ks", name="mv", is_index=True))[1].endswith("DROP MATERIALIZED VIEW")
    assert state.apply(cmd("drop_view", keyspace="ks", name="mv")).ok
    assert view_id not in state.tables and not state.tasks and not state.build_status
    assert state.apply(cmd("drop_table", keyspace="ks", name="t")).ok
    assert state.apply(cmd("drop_keyspace", name="ks")).ok
    assert not state.tables and not state.tablets and not state.keyspaces


def alter_rf(name: str, rf: int) -> AlterKeyspace:
    """An RF change as the statement layer proposes it today."""
    return AlterKeyspace(name=name, rf=rf, id_seed=new_id(), cmd_id=new_id())


def legacy_alter_rf(name: str, rf: int) -> dict:
    """An RF change as journaled before RF changes of keyspaces with tables were refused (version 1 form)."""
    return cmd("alter_keyspace", name=name, rf=rf, id_seed=new_id())


@pytest.mark.parametrize("rf", [1, 3])
@pytest.mark.parametrize("journal_form", [False, True])
def test_an_rf_change_journaled_before_data_could_move_is_refused_again_and_changes_nothing(rf, journal_form):
    state = cluster(nodes=3)
    make_table(state, rf=2, tablets=2)
    make_view(state)
    assert state.apply(cmd("create_table", id=new_id(), keyspace="ks", name="t2", columns=[["key", "int"]],
                           partition_key=["key"], clustering_key=[])).ok
    before = replicated_fields(state)
    command = AlterKeyspace(name="ks", rf=rf, id_seed=new_id(), cmd_id=new_id(), move_data=False)
    if journal_form:  # as journaled then: without "move_data"
        command = {k: v for k, v in encode(command).items() if k != "move_data"}
    code, message = error_of(state, json.loads(json.dumps(command)) if journal_form else command)
    assert code == "FAILED_PRECONDITION"
    assert message == (f"keyspace 'ks' holds tables (mv, t, t2): changing its replication factor from 2 to {rf} "
                       "needs data movement between nodes, which is not supported yet; create a new keyspace "
                       f"with replication = {{'rf': {rf}}} and copy the data into it")
    assert replicated_fields(state) == before  # tablet maps, tasks, statuses and the schema version


def test_an_rf_change_of_a_keyspace_with_tables_sets_the_rf_and_leaves_the_moves_to_the_driver():
    state = cluster(nodes=3)
    table_id = make_table(state, rf=2, tablets=2)
    maps = dict(state.tablets)
    outcome = state.apply(alter_rf("ks", 3))
    assert outcome.ok and outcome.value == "altered; 2 tablet replicas to add"
    assert state.keyspaces["ks"].rf == 3 and state.tablets == maps and table_id in state.tablets


def test_rf_change_of_an_empty_keyspace_is_allowed_and_tables_get_the_new_rf():
    state = cluster(nodes=3)
    assert state.apply(cmd("create_keyspace", name="ks", rf=1, initial_tablets=2)).ok
    version = state.schema_version
    assert state.apply(alter_rf("ks", 3)).ok
    assert state.keyspaces["ks"].rf == 3 and state.schema_version == version + 1 and not state.tablets
    make_table_in = cmd("create_table", id=new_id(), keyspace="ks", name="t", columns=[["key", "int"]],
                        partition_key=["key"], clustering_key=[])
    assert state.apply(make_table_in).ok
    assert all(len(replicas) == 3 for replicas in state.tablets[make_table_in["id"]].replicas)


def test_alter_keyspace_to_its_own_rf_is_allowed_with_tables():
    state = cluster(nodes=3)
    make_table(state, rf=2, tablets=2)
    make_view(state)
    tablets, tasks = pickle.dumps(state.tablets), pickle.dumps(state.tasks)
    assert state.apply(alter_rf("ks", 2)).ok
    assert pickle.dumps(state.tablets) == tablets and pickle.dumps(state.tasks) == tasks


def test_replaying_an_rf_change_journaled_before_the_refusal_resizes_replica_sets_and_tasks():
    state = cluster(nodes=3)
    make_table(state, rf=3, tablets=2)
    view_id = make_view(state)
    assert state.apply(legacy_alter_rf("ks", 2)).ok
    assert len(list(state.tasks_of_view(view_id))) == 2 * 2
    assert state.apply(legacy_alter_rf("ks", 3)).ok
    assert len(list(state.tasks_of_view(view_id))) == 2 * 3
    assert invariant_violations(state) == []


def test_a_retried_command_returns_the_first_outcome_and_changes_nothing():
    state = cluster()
    command = cmd("create_keyspace", name="ks", rf=1, initial_tablets=1)
    first = state.apply(command)
    version = state.schema_version
    assert state.apply(command) == first and state.schema_version == version


# ----------------------------------------------------------------- view function


def test_view_changes_on_key_change_filter_and_delete():
    state = cluster()
    make_table(state)
    view_id = make_view(state, key=("v", "key", "c"), where=[["v", "IS NOT NULL", None], ["key", "IS NOT NULL", None],
                                                              ["c", "IS NOT NULL", None], ["c", "<", 100]])
    view = state.tables[view_id]
    old = {"key": 1, "c": 2, "v": "a"}
    new = {"key": 1, "c": 2, "v": "b"}
    changes = view_changes(view, old, new)
    assert [c.is_delete for c in changes] == [True, False]
    assert changes[0].key == ("a", 1, 2) and changes[1].key == ("b", 1, 2)
    assert view_changes(view, new, None)[0].key == ("b", 1, 2)
    assert view_row(view, {"key": 1, "c": 200, "v": "x"}) is None  # filtered out
    assert view_row(view, {"key": 1, "c": 2}) is None  # null view key
    assert view_changes(view, new, dict(new)) == []


@given(st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), st.integers(-5, 5), st.one_of(st.none(), st.integers(-5, 5)))
def test_filters_never_match_null_and_agree_with_python(op, bound, value):
    from coordinator.core.views import matches

    result = matches((Filter("x", op, bound),), {"x": value})
    if value is None:
        assert result is False
    else:
        expected = {"=": value == bound, "!=": value != bound, "<": value < bound, "<=": value <= bound,
                    ">": value > bound, ">=": value >= bound}[op]
        assert result is expected


# ----------------------------------------------------------------- property tests

NAMES = st.sampled_from(["a", "b", "c"])
IDS = st.uuids().map(lambda u: u.hex)


def _commands():
    register = st.builds(lambda i, s: {"op": "register_node", "node_id": f"n{i}", "grpc": f"g{i}", "raft": f"r{i}",
                                       "shards": s}, st.integers(1, 5), st.integers(1, 3))
    keyspace = st.builds(lambda n, rf, t: {"op": "create_keyspace", "name": n, "rf": rf, "initial_tablets": t},
                         NAMES, st.integers(1, 4), st.sampled_from([1, 2, 4, 8, 3]))
    alter = st.builds(lambda n, rf, seed: {"op": "alter_keyspace", "name": n, "rf": rf, "id_seed": seed},
                      NAMES, st.integers(1, 4), st.one_of(IDS, st.just("not-a-uuid")))
    table = st.builds(lambda i, ks, n: {"op": "create_table", "id": i, "keyspace": ks, "name": "t" + n,
                                        "columns": [["k", "int"], ["c", "int"], ["v", "text"]],
                                        "partition_key": ["k"], "clustering_key": ["c"]}, IDS, NAMES, NAMES)
    view = st.builds(lambda i, ks, n, b: {"op": "create_view", "id": i, "keyspace": ks, "name": "v" + n,
                                          "base": "t" + b, "columns": None,
                                          "where": [[c, "IS NOT NULL", None] for c in ("c", "k")],
                                          "partition_key": ["c"], "clustering_key": ["k"]}, IDS, NAMES, NAMES, NAMES)
    index = st.builds(lambda i, ks, n, b: {"op": "create_index", "id": i, "keyspace": ks, "name": "i" + n,
                                           "base": "t" + b, "column": "v"}, IDS, NAMES, NAMES, NAMES)
    drop_view = st.builds(lambda ks, n: {"op": "drop_view", "keyspace": ks, "name": "v" + n}, NAMES, NAMES)
    drop_table = st.builds(lambda ks, n: {"op": "drop_table", "keyspace": ks, "name": "t" + n}, NAMES, NAMES)
    drop_ks = st.builds(lambda n: {"op": "drop_keyspace", "name": n}, NAMES)
    reuse_id = st.builds(lambda ks, n: {"op": "create_view", "id": "0" * 32, "keyspace": ks, "name": "w" + n,
                                        "base": "ta", "columns": None, "where": [["c", "IS NOT NULL", None],
                                                                                  ["k", "IS NOT NULL", None]],
                                        "partition_key": ["c"], "clustering_key": ["k"]}, NAMES, NAMES)
    fixed_table = st.builds(lambda ks: {"op": "create_table", "id": "0" * 32, "keyspace": ks, "name": "ta",
                                        "columns": [["k", "int"], ["c", "int"], ["v", "text"]],
                                        "partition_key": ["k"], "clustering_key": ["c"]}, NAMES)
    alter_now = st.builds(lambda n, rf, seed: {"op": "alter_keyspace", "v": JOURNAL_VERSION, "name": n, "rf": rf,
                                               "id_seed": seed, "refuse_with_tables": True},
                          NAMES, st.integers(1, 4), IDS)
    missing_field = st.builds(lambda ks, rf: {"op": "alter_keyspace", "name": ks, "rf": rf}, NAMES, st.integers(1, 4))
    one = st.one_of(register, keyspace, alter, alter_now, table, view, index, drop_view, drop_table, drop_ks, reuse_id,
                    fixed_table, missing_field)
    prefix = [{"op": "register_node", "node_id": f"n{i}", "grpc": f"g{i}", "raft": f"r{i}", "shards": 2}
              for i in (1, 2, 3)]
    prefix += [{"op": "create_keyspace", "name": "a", "rf": 1, "initial_tablets": 2},
               {"op": "create_table", "id": "1" * 32, "keyspace": "a", "name": "ta",
                "columns": [["k", "int"], ["c", "int"], ["v", "text"]], "partition_key": ["k"], "clustering_key": ["c"]}]
    prefix = [dict(c, cmd_id=f"prefix-{i}") for i, c in enumerate(prefix)]
    tail = st.lists(st.tuples(one, IDS).map(lambda p: {**p[0], "cmd_id": p[1]}), max_size=40)
    return st.one_of(tail, tail.map(lambda commands: prefix + commands))


def replicated_fields(state: Group0State) -> dict:
    """Every public attribute of the state (the private ones are bookkeeping such as the dedup memory)."""
    return pickle.loads(pickle.dumps({k: v for k, v in vars(state).items() if not k.startswith("_")}))


def test_replicated_fields_are_derived_from_the_state_object():
    assert {"nodes", "keyspaces", "tables", "tablets", "tasks", "build_status", "tasks_created", "processing_bases",
            "dropped_tables", "schema_version"} <= set(replicated_fields(Group0State()))


@settings(max_examples=200, deadline=None)
@given(_commands())
def test_invariants_hold_and_refused_commands_change_nothing(commands):
    state = Group0State()
    for command in commands:
        before = replicated_fields(state)
        outcome = state.apply(command)
        if not outcome.ok:
            assert replicated_fields(state) == before, f"{command['op']} refused ({outcome.error_message}) but changed state"
        assert invariant_violations(state) == []


@settings(max_examples=100, deadline=None)
@given(_commands(), st.randoms(use_true_random=False))
def test_apply_is_deterministic_and_retries_change_nothing(commands, rnd):
    first, second = Group0State(), Group0State()
    outcomes_first = [first.apply(c) for c in commands]
    outcomes_second = []
    for command in commands:
        outcomes_second.append(second.apply(command))
        if rnd.random() < 0.3:
            assert second.apply(command) == outcomes_second[-1]  # a retry returns the first outcome
    assert outcomes_first == outcomes_second
    assert replicated_fields(first) == replicated_fields(second)
    assert pickle.loads(pickle.dumps(first)).tables == first.tables


REPO = Path(__file__).resolve().parent.parent
FIXTURE_JOURNAL = REPO / "tests" / "fixtures" / "group0_journal_v1.json"
HASH_SEEDS = (0, 1, 2, 12345)  # 0 disables hash randomization; 0 and 12345 alone happen to order small sets alike
DUMP_SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys
    from coordinator.core.state import Group0State

    def canonical(value):  # keeps dict insertion order (part of the state), sorts sets (hash-ordered by nature)
        if dataclasses.is_dataclass(value):
            return {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, dict):
            return [[canonical(k), canonical(v)] for k, v in value.items()]
        if isinstance(value, (set, frozenset)):
            return sorted(canonical(v) for v in value)
        if isinstance(value, (list, tuple)):
            return [canonical(v) for v in value]
        return value

    state = Group0State()
    outcomes = [canonical(state.apply(c)) for c in json.load(sys.stdin)]
    print(json.dumps({"outcomes": outcomes, "state": canonical(vars(state))}, sort_keys=True))
""")


def dump_in_subprocess(commands: list[dict], hash_seed: int) -> str:
    """Outcomes and every field of the state (dedup memory included) after `commands`, from a fresh interpreter."""
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    done = subprocess.run([sys.executable, "-c", DUMP_SCRIPT], input=json.dumps(commands), capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.integration  # starts interpreters
@settings(max_examples=3, deadline=None, phases=(Phase.generate,))  # shrinking would only rerun the subprocesses
@given(st.lists(_commands(), min_size=3, max_size=3).map(lambda runs: [c for run in runs for c in run]))
def test_apply_gives_the_same_state_under_different_hash_seeds(tail):
    commands = json.loads(FIXTURE_JOURNAL.read_text())["commands"] + tail
    dumps = [dump_in_subprocess(commands, seed) for seed in HASH_SEEDS]
    assert json.loads(dumps[0])["state"], "the dump must not be empty"
    assert dumps == [dumps[0]] * len(HASH_SEEDS)


def test_a_view_cannot_reuse_an_existing_table_id():
    state = cluster()
    table_id = make_table(state)
    command = cmd("create_view", id=table_id, keyspace="ks", name="mv", base="t", columns=None,
                  where=[["c", "IS NOT NULL", None], ["key", "IS NOT NULL", None]],
                  partition_key=["c"], clustering_key=["key"])
    assert error_of(state, command)[0] == "ALREADY_EXISTS" and state.tables[table_id].view is None


def test_alter_keyspace_with_a_bad_seed_changes_nothing():
    state = cluster()
    make_table(state, rf=1)
    make_view(state)
    before = pickle.dumps((state.keyspaces, state.tablets, state.tasks))
    assert error_of(state, cmd("alter_keyspace", name="ks", rf=3, id_seed="not-a-uuid"))[0] == "INVALID_ARGUMENT"
    assert error_of(state, cmd("alter_keyspace", name="ks", rf=2))[0] == "INVALID_ARGUMENT"
    assert pickle.dumps((state.keyspaces, state.tablets, state.tasks)) == before


def test_replaying_an_rf_shrink_journaled_before_the_refusal_forgets_the_build_status_of_nodes_without_replicas():
    state = cluster(nodes=3)
    make_table(state, rf=3, tablets=1)
    view_id = make_view(state)
    assert state.apply(legacy_alter_rf("ks", 1)).ok
    assert len(state.view_progress(view_id)["hosts"]) == 1
    assert state.view_progress(view_id)["tasks_done"] == 0 and state.view_progress(view_id)["tasks_total"] == 1


def test_a_node_cannot_rejoin_with_fewer_shards_than_its_replicas_use():
    state = cluster(nodes=1, shards=2)
    make_table(state, rf=1, tablets=2)
    code, message = error_of(state, cmd("register_node", node_id="n1", grpc="h:1", raft="h:101", shards=1))
    assert code == "FAILED_PRECONDITION" and "shard 1" in message


def test_a_member_is_named_by_its_raft_address():
    state = cluster(nodes=1)
    state.apply(cmd("register_node", node_id="n9", grpc="h:9", raft="h:109", shards=1))
    assert state.member_id("h:109") == "n9" and state.member_id("h:1") is None


def test_nan_view_keys_compare_equal_and_negative_zero_is_stored_as_zero():
    import math

    from coordinator.core import types as coltypes

    state = cluster()
    state.apply(cmd("create_keyspace", name="ks", rf=1, initial_tablets=1))
    state.apply(cmd("create_table", id=new_id(), keyspace="ks", name="t", columns=[["k", "int"], ["d", "double"]],
                    partition_key=["k"], clustering_key=[]))
    view_id = new_id()
    assert state.apply(cmd("create_view", id=view_id, keyspace="ks", name="mv", base="t", columns=None,
                           where=[["d", "IS NOT NULL", None], ["k", "IS NOT NULL", None]],
                           partition_key=["d"], clustering_key=["k"])).ok
    view = state.tables[view_id]
    assert view_changes(view, {"k": 1, "d": float("nan")}, {"k": 1, "d": float("nan")}) == []
    assert math.copysign(1.0, coltypes.coerce("double", -0.0, "d")) == 1.0


def test_hybrid_clock_ignores_timestamps_far_ahead_of_the_wall_clock():
    from coordinator.core.hlc import HybridClock

    clock = HybridClock()
    clock.observe(2**62, wall_micros=1_000, max_skew_micros=500)
    assert clock.now(1_000) == 1_000
    clock.observe(1_400, wall_micros=1_000, max_skew_micros=500)
    assert clock.now(1_000) == 1_401


def test_a_dropped_table_id_is_never_reused():
    state = cluster()
    table_id = make_table(state)
    assert state.apply(cmd("drop_table", keyspace="ks", name="t")).ok
    again = cmd("create_table", id=table_id, keyspace="ks", name="t2", columns=[["a", "int"]], partition_key=["a"],
                clustering_key=[])
    assert error_of(state, again)[0] == "ALREADY_EXISTS"


def test_a_snapshot_without_newer_fields_restores_with_their_empty_value():
    state = cluster()
    saved = state.__dict__.copy()
    del saved["dropped_tables"]
    restored = Group0State.__new__(Group0State)
    restored.__setstate__(saved)
    assert restored.dropped_tables == set() and restored.nodes == state.nodes


def test_a_snapshot_holding_the_one_processing_base_of_older_releases_restores_it_as_a_set_of_one():
    for base, bases in (("b1", ("b1",)), (None, ())):
        saved = {k: v for k, v in vars(Group0State()).items() if k != "processing_bases"}
        restored = Group0State.__new__(Group0State)
        restored.__setstate__({**saved, "processing_base": base})
        assert restored.processing_bases == bases and "processing_base" not in vars(restored)
