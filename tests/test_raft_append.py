"""A follower's check of incoming appends (`coordinator.raft_append`): truncation only at a conflict, never of a
committed entry, and a commit index only over what the message checked."""
from __future__ import annotations

import gzip

from hypothesis import given
from hypothesis import strategies as st
from pysyncobj import pickle as raft_pickle

from coordinator.raft_append import (MEMBERSHIP_COMMAND, check_append, rejection_hint, snapshot_is_held,
                                     uncommitted_membership_change)

REGULAR, MEMBERSHIP = b"\x00cmd", bytes([MEMBERSHIP_COMMAND]) + b"change"


def log_of(terms: list[int], first: int = 1, command: bytes = REGULAR) -> list[tuple[bytes, int, int]]:
    return [(command, first + i, term) for i, term in enumerate(terms)]


def append(prev: int, prev_term: int, entries: list, commit: int = 100) -> dict:
    return {"type": "append_entries", "term": 3, "commit_index": commit, "prevLogIdx": prev, "prevLogTerm": prev_term,
            "entries": entries}


def test_entries_the_follower_holds_are_dropped_and_the_rest_appended_after_them():
    log = log_of([1, 1, 2, 2])
    check = check_append(log, 2, append(1, 1, log_of([1, 2, 2, 3], first=2)), current_term=3)
    assert check.message["prevLogIdx"] == 4 and check.message["prevLogTerm"] == 2
    assert check.message["entries"] == log_of([3], first=5) and not check.keep_tail
    assert check.message["commit_index"] == 5


def test_a_heartbeat_behind_the_log_keeps_its_tail_and_commits_only_what_it_checked():
    log = log_of([1, 1, 2, 2, 2])
    check = check_append(log, 3, append(3, 2, [], commit=5), current_term=3)
    assert check.keep_tail and check.tail_from == 4
    assert check.message["commit_index"] == 3  # entries 4 and 5 were not checked against the leader's


def test_a_tail_holding_a_membership_change_is_cut_as_pysyncobj_does():
    log = log_of([1, 1]) + [(MEMBERSHIP, 3, 1)]
    assert not check_append(log, 1, append(2, 1, []), current_term=3).keep_tail


def test_a_conflict_above_the_commit_index_truncates_there():
    log = log_of([1, 1, 1, 1])
    check = check_append(log, 2, append(2, 1, log_of([3, 3], first=3)), current_term=3)
    assert check.message["prevLogIdx"] == 2 and check.message["entries"] == log_of([3, 3], first=3)


def test_a_conflict_at_a_committed_entry_is_refused():
    log = log_of([1, 1, 1, 1])
    check = check_append(log, 3, append(2, 1, log_of([3, 3], first=3)), current_term=3)
    assert check.message is None and "entry 3 (term 3) conflicts" in check.conflict


def test_a_mismatch_at_prev_and_other_messages_pass_unchanged():
    log = log_of([1, 1])
    mismatch = append(2, 5, [])
    assert check_append(log, 1, mismatch, current_term=3).message is mismatch
    snapshot = {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": (b"x", True, False)}
    assert check_append(log, 1, snapshot, current_term=3).message is snapshot
    vote = {"type": "request_vote", "term": 3}
    assert check_append(log, 1, vote, current_term=3).message is vote


@given(ours=st.lists(st.integers(1, 3), min_size=1, max_size=8).map(sorted),
       leaders=st.lists(st.integers(1, 3), min_size=1, max_size=8).map(sorted),
       prev=st.integers(0, 8), commit=st.integers(0, 8))
def test_the_log_pysyncobj_builds_from_the_checked_message_is_the_raft_one(ours, leaders, prev, commit):
    """Applying the checked message as pysyncobj does (cut after prevLogIdx unless the tail is kept, append) gives
    Raft's result: the follower's log with the leader's entries from the first conflict on."""
    log = log_of(ours)
    leader = log_of(leaders)
    prev = min(prev, len(leader))
    if prev == 0 or prev > len(log) or log[prev - 1][2] != leader[prev - 1][2]:
        return  # pysyncobj refuses it (the leader would go back)
    commit = min(commit, len(log))
    if any(log[i][2] != leader[i][2] for i in range(min(len(log), len(leader), commit))):
        return  # logs differing at a committed entry: not a Raft state
    check = check_append(log, commit, append(prev, leader[prev - 1][2], leader[prev:]), current_term=3)
    message = check.message
    got = list(log) if check.keep_tail else log[:message["prevLogIdx"]]
    got += [tuple(entry) for entry in message["entries"]]
    expected = list(log)
    for entry in leader[prev:]:
        index = entry[1]
        if index <= len(expected) and expected[index - 1][2] != entry[2]:
            del expected[index - 1:]
        if index > len(expected):
            expected.append(entry)
    assert got == expected
    assert message["commit_index"] <= max(prev, leader[-1][1])


def dump_bytes(last: tuple, before_last: tuple) -> bytes:
    return gzip.compress(raft_pickle.dumps((None, last, before_last, set())))


def test_a_snapshot_ending_at_an_entry_the_log_holds_or_before_it_is_held():
    log = log_of([1, 1, 2, 2], first=5)  # entries 5..8
    assert snapshot_is_held(log, dump_bytes((REGULAR, 7, 2), (REGULAR, 6, 1)))
    assert snapshot_is_held(log, dump_bytes((REGULAR, 3, 1), (REGULAR, 2, 1)))  # older than the log's own dump
    assert not snapshot_is_held(log, dump_bytes((REGULAR, 7, 3), (REGULAR, 6, 1)))  # another term: a conflict
    assert not snapshot_is_held(log, dump_bytes((REGULAR, 9, 2), (REGULAR, 8, 2)))  # newer: installed
    assert not snapshot_is_held([], dump_bytes((REGULAR, 9, 2), (REGULAR, 8, 2)))


def test_an_append_of_a_deposed_leader_passes_unchanged():
    """Entry 2 is committed in term 3 here; a leader of term 2 that has not heard of term 3 sends its own entry 2.
    That is no lost write (pysyncobj ignores a message of an earlier term): nothing is refused or rewritten."""
    log = log_of([1, 3])
    stale = {**append(1, 1, log_of([2], first=2)), "term": 2}
    check = check_append(log, 2, stale, current_term=3)
    assert check.message is stale and not check.conflict


def test_a_rejection_sends_the_leader_back_to_just_after_the_commit_index_at_once():
    log = log_of([1, 1, 1, 2, 2], first=3)  # entries 3..7; the first is the dump's last, applied
    assert rejection_hint(log, commit_index=5, next_index=7) == 6  # a mismatch at 7: go back to 6, not one by one
    assert rejection_hint(log, commit_index=1, next_index=8) == 4  # just after the log's first entry
    assert rejection_hint(log, commit_index=6, next_index=4) == 4  # never forward of what pysyncobj answered
    assert rejection_hint([], commit_index=0, next_index=2) == 2


def test_a_membership_change_waits_for_every_earlier_one_to_commit():
    log = log_of([1, 1], first=1) + log_of([2], first=3, command=MEMBERSHIP) + log_of([2, 2], first=4)
    assert uncommitted_membership_change(log, commit_index=2) == 3
    assert uncommitted_membership_change(log, commit_index=3) is None
    assert uncommitted_membership_change(log_of([1, 1, 2]), commit_index=0) is None
