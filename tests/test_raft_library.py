"""What group0 corrects in pysyncobj, shown on hand-ticked members fed messages by hand (no timing, no peers running).

Each test shows the library's own behaviour next to ours, so a new pysyncobj version that changes it fails here."""
from __future__ import annotations

import gzip
from contextlib import contextmanager
from importlib.metadata import version

import pytest
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj import pickle as raft_pickle
from pysyncobj.transport import TCPTransport

from coordinator.raft import CheckedTransport, OneMembershipChange
from vbc.cluster import allocate_ports

PINNED = "0.3.17"


def test_the_pinned_pysyncobj_is_the_one_installed():
    assert version("pysyncobj") == PINNED, f"group0's corrections were made for pysyncobj {PINNED}: read them again"


class Counter(SyncObj):
    def __init__(self, self_addr: str, others: list[str], transport_class: type = TCPTransport):
        super().__init__(self_addr, others, SyncObjConf(autoTick=False, dynamicMembershipChange=True),
                         transportClass=transport_class)
        self.value = 0

    @replicated
    def add(self, x: int) -> int:
        self.value += x
        return self.value


class CheckedCounter(OneMembershipChange, Counter):
    """The counter with group0's membership rule, as group0's own member (`Group0SyncObj`) has it."""


def private(member: SyncObj, name: str):
    return getattr(member, "_SyncObj__" + name)


@pytest.mark.parametrize("transport_class, stale_entry_applied", [(TCPTransport, True), (CheckedTransport, False)])
def test_a_snapshot_chunk_does_not_commit_a_stale_uncommitted_entry(transport_class, stale_entry_applied):
    addresses = [f"127.0.0.1:{port}" for port in allocate_ports(3)]
    follower = Counter(addresses[0], addresses[1:], transport_class)
    try:
        follower.add(5)  # a command as a local call enqueues it: it becomes the follower's stale tail below
        command, _ = private(follower, "commandsQueue").get_nowait()
        private(follower, "raftLog").add(command, 2, 1)  # uncommitted, written while it led term 1
        setattr(follower, "_SyncObj__raftCurrentTerm", 1)
        answers = []
        private(follower, "commandsWaitingCommit")[2].append((1, lambda result, error: answers.append(error)))
        leader = next(iter(follower.otherNodes))
        transport = private(follower, "transport")
        # the new leader (term 2) compacted past index 2: it sends its snapshot; this is the first chunk only
        transport._onMessageReceived(leader, {"type": "append_entries", "term": 2, "commit_index": 50,
                                              "serialized": (b"first-chunk", True, False)})
        private(follower, "applyLogEntries")()
        assert (follower.value == 5) == stale_entry_applied
        assert (answers == [FAIL_REASON.SUCCESS]) == stale_entry_applied
    finally:
        private(follower, "transport").destroy()


@contextmanager
def follower_holding(transport_class: type, last_index: int, term: int, commit: int):
    """A hand-ticked member whose log holds entries 2..`last_index` of term 1, in `term`, committed and applied up
    to `commit`; yields it, its log and the node it takes for its leader."""
    addresses = [f"127.0.0.1:{port}" for port in allocate_ports(3)]
    follower = Counter(addresses[0], addresses[1:], transport_class)
    try:
        log = private(follower, "raftLog")
        for index in range(2, last_index + 1):
            log.add(b"\x00" + bytes([index]), index, 1)
        for name, value in (("raftCurrentTerm", term), ("raftCommitIndex", commit), ("raftLastApplied", commit)):
            setattr(follower, "_SyncObj__" + name, value)
        yield follower, log, next(iter(follower.otherNodes))
    finally:
        private(follower, "transport").destroy()


def deliver(follower: SyncObj, sender, message: dict) -> None:
    private(follower, "transport")._onMessageReceived(sender, {"type": "append_entries", **message})


@pytest.mark.parametrize("transport_class, tail_cut", [(TCPTransport, True), (CheckedTransport, False)])
def test_an_append_behind_the_log_cuts_no_matching_entry(transport_class, tail_cut, caplog):
    """Finding 5: the library cuts every entry after `prevLogIdx` of any append, applied ones too ("truncating
    already-applied log entries"); ours cuts only at a conflict."""
    with follower_holding(transport_class, last_index=5, term=1, commit=5) as (follower, log, leader):
        deliver(follower, leader, {"term": 1, "commit_index": 5, "prevLogIdx": 3, "prevLogTerm": 1, "entries": []})
        assert (log[-1][1] == 3) == tail_cut and (log[-1][1] == 5) != tail_cut
        assert ("truncating already-applied" in caplog.text) == tail_cut
        assert follower.raftCommitIndex == (3 if tail_cut else 5)


@pytest.mark.parametrize("transport_class, committed_changed", [(TCPTransport, True), (CheckedTransport, False)])
def test_an_append_that_would_change_a_committed_entry_is_refused(transport_class, committed_changed, caplog):
    """Committed and applied entries 3 and 4 (term 1) meet a leader's entries 3 and 4 of term 2: the library replaces
    them; ours keeps them and says why."""
    with follower_holding(transport_class, last_index=4, term=2, commit=4) as (follower, log, leader):
        deliver(follower, leader, {"term": 2, "commit_index": 6, "prevLogIdx": 2, "prevLogTerm": 1,
                                   "entries": [(b"\x00x", 3, 2), (b"\x00y", 4, 2)]})
        terms = [(entry[1], entry[2]) for entry in log][-3:]
        assert terms == ([(2, 1), (3, 2), (4, 2)] if committed_changed else [(2, 1), (3, 1), (4, 1)])
        assert ("conflicts with this member's committed entry 3" in caplog.text) != committed_changed


@pytest.mark.parametrize("transport_class, entries_lost", [(TCPTransport, True), (CheckedTransport, False)])
def test_a_snapshot_the_log_already_holds_erases_nothing(transport_class, entries_lost):
    """The leader sends its snapshot (ending at entry 3) again before the follower's answer to the first arrived;
    meanwhile the follower appended entries 4 and 5 and acknowledged them. The library installs it again, clearing
    them; ours drops it."""
    with follower_holding(transport_class, last_index=5, term=1, commit=3) as (follower, log, leader):
        dump = gzip.compress(raft_pickle.dumps(({"value": 7}, tuple(log[2]), tuple(log[1]),
                                                {follower.selfNode} | set(follower.otherNodes))))
        deliver(follower, leader, {"term": 1, "commit_index": 3, "serialized": (dump, True, True)})
        assert (log[-1][1] == 3) == entries_lost and (log[-1][1] == 5) != entries_lost


@pytest.mark.parametrize("member_class, both_appended", [(Counter, True), (CheckedCounter, False)])
def test_a_leader_appends_one_membership_change_at_a_time(member_class, both_appended):
    """Finding 1: leader A of {A, B, C}, its first entry of term 1 committed, is cut off from B and C; joins of D and
    E reach it. The library appends both (then {A, D, E} is a majority of the five-member configuration while {B, C}
    is one of the old): ours appends D's and denies E's until D's commits."""
    a, b, c, d, e = (f"127.0.0.1:{port}" for port in allocate_ports(5))
    leader = member_class(a, [b, c])
    try:
        for name, value in (("raftState", 2), ("raftCurrentTerm", 1), ("raftLeader", leader.selfNode),
                            ("noopIDx", 1), ("raftCommitIndex", 1), ("raftLastApplied", 1)):
            setattr(leader, "_SyncObj__" + name, value)
        answers = {}
        for joining in (d, e):
            leader.addNodeToCluster(joining, callback=lambda result, error, joining=joining:
                                    answers.setdefault(joining, error))
        leader._checkCommandsToApply()
        changes = [entry[1] for entry in private(leader, "raftLog") if entry[0][:1] == b"\x02"]
        assert changes == ([2, 3] if both_appended else [2])
        assert answers == ({} if both_appended else {e: FAIL_REASON.REQUEST_DENIED})
        assert leader.raftCommitIndex == 1  # neither change is committed: B and C never answered
    finally:
        private(leader, "transport").destroy()


@pytest.mark.parametrize("transport_class, entries_lost", [(TCPTransport, True), (CheckedTransport, False)])
def test_a_snapshot_is_never_completed_by_a_chunk_of_another(transport_class, entries_lost):
    """A snapshot ending at entry 3 comes in two chunks; the follower holds entries up to 5 (3 committed). Then the
    last chunk of a later sending arrives alone (its first was lost). The library installs the first snapshot, or
    completes it with the lone chunk: entries 4 and 5 are gone. Ours drops the held snapshot, then the lone chunk."""
    with follower_holding(transport_class, last_index=5, term=1, commit=3) as (follower, log, leader):
        dump = gzip.compress(raft_pickle.dumps(({"value": 7}, tuple(log[2]), tuple(log[1]),
                                                {follower.selfNode} | set(follower.otherNodes))))
        half = len(dump) // 2
        for chunk in ((dump[:half], True, False), (dump[half:], False, True), (dump[half:], False, True)):
            deliver(follower, leader, {"term": 1, "commit_index": 3, "serialized": chunk})
        assert (log[-1][1] == 3) == entries_lost and (log[-1][1] == 5) != entries_lost
