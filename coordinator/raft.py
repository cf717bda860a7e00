"""Group0's Raft adapter: replicates state-machine commands to every member through pysyncobj."""
from __future__ import annotations

import _socket
import hashlib
import hmac
import logging
import pickle
import socket
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.transport import TCPTransport

from coordinator import raft_storage
from coordinator.raft_append import (check_append, is_regular_append, rejection_hint, snapshot_is_held,
                                     uncommitted_membership_change)
from coordinator.raft_storage import DUMP_FILE, match_journal_to_dump

from coordinator.core.commands import Command, encode
from coordinator.core.errors import Unavailable

# pysyncobj 0.3.17 (`win_inet_pton`, imported with it) replaces socket.inet_ntop by a Windows-only version on every OS;
# the standard one goes back for the rest of the process (a CQL driver in the same process decodes addresses with it).
socket.inet_ntop = _socket.inet_ntop

logger = logging.getLogger(__name__)

T = TypeVar("T")

JOURNAL_FILE = "raft.journal"  # pysyncobj also writes "raft.journal.meta" (term, vote, commit index)

_RAFT_STATE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}
_FAIL_REASON_NAMES = {value: name for name, value in vars(FAIL_REASON).items() if not name.startswith("_")}
_CLOSED = "CLOSED"  # attempt outcome when close() interrupts a pending proposal
_RETRY_BACKOFF_FIRST = 0.005
_RETRY_BACKOFF_MAX = 0.2
_DUMP_POLL = 0.02  # how often write_full_dump looks whether the dump is written and the journal cut


def secret_fingerprint(secret: str) -> str:
    """A short keyed hash of a Raft secret: nodes compare theirs without sending the secret."""
    return hmac.new(secret.encode(), b"vbc raft secret fingerprint", hashlib.sha256).hexdigest()[:16]


def raft_options(data_dir: Path, password: str) -> dict:
    """The SyncObjConf settings group0 runs with: a few members on a local network."""
    return {
        "password": password,  # encrypts and authenticates the transport, which unpickles what it receives
        "journalFile": str(data_dir / JOURNAL_FILE),
        "fullDumpFile": str(data_dir / DUMP_FILE),
        "useFork": False,  # we share the process with gRPC threads; dumps are written by the tick thread
        "dynamicMembershipChange": True,  # nodes join (vbc node start --join) and leave (decommission, remove)
        "appendEntriesUseBatch": False,  # ship each entry at once: ~1 ms per command instead of ~100 ms
        "commandsWaitLeader": True,  # during an election, commands queue until a leader is known
        "appendEntriesPeriod": 0.1,  # heartbeats; an election starts 0.5-1.0 s after the last one seen
        "raftMinTimeout": 0.5,
        "raftMaxTimeout": 1.0,
        "leaderFallbackTimeout": 2.0,  # a leader cut off from the majority steps down after 2 s, not 30
        "connectionTimeout": 3.0,
        "connectionRetryTime": 0.5,  # restarted peers are reconnected within half a second
        "bindRetryTime": 0.5,
        "maxBindRetries": 10,  # start() fails after ~5 s instead of retrying the bind forever
        "logCompactionMinEntries": 5000,
        "logCompactionMinTime": 300,
    }


class CheckedMessages:
    """What group0 adds to a pysyncobj transport (a mixin before the transport class, whose instances keep their
    SyncObj as `_syncObj`): the member's journal synced before a message leaves (`before_send`), and checks in front
    of the member's message handler:

    - a snapshot chunk does not move the commit index. pysyncobj moves it for every append_entries message, but a
      snapshot chunk skips the check that the follower's log matches the leader's, so a stale uncommitted entry of
      the follower's was applied (and its proposer told SUCCESS) on the first chunk of a snapshot. The next regular
      append moves it instead;
    - a regular append truncates the log only at a conflict, never a committed entry, and commits only what it
      checked (`coordinator.raft_append`);
    - a rejection of an append sends the leader back to just after the member's commit index
      (`raft_append.rejection_hint`)."""

    _before_send: Callable[[], None] = staticmethod(lambda: None)

    def setOnMessageReceivedCallback(self, callback):
        super().setOnMessageReceivedCallback(None if callback is None else partial(_checked_message, self._syncObj,
                                                                                   callback))

    def send(self, node, message):
        self._before_send()  # what the message says (an append, its reply, a vote) is on disk first
        return super().send(node, _with_rejection_hint(self._syncObj, message))


class CheckedTransport(CheckedMessages, TCPTransport):
    """pysyncobj's TCP transport with group0's checks (`CheckedMessages`)."""

    def __init__(self, syncObj, selfNode, otherNodes, before_send: Callable[[], None] = lambda: None):
        super().__init__(syncObj, selfNode, otherNodes)
        self._before_send = before_send


class OneMembershipChange:
    """What group0 adds to a pysyncobj member (a mixin before `SyncObj`): as leader, it appends a membership change
    only when no earlier one is uncommitted (`raft_append.uncommitted_membership_change`), and denies it otherwise
    (its callback gets REQUEST_DENIED). pysyncobj's own guard of this (`__changeClusterIDx`) is never set."""

    def _SyncObj__changeCluster(self, request):
        pending = uncommitted_membership_change(self._SyncObj__raftLog, self.raftCommitIndex)
        if pending is not None:
            logger.info("group0 member %s: a membership change (%s) waits for the one at index %d to commit",
                        self.selfNode, request[0], pending)
            return False
        return super()._SyncObj__changeCluster(request)


class Group0SyncObj(OneMembershipChange, SyncObj):
    """pysyncobj's member with group0's membership rule."""


def close_snapshot_files(syncobj: SyncObj) -> None:
    """Close the files a stopped pysyncobj member keeps open while it sends or receives a snapshot (its `destroy`
    leaves them to the garbage collector, which flushed a half-received snapshot into the file of the member started
    after it in the same directory, at a moment of its choosing)."""
    serializer = getattr(syncobj, "_SyncObj__serializer", None)
    if serializer is None:
        return
    incoming = getattr(serializer, "_Serializer__incomingTransmissionFile", None)
    if incoming is not None:
        incoming.close()
        serializer._Serializer__incomingTransmissionFile = None
    transmissions = getattr(serializer, "_Serializer__transmissions", {})
    for transmission in transmissions.values():
        if "file" in transmission:
            transmission["file"].close()
    transmissions.clear()


def _sync_journal(path: Path) -> None:
    journal = raft_storage.journal_of(path)
    if journal is not None:
        journal.sync()


def _checked_message(syncobj: SyncObj, callback: Callable, node, message) -> None:
    log = getattr(syncobj, "_SyncObj__raftLog", None)
    if isinstance(message, dict) and message.get("type") == "append_entries" and "serialized" in message:
        message = {**message, "commit_index": min(message.get("commit_index", 0), syncobj.raftCommitIndex)}
        if log is not None and _held_snapshot(syncobj, log, message["serialized"]):
            return
    if log is None or not is_regular_append(message):
        callback(node, message)
        return
    check = check_append(log, syncobj.raftCommitIndex, message, current_term=syncobj.raftCurrentTerm)
    if check.message is None:
        _refuse_conflict(syncobj, node, check.conflict)
        return
    if not check.keep_tail:
        callback(node, check.message)
        return
    with _tail_kept(log):
        callback(node, check.message)


def _with_rejection_hint(syncobj: SyncObj, message):
    """A follower's rejection of an append sends the leader back to just after its commit index
    (`raft_append.rejection_hint`)."""
    if not (isinstance(message, dict) and message.get("type") == "next_node_idx" and message.get("reset")
            and not message.get("success")):
        return message
    log = getattr(syncobj, "_SyncObj__raftLog", None)
    if log is None:
        return message
    hint = rejection_hint(log, syncobj.raftCommitIndex, message["next_node_idx"])
    return message if hint == message["next_node_idx"] else {**message, "next_node_idx": hint}


def _held_snapshot(syncobj: SyncObj, log, chunk) -> bool:
    """Collect the chunks of an incoming snapshot (on the member); whether to drop this one: a chunk of a snapshot
    whose first chunk this member did not see, or the last chunk of one whose final entry the log already holds
    (`raft_append.snapshot_is_held`).

    pysyncobj appends any chunk to the snapshot file it has open, so a snapshot whose first chunk was lost (or one
    whose last chunk was dropped here) was completed by the last chunk of another: a member installed an old
    snapshot that way and lost the committed entries after it (seen in the Raft simulation)."""
    if chunk is None:
        return False
    data, first, last = chunk
    if first:
        syncobj._group0_snapshot = bytearray()
    received = getattr(syncobj, "_group0_snapshot", None)
    if received is None:
        logger.info("group0 member %s: dropped a snapshot chunk without its beginning", syncobj.selfNode)
        return True
    received += data
    if not last:
        return False
    syncobj._group0_snapshot = None
    try:
        held = snapshot_is_held(log, bytes(received))
    except Exception as error:  # noqa: BLE001 - pysyncobj reports a dump it cannot load itself
        logger.warning("group0 member %s: a snapshot from the leader could not be read (%s)", syncobj.selfNode, error)
        return False
    if held:
        logger.info("group0 member %s: dropped a snapshot ending at an entry its log holds", syncobj.selfNode)
    return held


_refused_conflicts: set[str] = set()


def _refuse_conflict(syncobj: SyncObj, node, conflict: str) -> None:
    """A committed entry would change: refuse the append (logged once per conflict), so the member applies nothing
    of the leader's history on top of its own."""
    if conflict not in _refused_conflicts:
        _refused_conflicts.add(conflict)
        logger.critical("group0 member %s refuses an append from %s: %s. One of the two logs lost entries it had "
                        "acknowledged (a disk that did not keep a synced write, or a Raft directory restored from a "
                        "copy). Stop this node, then remove it (vbc node remove) and add it again with an empty data "
                        "directory", syncobj.selfNode, node, conflict)


class _KeptTailLog(logging.Filter):
    """Hides pysyncobj's "truncating already-applied log entries" line while a tail it would cut is kept."""

    active = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(self.active, "on", False) and str(record.msg).startswith("truncating already-applied"))


_KEPT_TAIL_FILTER = _KeptTailLog()
logging.getLogger("pysyncobj.syncobj").addFilter(_KEPT_TAIL_FILTER)


@contextmanager
def _tail_kept(log):
    """pysyncobj handles an append that matches the log and adds nothing: its cut of the entries after it is
    skipped (the log's `deleteEntriesFrom`, overridden on the instance for the call)."""
    log.deleteEntriesFrom = lambda entry_from: None
    _KEPT_TAIL_FILTER.active.on = True
    try:
        yield
    finally:
        _KEPT_TAIL_FILTER.active.on = False
        del log.deleteEntriesFrom


class StateMachine(Protocol):
    """The replicated object: deterministic, picklable, never raises for bad input (a raise is a bug).

    It receives journal entries: plain dicts, as the Raft log and snapshots hold them.
    """

    def apply(self, command: dict) -> object: ...

    # Optional: `member_id(raft_addr) -> str | None`, the node id of a member that joined after this node started
    # (its address is in no peer list given at start).


class Group0Unavailable(Unavailable):
    """No leader, no quorum, a timeout, or a closed Group0: the command's outcome is unknown (UNAVAILABLE)."""


class StateMachineError(RuntimeError):
    """state_machine.apply raised: a bug. The command still counts as applied on every member."""


class _ApplyFailure:
    """Returned by the replicated apply when the state machine raised (exceptions cannot cross it)."""

    def __init__(self, description: str):
        self.description = description


class _Replica:
    """What a full dump holds: the state machine and how many commands it has applied."""

    def __init__(self, state_machine: StateMachine):
        self.state_machine = state_machine
        self.applied_index = 0


class _ReplicatedState(SyncObjConsumer):
    """The pysyncobj consumer whose replicated methods feed commands to the state machine.

    It runs on pysyncobj's tick thread. Only the _Replica goes into full dumps (see _serialize);
    the lock and callbacks are process-local.
    """

    def __init__(self, state_machine: StateMachine, on_applied: Callable[[int], None] | None,
                 on_dump_loaded: Callable[[], None] = lambda: None):
        super().__init__()
        self._replica = _Replica(state_machine)
        self._on_applied = on_applied
        self._on_dump_loaded = on_dump_loaded
        self.changed = threading.Condition()  # guards _replica; notified on every applied command
        self.closed = False

    def _serialize(self) -> dict:
        return {"replica": self._replica}

    def _deserialize(self, data: dict) -> None:
        with self.changed:
            self._replica = data["replica"]
            index = self._replica.applied_index
            self.changed.notify_all()
        logger.info("group0 state restored from full dump at applied index %d", index)
        self._report_applied(index)
        self._on_dump_loaded()

    @replicated
    def apply_command(self, command: dict) -> object:
        with self.changed:
            result = self._apply_to_state_machine(command)
            self._replica.applied_index += 1
            index = self._replica.applied_index
            self.changed.notify_all()
        self._report_applied(index)
        return result

    @replicated
    def barrier_noop(self) -> int:
        with self.changed:
            return self._replica.applied_index

    def _apply_to_state_machine(self, command: dict) -> object:
        try:
            return self._replica.state_machine.apply(command)
        except Exception as error:  # a bug; re-raising would make pysyncobj re-apply the entry forever
            logger.exception("group0 state machine raised on command %r", command)
            return _ApplyFailure(f"{type(error).__name__}: {error}")

    def _report_applied(self, index: int) -> None:
        if self._on_applied is None:
            return
        try:
            self._on_applied(index)
        except Exception:  # must not propagate into pysyncobj, which would re-apply the entry
            logger.exception("group0 on_applied(%d) callback raised", index)

    @property
    def applied_index(self) -> int:
        return self._replica.applied_index

    def read(self, fn: Callable[[StateMachine], T]) -> T:
        with self.changed:
            return fn(self._replica.state_machine)

    def wait_applied(self, index: int, timeout: float) -> bool:
        with self.changed:
            self.changed.wait_for(lambda: self.closed or self._replica.applied_index >= index, timeout)
            return self._replica.applied_index >= index

    def wait_for(self, holds: Callable[[StateMachine], bool], timeout: float) -> bool:
        """Wait until `holds(state)` after an apply (at most `timeout` s); whether it holds."""
        with self.changed:
            self.changed.wait_for(lambda: self.closed or holds(self._replica.state_machine), timeout)
            return holds(self._replica.state_machine)

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()


class _Attempt:
    """One submission to pysyncobj, completed once by its callback or by close()."""

    def __init__(self):
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.result: object = None
        self.failure: object = None

    def complete(self, result: object, failure: object) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self.result = result
            self.failure = None if failure == FAIL_REASON.SUCCESS else failure
            self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(max(timeout, 0.0))


class Group0:
    """One member of group0: every cluster node runs one, with the same static membership.

    state_machine is the initial (empty) state: on start() it is brought up to date from the full
    dump and journal in data_dir, and a restore from a dump *replaces* it with the unpickled copy.
    Always reach the live state through read(), never through the object passed in.

    on_applied(index) runs on pysyncobj's tick thread after each command, outside the state lock;
    like read()'s fn it must be quick and must not call propose()/barrier()/close(). After a restart
    the replayed commands are reported again (after a restore from a dump, once with the dump's index).
    start() must be called from a thread that outlives this Group0 (normally the main thread):
    pysyncobj stops ticking when the thread that created it exits.

    raft_overrides: SyncObjConf settings replacing those of raft_options() (benchmarks, tuning).
    """

    def __init__(self, *, node_id: str, raft_addr: str, peers: Mapping[str, str], data_dir: str | Path,
                 state_machine: StateMachine, password: str, on_applied: Callable[[int], None] | None = None,
                 raft_overrides: Mapping[str, object] | None = None):
        _check_membership(node_id, raft_addr, peers)
        _check_picklable(state_machine)
        if not password:
            raise ValueError("group0 needs a non-empty Raft password: the transport unpickles what it receives")
        self._node_id = node_id
        self._raft_addr = raft_addr
        self._peers = dict(peers)
        self._node_ids_by_addr = {addr: peer_id for peer_id, addr in self._peers.items()}
        self._node_ids_by_addr[raft_addr] = node_id
        self._data_dir = Path(data_dir)
        # bindAddress: listen on the configured host only (pysyncobj would otherwise bind 0.0.0.0)
        self._conf = SyncObjConf(**{**raft_options(self._data_dir, password), "bindAddress": raft_addr,
                                    **(raft_overrides or {})})
        self._state = _ReplicatedState(state_machine, on_applied, on_dump_loaded=self._rewrite_received_dump)
        self._syncobj: SyncObj | None = None
        self._lifecycle_lock = threading.Lock()
        self._closed = threading.Event()
        self._pending: set[_Attempt] = set()
        self._pending_lock = threading.Lock()
        self._leader_term: int | None = None  # the term this node became leader in, until its state changes again
        self._membership_lock = threading.Lock()  # one membership change at a time

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        with self._lifecycle_lock:
            if self._closed.is_set() or self._syncobj is not None:
                raise RuntimeError(f"group0 on {self._node_id} was already started")
            if threading.current_thread() is not threading.main_thread():
                logger.warning("group0 started from thread %s: it stops ticking when that thread exits",
                               threading.current_thread().name)
            self._data_dir.mkdir(parents=True, exist_ok=True)
            journal = self._data_dir / JOURNAL_FILE
            match_journal_to_dump(journal, self._data_dir / DUMP_FILE)
            raft_storage.install()
            self._conf.onStateChanged = self._state_changed
            self._syncobj = Group0SyncObj(self._raft_addr, list(self._peers.values()), conf=self._conf,
                                    transportClass=partial(CheckedTransport,
                                                           before_send=partial(_sync_journal, journal)),
                                    consumers=[self._state])
        self._wait_bound()

    def _wait_bound(self) -> None:
        try:
            self._syncobj.waitBinded()
        except Exception:
            self.close()
            raise OSError(f"group0 on {self._node_id} cannot listen on raft address {self._raft_addr} "
                          f"after {self._conf.maxBindRetries} attempts: port in use?") from None

    def close(self) -> None:
        with self._lifecycle_lock:
            if self._closed.is_set():
                return
            self._closed.set()
            syncobj = self._syncobj
        self._fail_pending_attempts()
        self._state.close()
        if syncobj is not None:
            syncobj.destroy_synchronous()
            close_snapshot_files(syncobj)

    def _state_changed(self, old_state: int, new_state: int) -> None:
        """pysyncobj's callback, on its tick thread once the state (and before it the term) changed."""
        self._leader_term = self.term if _RAFT_STATE_NAMES.get(new_state) == "leader" else None
        logger.info("group0 %s: %s -> %s in term %d", self._node_id, _RAFT_STATE_NAMES.get(old_state),
                    _RAFT_STATE_NAMES.get(new_state), self.term)

    # ----------------------------------------------------------------- commands

    def propose(self, command: Command | dict, timeout: float = 10.0) -> object:
        """Replicate command (a typed command is logged as its journal dict); return what apply returned here.

        Retries after leader changes with the same entry (the state machine deduplicates).
        """
        entry = encode(command) if isinstance(command, Command) else command
        result = self._replicate(lambda callback: self._state.apply_command(entry, callback=callback),
                                 "command", timeout)
        if isinstance(result, _ApplyFailure):
            raise StateMachineError(f"group0 state machine failed to apply {entry!r}: {result.description}")
        return result

    def members(self) -> set[str]:
        """The Raft addresses of the group's members, this node included, as this node knows them."""
        if self._syncobj is None:
            return {self._raft_addr, *self._peers.values()}
        return {self._raft_addr, *(node.id for node in self._syncobj.otherNodes)}

    def add_member(self, raft_addr: str, timeout: float = 10.0) -> None:
        """Add a node to the Raft group (it then starts with every member as its peers); done if already one.

        Only the leader admits: it first writes a full dump, so the new member catches up from a dump that names
        the members of now instead of replaying every membership change since the last one."""
        self._change_membership(raft_addr, adding=True, timeout=timeout)

    def remove_member(self, raft_addr: str, timeout: float = 10.0) -> None:
        """Take a node out of the Raft group; done if it is not a member. Only the leader removes."""
        self._change_membership(raft_addr, adding=False, timeout=timeout)

    def _change_membership(self, raft_addr: str, adding: bool, timeout: float) -> None:
        """One change at a time on this node, made by the leader after an entry of its term committed (so every
        change an earlier leader began is committed or gone), and done only once it is committed."""
        deadline = time.monotonic() + timeout
        with self._membership_lock:
            self._require_leader("change the members of group0")
            self.barrier(timeout=max(deadline - time.monotonic(), 0.1))
            if (raft_addr in self.members()) == adding:
                return
            if adding:
                self.write_full_dump(timeout=max(deadline - time.monotonic(), 0.1))
            change = self._syncobj.addNodeToCluster if adding else self._syncobj.removeNodeFromCluster
            try:
                self._replicate(lambda callback: change(raft_addr, callback=callback), "membership change",
                                max(deadline - time.monotonic(), 0.1))
            except Group0Unavailable as error:
                self._check_change_committed(raft_addr, adding, timeout, error)
        logger.info("group0 %s: %s %s", self._node_id, "added" if adding else "removed", raft_addr)

    def _check_change_committed(self, raft_addr: str, adding: bool, timeout: float, cause: Group0Unavailable) -> None:
        """After a change timed out: a barrier commits it if the leader has it; otherwise say it did not commit,
        and why (`cause`)."""
        what = f"{'adding' if adding else 'removing'} {raft_addr}"
        try:
            self.barrier(timeout=timeout)
        except Group0Unavailable as error:
            raise Group0Unavailable(f"{what} did not commit within {timeout:g}s: {error}") from None
        if (raft_addr in self.members()) != adding:
            raise Group0Unavailable(f"{what} did not commit within {timeout:g}s ({cause}); try again")

    def _require_leader(self, what: str) -> None:
        if not self.is_leader:
            leader = self.leader_id or "not known yet"
            raise Group0Unavailable(f"only the Raft leader can {what}; {self._node_id} is not it (leader: {leader})")

    def write_full_dump(self, timeout: float = 10.0) -> None:
        """Write a full dump of what this member applied and cut its journal before it; Group0Unavailable when
        that takes longer than `timeout`."""
        target = self._syncobj.raftLastApplied  # a Raft log index (the state machine's count skips no-ops)
        deadline = time.monotonic() + timeout
        self.force_log_compaction()
        while not self._journal_cut_at(target):
            if time.monotonic() >= deadline:
                raise Group0Unavailable(f"group0 {self._node_id} did not write its full dump within {timeout:g}s")
            if self._closed.wait(_DUMP_POLL):
                raise Group0Unavailable(f"group0 {self._node_id} closed while writing its full dump")

    def _journal_cut_at(self, index: int) -> bool:
        """Whether the journal was cut at a dump of Raft log index `index` or later (it keeps the dump's last two)."""
        journal = raft_storage.journal_of(self._data_dir / JOURNAL_FILE)
        return journal is not None and len(journal) > 0 and journal[0][1] >= index - 1

    def barrier(self, timeout: float = 10.0) -> int:
        """Wait until this node has applied everything committed before the call; return applied_index."""
        return self._replicate(lambda callback: self._state.barrier_noop(callback=callback), "barrier", timeout)

    def _replicate(self, submit: Callable[[Callable], None], what: str, timeout: float) -> object:
        deadline = time.monotonic() + timeout
        backoff = _RETRY_BACKOFF_FIRST
        last_failure = None
        while True:
            attempt = self._submit(submit)
            if not attempt.wait(deadline - time.monotonic()):
                self._forget(attempt)  # a late callback may still fire; it completes an orphaned attempt
                raise self._unavailable(what, timeout, last_failure)
            if attempt.failure is None:
                return attempt.result
            last_failure = attempt.failure
            logger.debug("group0 %s on %s failed (%s), retrying", what, self._node_id, _reason(last_failure))
            if self._closed.wait(min(backoff, max(deadline - time.monotonic(), 0.0))):
                raise self._unavailable(what, timeout, last_failure)
            if time.monotonic() >= deadline:
                raise self._unavailable(what, timeout, last_failure)
            backoff = min(backoff * 2, _RETRY_BACKOFF_MAX)

    def _submit(self, submit: Callable[[Callable], None]) -> _Attempt:
        attempt = _Attempt()
        with self._pending_lock:
            if self._closed.is_set() or self._syncobj is None:
                attempt.complete(None, _CLOSED)
                return attempt
            self._pending.add(attempt)

        def on_result(result: object, failure: object) -> None:
            self._forget(attempt)
            attempt.complete(result, failure)

        try:
            submit(on_result)
        except BlockingIOError:
            pass  # pysyncobj's wake-up pipe is full: the command is queued and the tick thread is awake
        return attempt

    def _forget(self, attempt: _Attempt) -> None:
        with self._pending_lock:
            self._pending.discard(attempt)

    def _fail_pending_attempts(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, set()
        for attempt in pending:
            attempt.complete(None, _CLOSED)

    # ----------------------------------------------------------------- local state

    def read(self, fn: Callable[[StateMachine], T]) -> T:
        """Run fn on the local state under the apply lock; keep it short, it blocks the Raft thread."""
        return self._state.read(fn)

    def wait_applied(self, index: int, timeout: float) -> bool:
        return self._state.wait_applied(index, timeout)

    def wait_for(self, holds: Callable[[StateMachine], bool], timeout: float) -> bool:
        return self._state.wait_for(holds, timeout)

    def _rewrite_received_dump(self) -> None:
        """A full dump received from the leader is kept as this member's own, and with it the member list of the
        node that wrote it, perhaps long ago. Were this member to lead, it would send that dump to a joining node,
        which adopts the list: one without the leader makes the joiner refuse the leader's connections and stand for
        election in ever higher terms. So a received dump is written again at once, by this member, its member list
        naming this member. (At start-up, when the member loads its own dump, `_syncobj` is not set yet.)"""
        self.force_log_compaction()

    def force_log_compaction(self) -> None:
        """Write a full dump on the next tick and truncate the journal (normally automatic)."""
        if self._syncobj is not None:
            self._syncobj.forceLogCompaction()

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def applied_index(self) -> int:
        return self._state.applied_index

    @property
    def term(self) -> int:
        return self._syncobj.raftCurrentTerm if self._syncobj is not None else 0

    @property
    def leader_id(self) -> str | None:
        leader = self._syncobj._getLeader() if self._syncobj is not None else None
        return None if leader is None else self._member_name(leader.id)

    def _member_name(self, raft_addr: str) -> str:
        """The node id of a member: from the peers given at start, else from the replicated state (a member that
        joined later), else its Raft address."""
        known = self._node_ids_by_addr.get(raft_addr)
        if known is None:
            known = self.read(lambda state: state.member_id(raft_addr) if hasattr(state, "member_id") else None)
        return known or raft_addr

    @property
    def is_leader(self) -> bool:
        return self._syncobj is not None and self._syncobj._isLeader()

    def leadership(self) -> tuple[bool, int]:
        """Whether this node leads, and the Raft term, as one consistent pair: leading means leading in that very
        term. The term a node became leader in is recorded by the state-change callback; pysyncobj sets a newer
        term before it steps a leader down, so in between the recorded term is older and the pair says "not
        leading" (never "leading" the newer term). Read between two reads of the term that agree."""
        while True:
            term = self.term
            leader_term = self._leader_term
            if self.term == term:
                return leader_term == term and self.is_leader, term

    def status(self) -> dict:
        status = {"node_id": self._node_id, "raft_addr": self._raft_addr, "started": self._syncobj is not None,
                  "closed": self._closed.is_set(), "applied_index": self.applied_index}
        if self._syncobj is None:
            return status
        raw = _pysyncobj_status(self._syncobj)
        status.update({
            "state": _RAFT_STATE_NAMES.get(raw["state"], raw["state"]),
            "term": raw["raft_term"],
            "leader_id": self.leader_id,
            "is_leader": raw["state"] == 2,
            "has_quorum": raw["has_quorum"],
            "commit_index": raw["commit_idx"],
            "raft_last_applied": raw["last_applied"],
            "leader_commit_index": raw["leader_commit_idx"],
            "log_len": raw["log_len"],
            "uptime_s": raw["uptime"],
            "peers": {peer_id: _peer_status(raw, addr) for peer_id, addr in self._current_peers().items()},
        })
        return status

    # ----------------------------------------------------------------- errors

    def _current_peers(self) -> dict[str, str]:
        """The other members as they are now (joined ones in, removed ones out), by node id: their Raft addresses."""
        if self._syncobj is None:
            return dict(self._peers)
        return {self._member_name(node.id): node.id for node in self._syncobj.otherNodes}

    def _unreachable_peers(self, peers: Mapping[str, str]) -> list[str]:
        if self._syncobj is None:
            return sorted(peers)
        connected = {node.id for node in self._syncobj.otherNodes if self._syncobj.isNodeConnected(node)}
        return sorted(peer_id for peer_id, addr in peers.items() if addr not in connected)

    def _unavailable(self, what: str, timeout: float, last_failure: object) -> Group0Unavailable:
        if self._closed.is_set() or last_failure == _CLOSED:
            return Group0Unavailable(f"group0 on {self._node_id} is closed; the {what} was not completed")
        leader = self.leader_id
        if leader is None:
            headline = f"no Raft leader for group0 as seen from {self._node_id} (term {self.term})"
        else:
            headline = f"group0 {what} not committed within {timeout:g}s (leader {leader}, term {self.term})"
        details = [headline, self._connectivity_summary()]
        if last_failure is not None:
            details.append(f"last attempt failed with {_reason(last_failure)}")
        if what == "command":
            details.append("the command may still be applied later: retry it unchanged (same command id)")
        if what == "membership change" and last_failure == FAIL_REASON.REQUEST_DENIED:
            details.append("another membership change is not committed yet (the leader makes one at a time, each "
                           "committed before the next) or the member is already in that state")
        return Group0Unavailable("; ".join(details))

    def _connectivity_summary(self) -> str:
        peers = self._current_peers()
        members = len(peers) + 1
        unreachable = self._unreachable_peers(peers)
        if not unreachable:
            return f"all {members} members connected (election in progress or cluster overloaded?)"
        names = ", ".join(f"{peer_id} at {peers[peer_id]}" for peer_id in unreachable)
        return (f"{len(unreachable)} of {members} members unreachable from {self._node_id} ({names}); "
                f"a majority of {members // 2 + 1} must run and reach each other: "
                f"start them, or check their raft address, port and password")


def _check_membership(node_id: str, raft_addr: str, peers: Mapping[str, str]) -> None:
    if node_id in peers:
        raise ValueError(f"peers must list the other members only, but it contains this node {node_id!r}")
    if raft_addr in peers.values():
        raise ValueError(f"peers must list the other members only, but it contains {raft_addr!r}")
    if len(set(peers.values())) != len(peers):
        raise ValueError(f"two peers share a raft address: {dict(peers)!r}")


def _check_picklable(state_machine: StateMachine) -> None:
    # pysyncobj only logs "Failed to store full dump" and lets the journal grow: fail early instead
    try:
        pickle.dumps(state_machine)
    except Exception as error:
        raise TypeError(f"the group0 state machine must be picklable, full dumps pickle it: {error}") from None


def _reason(failure: object) -> str:
    return _FAIL_REASON_NAMES.get(failure, str(failure))


def _pysyncobj_status(syncobj: SyncObj) -> dict:
    # getStatus() iterates dicts the tick thread may resize (first election); retry that rare race
    for _ in range(3):
        try:
            return syncobj.getStatus()
        except RuntimeError:
            continue
    return syncobj.getStatus()


def _peer_status(raw: dict, addr: str) -> dict:
    return {
        "raft_addr": addr,
        "connected": raw.get("partner_node_status_server_" + addr) == 2,
        "next_index": raw.get("next_node_idx_server_" + addr),
        "match_index": raw.get("match_idx_server_" + addr),
    }
