"""Holds of view rows in a node's outbox: a view whose build finished every task is built only once they are released."""
from __future__ import annotations

import pickle

from coordinator.core.commands import (
    DecommissionNode,
    FinishViewBuildingTasks,
    HoldViewRows,
    ReleaseViewRows,
    RemoveNode,
    decode,
    encode,
)
from coordinator.core.state import Group0State
from tests.test_core_state import cluster, make_table, make_view
from tests.test_tablet_migrations import drain


def finish_all(state: Group0State, view_id: str) -> None:
    ids = tuple(t.id for t in state.tasks_of_view(view_id))
    assert state.apply(FinishViewBuildingTasks(cmd_id=None, term=1, task_ids=ids)).ok


def hold(state: Group0State, view_id: str, holder: str = "n1", targets=("n2",)) -> int:
    outcome = state.apply(HoldViewRows(cmd_id=None, view_id=view_id, holder=holder, targets=tuple(targets)))
    assert outcome.ok, outcome
    return outcome.value


def built_state() -> tuple[Group0State, str]:
    state = cluster(nodes=3, shards=1)
    make_table(state, rf=2, tablets=2)
    return state, make_view(state)


def test_a_view_with_held_rows_is_built_only_once_they_are_released():
    state, view_id = built_state()
    assert hold(state, view_id, targets=("n2", "n3")) == 2
    finish_all(state, view_id)
    assert not state.view_is_built(view_id)
    assert state.view_progress(view_id)["held"] == [("n1", "n2"), ("n1", "n3")]
    for target in ("n2", "n3"):
        number = state.held_view_rows[(view_id, "n1", target)]
        assert state.apply(ReleaseViewRows(cmd_id=None, view_id=view_id, holder="n1", target=target,
                                           hold=number)).value is True
    assert state.view_is_built(view_id) and state.view_progress(view_id)["held"] == []
    state.validate()


def test_a_release_from_before_a_new_hold_leaves_it_held():
    state, view_id = built_state()
    hold(state, view_id)
    looked_at = state.held_view_rows[(view_id, "n1", "n2")]
    hold(state, view_id)  # another batch queued rows after the holder looked at its outbox
    stale = ReleaseViewRows(cmd_id=None, view_id=view_id, holder="n1", target="n2", hold=looked_at)
    assert state.apply(stale).value is False
    assert state.view_progress(view_id)["held"] == [("n1", "n2")]
    state.validate()


def test_holds_go_with_their_view_and_are_not_made_for_a_dropped_one():
    state, view_id = built_state()
    hold(state, view_id)
    assert state.apply({"op": "drop_view", "cmd_id": None, "keyspace": "ks", "name": "mv"}).ok
    assert state.held_view_rows == {}
    assert hold(state, view_id) == 0
    base_id = next(t.id for t in state.tables.values() if t.view is None)
    assert hold(state, base_id) == 0 and state.held_view_rows == {}
    state.validate()


def test_a_removed_node_takes_its_holds_both_ways():
    state = cluster(nodes=4, shards=1)
    make_table(state, rf=2, tablets=2)
    view_id = make_view(state)
    hold(state, view_id, holder="n1", targets=("n2",))
    hold(state, view_id, holder="n2", targets=("n1", "n3"))
    assert state.apply(DecommissionNode(cmd_id=None, node_id="n1")).ok
    drain(state)
    assert state.apply(RemoveNode(cmd_id=None, term=1, node_id="n1")).ok
    assert list(state.held_view_rows) == [(view_id, "n2", "n3")]
    assert hold(state, view_id, holder="n1") == 0 and hold(state, view_id, holder="n3", targets=("n1",)) == 0
    state.validate()


def test_hold_commands_go_through_the_journal_and_old_snapshots_restore_without_holds():
    command = HoldViewRows(cmd_id="c1", view_id="v", holder="n1", targets=("n2", "n3"))
    assert decode(encode(command)) == command
    release = ReleaseViewRows(cmd_id="c2", view_id="v", holder="n1", target="n2", hold=7)
    assert decode(encode(release)) == release
    state, view_id = built_state()
    saved = dict(vars(state))
    del saved["held_view_rows"], saved["holds_made"]
    restored = Group0State.__new__(Group0State)
    restored.__setstate__(pickle.loads(pickle.dumps(saved)))
    assert restored.held_view_rows == {} and restored.holds_made == 0


class InProcessGroup0:
    """A group0 of one member in process: `read` and `propose` on one state."""

    def __init__(self, state: Group0State):
        self.state = state

    def read(self, fn):
        return fn(self.state)

    def propose(self, command, timeout: float):
        return self.state.apply(command)


def test_a_node_releases_its_holds_once_its_outbox_delivered_their_rows(tmp_path):
    from node.view_row_holds import ViewRowHolds
    from storage.store import NodeStore

    state, view_id = built_state()
    store = NodeStore.for_data_dir(tmp_path)
    try:
        holds = ViewRowHolds("n1", InProcessGroup0(state), None, store)
        store.outbox_queue([("n2", b"{}"), ("n3", b"{}")], view_id)
        holds.hold(view_id, ("n2", "n3"))
        hold(state, view_id, holder="n2", targets=("n3",))  # another node's: not n1's to release
        assert holds.release_delivered() == 0
        store.outbox_ack([e.id for e in store.outbox_pending(target="n2")])
        assert holds.release_delivered() == 1
        assert state.view_progress(view_id)["held"] == [("n1", "n3"), ("n2", "n3")]
    finally:
        store.close()
