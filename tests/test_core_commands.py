"""Typed group0 commands: journal encode/decode round trips, version 1 entries, malformed entries, handler bugs."""
from __future__ import annotations

import dataclasses
import json
import pickle
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core import state as state_module
from coordinator.core.build_settings import DEFAULT_CHUNK_ROWS, BuildSettings, chunk_limit
from coordinator.core.commands import (
    COMMANDS,
    JOURNAL_VERSION,
    AlterKeyspace,
    ColumnSpec,
    Command,
    CreateKeyspace,
    CreateTable,
    CreateView,
    DropView,
    FinishViewBuildingTasks,
    Noop,
    RecordTaskProgress,
    RegisterNode,
    SetBuildSettings,
    SetProcessingBase,
    WhereTerm,
    cmd_id_of,
    decode,
    encode,
)
from coordinator.core.errors import InvalidArgument
from coordinator.core.schema import BUILD_STARTED, BUILD_SUCCESS
from coordinator.core.state import Group0State
from tests.strength import fast_and_deep

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
NAMES = st.lists(st.text(max_size=8), max_size=4).map(tuple)
FIELD_STRATEGIES = {
    str: st.text(max_size=12),
    int: st.integers(),
    bool: st.booleans(),
    bool | None: st.one_of(st.none(), st.booleans()),
    int | None: st.one_of(st.none(), st.integers()),
    str | None: st.one_of(st.none(), st.text(max_size=12)),
    tuple[str, ...]: NAMES,
    tuple[str, ...] | None: st.one_of(st.none(), NAMES),
    tuple[int, ...]: st.lists(st.integers(), max_size=4).map(tuple),
    tuple[ColumnSpec, ...]: st.lists(st.builds(ColumnSpec, st.text(max_size=8), st.text(max_size=8)),
                                     max_size=4).map(tuple),
    tuple[WhereTerm, ...]: st.lists(st.builds(WhereTerm, st.text(max_size=8), st.text(max_size=8),
                                              st.one_of(SCALARS, st.lists(SCALARS, max_size=3).map(tuple))),
                                    max_size=4).map(tuple),
}


def commands_of(cls: type[Command]) -> st.SearchStrategy[Command]:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: FIELD_STRATEGIES[hints[f.name]] for f in dataclasses.fields(cls)})


ANY_COMMAND = st.one_of([commands_of(cls) for cls in COMMANDS])


def create_table_entry(**changes) -> dict:
    entry = {"op": "create_table", "id": "1" * 32, "keyspace": "ks", "name": "t", "columns": [["k", "int"]],
             "partition_key": ["k"], "clustering_key": [], "if_not_exists": False, "cmd_id": "c1"}
    return {**entry, **changes}


def refusal(entry: object) -> str:
    with pytest.raises(InvalidArgument) as caught:
        decode(entry)
    outcome = Group0State().apply(entry)
    assert (outcome.error_code, outcome.error_message) == ("INVALID_ARGUMENT", caught.value.message)
    return caught.value.message


# ----------------------------------------------------------------- round trips


@settings(max_examples=300, deadline=None)
@given(ANY_COMMAND)
def test_every_command_survives_encode_json_and_decode(command):
    entry = encode(command)
    assert entry["op"] == command.op and entry["v"] == JOURNAL_VERSION and entry["cmd_id"] == command.cmd_id
    assert json.loads(json.dumps(entry)) == entry, "the journal form must hold plain JSON values only"
    assert decode(json.loads(json.dumps(entry))) == command
    assert encode(decode(entry)) == entry


def test_every_command_class_has_a_distinct_op_and_is_immutable():
    assert len({cls.op for cls in COMMANDS}) == len(COMMANDS)
    command = Noop(cmd_id="x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.cmd_id = "y"


def test_the_journal_form_of_a_view_uses_pairs_triples_and_lists():
    view = CreateView(id="2" * 32, keyspace="ks", name="mv", base="t", partition_key=("c",), clustering_key=("k",),
                      columns=("c", "k"), where=(WhereTerm("c", "IS NOT NULL", None), WhereTerm("k", "IN", (1, 2))),
                      cmd_id="c2")
    assert encode(view) == {"op": "create_view", "v": JOURNAL_VERSION, "cmd_id": "c2", "id": "2" * 32,
                            "keyspace": "ks", "name": "mv", "base": "t", "partition_key": ["c"],
                            "clustering_key": ["k"], "columns": ["c", "k"],
                            "where": [["c", "IS NOT NULL", None], ["k", "IN", [1, 2]]], "if_not_exists": False,
                            "implied_not_null": True}


# ----------------------------------------------------------------- version 1


def test_a_version_1_entry_may_leave_out_defaulted_fields_and_the_cmd_id():
    assert decode({"op": "drop_view", "keyspace": "ks", "name": "mv"}) == DropView(keyspace="ks", name="mv",
                                                                                 cmd_id=None)
    assert decode({"op": "create_keyspace", "name": "ks", "rf": 1, "initial_tablets": 2, "cmd_id": "a"}) == \
        CreateKeyspace(name="ks", rf=1, initial_tablets=2, if_not_exists=False, cmd_id="a")


def test_a_version_1_entry_holding_tuples_as_a_pickled_journal_does_decodes():
    entry = create_table_entry(columns=(("k", "int"), ("v", "text")), partition_key=("k",), clustering_key=())
    assert decode(entry).columns == (ColumnSpec("k", "int"), ColumnSpec("v", "text"))


def test_a_version_2_entry_must_hold_every_field():
    entry = {**create_table_entry(), "v": JOURNAL_VERSION}
    del entry["if_not_exists"]
    assert refusal(entry) == "malformed create_table command: missing field 'if_not_exists'"
    assert "missing field 'cmd_id'" in refusal({"op": "noop", "v": JOURNAL_VERSION})


# ----------------------------------------------------------------- malformed entries


@pytest.mark.parametrize("entry, message", [
    ({"op": "no_such_op", "cmd_id": "x"}, "unknown command 'no_such_op'"),
    ({"cmd_id": "x"}, "malformed command: missing field 'op'"),
    ({"op": ["create_table"]}, "unknown command ['create_table']"),
    (["create_table"], "malformed command: expected a dict, got list"),
    ({k: v for k, v in create_table_entry().items() if k != "columns"},
     "malformed create_table command: missing field 'columns'"),
    (create_table_entry(colour="red"), "malformed create_table command: unexpected field 'colour'"),
    (create_table_entry(columns=[["k", "int", "extra"]]),
     "malformed create_table command: field 'columns' must be a list of [name, type] string pairs, "
     "got [['k', 'int', 'extra']]"),
    (create_table_entry(partition_key="k"),
     "malformed create_table command: field 'partition_key' must be a list of strings, got 'k'"),
    (create_table_entry(name=7), "malformed create_table command: field 'name' must be a string, got 7"),
    (create_table_entry(if_not_exists=1), "malformed create_table command: field 'if_not_exists' must be a boolean"),
    (create_table_entry(cmd_id=5), "malformed create_table command: field 'cmd_id' must be a string or null, got 5"),
    ({"op": "create_keyspace", "name": "ks", "rf": True, "initial_tablets": 1},
     "malformed create_keyspace command: field 'rf' must be an integer, got True"),
    ({"op": "create_view", "id": "2" * 32, "keyspace": "ks", "name": "v", "base": "t", "partition_key": ["k"],
      "clustering_key": [], "where": [["k", "IN", [[1]]]]},
     "malformed create_view command: field 'where' must be a list of [column, op, value] triples"),
    ({**create_table_entry(), "v": 3}, "malformed create_table command: unsupported version 3"),
    ({**create_table_entry(), "v": True}, "malformed create_table command: unsupported version True"),
])
def test_malformed_entries_are_refused_naming_the_op_and_the_field(entry, message):
    assert refusal(entry).startswith(message)


def test_a_malformed_entry_is_remembered_by_its_cmd_id():
    state = Group0State()
    entry = create_table_entry(columns="k int")
    first = state.apply(entry)
    assert not first.ok and state.apply(entry) is first
    assert cmd_id_of(entry) == "c1" and cmd_id_of({"cmd_id": 3}) is None and cmd_id_of([]) is None


def test_an_in_term_without_a_list_is_refused_by_the_handler():
    state = Group0State()
    for entry in ({"op": "register_node", "node_id": "n1", "grpc": "g", "raft": "r", "shards": 1},
                  {"op": "create_keyspace", "name": "ks", "rf": 1, "initial_tablets": 1},
                  create_table_entry(columns=[["k", "int"], ["c", "int"]], clustering_key=["c"])):
        assert state.apply(entry).ok
    outcome = state.apply({"op": "create_view", "id": "2" * 32, "keyspace": "ks", "name": "v", "base": "t",
                           "partition_key": ["c"], "clustering_key": ["k"],
                           "where": [["c", "IS NOT NULL", None], ["k", "IS NOT NULL", None], ["k", "IN", 1]]})
    assert outcome.error_code == "INVALID_ARGUMENT" and "needs a list of values" in outcome.error_message


# ----------------------------------------------------------------- handler bugs


@pytest.mark.parametrize("bug", [KeyError("columns"), TypeError("unhashable"), ValueError("bad")])
def test_a_handler_bug_is_raised_not_reported_as_invalid_argument(monkeypatch, bug):
    def broken(state, command):
        raise bug

    monkeypatch.setitem(state_module._HANDLERS, CreateTable, broken)
    state = Group0State()
    with pytest.raises(type(bug)):
        state.apply(create_table_entry())
    with pytest.raises(type(bug)):
        state.apply(decode(create_table_entry()))
    assert not state._recent, "a command that hit a bug must not be remembered as applied"


def test_typed_commands_and_their_journal_form_apply_alike():
    typed, journal = Group0State(), Group0State()
    commands = [decode({"op": "register_node", "node_id": "n1", "grpc": "g", "raft": "r", "shards": 2,
                        "cmd_id": "r1"}),
                CreateKeyspace(name="ks", rf=1, initial_tablets=2, cmd_id="k1"),
                decode(create_table_entry()),
                CreateKeyspace(name="ks", rf=1, initial_tablets=2, cmd_id="k2")]
    assert [typed.apply(c) for c in commands] == [journal.apply(encode(c)) for c in commands]
    assert vars(typed) == vars(journal)


# ----------------------------------------------------------------- well-formed commands never hit a bug

FIXTURE = Path(__file__).parent / "fixtures" / "group0_journal_v1.json"
WORDS = st.one_of(
    st.sampled_from(["ks", "tab", "other", "mv", "mv2", "n_idx", "key", "c", "v", "d", "b", "t", "big", "id", "n",
                     "n1", "int", "text", "double", "timestamp", "=", "<", ">=", "!=", "IN", "IS NOT NULL"]),
    st.uuids().map(lambda u: u.hex), st.text(max_size=6))
KEYS = st.lists(WORDS, max_size=3).map(tuple)
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False), WORDS)
SCHEMA_STRATEGIES = {
    **FIELD_STRATEGIES,
    str: WORDS,
    int: st.integers(-1, 5),
    tuple[str, ...]: KEYS,
    tuple[str, ...] | None: st.one_of(st.none(), KEYS),
    tuple[ColumnSpec, ...]: st.lists(st.builds(ColumnSpec, WORDS, WORDS), max_size=4).map(tuple),
    tuple[WhereTerm, ...]: st.lists(st.builds(WhereTerm, WORDS, WORDS,
                                              st.one_of(VALUES, st.lists(VALUES, max_size=3).map(tuple))),
                                    max_size=4).map(tuple),
}


def schema_commands_of(cls: type[Command]) -> st.SearchStrategy[Command]:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: SCHEMA_STRATEGIES[hints[f.name]] for f in dataclasses.fields(cls)})


def well_formed_commands_get_an_outcome_and_refusals_change_nothing(commands):
    state = Group0State()
    for entry in json.loads(FIXTURE.read_text())["commands"]:
        state.apply(entry)
    for command in commands:
        before = pickle.dumps({k: v for k, v in vars(state).items() if not k.startswith("_")})
        outcome = state.apply(json.loads(json.dumps(encode(command))))
        if not outcome.ok:
            assert pickle.dumps({k: v for k, v in vars(state).items() if not k.startswith("_")}) == before


test_well_formed_commands_get_an_outcome_and_refusals_change_nothing, \
    test_well_formed_commands_get_an_outcome_and_refusals_change_nothing_in_200_examples = fast_and_deep(
        well_formed_commands_get_an_outcome_and_refusals_change_nothing, 70, 200,
        given(st.lists(st.one_of([schema_commands_of(cls) for cls in COMMANDS]), max_size=6)), deadline=None)


# ----------------------------------------------------------------- the view building loop's commands


def building_state(nodes: int = 3, rf: int = 2, tablets: int = 2) -> tuple[Group0State, str, str]:
    """A cluster with table ks.t and one building view ks.mv; returns (state, base id, view id)."""
    state = Group0State()
    for i in range(1, nodes + 1):
        assert state.apply(RegisterNode(node_id=f"n{i}", grpc="g", raft="r", shards=2, cmd_id=None)).ok
    assert state.apply(CreateKeyspace(name="ks", rf=rf, initial_tablets=tablets, cmd_id=None)).ok
    assert state.apply(decode(create_table_entry(columns=[["k", "int"], ["c", "int"]], clustering_key=["c"],
                                                 cmd_id=None))).ok
    view = CreateView(id="2" * 32, keyspace="ks", name="mv", base="t", partition_key=("c",), clustering_key=("k",),
                      where=(WhereTerm("c", "IS NOT NULL", None), WhereTerm("k", "IS NOT NULL", None)), cmd_id=None)
    assert state.apply(view).ok
    return state, "1" * 32, "2" * 32


def test_the_journal_form_of_the_loop_commands_carries_the_term():
    finish = FinishViewBuildingTasks(term=3, task_ids=("a", "b"), rows_scanned=(10, 0), cmd_id="f1")
    assert encode(finish) == {"op": "finish_view_building_tasks", "v": JOURNAL_VERSION, "cmd_id": "f1", "term": 3,
                              "task_ids": ["a", "b"], "rows_scanned": [10, 0]}
    assert decode(encode(finish)) == finish
    base = SetProcessingBase(term=3, base_id=None, cmd_id=None)
    assert encode(base) == {"op": "set_processing_base", "v": JOURNAL_VERSION, "cmd_id": None, "term": 3,
                            "base_id": None}
    assert decode(encode(base)) == base
    assert "field 'term' must be an integer" in refusal({**encode(finish), "term": "3"})


def test_finishing_tasks_adds_the_rows_their_batches_scanned_to_the_view():
    state, _, view_id = building_state()
    ids = sorted(t.id for t in state.tasks_of_view(view_id))[:2]
    term = max(state.view_building_term, 1)
    assert state.apply(FinishViewBuildingTasks(term=term, task_ids=tuple(ids), rows_scanned=(7, 5),
                                               cmd_id="r1")).ok
    assert state.view_progress(view_id)["rows_done"] == 12
    again = state.apply(FinishViewBuildingTasks(term=term, task_ids=tuple(ids), rows_scanned=(7, 5), cmd_id="r2"))
    assert again.ok and state.view_progress(view_id)["rows_done"] == 12  # already removed: counted once
    refused = state.apply(FinishViewBuildingTasks(term=term, task_ids=("x",), rows_scanned=(1, 2), cmd_id="r3"))
    assert refused.error_code == "INVALID_ARGUMENT" and "2 counts for 1 task ids" in refused.error_message


def test_rows_reported_chunk_by_chunk_move_rows_done_which_never_goes_down():
    state, _, view_id = building_state()
    first, second = sorted(t.id for t in state.tasks_of_view(view_id))[:2]
    assert state.apply(RecordTaskProgress(task_ids=(first, second), rows_scanned=(1000, 400), cmd_id=None)).value == 2
    assert state.view_progress(view_id)["rows_done"] == 1400
    assert state.apply(RecordTaskProgress(task_ids=(first,), rows_scanned=(600,), cmd_id=None)).ok  # a late report
    assert state.apply(RecordTaskProgress(task_ids=(first, "gone"), rows_scanned=(2000, 9), cmd_id=None)).value == 1
    assert state.view_progress(view_id)["rows_done"] == 2400
    term = max(state.view_building_term, 1)
    finished = FinishViewBuildingTasks(term=term, task_ids=(first, second), rows_scanned=(2500, 300), cmd_id=None)
    assert state.apply(finished).ok
    assert state.view_progress(view_id)["rows_done"] == 2900  # 500 more of the first; the second's 300 < its 400
    assert first not in state.task_rows and second not in state.task_rows
    refused = state.apply(RecordTaskProgress(task_ids=("x", "y"), rows_scanned=(1,), cmd_id=None))
    assert refused.error_code == "INVALID_ARGUMENT"


def test_the_chunk_size_and_rate_limit_are_cluster_settings_within_bounds():
    state = Group0State()
    assert state.build_settings == BuildSettings(DEFAULT_CHUNK_ROWS, 0)
    assert state.apply(SetBuildSettings(chunk_rows=1000, cmd_id=None)).value == BuildSettings(1000, 0)
    refused = state.apply(SetBuildSettings(chunk_rows=5, cmd_id=None))
    assert refused.error_code == "INVALID_ARGUMENT" and "not 5" in refused.error_message
    assert state.apply(SetBuildSettings(rate_rows_per_s=500, cmd_id=None)).value == BuildSettings(1000, 500)
    assert chunk_limit(state.build_settings) == 500  # a second's worth of rows under a limit
    refused = state.apply(SetBuildSettings(chunk_rows=2000, rate_rows_per_s=3, cmd_id=None))
    assert refused.error_code == "INVALID_ARGUMENT" and state.build_settings == BuildSettings(1000, 500)
    assert state.apply(SetBuildSettings(rate_rows_per_s=0, cmd_id=None)).value == BuildSettings(1000, 0)
    assert chunk_limit(state.build_settings) == 1000


def test_finishing_tasks_removes_them_once_and_ignores_absent_ids():
    state, _, view_id = building_state()
    ids = sorted(t.id for t in state.tasks_of_view(view_id))
    assert state.apply(FinishViewBuildingTasks(term=1, task_ids=(ids[0], ids[1], "gone"), cmd_id=None)).value == 2
    assert state.apply(FinishViewBuildingTasks(term=1, task_ids=(ids[0],), cmd_id=None)).value == 0
    assert ids[0] not in state.tasks and ids[2] in state.tasks
    assert state.view_progress(view_id)["tasks_done"] == 2


def test_a_node_without_tasks_of_a_view_is_success_and_the_view_is_built_when_all_are():
    state, _, view_id = building_state()
    by_node: dict[str, list[str]] = {}
    for task in state.tasks_of_view(view_id):
        by_node.setdefault(task.replica.node, []).append(task.id)
    first, *others = sorted(by_node)
    assert state.apply(FinishViewBuildingTasks(term=1, task_ids=tuple(by_node[first]), cmd_id=None)).ok
    assert state.build_status[(view_id, first)] == BUILD_SUCCESS
    assert all(state.build_status[(view_id, n)] == BUILD_STARTED for n in others)
    assert not state.view_is_built(view_id)
    rest = tuple(i for n in others for i in by_node[n])
    assert state.apply(FinishViewBuildingTasks(term=1, task_ids=rest, cmd_id=None)).ok
    assert state.view_is_built(view_id) and set(state.build_status.values()) == {BUILD_SUCCESS}


@pytest.mark.handmade_group0
def test_an_aborted_task_is_not_removed_by_a_finish():
    state, _, view_id = building_state()
    task = next(state.tasks_of_view(view_id))
    state.tasks[task.id] = dataclasses.replace(task, aborted=True)
    assert state.apply(FinishViewBuildingTasks(term=1, task_ids=(task.id,), cmd_id=None)).value == 0
    assert task.id in state.tasks


def test_an_empty_finish_settles_statuses_of_nodes_left_without_tasks():
    state, _, view_id = building_state()
    for task in [t for t in state.tasks_of_view(view_id) if t.replica.node == "n1"]:
        del state.tasks[task.id]  # as an RF change may leave a node
    assert state.apply(FinishViewBuildingTasks(term=1, task_ids=(), cmd_id=None)).value == 0
    assert state.build_status[(view_id, "n1")] == BUILD_SUCCESS


def test_a_loop_command_from_an_older_term_is_refused_and_changes_nothing():
    state, base_id, view_id = building_state()
    assert state.apply(SetProcessingBase(term=5, base_id=base_id, cmd_id=None)).ok
    assert state.view_building_term == 5
    task_id = next(state.tasks_of_view(view_id)).id
    before = pickle.dumps(vars(state))
    for stale in (FinishViewBuildingTasks(term=4, task_ids=(task_id,), cmd_id=None),
                  SetProcessingBase(term=4, base_id=None, cmd_id=None)):
        outcome = state.apply(stale)
        assert (outcome.error_code, outcome.error_message) == (
            "FAILED_PRECONDITION", "stale term 4: a newer leader (term 5) has taken over")
    assert pickle.dumps(vars(state)) == before
    assert state.apply(FinishViewBuildingTasks(term=6, task_ids=(task_id,), cmd_id=None)).value == 1
    assert state.view_building_term == 6
    assert state.apply(SetProcessingBase(term=6, base_id=None, cmd_id=None)).ok  # the same term is accepted


def test_the_processing_base_must_be_an_existing_base_table():
    state, base_id, view_id = building_state()
    for wrong in (view_id, "9" * 32):
        outcome = state.apply(SetProcessingBase(term=1, base_id=wrong, cmd_id=None))
        assert outcome.error_code == "NOT_FOUND" and state.processing_bases == ()
    assert state.view_building_term == 0, "a refused command records no term"
    assert state.apply(SetProcessingBase(term=1, base_id=base_id, cmd_id=None)).value == base_id
    assert state.processing_bases == (base_id,)
    assert state.apply(DropView(keyspace="ks", name="mv", cmd_id=None)).ok
    assert not state.tasks and state.processing_bases == (base_id,)  # the loop clears it (planner)
    assert state.apply(SetProcessingBase(term=1, base_id=None, cmd_id=None)).ok and state.processing_bases == ()


def test_a_loop_term_must_be_positive():
    state, _, _ = building_state()
    outcome = state.apply(FinishViewBuildingTasks(term=0, task_ids=(), cmd_id=None))
    assert outcome.error_code == "INVALID_ARGUMENT" and "positive" in outcome.error_message


def test_a_snapshot_written_before_loop_terms_restores_term_zero():
    state, base_id, _ = building_state()
    saved = state.__dict__.copy()
    del saved["_view_building_term"]
    restored = Group0State.__new__(Group0State)
    restored.__setstate__(saved)
    assert restored.view_building_term == 0 and restored.tasks == state.tasks
    assert restored.apply(SetProcessingBase(term=1, base_id=base_id, cmd_id=None)).ok
    assert pickle.loads(pickle.dumps(restored)).view_building_term == 1


def test_a_finish_command_journaled_before_rows_scanned_existed_still_decodes():
    entry = {"op": "finish_view_building_tasks", "v": JOURNAL_VERSION, "cmd_id": "f", "term": 2, "task_ids": ["a"]}
    assert decode(entry) == FinishViewBuildingTasks(term=2, task_ids=("a",), cmd_id="f")


def test_an_rf_change_journaled_before_the_refusal_decodes_as_not_refusing():
    fields = {"cmd_id": "a", "name": "ks", "rf": 2, "id_seed": "1" * 32}
    legacy = AlterKeyspace(refuse_with_tables=False, move_data=False, **fields)
    assert decode({"op": "alter_keyspace", **fields}) == legacy
    assert decode({"op": "alter_keyspace", "v": JOURNAL_VERSION, **fields}) == legacy
    built_now = AlterKeyspace(**fields)
    assert built_now.refuse_with_tables and encode(built_now)["refuse_with_tables"] is True
    assert built_now.move_data and encode(built_now)["move_data"] is True
    assert decode(json.loads(json.dumps(encode(built_now)))) == built_now
    refusing = {"op": "alter_keyspace", "v": JOURNAL_VERSION, "refuse_with_tables": True, **fields}
    assert decode(refusing) == AlterKeyspace(move_data=False, **fields)  # journaled before data could move


def test_a_view_journaled_before_implied_not_null_decodes_under_the_old_key_rule():
    fields = {"cmd_id": "v", "id": "2" * 32, "keyspace": "ks", "name": "mv", "base": "t", "partition_key": ["c"],
              "clustering_key": ["k"], "columns": None, "where": [["c", "IS NOT NULL", None]], "if_not_exists": False}
    assert not decode({"op": "create_view", **fields}).implied_not_null
    assert not decode({"op": "create_view", "v": JOURNAL_VERSION, **fields}).implied_not_null
    built_now = decode(encode(decode({"op": "create_view", "v": JOURNAL_VERSION, **fields, "implied_not_null": True})))
    assert built_now.implied_not_null
