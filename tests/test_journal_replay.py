"""Replay of a group0 journal recorded by the pre-typed-commands code: same outcomes, same final state."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from coordinator.core.commands import JOURNAL_VERSION, decode, encode
from coordinator.core.state import Group0State

FIXTURE = Path(__file__).parent / "fixtures" / "group0_journal_v1.json"
# Fields of the state's records added since the fixture was recorded, with their defaults: left out when default
ADDED_FIELDS = {"Task": {"repair": False, "staged_through": 0, "staged_rows": 0}, "TabletTransition": {"deaths_at_start": 0},
                "Node": {"cql": ""}}
# State fields renamed since: the fixture's name -> (the name now, the recorded value in today's form)
RENAMED_FIELDS = {"processing_base": ("processing_bases", lambda base: [] if base is None else [base])}


def plain(value):
    """The canonical JSON-able form the fixture's expected outcomes and state were written in."""
    if dataclasses.is_dataclass(value):
        added = ADDED_FIELDS.get(type(value).__name__, {})
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in added or getattr(value, f.name) != added[f.name]}
    if isinstance(value, dict):
        return sorted([[plain(k), plain(v)] for k, v in value.items()], key=json.dumps)
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def state_summary(state: Group0State) -> dict:
    """Every replicated field of the state, canonicalized and through JSON like the fixture."""
    fields = {name: plain(value) for name, value in vars(state).items() if not name.startswith("_")}
    return json.loads(json.dumps(fields))


def assert_state_as_recorded(summary: dict, recorded: dict) -> None:
    """The state equals the fixture's; fields added since the fixture was recorded must hold their initial value."""
    expected_state = dict(recorded["expected"]["state"])
    for old_name, (name, today) in RENAMED_FIELDS.items():
        if old_name in expected_state:
            expected_state[name] = today(expected_state.pop(old_name))
    added_since = set(summary) - set(expected_state)
    initial = state_summary(Group0State())
    assert {name: summary[name] for name in added_since} == {name: initial[name] for name in added_since}
    assert {name: summary[name] for name in expected_state} == expected_state


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(FIXTURE.read_text())


def recorded_form(outcome) -> dict:
    """An outcome in the fixture's form: the fields it was recorded with (`error_kind`, the typed refusal's class
    name, came later)."""
    form = json.loads(json.dumps(plain(outcome)))
    assert (form.pop("error_kind") is None) == (form["error_code"] is None)
    return form


def replay(entries: list) -> tuple[list, dict]:
    state = Group0State()
    outcomes = [recorded_form(state.apply(entry)) for entry in entries]
    return outcomes, state_summary(state)


def test_the_fixture_holds_version_1_entries_of_every_recorded_kind(recorded):
    commands = recorded["commands"]
    assert all("v" not in entry for entry in commands)
    assert {entry["op"] for entry in commands} >= {"register_node", "create_keyspace", "alter_keyspace",
                                                    "create_table", "create_view", "create_index", "drop_view",
                                                    "drop_table", "drop_keyspace"}


def test_replaying_the_v1_journal_gives_the_recorded_outcomes_and_state(recorded):
    outcomes, summary = replay(recorded["commands"])
    for index, (got, expected) in enumerate(zip(outcomes, recorded["expected"]["outcomes"], strict=True)):
        assert got == expected, f"entry {index} ({recorded['commands'][index]['op']})"
    assert_state_as_recorded(summary, recorded)


def test_replaying_the_journal_re_encoded_gives_the_same_result(recorded):
    entries = [encode(decode(entry)) for entry in recorded["commands"]]
    assert all(entry["v"] == JOURNAL_VERSION for entry in entries)
    outcomes, summary = replay(json.loads(json.dumps(entries)))
    assert outcomes == recorded["expected"]["outcomes"]
    assert_state_as_recorded(summary, recorded)


def test_replaying_typed_commands_gives_the_same_result(recorded):
    outcomes, summary = replay([decode(entry) for entry in recorded["commands"]])
    assert outcomes == recorded["expected"]["outcomes"]
    assert_state_as_recorded(summary, recorded)


def test_a_replayed_journal_applied_again_changes_nothing(recorded):
    state = Group0State()
    first = [state.apply(entry) for entry in recorded["commands"]]
    before = state_summary(state)
    assert [state.apply(entry) for entry in recorded["commands"]] == first
    assert state_summary(state) == before
