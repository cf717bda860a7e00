"""A seeded simulation of group0's Raft: real pysyncobj members with group0's journal and message checks, on a
simulated network and clock (used by test_raft_sim.py).

No sockets, threads or sleeps. Each member is a `SyncObj` (autoTick off) whose transport is `SimTransport`
(`coordinator.raft.CheckedMessages` over pysyncobj's `Transport`), whose journal is group0's `DurableJournal` in a
directory of its own, and whose clock is the simulation's (pysyncobj's `monotonicTime`, patched by the caller).
A schedule mixes proposals, ticks, message deliveries (late, reordered, dropped), partitions, crashes (the member is
discarded and started again from its files), power losses (every file of the member reverted to what was last
synced), several members killed at once, concurrent joins of new members under a partition, and log compactions
(a crash right after one).

After every step: at most one leader per term, log matching between every two members, and every member's
applied sequence a prefix of one history; every acknowledged proposal is in the log (or the dump) of every leader
of a later term. At the end, with the network healed, every live member applies every acknowledged proposal.
"""
from __future__ import annotations

import logging
import os
import pickle
import random
import shutil
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pysyncobj.syncobj
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.transport import Transport

from coordinator import raft_storage
from coordinator.raft import CheckedMessages, OneMembershipChange, close_snapshot_files

TICK = 0.05  # simulated seconds per step of the clock


class Clock:
    """The simulated time pysyncobj reads (`pysyncobj.syncobj.monotonicTime`). Each reading moves it on by 0.1 ms,
    as a real clock would, so pysyncobj's loops bounded by time (sending a snapshot while a dump is written, say)
    end."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1e-4
        return self.now


class Disk:
    """What each file held when it was last synced (a power loss brings that back), by normalized path."""

    def __init__(self) -> None:
        self.synced: dict[str, bytes] = {}

    def record(self, path) -> None:
        try:
            with open(path, "rb") as file:
                self.synced[os.path.normpath(path)] = file.read()
        except (FileNotFoundError, IsADirectoryError):
            pass

    def power_loss(self, directory: Path) -> None:
        for path in directory.iterdir():
            if path.is_file():
                if str(path) in self.synced:
                    path.write_bytes(self.synced[str(path)])
                else:
                    path.unlink()


def install_world(setattr_=setattr) -> tuple[Clock, Disk]:
    """Make pysyncobj read the simulation's clock and group0's storage record what each sync made durable (through
    `setattr_`: pytest's `monkeypatch.setattr` undoes it after the test); the clock and the disk."""
    clock, disk = Clock(), Disk()
    setattr_(pysyncobj.syncobj, "monotonicTime", clock)
    raft_storage.install()
    synced_journal = raft_storage.DurableJournal.sync
    synced_file = raft_storage.sync_file

    def sync_journal(journal) -> None:
        written = journal._dirty
        synced_journal(journal)
        if written:
            disk.record(journal._path)

    def sync_file(path) -> None:
        synced_file(path)
        disk.record(path)

    setattr_(raft_storage.DurableJournal, "sync", sync_journal)
    setattr_(raft_storage, "sync_file", sync_file)
    return clock, disk


@dataclass
class Message:
    due: float
    order: int
    source: str
    target: str
    body: bytes


class Network:
    """Messages between members over connections as TCP gives them: in order on each (source, target) pair, late,
    interleaved across pairs; a connection that resets loses what it had in flight; partitions cut pairs."""

    def __init__(self, rng: random.Random, clock: Clock):
        self.rng = rng
        self.clock = clock
        self.transports: dict[str, SimTransport] = {}
        self.in_flight: list[Message] = []
        self.last_due: dict[tuple[str, str], float] = {}  # when the last message in flight on a connection is due
        self.cut: set[frozenset] = set()
        self.sent = 0
        self.drop_rate = 0.0

    def send(self, source: str, target: str, message) -> None:
        self.sent += 1
        if frozenset((source, target)) in self.cut:
            return
        if self.rng.random() < self.drop_rate:
            self.reset(source, target)
            return
        delay = self.rng.choice((0.0, 0.0, 0.01, 0.05, 0.2))
        due = max(self.last_due.get((source, target), 0.0), self.clock.now + delay)
        self.last_due[(source, target)] = due
        self.in_flight.append(Message(due, self.sent, source, target, pickle.dumps(message)))

    def reset(self, source: str, target: str) -> None:
        self.in_flight = [m for m in self.in_flight if (m.source, m.target) != (source, target)]
        self.last_due.pop((source, target), None)

    def deliver_some(self) -> int:
        """Deliver the due messages of some connections, each connection's in the order sent."""
        due = [m for m in self.in_flight if m.due <= self.clock.now]
        pairs = sorted({(m.source, m.target) for m in due})
        chosen_pairs = set(self.rng.sample(pairs, self.rng.randint(1, len(pairs)))) if pairs else set()
        chosen = sorted((m for m in due if (m.source, m.target) in chosen_pairs), key=lambda m: m.order)
        taken = {id(m) for m in chosen}
        self.in_flight = [m for m in self.in_flight if id(m) not in taken]
        delivered = 0
        for message in chosen:
            transport = self.transports.get(message.target)
            if transport is not None and frozenset((message.source, message.target)) not in self.cut:
                transport.receive(message.source, pickle.loads(message.body))
                delivered += 1
        return delivered

    def forget(self, address: str) -> None:
        self.in_flight = [m for m in self.in_flight if address not in (m.source, m.target)]
        self.last_due = {pair: due for pair, due in self.last_due.items() if address not in pair}


class NetworkTransport(Transport):
    """A pysyncobj transport over `Network`; every member is always "connected"."""

    def __init__(self, network: Network, syncObj, selfNode, otherNodes):
        super().__init__(syncObj, selfNode, otherNodes)
        self._syncObj = syncObj
        self._network = network
        self._self = selfNode
        self._others = {node.address: node for node in otherNodes}
        network.transports[selfNode.address] = self
        self._ready = False

    @property
    def ready(self) -> bool:
        return self._ready

    def tryGetReady(self) -> None:
        """On the first tick (the member has set its callbacks by then): every other member is connected."""
        self._ready = True
        for node in list(self._others.values()):
            self._onNodeConnected(node)

    def waitReady(self) -> None:
        self.tryGetReady()

    def addNode(self, node) -> None:
        self._others[node.address] = node
        self._onNodeConnected(node)

    def dropNode(self, node) -> None:
        self._others.pop(node.address, None)
        self._onNodeDisconnected(node)

    def send(self, node, message) -> bool:
        self._network.send(self._self.address, node.address, message)
        return True

    def receive(self, source: str, message) -> None:
        node = self._others.get(source)
        if node is not None:
            self._onMessageReceived(node, message)

    def destroy(self) -> None:
        if self._network.transports.get(self._self.address) is self:
            del self._network.transports[self._self.address]


class SimTransport(CheckedMessages, NetworkTransport):
    """`NetworkTransport` with group0's checks (`coordinator.raft.CheckedMessages`), as group0's TCP transport has."""

    def __init__(self, network: Network, syncObj, selfNode, otherNodes):
        super().__init__(network, syncObj, selfNode, otherNodes)
        self._before_send = partial(_sync_journal, syncObj)


def _sync_journal(syncobj: SyncObj) -> None:
    journal = getattr(syncobj, "_SyncObj__raftLog", None)
    if isinstance(journal, raft_storage.DurableJournal):
        journal.sync()


class Member(OneMembershipChange, SyncObj):
    """A replicated list of the values proposed to it, with group0's membership rule."""

    def __init__(self, address: str, others: list[str], directory: Path, network: Network, compact_every: int):
        conf = SyncObjConf(autoTick=False, dynamicMembershipChange=True, appendEntriesUseBatch=False,
                           journalFile=str(directory / "raft.journal"), fullDumpFile=str(directory / "raft.dump"),
                           useFork=False, logCompactionMinEntries=compact_every, logCompactionMinTime=1.0,
                           appendEntriesPeriod=0.1, raftMinTimeout=0.5, raftMaxTimeout=1.0,
                           leaderFallbackTimeout=2.0, commandsWaitLeader=False)
        super().__init__(address, others, conf, transportClass=partial(SimTransport, network))
        self.applied: list[int] = []

    @replicated
    def append(self, value: int) -> int:
        self.applied.append(value)
        return len(self.applied)


def private(member: SyncObj, name: str):
    return getattr(member, "_SyncObj__" + name)


def log_entries(member: SyncObj) -> list[tuple[bytes, int, int]]:
    """A copy of the member's Raft log: (command, index, term) entries, as its journal holds them."""
    journal = private(member, "raftLog")
    return list(getattr(journal, "_FileJournal__journal", journal))


def check_logs_match(a: str, b: str, log_a: list, log_b: list) -> None:
    """Raft's log matching: two logs that agree on the term of an entry hold the same entries up to it."""
    entries_a = {entry[1]: (entry[2], entry[0]) for entry in log_a}
    entries_b = {entry[1]: (entry[2], entry[0]) for entry in log_b}
    common = sorted(entries_a.keys() & entries_b.keys(), reverse=True)
    matching = next((index for index in common if entries_a[index][0] == entries_b[index][0]), None)
    if matching is None:
        return
    for index in common:
        if index <= matching:
            assert entries_a[index] == entries_b[index], (
                f"{a} and {b} agree on the term of entry {matching} but differ at entry {index}")


class Refusals(logging.Handler):
    """The appends a member refused as changing a committed entry: none of the schedules should see one."""

    def __init__(self) -> None:
        super().__init__(logging.CRITICAL)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@dataclass
class Proposal:
    value: int
    term: int  # the proposer's term when it answered SUCCESS
    acknowledged: bool = False


@dataclass
class Simulation:
    """One seeded schedule over `size` members (more join during it)."""

    seed: int
    root: Path
    stats: Counter
    clock: Clock
    disk: Disk
    size: int = 3
    steps: int = 300
    first_joiner: int = 0  # the number of the first member to join, after m1..m{size}
    rng: random.Random = field(init=False)
    network: Network = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        random.seed(self.seed)  # pysyncobj draws its election timeouts from the global generator
        self.clock.now = 1000.0  # a schedule runs the same alone or after others
        self.network = Network(self.rng, self.clock)
        self.network.drop_rate = self.rng.choice((0.0, 0.02, 0.1))
        self.compact_every = self.rng.choice((10, 40, 1000))
        self.addresses = [f"m{i}:1" for i in range(1, self.size + 1)]
        self.members: dict[str, Member | None] = {}
        self.peers_at_start: dict[str, list[str]] = {}
        self.proposals: list[Proposal] = []
        self.leaders: dict[int, str] = {}  # term -> the member that led it
        self.history: list[int] = []  # the longest applied sequence seen
        self.join_requests = 0
        self.high_water: dict[str, tuple[int, int]] = {}  # a running member's highest commit index and applied count
        self.joining: set[str] = set()  # members whose join is not answered yet
        self.to_start: list[str] = []  # members whose join committed, started at the next step
        self.matched: dict[tuple[str, str], tuple[list, list]] = {}  # two members' logs when last found matching
        for address in self.addresses:
            self.start(address, [a for a in self.addresses if a != address])

    # ------------------------------------------------------------ members

    def directory(self, address: str) -> Path:
        path = self.root / address.replace(":", "_")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def start(self, address: str, peers: list[str]) -> None:
        self.peers_at_start[address] = peers
        self.high_water.pop(address, None)
        directory = self.directory(address)
        raft_storage.match_journal_to_dump(directory / "raft.journal", directory / "raft.dump")  # as Group0.start
        self.members[address] = Member(address, peers, self.directory(address), self.network, self.compact_every)

    def stop(self, address: str) -> None:
        member = self.members.get(address)
        if member is None:
            return
        self.members[address] = None
        self.network.forget(address)
        member.destroy()
        close_snapshot_files(member)
        notifier = getattr(member, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            os.close(notifier._PipeNotifier__pipeR)
            os.close(notifier._PipeNotifier__pipeW)

    def crash(self, address: str, power_loss: bool) -> None:
        self.stop(address)
        if power_loss:
            self.disk.power_loss(self.directory(address))
        self.stats["power losses" if power_loss else "crashes"] += 1

    def live(self) -> list[tuple[str, Member]]:
        return [(a, m) for a, m in self.members.items() if m is not None]

    # ------------------------------------------------------------ the schedule

    def run(self) -> None:
        refusals = Refusals()
        logging.getLogger("coordinator.raft").addHandler(refusals)
        try:
            for _ in range(self.steps):
                self.step()
                self.check()
                assert not refusals.messages, refusals.messages[0]
            self.heal()
            self.check_end()
            assert not refusals.messages, refusals.messages[0]
        finally:
            logging.getLogger("coordinator.raft").removeHandler(refusals)

    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.2:
            self.propose()
        elif roll < 0.23:
            self.partition()
        elif roll < 0.24:
            self.crash_one()
        elif roll < 0.243:
            self.crash_all()
        elif roll < 0.27:
            self.restart_one()
        elif roll < 0.276 and len(self.members) + len(self.joining) < self.size + 2:
            self.join()
        else:
            self.advance()

    def advance(self) -> None:
        self.start_joined()
        self.clock.now += TICK
        self.network.deliver_some()
        for _, member in self.live():
            member.doTick(0.0)
        self.stats["ticks"] += 1

    def propose(self) -> None:
        live = self.live()
        if not live:
            return
        address, member = self.rng.choice(live)
        proposal = Proposal(len(self.proposals) + 1, 0)
        self.proposals.append(proposal)

        def answered(result, error, member=member, proposal=proposal) -> None:
            if error == FAIL_REASON.SUCCESS:
                proposal.acknowledged = True
                proposal.term = private(member, "raftCurrentTerm")
                self.stats["acknowledged"] += 1

        member.append(proposal.value, callback=answered)
        self.stats["proposed"] += 1

    def partition(self) -> None:
        if self.network.cut and self.rng.random() < 0.5:
            self.network.cut.clear()
            self.stats["partitions healed"] += 1
            return
        alone = self.rng.choice(list(self.members))
        self.network.cut |= {frozenset((alone, other)) for other in self.members if other != alone}
        self.stats["partitions"] += 1

    def crash_one(self) -> None:
        live = self.live()
        if live:
            address, _ = self.rng.choice(live)
            self.crash(address, power_loss=self.rng.random() < 0.5)

    def crash_all(self) -> None:
        power_loss = self.rng.random() < 0.5
        for address, _ in self.live():
            self.crash(address, power_loss)
        self.stats["all members killed"] += 1

    def restart_one(self) -> None:
        down = [a for a, m in self.members.items() if m is None]
        if down:
            address = self.rng.choice(down)
            self.start(address, self.peers_at_start[address])
            self.stats["restarts"] += 1

    def join(self) -> None:
        """New members ask a leader (one that believes it leads: under a partition, maybe a stale one) to add them,
        one or two at once. As with `vbc cluster add-node`, a new member starts once its join committed."""
        for _ in range(self.rng.choice((1, 1, 2))):
            leader = next((m for _, m in self.live() if m._isLeader()), None)
            if leader is None:
                self.stats["joins refused (no leader)"] += 1
                continue
            self.join_requests += 1
            address = f"m{self.size + self.first_joiner + self.join_requests}:1"
            self.joining.add(address)

            def done(result, error, address=address) -> None:
                self.joining.discard(address)
                if error == FAIL_REASON.SUCCESS:
                    self.to_start.append(address)
                    self.stats["joins"] += 1
                else:
                    self.stats["joins refused or dropped"] += 1

            leader.addNodeToCluster(address, callback=done)

    def start_joined(self) -> None:
        while self.to_start:
            address = self.to_start.pop(0)
            self.members[address] = None
            self.start(address, [a for a in self.members if a != address])

    def heal(self) -> None:
        """The network heals, every member comes back, and time passes until nothing is in flight."""
        self.network.cut.clear()
        self.network.drop_rate = 0.0
        for address in [a for a, m in self.members.items() if m is None]:
            self.start(address, self.peers_at_start[address])
        for _ in range(600):
            self.advance()
            self.check()
            if self.settled():
                return

    def settled(self) -> bool:
        wanted = {p.value for p in self.proposals if p.acknowledged}
        leader = next((m for _, m in self.live() if m._isLeader()), None)
        if leader is None:
            return False
        members = {leader.selfNode.address} | {node.address for node in leader.otherNodes}
        return all(wanted <= set(m.applied) for a, m in self.live() if a in members)

    # ------------------------------------------------------------ the checks

    def check(self) -> None:
        logs = {}
        for address, member in self.live():
            if member._isLeader():
                term = private(member, "raftCurrentTerm")
                assert self.leaders.setdefault(term, address) == address, (
                    f"two leaders in term {term}: {self.leaders[term]} and {address}")
                self.check_leader_holds_acknowledged(member, term)
            logs[address] = log_entries(member)
            self.check_applied(address, member.applied)
            self.check_no_regression(address, member)
        self.check_log_matching(logs)

    def check_no_regression(self, address: str, member: Member) -> None:
        """While a member runs, its commit index and what it applied never go back (a restart may lower the commit
        index it knows of, never what it applied: that is in its dump and journal)."""
        seen = (member.raftCommitIndex, len(member.applied))
        before = self.high_water.get(address, (0, 0))
        assert seen[0] >= before[0], f"{address}'s commit index went back from {before[0]} to {seen[0]}"
        assert seen[1] >= before[1], f"{address} forgot applied entries: {before[1]} applied, now {seen[1]}"
        self.high_water[address] = seen

    def check_applied(self, address: str, applied: list[int]) -> None:
        shorter, longer = sorted((applied, self.history), key=len)
        assert longer[:len(shorter)] == shorter, f"{address} applied {applied}, another member {self.history}"
        self.history = list(longer)

    def check_log_matching(self, logs: dict[str, list]) -> None:
        """Every two members' logs match (`check_logs_match`); a pair whose logs are both as they were at its last
        check is not checked again."""
        members = list(logs)
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                pair = (logs[a], logs[b])
                if self.matched.get((a, b)) != pair:
                    check_logs_match(a, b, *pair)
                    self.matched[(a, b)] = pair

    def check_leader_holds_acknowledged(self, leader: Member, term: int) -> None:
        """A leader of a later term holds every proposal acknowledged before (applied, or in its log)."""
        pending = {p.value for p in self.proposals if p.acknowledged and p.term < term}
        missing = pending - set(leader.applied)
        if not missing:
            return
        in_log = set()
        for entry in log_entries(leader):
            command = entry[0]
            if command[:1] == b"\x00":
                in_log |= {arg for arg in pickle.loads(command[1:])[1] if isinstance(arg, int)}
        assert not missing - in_log, f"the leader of term {term} lost acknowledged proposals {sorted(missing - in_log)}"

    def check_end(self) -> None:
        """Every member of the final configuration (a join that did not commit left its member out) applied every
        acknowledged proposal."""
        wanted = [p.value for p in self.proposals if p.acknowledged]
        leader = next((m for _, m in self.live() if m._isLeader()), None)
        assert leader is not None or not self.live(), "no leader after the network healed"
        members = {leader.selfNode.address} | {node.address for node in leader.otherNodes}
        for address, member in self.live():
            if address not in members:
                self.stats["joins that did not commit"] += 1
                continue
            assert set(wanted) <= set(member.applied), (
                f"{address} never applied acknowledged proposals {sorted(set(wanted) - set(member.applied))}")
        self.stats["schedules"] += 1

    def close(self) -> None:
        for address in list(self.members):
            self.stop(address)
        shutil.rmtree(self.root, ignore_errors=True)
