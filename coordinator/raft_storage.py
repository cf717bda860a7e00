"""group0's Raft files made durable: pysyncobj's journal, meta file and full dump, synced before they are relied on.

pysyncobj 0.3.17 keeps its journal in a memory-mapped file it never flushes, writes term and vote by write and rename
without fsync (reading a corrupt meta file as empty), and renames a full dump into place without fsync. Through its
journal factory (`pysyncobj.syncobj.createJournal`, which SyncObj looks up when it starts) group0's members get a
`DurableJournal`: appends mark it dirty, and it is synced (one fsync for a burst of appends) before a message leaves
the member (`CheckedTransport` in coordinator.raft calls `sync_before_send`) and before the commit index moves; the
term and vote are synced (file and directory) before `setCurrentTerm` returns, that is before the vote or reply
that depends on them is sent; the full dump is synced before the journal entries it replaces are cut, and a cut
never passes the entries the dump on disk ends with (a snapshot installed between pysyncobj's dump and its cut
replaced that dump with an older one).
"""
from __future__ import annotations

import gzip
import logging
import os
import threading
import weakref
from pathlib import Path

import pysyncobj.syncobj
from pysyncobj import pickle as raft_pickle
from pysyncobj.journal import FileJournal, MemoryJournal

logger = logging.getLogger(__name__)

META_SUFFIX = ".meta"  # pysyncobj's name for the term, vote and commit index beside the journal
DUMP_FILE = "raft.dump"

_journals: weakref.WeakValueDictionary[str, DurableJournal] = weakref.WeakValueDictionary()
_journals_lock = threading.Lock()


class CorruptRaftFile(Exception):
    """A Raft file that cannot be read: the member must not start (it could vote twice in a term)."""


def sync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_directory(path: str | os.PathLike) -> None:
    """Make a rename or a new file in the directory durable."""
    sync_file(path)


class DurableJournal(FileJournal):
    """pysyncobj's FileJournal, synced before anything relies on what it holds (see the module's docstring)."""

    def __init__(self, journal_file: str):
        check_meta(journal_file + META_SUFFIX)
        super().__init__(journal_file)
        self._path = journal_file
        self._directory = os.path.dirname(os.path.abspath(journal_file))
        self._dump = os.path.join(self._directory, DUMP_FILE)
        self._fd = os.open(journal_file, os.O_RDONLY)  # kept open: a sync is then one fsync call
        self._dirty = False
        self._cutting = False
        self._lock = threading.Lock()
        self.syncs = 0  # how many times the journal was synced (tests and benchmarks read it)

    def add(self, command, idx, term):
        super().add(command, idx, term)
        self._dirty = True

    def deleteEntriesFrom(self, entryFrom):
        super().deleteEntriesFrom(entryFrom)
        self._dirty = True

    def deleteEntriesTo(self, entryTo):
        entryTo = self._cut_within_dump(entryTo)
        if entryTo <= 0:
            return
        self._sync_dump()  # the dump now holds what these entries held
        self._cutting = True
        try:
            super().deleteEntriesTo(entryTo)  # clears the journal, then adds the entries kept
        finally:
            self._cutting = False
        self.sync()

    def clear(self):
        if not self._cutting:
            self._sync_dump()  # a dump received from the leader replaces the whole journal
        super().clear()
        self._dirty = True

    def setRaftCommitIndex(self, raftCommitIndex):
        self.sync()  # a leader alone (or ahead of its replies) commits only what is on disk
        super().setRaftCommitIndex(raftCommitIndex)

    def setCurrentTerm(self, term, votedForNodeId):
        super().setCurrentTerm(term, votedForNodeId)  # written and renamed into place, not synced
        sync_file(self._path + META_SUFFIX)
        sync_directory(self._directory)

    def sync(self) -> None:
        """fsync the journal if something was written since the last time (one fsync for a burst of appends)."""
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            os.fsync(self._fd)  # the mapped pages are the file's: an fsync of any descriptor writes them
            self.syncs += 1

    def _destroy(self):
        super()._destroy()
        os.close(self._fd)

    def _cut_within_dump(self, entry_to: int) -> int:
        """`entry_to` (a position), lowered so the journal keeps the entries the dump on disk ends with. pysyncobj
        cuts at the dump it wrote, a tick later; a snapshot installed from the leader in between replaced that dump
        with an older one, and the cut would have left a gap between it and the journal (or no journal at all)."""
        try:
            dumped = dump_ends(Path(self._dump))
        except Exception as error:  # noqa: BLE001 - an unreadable dump: keep every entry
            logger.warning("group0 journal %s: not cut, its full dump cannot be read (%s)", self._path, error)
            return 0
        if dumped is None:
            return 0
        before_last = next((i for i in range(len(self)) if self[i][1] == dumped[0][1]), None)
        if before_last is None or self[before_last] != dumped[0]:
            logger.warning("group0 journal %s: not cut, it does not hold the entries its full dump ends with",
                           self._path)
            return 0
        return min(entry_to, before_last)

    def _sync_dump(self) -> None:
        if os.path.exists(self._dump):
            sync_file(self._dump)
            sync_directory(self._directory)


def check_meta(meta_path: str) -> None:
    """CorruptRaftFile when the meta file exists and cannot be read: pysyncobj would read it as empty, forgetting
    the term and the vote of this member."""
    if not os.path.exists(meta_path):
        return
    try:
        with open(meta_path, "rb") as file:
            meta = raft_pickle.loads(file.read())
    except Exception as error:  # noqa: BLE001 - whatever the unpickler raises, the file is unusable
        raise CorruptRaftFile(f"the Raft meta file {meta_path} (term and vote) cannot be read ({error}): this member "
                              "must not start with it, or it could vote twice in one term. Restore it from a "
                              "backup, or remove the member's data directory and add it again as a new node") from None
    if not isinstance(meta, dict):
        raise CorruptRaftFile(f"the Raft meta file {meta_path} holds {type(meta).__name__}, not the term and vote")


def create_journal(journal_file: str | None = None):
    """pysyncobj's journal factory, giving group0 a DurableJournal (a memory journal when there is no file)."""
    if journal_file is None:
        return MemoryJournal()
    journal = DurableJournal(journal_file)
    with _journals_lock:
        _journals[os.path.abspath(journal_file)] = journal
    return journal


def journal_of(journal_file: str | os.PathLike) -> DurableJournal | None:
    with _journals_lock:
        return _journals.get(os.path.abspath(journal_file))


def install() -> None:
    """Make SyncObj, which looks its journal factory up when it starts, create DurableJournals."""
    pysyncobj.syncobj.createJournal = create_journal


def dump_ends(dump_path: Path) -> tuple[tuple, tuple] | None:
    """The last two entries (before last, last) a full dump holds; None when there is no dump."""
    if not dump_path.is_file():
        return None
    with open(dump_path, "rb") as file, gzip.GzipFile(fileobj=file) as unzipped:
        _, last, before_last, _ = raft_pickle.load(unzipped)
    return before_last, last


def match_journal_to_dump(journal_path: Path, dump_path: Path) -> None:
    """Cut the journal before the entries the full dump ends with, as pysyncobj would have on its next tick.

    pysyncobj writes the dump, then cuts the journal on a later tick; at start it keeps the journal only if it
    begins with the dump's last two entries, and otherwise clears it down to them. A member that stopped between
    the two would so lose the entries appended after the dump, acknowledged ones among them."""
    dumped = dump_ends(dump_path)
    if not journal_path.is_file() or dumped is None:
        return
    before_last, last = dumped
    journal = FileJournal(str(journal_path))
    try:
        entries = [journal[i] for i in range(len(journal))]
        start = next((i for i in range(len(entries) - 1)
                      if entries[i] == before_last and entries[i + 1] == last), None)
        if start:
            logger.info("group0 journal %s: cutting the %d entries before its full dump's (a stop came between "
                        "writing the dump and cutting the journal)", journal_path, start)
            sync_file(dump_path)  # the dump now holds what the entries cut held: on disk first
            sync_directory(dump_path.parent)
            journal.deleteEntriesTo(start)
    finally:
        journal._destroy()
    sync_file(journal_path)
