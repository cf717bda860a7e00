"""Tests of coordinator.raft.Group0 against real pysyncobj members on loopback."""
from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TypeVar

import pysyncobj.pickle as raft_pickle
import pytest
from pysyncobj.journal import FileJournal

from coordinator.core import state as state_module
from coordinator.core.commands import Command, CreateKeyspace, RegisterNode, encode
from coordinator.core.state import Group0State
from coordinator.raft import DUMP_FILE, JOURNAL_FILE, Group0, Group0Unavailable, StateMachineError
from vbc.cluster import allocate_ports

pytestmark = pytest.mark.waits  # elections, timeouts

T = TypeVar("T")
PASSWORD = "group0-test-secret"
ELECTION_TIMEOUT = 10.0


class KeyValue:
    """Test state machine: a dict; commands deduplicated by cmd_id; every apply call is counted."""

    def __init__(self):
        self.data: dict[str, object] = {}
        self.outcomes: dict[str, tuple] = {}
        self.apply_calls = 0

    def apply(self, command: dict) -> tuple:
        self.apply_calls += 1
        cmd_id = command["cmd_id"]
        if cmd_id in self.outcomes:
            return self.outcomes[cmd_id]
        if command["op"] == "bug":
            raise RuntimeError("deliberate state machine bug")
        if command["op"] == "put":
            self.data[command["key"]] = command["value"]
            outcome = ("ok", command["value"])
        else:
            outcome = ("error", f"unknown op {command['op']!r}")
        self.outcomes[cmd_id] = outcome
        return outcome

    def snapshot(self) -> tuple:
        return dict(self.data), dict(self.outcomes), self.apply_calls


def put(key: str, value: object, cmd_id: str | None = None) -> dict:
    return {"op": "put", "key": key, "value": value, "cmd_id": cmd_id or f"put-{key}-{value}"}


def wait_until(predicate: Callable[[], T], timeout: float, what: str) -> T:
    """Observe external state (elections, files) by polling; never used to order Raft operations."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
    return result


class Cluster:
    """Three Group0 members in this process, restartable on the same ports and data dirs."""

    def __init__(self, root: Path, size: int = 3, make_state: Callable[[], object] = KeyValue):
        self.make_state = make_state
        self.ids = [f"n{i}" for i in range(1, size + 1)]
        self.addrs = {node_id: f"127.0.0.1:{port}" for node_id, port in zip(self.ids, allocate_ports(size))}
        self.dirs = {node_id: root / node_id for node_id in self.ids}
        self.members: dict[str, Group0] = {}
        self.applied_reports: dict[str, list[int]] = {}

    def start(self) -> None:
        for node_id in self.ids:
            self.start_member(node_id)

    def start_member(self, node_id: str) -> Group0:
        reports = self.applied_reports[node_id] = []
        member = Group0(node_id=node_id, raft_addr=self.addrs[node_id],
                        peers={other: addr for other, addr in self.addrs.items() if other != node_id},
                        data_dir=self.dirs[node_id], state_machine=self.make_state(), password=PASSWORD,
                        on_applied=reports.append)
        self.members[node_id] = member
        member.start()
        return member

    def close_member(self, node_id: str) -> None:
        self.members.pop(node_id).close()

    def close_all(self) -> None:
        with ExitStack() as closing:  # closes every member even if one close() raises
            for node_id in list(self.members):
                closing.callback(self.close_member, node_id)

    def restart_all(self) -> None:
        self.close_all()
        self.start()

    def running(self) -> list[Group0]:
        return list(self.members.values())

    def wait_for_leader(self, timeout: float = ELECTION_TIMEOUT) -> Group0:
        def agreed_leader() -> Group0 | None:
            leader_ids = {member.leader_id for member in self.running()}
            leader = self.members.get(leader_ids.pop()) if len(leader_ids) == 1 else None
            return leader if leader is not None and leader.is_leader else None

        return wait_until(agreed_leader, timeout, "all running members to agree on one leader")

    def follower(self) -> Group0:
        return next(member for member in self.running() if not member.is_leader)

    def states(self) -> dict[str, tuple]:
        return {node_id: (member.applied_index, member.read(KeyValue.snapshot))
                for node_id, member in self.members.items()}


def running_cluster(group: Cluster):
    try:
        group.start()
        yield group
    finally:
        group.close_all()


@pytest.fixture
def cluster(tmp_path):
    yield from running_cluster(Cluster(tmp_path))


@pytest.fixture
def group0_cluster(tmp_path):
    yield from running_cluster(Cluster(tmp_path, make_state=Group0State))


def test_one_leader_is_elected_and_known_by_node_id(cluster):
    leader = cluster.wait_for_leader()

    assert [member.is_leader for member in cluster.running()].count(True) == 1
    assert leader.term >= 1
    status = cluster.follower().status()
    assert status["leader_id"] == leader.node_id and status["state"] == "follower"
    assert status["term"] == leader.term
    assert set(status["peers"]) == set(cluster.ids) - {status["node_id"]}
    assert leader.leadership() == (True, leader.term)  # the leader flag and the term as one pair
    assert cluster.follower().leadership() == (False, status["term"])


def test_status_and_errors_name_the_members_as_they_are_after_a_removal(cluster):
    leader = cluster.wait_for_leader()
    removed = next(node_id for node_id in cluster.ids if node_id != leader.node_id)
    leader.remove_member(cluster.addrs[removed])
    cluster.close_member(removed)
    assert set(leader.status()["peers"]) == set(cluster.ids) - {leader.node_id, removed}
    assert leader._connectivity_summary().startswith("all 2 members connected")


class SteppingDown:
    """pysyncobj's fields as a leader of `term` sees them while it steps down: the newer term is set first, the
    state (and its callback) follows."""

    def __init__(self, term: int):
        self.raftCurrentTerm = term
        self.leading = True

    def _isLeader(self) -> bool:
        return self.leading


def test_a_leader_that_learned_a_newer_term_is_not_reported_leading_it(tmp_path):
    group0 = Group0(node_id="n1", raft_addr="127.0.0.1:1", peers={"n2": "127.0.0.1:2"}, data_dir=tmp_path,
                    state_machine=KeyValue(), password=PASSWORD)
    raft = group0._syncobj = SteppingDown(term=4)
    group0._state_changed(1, 2)  # became leader in term 4
    assert group0.leadership() == (True, 4)
    raft.raftCurrentTerm = 5  # a newer term heard, the state not yet changed
    assert group0.leadership() == (False, 5)
    raft.leading = False
    group0._state_changed(2, 0)
    assert group0.leadership() == (False, 5)


def test_proposals_from_leader_and_follower_apply_on_every_member(cluster):
    leader = cluster.wait_for_leader()
    follower = cluster.follower()

    assert leader.propose(put("a", 1)) == ("ok", 1)
    assert follower.propose(put("b", 2)) == ("ok", 2)
    assert follower.propose({"op": "nope", "cmd_id": "c1"}) == ("error", "unknown op 'nope'")

    for member in cluster.running():
        assert member.wait_applied(3, timeout=5.0)
        assert member.read(lambda kv: kv.data) == {"a": 1, "b": 2}
    assert all(reports == [1, 2, 3] for reports in cluster.applied_reports.values())


def test_retried_command_is_replicated_again_and_deduplicated_by_the_state_machine(cluster):
    leader = cluster.wait_for_leader()
    command = put("k", "v", cmd_id="same-id")

    assert leader.propose(command) == ("ok", "v")
    assert cluster.follower().propose(command) == ("ok", "v")

    assert command == put("k", "v", cmd_id="same-id")  # propose never mutates the command
    assert leader.read(lambda kv: kv.apply_calls) == 2 and leader.applied_index == 2


def test_barrier_on_follower_sees_value_committed_via_leader(cluster):
    leader = cluster.wait_for_leader()
    follower = cluster.follower()

    for value in range(20):
        leader.propose(put("x", value))
    applied = follower.barrier()

    assert applied == 20
    assert follower.read(lambda kv: kv.data["x"]) == 19


def test_wait_applied_times_out_for_an_index_not_reached(cluster):
    cluster.wait_for_leader()
    started = time.monotonic()

    assert not cluster.follower().wait_applied(1, timeout=0.2)
    assert time.monotonic() - started < 2.0


def test_state_machine_bug_is_raised_to_proposer_and_counted_everywhere(cluster):
    leader = cluster.wait_for_leader()

    with pytest.raises(StateMachineError, match="deliberate state machine bug"):
        leader.propose({"op": "bug", "cmd_id": "bug-1"})
    assert leader.propose(put("after", "bug")) == ("ok", "bug")

    indexes = {member.barrier() for member in cluster.running()}
    assert indexes == {2}


def test_full_restart_replays_the_journal_without_double_apply(cluster):
    leader = cluster.wait_for_leader()
    follower = cluster.follower()
    for value in range(10):
        leader.propose(put(f"l{value}", value))
        follower.propose(put(f"f{value}", value))
    leader.propose(put("l0", 0))  # a duplicate: applied (counted) but deduplicated
    for member in cluster.running():
        member.barrier()
    before = cluster.states()

    cluster.restart_all()
    cluster.wait_for_leader()
    for member in cluster.running():
        member.barrier()

    assert cluster.states() == before
    assert all(state == before["n1"] for state in before.values()) and before["n1"][0] == 21
    assert cluster.follower().propose(put("new", 1)) == ("ok", 1)


def journal_is_compacted(member: Group0, commands: int) -> bool:
    """The journal holds fewer entries than the commands applied: a full dump holds the rest."""
    return member.status()["log_len"] < commands


def test_full_restart_restores_the_state_machine_from_the_full_dump(cluster):
    leader = cluster.wait_for_leader()
    for value in range(30):
        leader.propose(put(f"k{value}", value))
    for member in cluster.running():
        member.barrier()
        member.force_log_compaction()
    wait_until(lambda: all(journal_is_compacted(member, 30) for member in cluster.running()), 10.0,
               "every member to write its full dump and truncate its journal")
    assert all((cluster.dirs[node_id] / DUMP_FILE).is_file() for node_id in cluster.ids)
    leader.propose(put("after-dump", 1))
    for member in cluster.running():
        member.barrier()
    before = cluster.states()

    cluster.restart_all()
    cluster.wait_for_leader()
    for member in cluster.running():
        member.barrier()

    assert cluster.states() == before
    assert all(journal_is_compacted(member, 30) for member in cluster.running())  # the dump did the work
    assert all(reports[0] == 30 for reports in cluster.applied_reports.values())  # restore is reported
    assert cluster.follower().propose(put("new", 2)) == ("ok", 2)


def test_new_leader_is_elected_after_the_leader_closes(cluster):
    old_leader = cluster.wait_for_leader()
    old_leader.propose(put("before", 1))
    old_term = old_leader.term

    cluster.close_member(old_leader.node_id)
    new_leader = cluster.wait_for_leader()

    assert new_leader.node_id != old_leader.node_id and new_leader.term > old_term
    survivor = cluster.follower()
    assert new_leader.propose(put("after", 1)) == ("ok", 1)
    assert survivor.propose(put("after", 2)) == ("ok", 2)
    survivor.barrier()
    assert survivor.read(lambda kv: kv.data) == {"before": 1, "after": 2}

    rejoined = cluster.start_member(old_leader.node_id)
    assert rejoined.barrier() == 3
    assert cluster.states()[rejoined.node_id] == cluster.states()[survivor.node_id]


def test_proposal_without_quorum_raises_unavailable_within_timeout(cluster):
    cluster.wait_for_leader()
    survivor_id, *stopped = cluster.ids
    for node_id in stopped:
        cluster.close_member(node_id)
    survivor = cluster.members[survivor_id]

    started = time.monotonic()
    with pytest.raises(Group0Unavailable, match="2 of 3 members unreachable") as raised:
        survivor.propose(put("lost", 1), timeout=1.5)

    assert 1.5 <= time.monotonic() - started < 3.0
    assert all(node_id in str(raised.value) for node_id in stopped)
    with pytest.raises(Group0Unavailable):
        survivor.barrier(timeout=0.5)


def test_close_fails_pending_proposals_and_later_calls(cluster):
    cluster.wait_for_leader()
    survivor_id, *stopped = cluster.ids
    for node_id in stopped:
        cluster.close_member(node_id)
    survivor = cluster.members[survivor_id]
    errors: list[Exception] = []
    proposer = threading.Thread(target=lambda: _capture(errors, survivor.propose, put("p", 1), timeout=30.0))
    proposer.start()
    wait_until(lambda: survivor._pending, 5.0, "the proposal to be submitted")

    survivor.close()
    proposer.join(timeout=5.0)

    assert not proposer.is_alive() and "closed" in str(errors[0])
    with pytest.raises(Group0Unavailable, match="closed"):
        survivor.propose(put("q", 1))
    assert not survivor.wait_applied(1, timeout=0.1)
    survivor.close()  # idempotent


def _capture(errors: list[Exception], fn: Callable, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except Exception as error:
        errors.append(error)


def test_rejects_bad_membership_an_empty_password_and_an_unpicklable_state_machine(tmp_path):
    with pytest.raises(ValueError, match="other members only"):
        Group0(node_id="n1", raft_addr="127.0.0.1:1", peers={"n1": "127.0.0.1:1"}, data_dir=tmp_path,
               state_machine=KeyValue(), password=PASSWORD)
    with pytest.raises(ValueError, match="password"):
        Group0(node_id="n1", raft_addr="127.0.0.1:1", peers={"n2": "127.0.0.1:2"}, data_dir=tmp_path,
               state_machine=KeyValue(), password="")
    unpicklable = KeyValue()
    unpicklable.data["lock"] = threading.Lock()
    with pytest.raises(TypeError, match="picklable"):
        Group0(node_id="n1", raft_addr="127.0.0.1:1", peers={"n2": "127.0.0.1:2"}, data_dir=tmp_path,
               state_machine=unpicklable, password=PASSWORD)


def test_start_fails_when_the_raft_port_is_taken(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        addr = f"127.0.0.1:{squatter.getsockname()[1]}"
        member = Group0(node_id="n1", raft_addr=addr, peers={"n2": "127.0.0.1:1"}, data_dir=tmp_path,
                        state_machine=KeyValue(), password=PASSWORD, raft_overrides={"maxBindRetries": 1})
        try:
            with pytest.raises(OSError, match="cannot listen on raft address"):
                member.start()
        finally:
            member.close()


# ----------------------------------------------------------------- group0's own state machine


def register(node_id: str) -> RegisterNode:
    return RegisterNode(node_id=node_id, grpc=f"g-{node_id}", raft=f"r-{node_id}", shards=2, cmd_id=f"reg-{node_id}")


def journal_entries(data_dir: Path) -> list[object]:
    """The arguments of every replicated call in a closed member's pysyncobj journal."""
    journal = FileJournal(str(data_dir / JOURNAL_FILE))
    entries = []
    for i in range(len(journal)):
        raw = journal[i][0]
        payload = raft_pickle.loads(raw[1:]) if len(raw) > 1 else None
        if isinstance(payload, tuple) and len(payload) >= 2 and payload[1]:
            entries.extend(payload[1])
    journal._destroy()
    return entries


def replicated_state(member: Group0) -> dict:
    return member.read(lambda state: {k: v for k, v in vars(state).items() if not k.startswith("_")})


def test_typed_commands_are_logged_as_journal_dicts_and_replay_after_a_restart(group0_cluster):
    leader = group0_cluster.wait_for_leader()
    commands = [register(node_id) for node_id in group0_cluster.ids]
    commands.append(CreateKeyspace(name="ks", rf=3, initial_tablets=2, cmd_id="ks-1"))
    assert all(leader.propose(command).ok for command in commands)
    refused = group0_cluster.follower().propose(CreateKeyspace(name="big", rf=9, initial_tablets=2, cmd_id="ks-2"))
    assert refused.error_code == "INVALID_ARGUMENT" and "exceeds the number of nodes" in refused.error_message
    for member in group0_cluster.running():
        member.barrier()
    before = {member.node_id: replicated_state(member) for member in group0_cluster.running()}
    assert before["n1"]["keyspaces"].keys() == {"ks"} and len({repr(s) for s in before.values()}) == 1

    group0_cluster.close_all()
    logged = journal_entries(group0_cluster.dirs["n1"])
    assert not any(isinstance(entry, Command) for entry in logged)
    assert [e for e in logged if isinstance(e, dict)] == [encode(c) for c in commands] + [
        encode(CreateKeyspace(name="big", rf=9, initial_tablets=2, cmd_id="ks-2"))]

    group0_cluster.start()
    group0_cluster.wait_for_leader()
    for member in group0_cluster.running():
        member.barrier()
        assert replicated_state(member) == before[member.node_id]


def test_a_handler_bug_fails_the_proposal_and_group0_keeps_applying(group0_cluster, monkeypatch):
    def broken(state, command):
        raise KeyError("a handler bug")

    leader = group0_cluster.wait_for_leader()
    assert leader.propose(register("n1")).ok
    monkeypatch.setitem(state_module._HANDLERS, CreateKeyspace, broken)

    with pytest.raises(StateMachineError, match="KeyError"):
        leader.propose(CreateKeyspace(name="ks", rf=1, initial_tablets=1, cmd_id="ks-bug"))
    assert group0_cluster.follower().propose(register("n2")).ok
    assert {member.barrier() for member in group0_cluster.running()} == {3}
    assert all(member.read(lambda state: sorted(state.nodes)) == ["n1", "n2"] for member in group0_cluster.running())


def dump_members(data_dir: Path) -> set[str]:
    """The Raft addresses a member's full dump names as the cluster (a joiner receiving it adopts them)."""
    with open(data_dir / DUMP_FILE, "rb") as file, gzip.GzipFile(fileobj=file) as unzipped:
        return {node.address for node in raft_pickle.load(unzipped)[3]}


def test_a_dump_received_on_joining_is_written_again_naming_the_joiner(cluster, tmp_path):
    leader = cluster.wait_for_leader()
    for value in range(30):
        leader.propose(put(f"k{value}", value))
    leader.force_log_compaction()
    wait_until(lambda: journal_is_compacted(leader, 30), 10.0, "the leader to write its full dump")
    assert dump_members(cluster.dirs[leader.node_id]) == set(cluster.addrs.values())
    [address] = [f"127.0.0.1:{port}" for port in allocate_ports(1)]
    leader.add_member(address)
    joiner = Group0(node_id="n4", raft_addr=address, peers=cluster.addrs, data_dir=tmp_path / "n4",
                    state_machine=KeyValue(), password=PASSWORD)
    cluster.members["n4"] = joiner  # closed with the cluster
    joiner.start()
    wait_until(lambda: joiner.applied_index >= leader.applied_index, 10.0, "the joiner to catch up")
    # Had it kept the leader's dump, leading it would hand joiners a member list without itself.
    wait_until(lambda: address in dump_members(tmp_path / "n4"), 10.0, "the joiner to write its own dump")
    assert joiner.read(KeyValue.snapshot)[0] == leader.read(KeyValue.snapshot)[0]


def test_only_the_leader_admits_and_it_first_writes_a_dump_naming_the_members_of_now(cluster, tmp_path):
    leader = cluster.wait_for_leader()
    for value in range(30):
        leader.propose(put(f"k{value}", value))
    [address] = [f"127.0.0.1:{port}" for port in allocate_ports(1)]
    with pytest.raises(Group0Unavailable, match=f"only the Raft leader .* \\(leader: {leader.node_id}\\)"):
        cluster.follower().add_member(address)
    leader.add_member(address)
    assert leader.status()["log_len"] < 30  # a joiner replays no history of membership changes
    assert dump_members(cluster.dirs[leader.node_id]) == set(cluster.addrs.values())
    joiner = Group0(node_id="n4", raft_addr=address, peers=cluster.addrs, data_dir=tmp_path / "n4",
                    state_machine=KeyValue(), password=PASSWORD)
    cluster.members["n4"] = joiner
    joiner.start()
    wait_until(lambda: joiner.applied_index >= leader.applied_index, 10.0, "the joiner to catch up")
    assert joiner.members() == leader.members() == {*cluster.addrs.values(), address}


@pytest.mark.parametrize("matched", [True, False], ids=["group0", "pysyncobj-alone"])
def test_entries_appended_after_a_dump_survive_a_stop_before_the_journal_was_cut(tmp_path, monkeypatch, matched):
    """pysyncobj writes a full dump, then cuts the journal on a later tick; a member stopped in between kept (in
    pysyncobj alone) only the dump, losing the acknowledged entries after it. The stop is made on disk: the
    journal of before the cut, with the entries appended since."""
    from pysyncobj.journal import FileJournal

    from coordinator import raft
    [address] = [f"127.0.0.1:{port}" for port in allocate_ports(1)]
    data_dir = tmp_path / "n1"

    def member() -> Group0:
        started = Group0(node_id="n1", raft_addr=address, peers={}, data_dir=data_dir, state_machine=KeyValue(),
                         password=PASSWORD)
        started.start()
        wait_until(lambda: started.is_leader, ELECTION_TIMEOUT, "the single member to lead")
        return started

    first = member()
    try:
        for value in range(10):
            first.propose(put(f"k{value}", value))
        uncut = [first._syncobj._SyncObj__raftLog[i] for i in range(len(first._syncobj._SyncObj__raftLog))]
        first.write_full_dump()
        for value in range(10, 14):
            first.propose(put(f"k{value}", value))
        after = [e for e in (first._syncobj._SyncObj__raftLog[i] for i in range(len(first._syncobj._SyncObj__raftLog)))
                 if e[1] > uncut[-1][1]]
        expected = first.read(KeyValue.snapshot)[0]
    finally:
        first.close()
    journal = FileJournal(str(data_dir / JOURNAL_FILE))
    journal.clear()
    for entry in uncut + after:  # as if the cut had not happened
        journal.add(*entry)
    journal._destroy()
    if not matched:
        monkeypatch.setattr(raft, "match_journal_to_dump", lambda journal_path, dump_path: None)
    again = member()
    try:
        again.barrier()
        restored = again.read(KeyValue.snapshot)[0]
    finally:
        again.close()
    assert (restored == expected) == matched  # pysyncobj alone keeps the dump only: k10..k13 are gone
    assert matched or "k13" not in restored
