"""`make soak`: a seeded random run of writes, DDL and topology changes on a real 3-4 node cluster, checked exactly.

Run: `.venv/bin/python bench/soak.py --minutes N [--seed S] [--keep-data]` (the Makefile's `soak` target).

A local cluster of 3 nodes (2 shards each, SQLite, mutual TLS, 127.0.0.1, a temporary directory, fault injection
enabled) is started with the `vbc cluster up` code; then, until the minutes are up, one operation at a time chosen
by a seeded generator: batches of writes (INSERT / UPDATE / DELETE, single or in a BATCH, each with `USING
TIMESTAMP` from a client-side clock, recorded in a client-side model once acknowledged, retried with the same
timestamp when refused), CREATE MATERIALIZED VIEW and CREATE INDEX, tablet moves, splits and merges, RF changes
(1..3), a node added (`--join`), decommissioned, or killed with -9 and removed, the Raft leader killed with -9 and
restarted, the balancer switched, one-shot fault injections. While a topology operation is awaited (polled, with a
bounded timeout), a few writes go on between the polls. The cluster keeps 3 or 4 nodes.

At the end: pending writes are retried, every migration must end and every view and index be built; `vbc check`
of each (every replica), a full SELECT of the base table through every node and each view's rows must equal what
the model says, and index lookups must answer the model's keys. The same seed makes the same choices of
operations. A tenth of the write units are a bulk load's executions (inserts of one timestamp as Arrow values,
staged into the replicas of a table with views); the final phase waits until no staged row is left. Exit status 0
only when no operation failed and every check matched. Every process started here is
stopped by pid at the end, on failure, on Ctrl-C and at the hard deadline (MINUTES plus HARD_EXTRA seconds).

Every acknowledged write (where it was made, after how many attempts), every operation and the tablet maps after
each one go to DATA_DIR/soak-journal.log; a mismatch names the last writes of the keys it concerns. The data
directory (node logs included) is kept when the run fails, removed when it passed (unless --keep-data).
"""
from __future__ import annotations

import argparse
import collections
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc  # noqa: E402
import pyarrow as pa  # noqa: E402

from vbc import client  # noqa: E402
from vbc import cluster as cluster_mod  # noqa: E402

KS = "soak"
JOURNAL_NAME = "soak-journal.log"
BASE = f"{KS}.t"
SHARDS = 2
INITIAL_TABLETS = 4
MAX_TABLETS = 16
KEYS = 400
B_VALUES = [f"b{i:02d}" for i in range(12)]
INITIAL_UNITS = 150

PACE = 0.5  # seconds between two operations
POLL = 0.5
START_TIMEOUT = 240.0
TOPOLOGY_TIMEOUT = 300.0
LEADER_TIMEOUT = 60.0
REFUSAL_PATIENCE = 60.0  # how long a refused (FAILED_PRECONDITION) request is asked again before it counts as refused
WRITE_RPC_TIMEOUT = 15.0
WRITE_RETRY_TIMEOUT = 90.0  # a write still refused after this goes to the pending list, retried later
FINAL_TIMEOUT = 900.0  # the final phase: pending writes, quiescence, builds, checks
HARD_EXTRA = 1500.0  # the hard deadline: MINUTES plus this (start, the last operation, the final phase)
BACKGROUND_UNITS = 2  # writes sent per poll while a topology operation is awaited
STAGED_SHARE = 0.1  # of the write units: a bulk load's execution (staged into the replicas of a table with views)
MAX_PENDING = 40  # no new background writes while this many wait to be acknowledged (e.g. a node is down)

EVIDENCE_MARKS = (" ERROR ", "Traceback", " CRITICAL ", "WARNING coordinator.")  # node log lines shown on failure
INJECTION_POINTS = ["write.coordinator.before_send", "write.replica.before_apply", "write.replica.after_apply",
                    "view_update.before_send", "view_update.receive", "view_rows.receive",
                    "worker_fail_build_range", "worker.work_on_tasks"]


# ------------------------------------------------------------------ views and indexes


@dataclass(frozen=True)
class ViewSpec:
    """A materialized view over the base table: its CQL, its columns, and which live base rows it holds."""

    name: str
    select: str
    columns: tuple[str, ...]
    keep: Callable[[dict], bool]

    def statement(self) -> str:
        return f"CREATE MATERIALIZED VIEW IF NOT EXISTS {KS}.{self.name} AS {self.select}"


VIEWS = [
    ViewSpec("v_by_a", f"SELECT * FROM {BASE} WHERE a IS NOT NULL PRIMARY KEY (a, k)", ("a", "k", "b"),
             lambda r: r["a"] is not None),
    ViewSpec("v_by_b", f"SELECT k, a FROM {BASE} WHERE b IS NOT NULL PRIMARY KEY (b, k)", ("b", "k", "a"),
             lambda r: r["b"] is not None),
    ViewSpec("v_high_a", f"SELECT * FROM {BASE} WHERE a >= 500 PRIMARY KEY (k)", ("k", "a", "b"),
             lambda r: r["a"] is not None and r["a"] >= 500),
    ViewSpec("v_k_a", f"SELECT * FROM {BASE} WHERE a < 300 AND b IN ('b01', 'b02', 'b03') PRIMARY KEY (k, a)",
             ("k", "a", "b"), lambda r: r["a"] is not None and r["a"] < 300 and r["b"] in ("b01", "b02", "b03")),
]
INDEXES = {"idx_b": "b", "idx_a": "a"}  # index name -> indexed column


# ------------------------------------------------------------------ the client-side model


@dataclass
class RowState:
    """One base row as last-write-wins stores it: marker, tombstone and per-cell (timestamp, value)."""

    marker: int = 0
    tomb: int = 0
    cells: dict = field(default_factory=dict)


def newer_cell(old: tuple | None, new: tuple) -> tuple:
    """storage/cells.py's rule: the higher timestamp wins; on a tie a deletion, then the greater value."""
    if old is None or new[0] > old[0]:
        return new
    if new[0] < old[0]:
        return old
    if old[1] is None or new[1] is None:
        return (new[0], None)
    return max(old, new, key=lambda cell: cell[1])


@dataclass(frozen=True)
class Write:
    """One statement: kind insert | update | delete of key k, the cells it sets, its timestamp."""

    kind: str
    k: int
    cells: tuple
    ts: int

    def cql(self) -> str:
        if self.kind == "delete":
            return f"DELETE FROM {BASE} USING TIMESTAMP {self.ts} WHERE k = {self.k}"
        if self.kind == "insert":
            names = ", ".join(["k"] + [c for c, _ in self.cells])
            values = ", ".join([str(self.k)] + [literal(v) for _, v in self.cells])
            return f"INSERT INTO {BASE} ({names}) VALUES ({values}) USING TIMESTAMP {self.ts}"
        sets = ", ".join(f"{c} = {literal(v)}" for c, v in self.cells)
        return f"UPDATE {BASE} USING TIMESTAMP {self.ts} SET {sets} WHERE k = {self.k}"


def staged_values(unit: Unit) -> pa.Table:
    """A staged unit's (k, a, b) value sets as Arrow columns."""
    cells = [dict(w.cells) for w in unit.writes]
    return pa.table({"k": pa.array([w.k for w in unit.writes], pa.int32()),
                     "a": pa.array([c["a"] for c in cells], pa.int32()), "b": pa.array([c["b"] for c in cells])})


def literal(value: object) -> str:
    if value is None:
        return "null"
    return f"'{value}'" if isinstance(value, str) else str(value)


class Model:
    """What the base table holds after every acknowledged write, by the storage's merge rule."""

    def __init__(self) -> None:
        self.rows: dict[int, RowState] = {}

    def apply(self, write: Write) -> None:
        row = self.rows.setdefault(write.k, RowState())
        if write.kind == "delete":
            row.tomb = max(row.tomb, write.ts)
            return
        row.marker = max(row.marker, write.ts)
        for column, value in write.cells:
            row.cells[column] = newer_cell(row.cells.get(column), (write.ts, value))

    def visible(self) -> dict[int, dict]:
        """The live rows as a SELECT * answers them: {k: {"k", "a", "b"}}."""
        return {k: {"k": k, **{c: visible_value(row, c) for c in ("a", "b")}}
                for k, row in self.rows.items() if row.marker > row.tomb}


def visible_value(row: RowState, column: str) -> object:
    cell = row.cells.get(column)
    return cell[1] if cell is not None and cell[0] > row.tomb else None


# ------------------------------------------------------------------ the writer


@dataclass
class Unit:
    """What one Execute sends: one statement, or a BATCH of several (each with its own timestamp); where it was made
    and how many times it was sent."""

    writes: list[Write]
    made: str = ""
    attempts: int = 0
    staged: bool = False  # inserts of one timestamp, sent as a bulk load's Arrow values (the staging path)

    def cql(self) -> str:
        if self.staged:
            return f"INSERT INTO {BASE} (k, a, b) VALUES (?, ?, ?) USING TIMESTAMP {self.writes[0].ts}"
        if len(self.writes) == 1:
            return self.writes[0].cql()
        return "BEGIN UNLOGGED BATCH " + "; ".join(w.cql() for w in self.writes) + "; APPLY BATCH"


class Writer:
    """Makes writes, sends them until acknowledged (same timestamps on every retry) and records them in the model;
    every acknowledged unit goes to the journal, and each key keeps the story of its last writes (for reports)."""

    def __init__(self, model: Model, addresses: Callable[[], list[str]], journal: Callable[[str], None]):
        self.model = model
        self._addresses = addresses
        self._journal = journal
        self._last_ts = 0
        self.context = "setup"  # "step N kind", set by the run
        self.pending: list[Unit] = []
        self.history: dict[int, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=4))
        self.units = self.statements = self.failed_attempts = self.background = self.staged_units = 0
        self.errors: collections.Counter = collections.Counter()

    def timestamp(self) -> int:
        """A client-side clock in microseconds: the wall clock, never repeating nor going back."""
        self._last_ts = max(self._last_ts + 1, time.time_ns() // 1000)
        return self._last_ts

    def make_unit(self, rng: random.Random, background: bool = False) -> Unit:
        made = self.context + (" (during the operation)" if background else "")
        if rng.random() < STAGED_SHARE:
            return self.make_staged_unit(rng, made)
        count = 1 if rng.random() < 0.7 else rng.randint(2, 5)
        return Unit([self.make_write(rng) for _ in range(count)], made)

    def make_staged_unit(self, rng: random.Random, made: str) -> Unit:
        """Inserts of distinct keys at one timestamp, loaded as `vbc load` does (staged into a table with views)."""
        ts = self.timestamp()
        writes = [Write("insert", k, (("a", None if rng.random() < 0.1 else rng.randrange(1000)),
                                      ("b", None if rng.random() < 0.1 else rng.choice(B_VALUES))), ts)
                  for k in sorted(rng.sample(range(KEYS), rng.randint(5, 40)))]
        return Unit(writes, made, staged=True)

    def make_write(self, rng: random.Random) -> Write:
        k, roll = rng.randrange(KEYS), rng.random()
        if roll < 0.2:
            return Write("delete", k, (), self.timestamp())
        a = None if rng.random() < 0.1 else rng.randrange(1000)
        b = None if rng.random() < 0.1 else rng.choice(B_VALUES)
        if roll < 0.65:
            return Write("insert", k, (("a", a), ("b", b)), self.timestamp())
        cells = rng.choice([(("a", a),), (("b", b),), (("a", a), ("b", b))])
        return Write("update", k, cells, self.timestamp())

    def attempt(self, unit: Unit, turn: int) -> bool:
        """One try of `unit` through the live nodes (starting at a rotating one); True once acknowledged."""
        addresses = self._addresses()
        start = turn % max(len(addresses), 1)
        unit.attempts += 1
        try:
            client.execute(addresses[start:] + addresses[:start], unit.cql(), timeout=WRITE_RPC_TIMEOUT,
                           params=staged_values(unit) if unit.staged else None, staged=unit.staged)
        except grpc.RpcError as error:
            self.failed_attempts += 1
            self.errors[client.error_text(error)[:160]] += 1
            return False
        self.acknowledged(unit)
        return True

    def acknowledged(self, unit: Unit) -> None:
        story = f"made at {unit.made}, acknowledged at {self.context} after {unit.attempts} attempt(s)"
        for write in unit.writes:
            self.model.apply(write)
            self.history[write.k].append((write.ts, f"ts {write.ts} {write.kind} {dict(write.cells)}: {story}"))
        self.units += 1
        self.staged_units += unit.staged
        self.statements += len(unit.writes)
        self._journal(f"write {story}: {unit.cql()}" + (f" staged keys {[w.k for w in unit.writes]}" if unit.staged
                                                         else ""))

    def send(self, unit: Unit, timeout: float) -> bool:
        """Retry `unit` until acknowledged or `timeout` (then it waits in `pending`); True when acknowledged."""
        deadline, pause, turn = time.monotonic() + timeout, 0.2, 0
        while not self.attempt(unit, turn):
            turn += 1
            if time.monotonic() + pause > deadline:
                self.pending.append(unit)
                return False
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
        return True

    def background_tick(self, rng: random.Random) -> None:
        """A few writes while a topology operation is awaited: one try each, refused ones go to `pending`."""
        if self.pending:
            unit = self.pending.pop(0)
            if not self.attempt(unit, rng.randrange(8)):
                self.pending.append(unit)
        for _ in range(BACKGROUND_UNITS if len(self.pending) < MAX_PENDING else 0):
            unit = self.make_unit(rng, background=True)
            if self.attempt(unit, rng.randrange(8)):
                self.background += 1
            else:
                self.pending.append(unit)

    def flush_pending(self, timeout: float) -> int:
        """Send every pending unit until acknowledged, within `timeout` overall; how many are left."""
        deadline = time.monotonic() + timeout
        waiting, self.pending = self.pending, []
        for unit in waiting:
            self.send(unit, max(deadline - time.monotonic(), 0.0))
        return len(self.pending)


# ------------------------------------------------------------------ outcomes


class Refused(Exception):
    """The cluster declined the operation for a documented reason (e.g. a tablet already moving): not a failure."""


class OpFailed(Exception):
    """The operation failed or timed out; the message says what and where."""


class Reverted(Exception):
    """A migration this run started ended reverted (rolled back) instead of done."""


class HardDeadline(BaseException):
    """The overall hard deadline passed."""


def on_alarm(signum, frame) -> None:
    raise HardDeadline()


def error_text(error: BaseException) -> str:
    if isinstance(error, grpc.RpcError):
        return client.error_text(error)
    return f"{type(error).__name__}: {error}"


def is_refusal(error: grpc.RpcError) -> bool:
    return error.code() == grpc.StatusCode.FAILED_PRECONDITION


def is_transient(error: grpc.RpcError) -> bool:
    return error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


# ------------------------------------------------------------------ the cluster


class Cluster:
    """The local cluster of this run: started with the `vbc cluster up` code; every pid it spawned is remembered."""

    def __init__(self, data_dir: Path, say: Callable[[str], None]):
        self.data_dir = data_dir
        self.pids: list[int] = []
        self._say = say

    def _spawn(self, node: dict, die_with_parent: bool) -> int:
        pid = cluster_mod.spawn_node(node, die_with_parent)
        self.pids.append(pid)
        return pid

    def start(self, nodes: int) -> dict:
        return cluster_mod.start_cluster(self.data_dir, nodes=nodes, shards=SHARDS, timeout=START_TIMEOUT,
                                         die_with_parent=True, spawn=self._spawn, injections=True)

    def records(self) -> list[dict]:
        return cluster_mod.load_cluster(self.data_dir)["nodes"]

    def live(self) -> list[dict]:
        """The nodes of cluster.json whose process runs, by id."""
        return sorted((n for n in self.records() if cluster_mod.running_pid(n)), key=lambda n: n["id"])

    def live_ids(self) -> list[str]:
        return [n["id"] for n in self.live()]

    def addresses(self) -> list[str]:
        """Every node's address, the running ones first (a dead one is passed over by the client library)."""
        records = self.records()
        running = [n["grpc"] for n in records if cluster_mod.running_pid(n)]
        return running + [n["grpc"] for n in records if n["grpc"] not in running]

    def addr(self, node_id: str) -> str:
        return cluster_mod.find_node(cluster_mod.load_cluster(self.data_dir), node_id)["grpc"]

    def others(self, node_id: str) -> list[str]:
        return [n["grpc"] for n in self.live() if n["id"] != node_id]

    def kill(self, node_id: str) -> str:
        return cluster_mod.stop_node(self.data_dir, node_id, kill=True)

    def restart(self, node_id: str) -> int:
        return cluster_mod.start_node(self.data_dir, node_id, timeout=START_TIMEOUT, die_with_parent=True,
                                      spawn=self._spawn)

    def add(self) -> dict:
        return cluster_mod.add_node(self.data_dir, timeout=START_TIMEOUT, die_with_parent=True, spawn=self._spawn)

    def forget(self, node_id: str) -> None:
        cluster_mod.forget_node(self.data_dir, node_id)

    def stop_everything(self) -> dict[int, str]:
        """SIGTERM every pid this run started, SIGKILL what is left after 15 s (process groups included)."""
        return cluster_mod.stop_pids(self.pids, timeout=15.0)

    def log_evidence(self, lines: int = 8) -> list[str]:
        """The last errors and migration warnings of every node log of the run (removed nodes included)."""
        found = []
        for log in sorted(self.data_dir.glob("n*/" + cluster_mod.LOG_NAME)):
            text = log.read_text(errors="replace").splitlines()
            hits = [line for line in text if any(mark in line for mark in EVIDENCE_MARKS)]
            found += [f"{log.parent.name}: {line[:300]}" for line in hits[-lines:]]
        return found


# ------------------------------------------------------------------ the run


class Soak:
    """The seeded sequence of operations, its bookkeeping and the final checks."""

    def __init__(self, seed: int, minutes: float, data_dir: Path):
        self.seed, self.minutes = seed, minutes
        self.rng = random.Random(seed)
        self.background_rng = random.Random(f"{seed}/background")
        self.began = time.monotonic()
        self.cluster = Cluster(data_dir, self.say)
        self.journal_path = data_dir / JOURNAL_NAME
        self._journal_file = open(self.journal_path, "a", buffering=1)
        self.model = Model()
        self.writer = Writer(self.model, self.cluster.addresses, self.journal)
        self.rf, self.tablet_count, self.balancer_on = 2, INITIAL_TABLETS, True
        self.views: list[ViewSpec] = []
        self.indexes: list[str] = []
        self.injected: list[tuple[str, str]] = []
        self.outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.failures: list[str] = []
        self.checks: list[tuple[str, bool, str]] = []
        self.step = 0
        self.background_writes = False
        self.unsettled = False  # an operation failed: nodes may be half-removed until `reconcile` sees them settle

    # -------------------------------------------------------------- output

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.began
        print(f"{time.strftime('%H:%M:%S')} +{elapsed:7.1f}s {text}", flush=True)

    def fail(self, text: str) -> None:
        self.failures.append(f"step {self.step}: {text}")

    def journal(self, text: str) -> None:
        """A line of DATA_DIR/soak-journal.log: every acknowledged write, operation and tablet map, timestamped."""
        self._journal_file.write(f"{time.strftime('%H:%M:%S')} {time.time():.3f} {text}\n")

    def close_journal(self) -> None:
        """Close the journal (the cluster is stopped)."""
        self._journal_file.close()

    def journal_tablets(self) -> None:
        """The replicas of every tablet of every table now (for reports: where rows and view updates went)."""
        try:
            for table in self.tables():
                maps = [f"{t['tablet']}:{','.join(t['replicas'])}" + (f"[{t['stage']}]" if t.get("stage") else "")
                        for t in client.tablets(self.cluster.addresses(), table)]
                self.journal(f"tablets of {table}: {' '.join(maps)}")
        except grpc.RpcError as error:
            self.journal(f"tablets: {error_text(error)}")

    # -------------------------------------------------------------- waiting

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str):
        """Poll `predicate` until truthy (returned); errors count as not yet. A few writes go on between polls
        while `background_writes` is set. OpFailed names `what` and the last error after `timeout`."""
        deadline, last_error = time.monotonic() + timeout, None
        while True:
            try:
                value = predicate()
                if value:
                    return value
                last_error = None
            except (grpc.RpcError, cluster_mod.ClusterError, LookupError) as error:
                last_error = error
            if time.monotonic() >= deadline:
                detail = f"; last error: {error_text(last_error)}" if last_error else ""
                raise OpFailed(f"timed out after {timeout:g} s waiting for {what}{detail}")
            if self.background_writes:
                self.writer.background_tick(self.background_rng)
            time.sleep(POLL)

    def ask(self, request: Callable[[], object], what: str, patience: float = REFUSAL_PATIENCE):
        """`request()`, asked again while the cluster refuses it (FAILED_PRECONDITION) or is briefly unavailable;
        Refused once `patience` runs out on a refusal."""
        deadline = time.monotonic() + patience
        while True:
            try:
                return request()
            except grpc.RpcError as error:
                if not (is_refusal(error) or is_transient(error)) or time.monotonic() >= deadline:
                    if is_refusal(error):
                        raise Refused(f"{what}: {client.error_text(error)}") from None
                    raise
            if self.background_writes:
                self.writer.background_tick(self.background_rng)
            time.sleep(1.0)

    def status(self, views_only: bool = False) -> dict:
        return client.status(self.cluster.addresses(), views_only=views_only)

    # -------------------------------------------------------------- the sequence

    def weights(self) -> list[tuple[str, int]]:
        """The operations that make sense now (3 or 4 nodes kept), with their weights; fixed order."""
        nodes = len(self.cluster.records())
        table = [
            ("writes", 30, True),
            ("create_view", 6 if not self.views else 2, len(self.views) < len(VIEWS)),
            ("create_index", 2, len(self.indexes) < len(INDEXES)),
            ("move", 12, True),
            ("split", 3, self.tablet_count < MAX_TABLETS),
            ("merge", 3, self.tablet_count > 1),
            ("alter_rf", 5, True),
            ("add_node", 5, nodes < 4),
            ("decommission", 4, nodes > 3),
            ("kill_and_remove", 4, nodes > 3 and self.rf >= 2),
            ("kill_leader", 4, True),
            ("balancer", 3, True),
            ("inject", 3, True),
        ]
        return [(kind, weight) for kind, weight, allowed in table if allowed]

    def run(self) -> None:
        self.setup()
        end = self.began + self.minutes * 60
        while time.monotonic() < end:
            self.step += 1
            choices = self.weights()
            kind = self.rng.choices([k for k, _ in choices], [w for _, w in choices])[0]
            self.run_op(kind, random.Random(self.rng.getrandbits(64)))
            time.sleep(PACE)

    def run_op(self, kind: str, rng: random.Random) -> None:
        if self.unsettled:
            self.reconcile()
        self.say(f"step {self.step} {kind}: start")
        self.journal(f"step {self.step} {kind}: start")
        self.writer.context = f"step {self.step} {kind}"
        started = time.monotonic()
        self.background_writes = kind != "writes"
        try:
            detail = getattr(self, f"op_{kind}")(rng)
            outcome = "done"
        except Refused as refusal:
            outcome, detail = "refused", str(refusal)
        except Reverted as revert:
            outcome, detail = "reverted", str(revert)
        except (OpFailed, grpc.RpcError, cluster_mod.ClusterError, TimeoutError, LookupError) as error:
            outcome, detail = "FAILED", error_text(error) if not isinstance(error, OpFailed) else str(error)
        except Exception as error:  # noqa: BLE001 - a bug of this script: reported with its traceback, the run goes on
            outcome, detail = "FAILED", f"{error_text(error)}\n{traceback.format_exc()}"
        finally:
            self.background_writes = False
        self.outcomes[kind][outcome] += 1
        if outcome == "FAILED":
            self.fail(f"{kind}: {detail}")
        self.say(f"step {self.step} {kind}: {outcome} ({time.monotonic() - started:.1f} s): {detail}")
        self.journal(f"step {self.step} {kind}: {outcome}: {detail}")
        if kind != "writes":
            self.journal_tablets()
        if outcome == "FAILED":
            self.unsettled = True
            self.repair()

    def reconcile(self) -> None:
        """After a failure: forget (and stop) the nodes of cluster.json the cluster has removed meanwhile."""
        states = {}
        for node in self.cluster.records():
            try:
                states[node["id"]] = client.node_state(self.cluster.others(node["id"]), node["id"])["state"]
            except grpc.RpcError as error:
                states[node["id"]] = error_text(error)
            if states[node["id"]] in ("removed", "unknown"):
                self.cluster.forget(node["id"])
                self.say(f"reconcile: {node['id']} was removed from the cluster meanwhile; its process is stopped")
        self.unsettled = any(state not in ("normal", "removed", "unknown") for state in states.values())

    def repair(self) -> None:
        """After a failure: start again every node of cluster.json whose process does not run, so the run goes on."""
        for node in self.cluster.records():
            if cluster_mod.running_pid(node):
                continue
            try:
                state = client.node_state(self.cluster.others(node["id"]), node["id"])["state"]
                if state in ("removed", "unknown"):
                    self.cluster.forget(node["id"])
                    self.say(f"repair: {node['id']} was removed from the cluster; forgotten")
                    continue
                self.cluster.restart(node["id"])
                self.say(f"repair: {node['id']} was not running ({state}); restarted")
            except (grpc.RpcError, cluster_mod.ClusterError) as error:
                self.say(f"repair: {node['id']} could not be restarted: {error_text(error)}")

    # -------------------------------------------------------------- setup

    def setup(self) -> None:
        self.say(f"starting 3 nodes ({SHARDS} shards each, SQLite, TLS, --enable-injections) in "
                 f"{self.cluster.data_dir}")
        started = self.cluster.start(3)
        self.say(f"cluster up, leader {started['leader']}: " + ", ".join(
            f"{n['id']} {n['grpc']} pid {n['pid']}" for n in started["nodes"]))
        self.ddl(f"CREATE KEYSPACE IF NOT EXISTS {KS} WITH replication = {{'rf': 2}} "
                 f"AND tablets = {{'initial': {INITIAL_TABLETS}}}")
        self.ddl(f"CREATE TABLE IF NOT EXISTS {BASE} (k int, a int, b text, PRIMARY KEY (k))")
        rng = random.Random(f"{self.seed}/initial")
        for _ in range(INITIAL_UNITS):
            if not self.writer.send(self.writer.make_unit(rng), WRITE_RETRY_TIMEOUT):
                self.fail("an initial write was not acknowledged")
        self.say(f"setup: keyspace {KS} (rf 2, {INITIAL_TABLETS} tablets), table {BASE}, "
                 f"{self.writer.statements} initial writes")

    def ddl(self, statement: str) -> str:
        """A schema statement, asked again while briefly unavailable; its answer's message."""
        _, _, message = self.ask(lambda: client.execute(self.cluster.addresses(), statement, timeout=60.0),
                                 statement.split(" AS ")[0])
        return message

    # -------------------------------------------------------------- operations

    def op_writes(self, rng: random.Random) -> str:
        count, before = rng.randint(5, 30), (self.writer.units, self.writer.statements, self.writer.failed_attempts)
        parked = sum(not self.writer.send(self.writer.make_unit(rng), WRITE_RETRY_TIMEOUT) for _ in range(count))
        units, statements, failed = (now - then for now, then in zip(
            (self.writer.units, self.writer.statements, self.writer.failed_attempts), before))
        if parked:
            self.fail(f"writes: {parked} unit(s) not acknowledged within {WRITE_RETRY_TIMEOUT:g} s (pending)")
        return (f"{units}/{count} units ({statements} statements) acknowledged, {failed} refused attempts retried"
                + (f", {parked} pending" if parked else ""))

    def op_create_view(self, rng: random.Random) -> str:
        spec = rng.choice([v for v in VIEWS if v not in self.views])
        message = self.ddl(spec.statement())
        self.views.append(spec)
        return f"{KS}.{spec.name}: {message}"

    def op_create_index(self, rng: random.Random) -> str:
        name = rng.choice(sorted(set(INDEXES) - set(self.indexes)))
        message = self.ddl(f"CREATE INDEX IF NOT EXISTS {name} ON {BASE} ({INDEXES[name]})")
        self.indexes.append(name)
        return f"{KS}.{name} on {INDEXES[name]}: {message}"

    def tables(self) -> list[str]:
        return [BASE] + [f"{KS}.{v.name}" for v in self.views] + [f"{KS}.{i}" for i in self.indexes]

    def op_move(self, rng: random.Random) -> str:
        table = BASE if rng.random() < 0.6 else rng.choice(self.tables())
        idle = [t for t in client.tablets(self.cluster.addresses(), table) if not t.get("stage")]
        if not idle:
            raise Refused(f"every tablet of {table} is moving")
        tablet = rng.choice(idle)
        source, destination = self.move_ends(rng, tablet)
        migration = self.start_move(table, tablet, source, destination)
        self.say(f"  moving tablet {tablet['tablet']} of {table} from {source} to {destination} "
                 f"(migration {migration[:8]})")
        result = self.wait_for(lambda: self.migration_ended(migration), TOPOLOGY_TIMEOUT,
                               f"migration {migration} of tablet {tablet['tablet']} of {table}")
        if result["state"] != "done":
            raise Reverted(f"migration {migration} of tablet {tablet['tablet']} of {table} {source} -> "
                           f"{destination}: {result['state']}: {result['reason']}")
        return f"tablet {tablet['tablet']} of {table}: {source} -> {destination}"

    def start_move(self, table: str, tablet: dict, source: str, destination: str) -> str:
        """The migration's id; Refused when the tablet moved or changed meanwhile (the balancer's doing)."""
        addresses = self.cluster.addresses()
        try:
            return self.ask(lambda: client.move_tablet(addresses, table, tablet["tablet"], source, destination),
                            f"move of tablet {tablet['tablet']} of {table}", patience=5.0)
        except grpc.RpcError as error:
            now = client.tablets(addresses, table)[tablet["tablet"]]
            if error.code() == grpc.StatusCode.INVALID_ARGUMENT and now["replicas"] != tablet["replicas"]:
                raise Refused(f"tablet {tablet['tablet']} of {table} changed meanwhile ({tablet['replicas']} -> "
                              f"{now['replicas']}): {client.error_text(error)}") from None
            raise

    def move_ends(self, rng: random.Random, tablet: dict) -> tuple[str, str]:
        """A replica of `tablet` and where it goes: a node that does not hold it, else another shard of its node."""
        source = rng.choice(tablet["replicas"])
        holders = {r.split(":")[0] for r in tablet["replicas"]}
        elsewhere = [n for n in self.cluster.live_ids() if n not in holders]
        if elsewhere and rng.random() < 0.85:
            return source, f"{rng.choice(elsewhere)}:{rng.randrange(SHARDS)}"
        node, _, shard = source.partition(":")
        return source, f"{node}:{(int(shard or 0) + 1) % SHARDS}"

    def migration_ended(self, migration_id: str) -> dict | None:
        current = client.migration(self.cluster.addresses(), migration_id)
        return current if current["state"] != "in_progress" else None

    def op_split(self, rng: random.Random) -> str:
        return self.resize(merge=False)

    def op_merge(self, rng: random.Random) -> str:
        return self.resize(merge=True)

    def resize(self, merge: bool) -> str:
        word = "merge" if merge else "split"
        addresses = self.cluster.addresses()
        before = len(client.tablets(addresses, BASE))
        _, target = self.ask(lambda: client.resize_tablets(addresses, BASE, merge), f"{word} of {BASE}")
        try:
            self.wait_for(lambda: len(client.tablets(self.cluster.addresses(), BASE)) == target, TOPOLOGY_TIMEOUT,
                          f"{BASE} to have {target} tablets after a {word}")
        finally:
            self.tablet_count = len(client.tablets(self.cluster.addresses(), BASE))
        return f"{BASE}: {before} -> {target} tablets"

    def op_alter_rf(self, rng: random.Random) -> str:
        rf = rng.choice([r for r in (1, 2, 3) if r != self.rf])
        message = self.ddl(f"ALTER KEYSPACE {KS} WITH replication = {{'rf': {rf}}}")
        previous, self.rf = self.rf, rf
        self.wait_for(lambda: self.replicated(rf), TOPOLOGY_TIMEOUT, f"every tablet of {KS} to have {rf} replicas")
        return f"rf {previous} -> {rf} ({message})"

    def replicated(self, rf: int) -> bool:
        addresses = self.cluster.addresses()
        return all(len(t["replicas"]) == rf and not t.get("stage")
                   for table in self.tables() for t in client.tablets(addresses, table))

    def op_add_node(self, rng: random.Random) -> str:
        node = self.cluster.add()
        self.wait_for(lambda: self.alive_in_status(node["id"]), TOPOLOGY_TIMEOUT, f"{node['id']} to be alive")
        return f"{node['id']} joined (grpc {node['grpc']}, pid {node['pid']})"

    def alive_in_status(self, node_id: str) -> bool:
        return any(n["id"] == node_id and n["alive"] for n in self.status()["nodes"])

    def op_decommission(self, rng: random.Random) -> str:
        node_id = rng.choice(self.cluster.live_ids())
        leader = self.status()["leader"]
        others = self.cluster.others(node_id)
        started = self.ask(lambda: client.decommission(others, node_id), f"decommission of {node_id}")
        self.say(f"  {node_id}{' (the leader)' if node_id == leader else ''}: {started['state']}, "
                 f"{started['replicas']} replica(s) to move")
        self.wait_removed(node_id)
        return f"{node_id} decommissioned{' (it was the leader)' if node_id == leader else ''}"

    def wait_removed(self, node_id: str) -> None:
        others = self.cluster.others(node_id)
        self.wait_for(lambda: client.node_state(others, node_id)["state"] in ("removed", "unknown"), TOPOLOGY_TIMEOUT,
                      f"{node_id} to be removed from the cluster")
        self.cluster.forget(node_id)

    def op_kill_and_remove(self, rng: random.Random) -> str:
        leader = self.wait_for(lambda: self.status()["leader"], LEADER_TIMEOUT, "a Raft leader")
        node_id = rng.choice([n for n in self.cluster.live_ids() if n != leader])
        self.cluster.kill(node_id)
        self.say(f"  {node_id} killed (-9)")
        others = self.cluster.others(node_id)
        try:
            self.ask(lambda: client.decommission(others, node_id, dead=True), f"removal of {node_id}")
        except Refused:
            self.cluster.restart(node_id)
            raise
        self.wait_removed(node_id)
        return f"{node_id} killed and removed"

    def op_kill_leader(self, rng: random.Random) -> str:
        leader = self.wait_for(lambda: self.status()["leader"], LEADER_TIMEOUT, "a Raft leader")
        self.cluster.kill(leader)
        killed = time.monotonic()
        others = self.cluster.others(leader)
        successor = self.wait_for(lambda: self.new_leader(others, leader), LEADER_TIMEOUT,
                                  f"a new Raft leader after {leader} was killed")
        elected = time.monotonic() - killed
        self.cluster.restart(leader)
        self.wait_for(lambda: self.alive_in_status(leader), TOPOLOGY_TIMEOUT, f"{leader} to be alive again")
        return (f"killed leader {leader}; {successor} elected after {elected:.1f} s; {leader} back after "
                f"{time.monotonic() - killed:.1f} s")

    @staticmethod
    def new_leader(addresses: list[str], old: str) -> str:
        leader = client.status(addresses, views_only=True)["leader"]
        return leader if leader and leader != old else ""

    def op_balancer(self, rng: random.Random) -> str:
        action = "off" if self.balancer_on else "on"
        result = client.balancer(self.cluster.addresses(), action)
        self.balancer_on = result["enabled"]
        return f"balancer {action}; loads {result['loads']}"

    def op_inject(self, rng: random.Random) -> str:
        point, node_id = rng.choice(INJECTION_POINTS), rng.choice(self.cluster.live_ids())
        client.inject(self.cluster.addr(node_id), point, "enable", mode="fail", one_shot=True)
        self.injected.append((node_id, point))
        return f"{point} enabled on {node_id} (fail, one-shot)"

    # -------------------------------------------------------------- the final checks

    def finish(self) -> None:
        self.step += 1
        final_deadline = time.monotonic() + FINAL_TIMEOUT
        self.say(f"final phase: {len(self.writer.pending)} pending write(s), views {[v.name for v in self.views]}, "
                 f"indexes {self.indexes}")
        self.disable_injections()
        self.final_stage("pending writes", lambda: self.flush(final_deadline))
        self.final_stage("staged rows processed", lambda: self.wait_staged(remaining(final_deadline)))
        self.final_stage("migrations ended", lambda: self.wait_quiet(remaining(final_deadline)))
        self.reconcile()
        self.journal_tablets()
        self.final_stage("views built", lambda: self.wait_built(remaining(final_deadline)))
        self.final_stage("view updates delivered", lambda: self.wait_flushed(remaining(final_deadline)))
        for name in [v.name for v in self.views] + self.indexes:
            self.final_stage(f"vbc check {KS}.{name}", lambda name=name: self.check_view(name))
        expected = self.model.visible()
        for node in self.cluster.live():
            self.final_stage(f"SELECT * FROM {BASE} through {node['id']}",
                             lambda node=node: self.compare_base(node, expected))
        for spec in self.views:
            self.final_stage(f"rows of {KS}.{spec.name}", lambda spec=spec: self.compare_view(spec, expected))
        for name in self.indexes:
            self.final_stage(f"lookups through {KS}.{name}", lambda name=name: self.compare_index(name, expected))

    def final_stage(self, what: str, run: Callable[[], str]) -> None:
        started = time.monotonic()
        try:
            detail, ok = run(), True
        except (OpFailed, grpc.RpcError, TimeoutError, LookupError, AssertionError) as error:
            detail, ok = str(error) if isinstance(error, (OpFailed, AssertionError)) else error_text(error), False
        self.checks.append((what, ok, detail))
        self.say(f"check {what}: {'ok' if ok else 'MISMATCH'} ({time.monotonic() - started:.1f} s): {detail}")

    def disable_injections(self) -> None:
        for node_id, point in self.injected:
            try:
                client.inject(self.cluster.addr(node_id), point, "disable")
            except (grpc.RpcError, cluster_mod.ClusterError):
                pass  # the node left the cluster

    def flush(self, deadline: float) -> str:
        pending = len(self.writer.pending)
        left = self.writer.flush_pending(min(remaining(deadline), 300.0))
        if left:
            raise AssertionError(f"{left} of {pending} pending write unit(s) never acknowledged: the model is not "
                                 "exact")
        return f"{pending} pending unit(s) acknowledged"

    def wait_quiet(self, timeout: float) -> str:
        seen: list[bool] = []

        def quiet() -> bool:
            status = self.status()
            moving = status["migrations"] or any(t.get("stage") for table in self.tables()
                                                  for t in client.tablets(self.cluster.addresses(), table))
            seen.append(not moving and all(n["alive"] for n in status["nodes"]))
            return len(seen) >= 2 and seen[-1] and seen[-2]
        self.wait_for(quiet, timeout, "every migration to end (two polls in a row without one)")
        counts = {t: len(client.tablets(self.cluster.addresses(), t)) for t in self.tables()}
        return f"no migration; tablets {counts}; nodes {self.cluster.live_ids()}"

    def wait_staged(self, timeout: float) -> str:
        self.wait_for(lambda: not self.status(views_only=True)["staging"], timeout,
                      "every staged row of a load to be processed")
        return f"no staged rows left ({self.writer.staged_units} staged unit(s) acknowledged in the run)"

    def wait_built(self, timeout: float) -> str:
        names = {f"{KS}.{v.name}" for v in self.views} | {f"{KS}.{i}" for i in self.indexes}

        def built() -> bool:
            states = {v["name"]: v["state"] for v in self.status(views_only=True)["views"]}
            return all(states.get(name) == "BUILT" for name in names)
        self.wait_for(built, timeout, f"{', '.join(sorted(names)) or 'no view'} to be BUILT")
        return f"{len(names)} view(s) and index(es) BUILT"

    def wait_flushed(self, timeout: float) -> str:
        self.wait_for(lambda: all(n["alive"] and n["pending_view_updates"] == 0 for n in self.status()["nodes"]),
                      timeout, "every node alive with no pending view update")
        return "no pending view update on any node"

    def check_view(self, name: str) -> str:
        result = client.check(self.cluster.addresses(), f"{KS}.{name}", timeout=300.0)
        text = (f"{result['state']}, base rows {result['base_rows']}, view rows {result['view_rows']}, missing "
                f"{result['missing']}, extra {result['extra']}, different {result['different']}, replicas checked "
                f"{result['replicas_checked']}")
        if not result["consistent"] or result["state"] != "BUILT":
            keys = [int(k) for e in result["examples"] for k in re.findall(r"\bk=(-?\d+)", e["key"])]
            raise AssertionError(f"{text}; examples {result['examples']}{self.stories(keys)}")
        return text

    def compare_base(self, node: dict, expected: dict[int, dict]) -> str:
        rows = client.query([node["grpc"]], f"SELECT * FROM {BASE}", timeout=120.0)
        got = {row["k"]: {c: row[c] for c in ("k", "a", "b")} for row in rows}
        if len(rows) != len(got):
            raise AssertionError(f"{len(rows)} rows but {len(got)} distinct keys")
        return differences(got, expected, "rows")

    def compare_view(self, spec: ViewSpec, expected: dict[int, dict]) -> str:
        rows = client.query(self.cluster.addresses(), f"SELECT * FROM {KS}.{spec.name}", timeout=120.0)
        got = collections.Counter(tuple(row[c] for c in spec.columns) for row in rows)
        want = collections.Counter(tuple(row[c] for c in spec.columns) for row in expected.values() if spec.keep(row))
        if got != want:
            keys = [row[spec.columns.index("k")] for row in (want - got) + (got - want)]
            raise AssertionError(f"{sum(got.values())} rows, expected {sum(want.values())}; missing "
                                 f"{sorted((want - got).elements())[:5]}, extra {sorted((got - want).elements())[:5]}"
                                 f"{self.stories(keys)}")
        return f"{sum(got.values())} rows as the model says"

    def compare_index(self, name: str, expected: dict[int, dict]) -> str:
        column = INDEXES[name]
        present = sorted({row[column] for row in expected.values() if row[column] is not None})
        values = random.Random(f"{self.seed}/{name}").sample(present, min(10, len(present)))
        values.append("b_absent" if column == "b" else -1)
        for value in values:
            rows = client.query(self.cluster.addresses(), f"SELECT k FROM {BASE} WHERE {column} = {literal(value)}")
            got = collections.Counter(row["k"] for row in rows)
            want = collections.Counter(k for k, row in expected.items() if row[column] == value)
            if got != want:
                wrong = (want - got) + (got - want)
                raise AssertionError(f"{column} = {value!r}: {sum(got.values())} keys, expected {sum(want.values())}; "
                                     f"missing {sorted((want - got).elements())[:10]}, extra "
                                     f"{sorted((got - want).elements())[:10]}{self.stories(wrong)}")
        return f"{len(values)} lookups answered the model's keys"

    def stories(self, keys) -> str:
        """The last acknowledged writes of up to 3 of `keys` (by timestamp), for a mismatch's report."""
        lines = [f"\n      k={k}: {story}" for k in sorted(set(keys))[:3]
                 for _, story in sorted(self.writer.history.get(k, []))]
        return "; their last writes:" + "".join(lines) if lines else ""

    # -------------------------------------------------------------- the summary

    def summary(self) -> bool:
        ok = not self.failures and all(passed for _, passed, _ in self.checks) and bool(self.checks)
        print("\n==== soak summary", flush=True)
        print(f"seed {self.seed}, {self.minutes:g} minute(s), {self.step} step(s), "
              f"{time.monotonic() - self.began:.0f} s in all")
        for kind in sorted(self.outcomes):
            print(f"  {kind:<16} " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.outcomes[kind].items())))
        w = self.writer
        print(f"  writes: {w.units} units ({w.statements} statements) acknowledged, {w.background} of the units "
              f"during topology operations, {w.failed_attempts} refused attempts retried, {len(w.pending)} pending")
        for error, count in w.errors.most_common(5):
            print(f"    {count} x {error}")
        print(f"  final rf {self.rf}, {self.tablet_count} base tablets, balancer "
              f"{'on' if self.balancer_on else 'off'}, views {[v.name for v in self.views]}, indexes {self.indexes}")
        print(f"failures: {len(self.failures)}")
        for failure in self.failures:
            print(f"  {failure}")
        print("final checks:" if self.checks else "final checks: not run")
        for what, passed, detail in self.checks:
            print(f"  {'ok      ' if passed else 'MISMATCH'} {what}: {detail}")
        print(f"soak {'PASSED' if ok else 'FAILED'} (seed {self.seed})", flush=True)
        return ok


def differences(got: dict, want: dict, noun: str) -> str:
    """'' when equal, else AssertionError naming a few missing, extra and different keys."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    different = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    if missing or extra or different:
        raise AssertionError(f"{len(got)} {noun}, model {len(want)}: missing {len(missing)} {missing[:5]}, extra "
                             f"{len(extra)} {[got[k] for k in extra[:5]]}, different {len(different)} "
                             f"{[(got[k], want[k]) for k in different[:5]]}")
    return f"{len(got)} {noun}, exactly the model's"


def remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 1.0)


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of operations (default 10)")
    parser.add_argument("--seed", type=int, help="seed of the choices (default: a random one, printed)")
    parser.add_argument("--keep-data", action="store_true", help="keep the data directory even when the run passed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    data_dir = Path(tempfile.mkdtemp(prefix="vbc-soak-"))
    soak = Soak(seed, args.minutes, data_dir)
    soak.say(f"soak: seed {seed}, {args.minutes:g} minute(s), data in {data_dir} "
             f"(again: make soak MINUTES={args.minutes:g} SEED={seed})")
    cluster_mod.stop_on_signals()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.minutes * 60 + HARD_EXTRA))
    ok = False
    try:
        soak.run()
        soak.finish()
    except HardDeadline:
        soak.fail(f"the hard deadline ({args.minutes:g} min + {HARD_EXTRA:g} s) passed")
    except KeyboardInterrupt:
        soak.fail("interrupted")
    except Exception as error:  # noqa: BLE001 - the cluster must still be stopped; reported as a failure
        soak.fail(f"{error_text(error)}\n{traceback.format_exc()}")
    finally:
        signal.alarm(0)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
        ok = finish_run(soak, args.keep_data)
    return 0 if ok else 1


def finish_run(soak: Soak, keep_data: bool) -> bool:
    """Stop every process of the run, print the summary, and the node logs' errors when something failed."""
    outcome = soak.cluster.stop_everything()
    soak.close_journal()
    soak.say(f"stopped {len(outcome)} process(es) started by this run: "
             + ", ".join(f"{pid} {what}" for pid, what in outcome.items()))
    ok = soak.summary()
    if not ok:
        evidence = soak.cluster.log_evidence()
        print(f"node logs in {soak.cluster.data_dir}/n*/node.log" + ("; their last errors:" if evidence else ""))
        for line in evidence:
            print(f"  {line}")
    if ok and not keep_data:
        shutil.rmtree(soak.cluster.data_dir, ignore_errors=True)
    else:
        print(f"data kept in {soak.cluster.data_dir} (every acknowledged write, operation and tablet map: "
              f"{soak.journal_path})")
    return ok


if __name__ == "__main__":
    sys.exit(main())
