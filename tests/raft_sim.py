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

import os
import pickle
import random
import shutil
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.transport import Transport

from coordinator import raft_storage
from coordinator.raft import CheckedMessages

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
    """What each file held when it was last synced (a power loss brings that back)."""

    def __init__(self) -> None:
        self.synced: dict[Path, bytes] = {}

    def record(self, path) -> None:
        path = Path(path)
        if path.is_file():
            self.synced[path] = path.read_bytes()

    def power_loss(self, directory: Path) -> None:
        for path in directory.iterdir():
            if path.is_file():
                if path in self.synced:
                    path.write_bytes(self.synced[path])
                else:
                    path.unlink()


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
        previous = max((m.due for m in self.in_flight if (m.source, m.target) == (source, target)), default=0.0)
        due = max(previous, self.clock.now + self.rng.choice((0.0, 0.0, 0.01, 0.05, 0.2)))
        self.in_flight.append(Message(due, self.sent, source, target, pickle.dumps(message)))

    def reset(self, source: str, target: str) -> None:
        self.in_flight = [m for m in self.in_flight if (m.source, m.target) != (source, target)]

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


class SimTransport(CheckedMessages, Transport):
    """A pysyncobj transport over `Network`, with group0's checks; every member is always "connected"."""

    def __init__(self, network: Network, syncObj, selfNode, otherNodes):
        super().__init__(syncObj, selfNode, otherNodes)
        self._syncObj = syncObj
        self._network = network
        self._self = selfNode
        self._others = {node.address: node for node in otherNodes}
        network.transports[selfNode.address] = self
        self._before_send = partial(_sync_journal, syncObj)
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
        self._before_send()
        self._network.send(self._self.address, node.address, message)
        return True

    def receive(self, source: str, message) -> None:
        node = self._others.get(source)
        if node is not None:
            self._onMessageReceived(node, message)

    def destroy(self) -> None:
        if self._network.transports.get(self._self.address) is self:
            del self._network.transports[self._self.address]


def _sync_journal(syncobj: SyncObj) -> None:
    journal = getattr(syncobj, "_SyncObj__raftLog", None)
    if isinstance(journal, raft_storage.DurableJournal):
        journal.sync()


class Member(SyncObj):
    """A replicated list of the values proposed to it."""

    def __init__(self, address: str, others: list[str], directory: Path, network: Network, compact_every: int):
        conf = SyncObjConf(autoTick=False, dynamicMembershipChange=True, appendEntriesUseBatch=False,
                           journalFile=str(directory / "raft.journal"), fullDumpFile=str(directory / "raft.dump"),
                           useFork=False, logCompactionMinEntries=compact_every, logCompactionMinTime=1.0,
                           appendEntriesPeriod=0.1, raftMinTimeout=0.5, raftMaxTimeout=1.0,
                           leaderFallbackTimeout=2.0, commandsWaitLeader=False)
        super().__init__(address, others, conf, transportClass=partial(SimTransport, network))
        self.applied: list[int] = []
        self.changing = False  # a membership change it began is not done yet

    @replicated
    def append(self, value: int) -> int:
        self.applied.append(value)
        return len(self.applied)


def private(member: SyncObj, name: str):
    return getattr(member, "_SyncObj__" + name)


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
    rng: random.Random = field(init=False)
    network: Network = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        random.seed(self.seed)  # pysyncobj draws its election timeouts from the global generator
        self.network = Network(self.rng, self.clock)
        self.network.drop_rate = self.rng.choice((0.0, 0.02, 0.1))
        self.compact_every = self.rng.choice((10, 40, 1000))
        self.addresses = [f"m{i}:1" for i in range(1, self.size + 1)]
        self.members: dict[str, Member | None] = {}
        self.peers_at_start: dict[str, list[str]] = {}
        self.proposals: list[Proposal] = []
        self.leaders: dict[int, str] = {}  # term -> the member that led it
        self.history: list[int] = []  # the longest applied sequence seen
        for address in self.addresses:
            self.start(address, [a for a in self.addresses if a != address])

    # ------------------------------------------------------------ members

    def directory(self, address: str) -> Path:
        path = self.root / address.replace(":", "_")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def start(self, address: str, peers: list[str]) -> None:
        self.peers_at_start[address] = peers
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
        for _ in range(self.steps):
            self.step()
            self.check()
        self.heal()
        self.check_end()

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
        elif roll < 0.276 and len(self.members) < self.size + 2:
            self.join()
        else:
            self.advance()

    def advance(self) -> None:
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
        """New members ask to be added, one or two at once (under a partition, sometimes). As group0's
        `Group0._change_membership` does, only a leader adds a member, one change at a time, and only once an entry
        of its term is committed (every change an earlier leader began is then committed or gone)."""
        for _ in range(self.rng.choice((1, 1, 2))):
            leader = next((m for _, m in self.live() if m._isLeader()), None)
            if leader is None or leader.changing or private(leader, "raftCommitIndex") < (
                    private(leader, "noopIDx") or 0):
                self.stats["joins refused (no leader, or a change under way)"] += 1
                continue
            address = f"m{len(self.members) + 1}:1"
            self.members[address] = None
            leader.changing = True

            def done(result, error, leader=leader) -> None:
                leader.changing = False

            leader.addNodeToCluster(address, callback=done)
            self.start(address, [a for a in self.members if a != address])
            self.stats["joins"] += 1

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
        return all(wanted <= set(m.applied) for a, m in self.live() if a in members) and not self.network.in_flight

    # ------------------------------------------------------------ the checks

    def check(self) -> None:
        logs = {}
        for address, member in self.live():
            if member._isLeader():
                term = private(member, "raftCurrentTerm")
                assert self.leaders.setdefault(term, address) == address, (
                    f"two leaders in term {term}: {self.leaders[term]} and {address}")
                self.check_leader_holds_acknowledged(member, term)
            logs[address] = {entry[1]: (entry[2], entry[0]) for entry in private(member, "raftLog")}
            self.check_applied(address, member.applied)
        self.check_log_matching(logs)

    def check_applied(self, address: str, applied: list[int]) -> None:
        shorter, longer = sorted((applied, self.history), key=len)
        assert longer[:len(shorter)] == shorter, f"{address} applied {applied}, another member {self.history}"
        self.history = list(longer)

    @staticmethod
    def check_log_matching(logs: dict) -> None:
        members = list(logs)
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                common = sorted(set(logs[a]) & set(logs[b]), reverse=True)
                matching = next((index for index in common if logs[a][index][0] == logs[b][index][0]), None)
                if matching is None:
                    continue
                for index in common:
                    if index <= matching:
                        assert logs[a][index] == logs[b][index], (
                            f"{a} and {b} agree on the term of entry {matching} but differ at entry {index}")

    def check_leader_holds_acknowledged(self, leader: Member, term: int) -> None:
        """A leader of a later term holds every proposal acknowledged before (applied, or in its log)."""
        pending = {p.value for p in self.proposals if p.acknowledged and p.term < term}
        missing = pending - set(leader.applied)
        if not missing:
            return
        in_log = set()
        for entry in private(leader, "raftLog"):
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
