"""group0's Raft files made durable (coordinator/raft_storage.py): what is synced when, and a corrupt meta file."""
from __future__ import annotations

import gzip

import pytest
from pysyncobj import pickle as raft_pickle

from coordinator import raft_storage
from coordinator.raft import JOURNAL_FILE, Group0
from coordinator.raft_storage import CorruptRaftFile, DurableJournal
from vbc.cluster import allocate_ports

from .test_raft_adapter import ELECTION_TIMEOUT, PASSWORD, KeyValue, put, wait_until


@pytest.fixture
def synced(monkeypatch) -> list[str]:
    """The paths fsync'd, in order."""
    calls: list[str] = []
    real = raft_storage.sync_file
    monkeypatch.setattr(raft_storage, "sync_file", lambda path: calls.append(str(path)) or real(path))
    return calls


def test_a_burst_of_appends_is_synced_once_before_it_is_relied_on(tmp_path, synced):
    journal = DurableJournal(str(tmp_path / JOURNAL_FILE))
    try:
        for index in range(1, 6):
            journal.add(b"command", index, 1)
        assert synced == []  # nothing yet: appends only mark the journal dirty
        journal.sync()
        journal.sync()  # clean: no second fsync
        assert journal.syncs == 1
        journal.add(b"command", 6, 1)
        journal.setRaftCommitIndex(6)  # a commit index only over synced entries
        assert journal.syncs == 2
        journal.setCurrentTerm(2, "127.0.0.1:1")
        assert synced[-2:] == [str(tmp_path / (JOURNAL_FILE + ".meta")), str(tmp_path)]  # the file, then the rename
    finally:
        journal._destroy()


def test_the_dump_is_synced_before_the_entries_it_replaces_are_cut(tmp_path, synced):
    write_dump(tmp_path / raft_storage.DUMP_FILE, before_last=(b"command", 2, 1), last=(b"command", 3, 1))
    journal = DurableJournal(str(tmp_path / JOURNAL_FILE))
    try:
        for index in range(1, 4):
            journal.add(b"command", index, 1)
        journal.deleteEntriesTo(1)
        assert synced[:2] == [str(tmp_path / raft_storage.DUMP_FILE), str(tmp_path)]
        assert journal.syncs == 1 and not journal._dirty  # then the cut journal
        assert [entry[1] for entry in journal] == [2, 3]
    finally:
        journal._destroy()


def write_dump(path, before_last, last) -> None:
    with open(path, "wb") as file, gzip.GzipFile(fileobj=file, mode="wb") as zipped:
        raft_pickle.dump((None, last, before_last, set()), zipped)


def test_a_cut_never_passes_the_dump_on_disk(tmp_path):
    """pysyncobj cuts at the dump it wrote a tick later; a snapshot installed in between left an older dump: the
    journal keeps the entries that one ends with (else it would be left empty, or with a gap after the dump)."""
    write_dump(tmp_path / raft_storage.DUMP_FILE, before_last=(b"command", 2, 1), last=(b"command", 3, 1))
    journal = DurableJournal(str(tmp_path / JOURNAL_FILE))
    try:
        for index in range(2, 7):
            journal.add(b"command", index, 1)
        journal.deleteEntriesTo(3)  # the dump pysyncobj wrote ended at 5 and 6
        assert [entry[1] for entry in journal] == [2, 3, 4, 5, 6]
        (tmp_path / raft_storage.DUMP_FILE).write_bytes(b"not a dump")
        journal.deleteEntriesTo(1)
        assert len(journal) == 5
    finally:
        journal._destroy()


def test_a_member_syncs_its_journal_before_its_messages_leave(tmp_path):
    addresses = [f"127.0.0.1:{port}" for port in allocate_ports(2)]
    members = [Group0(node_id=f"n{i}", raft_addr=addresses[i], peers={f"n{1 - i}": addresses[1 - i]},
                      data_dir=tmp_path / f"n{i}", state_machine=KeyValue(), password=PASSWORD) for i in (0, 1)]
    try:
        for member in members:
            member.start()
        leader = wait_until(lambda: next((m for m in members if m.is_leader), None), ELECTION_TIMEOUT, "a leader")
        before = {m.node_id: raft_storage.journal_of(tmp_path / m.node_id / JOURNAL_FILE).syncs for m in members}
        for value in range(5):
            leader.propose(put(f"k{value}", value))
        after = {m.node_id: raft_storage.journal_of(tmp_path / m.node_id / JOURNAL_FILE).syncs for m in members}
        assert all(after[node] > before[node] for node in after)  # the leader's appends, the follower's replies
    finally:
        for member in members:
            member.close()


def test_a_corrupt_meta_file_refuses_to_start_with_what_to_do(tmp_path):
    data_dir = tmp_path / "n1"
    data_dir.mkdir()
    (data_dir / (JOURNAL_FILE + ".meta")).write_bytes(b"\x80\x04 not a pickle")
    [address] = [f"127.0.0.1:{port}" for port in allocate_ports(1)]
    member = Group0(node_id="n1", raft_addr=address, peers={}, data_dir=data_dir, state_machine=KeyValue(),
                    password=PASSWORD)
    with pytest.raises(CorruptRaftFile, match="could vote twice in one term"):
        member.start()
    member.close()


def test_a_journal_matched_to_its_dump_at_start_is_cut_only_after_the_dump_is_synced(tmp_path, synced):
    """A stop between pysyncobj's dump and its cut: at start the journal is cut to the dump's entries, and the dump
    (never synced by the member that wrote it) is synced first, or a power loss then leaves neither."""
    journal = DurableJournal(str(tmp_path / JOURNAL_FILE))
    try:
        for index in range(1, 6):
            journal.add(b"command", index, 1)
        journal.sync()
    finally:
        journal._destroy()
    write_dump(tmp_path / raft_storage.DUMP_FILE, before_last=(b"command", 3, 1), last=(b"command", 4, 1))
    synced.clear()
    raft_storage.match_journal_to_dump(tmp_path / JOURNAL_FILE, tmp_path / raft_storage.DUMP_FILE)
    assert synced == [str(tmp_path / raft_storage.DUMP_FILE), str(tmp_path), str(tmp_path / JOURNAL_FILE)]
    journal = DurableJournal(str(tmp_path / JOURNAL_FILE))
    try:
        assert [entry[1] for entry in journal] == [3, 4, 5]
    finally:
        journal._destroy()
