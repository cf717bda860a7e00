"""Benchmark of group0 commit latency: 3 Group0 members on loopback, tuned vs pysyncobj's batching default."""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

PROJECT_ROOT = str(Path(__file__).resolve().parents[1])
if PROJECT_ROOT not in sys.path:
    sys.path.insert(0, PROJECT_ROOT)

from coordinator.raft import Group0  # noqa: E402
from vbc.cluster import allocate_ports  # noqa: E402

MEMBER_IDS = ("n1", "n2", "n3")
PASSWORD = "bench-secret"
BASELINE_OVERRIDES = {"appendEntriesUseBatch": True}  # pysyncobj's default: entries ride the next heartbeat
WARMUP_COMMANDS = 50
ELECTION_TIMEOUT = 15.0
RESENT_ENTRY_WARNING = "truncating already-applied log entries"


class Counter:
    """The trivial state machine: counts commands."""

    def __init__(self):
        self.count = 0

    def apply(self, command: dict) -> int:
        self.count += 1
        return self.count


def propose_sequentially(member: Group0, n: int, tag: str) -> list[float]:
    """Latency in ms of n proposals made one after the other."""
    latencies = []
    for i in range(n):
        started = time.perf_counter()
        member.propose({"op": "inc", "cmd_id": f"{tag}-{i}"})
        latencies.append((time.perf_counter() - started) * 1000.0)
    return latencies


def summarize(latencies_ms: list[float]) -> dict:
    percentiles = statistics.quantiles(latencies_ms, n=100, method="inclusive")
    mean = statistics.fmean(latencies_ms)
    return {"n": len(latencies_ms), "p50_ms": percentiles[49], "p99_ms": percentiles[98], "mean_ms": mean,
            "commands_per_s": 1000.0 / mean}


def member_specs(root: Path, raft_overrides: dict) -> list[dict]:
    addrs = dict(zip(MEMBER_IDS, (f"127.0.0.1:{port}" for port in allocate_ports(len(MEMBER_IDS)))))
    return [{"node_id": node_id, "raft_addr": addr, "data_dir": str(root / node_id), "raft_overrides": raft_overrides,
             "peers": {other: other_addr for other, other_addr in addrs.items() if other != node_id}}
            for node_id, addr in addrs.items()]


def start_group0(spec: dict) -> Group0:
    member = Group0(node_id=spec["node_id"], raft_addr=spec["raft_addr"], peers=spec["peers"],
                    data_dir=spec["data_dir"], state_machine=Counter(), password=PASSWORD,
                    raft_overrides=spec["raft_overrides"])
    member.start()
    return member


class LocalMember:
    """A member in this process (its logs go to this process's logging, see log_to_file)."""

    def __init__(self, spec: dict, log_path: Path):
        self.node_id = spec["node_id"]
        self._group0 = start_group0(spec)

    def role(self) -> dict:
        return {"is_leader": self._group0.is_leader, "leader_id": self._group0.leader_id}

    def propose(self, n: int, tag: str) -> list[float]:
        return propose_sequentially(self._group0, n, tag)

    def close(self) -> None:
        self._group0.close()


class ProcessMember:
    """A member in a child process, driven by JSON lines over its stdin/stdout."""

    def __init__(self, spec: dict, log_path: Path):
        self.node_id = spec["node_id"]
        self._log = open(log_path, "w")
        self._process = subprocess.Popen([sys.executable, __file__, "--member", json.dumps(spec)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        try:
            self._call({"cmd": "ping"})
        except Exception:
            self._kill()
            raise

    def role(self) -> dict:
        return self._call({"cmd": "role"})

    def propose(self, n: int, tag: str) -> list[float]:
        return self._call({"cmd": "propose", "n": n, "tag": tag})["latencies_ms"]

    def close(self) -> None:
        try:
            self._call({"cmd": "close"})
            self._process.wait(timeout=10)
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            self._kill()
        finally:
            self._log.close()

    def _kill(self) -> None:
        self._process.kill()
        self._process.wait()

    def _call(self, request: dict) -> dict:
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        reply = self._process.stdout.readline()
        if not reply:
            raise RuntimeError(f"benchmark member {self.node_id} exited (see its log)")
        return json.loads(reply)


def serve_member(spec: dict) -> None:
    """Child process side of ProcessMember."""
    member = start_group0(spec)
    try:
        for line in sys.stdin:
            request = json.loads(line)
            if request["cmd"] == "ping":
                reply = {}
            elif request["cmd"] == "role":
                reply = {"is_leader": member.is_leader, "leader_id": member.leader_id}
            elif request["cmd"] == "propose":
                reply = {"latencies_ms": propose_sequentially(member, request["n"], request["tag"])}
            else:
                break
            print(json.dumps(reply), flush=True)
    finally:
        member.close()
    print(json.dumps({}), flush=True)


@contextmanager
def log_to_file(path: Path):
    """Send pysyncobj's warnings to path while members run in this process."""
    handler = logging.FileHandler(path)
    handler.setLevel(logging.WARNING)
    pysyncobj_logger = logging.getLogger("pysyncobj")
    pysyncobj_logger.addHandler(handler)
    pysyncobj_logger.propagate = False
    try:
        yield
    finally:
        pysyncobj_logger.removeHandler(handler)
        pysyncobj_logger.propagate = True
        handler.close()


def wait_for_leader(members: list) -> tuple:
    deadline = time.monotonic() + ELECTION_TIMEOUT
    while time.monotonic() < deadline:
        roles = {member.node_id: member.role() for member in members}
        leader_ids = {role["leader_id"] for role in roles.values()}
        leader_id = leader_ids.pop() if len(leader_ids) == 1 else None
        if roles.get(leader_id, {}).get("is_leader"):
            leader = next(member for member in members if member.node_id == leader_id)
            follower = next(member for member in members if member is not leader)
            return leader, follower
        time.sleep(0.05)
    raise RuntimeError(f"no agreed Raft leader within {ELECTION_TIMEOUT}s")


def measure_cluster(n: int, raft_overrides: dict, in_process: bool) -> dict:
    """Start a fresh 3-member cluster, then time n proposals from the leader and n from a follower."""
    member_class = LocalMember if in_process else ProcessMember
    with tempfile.TemporaryDirectory(prefix="raft-bench-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        if in_process:
            stack.enter_context(log_to_file(root / "in-process.log"))
        members = []
        for spec in member_specs(root, raft_overrides):
            member = member_class(spec, root / f"{spec['node_id']}.log")
            stack.callback(member.close)
            members.append(member)
        leader, follower = wait_for_leader(members)
        leader.propose(WARMUP_COMMANDS, "warmup")
        result = {"leader": summarize(leader.propose(n, "leader")),
                  "follower": summarize(follower.propose(n, "follower"))}
        stack.close()
        result["resent_entry_warnings"] = sum(log.read_text().count(RESENT_ENTRY_WARNING)
                                              for log in root.glob("*.log"))
    return result


def fsync_floor_ms(n: int = 200) -> float:
    """p50 of a 100-byte append and fsync in the directory the members' data goes to: what one sync costs here."""
    with tempfile.TemporaryDirectory(prefix="raft-bench-fsync-") as tmp:
        fd = os.open(Path(tmp) / "probe", os.O_WRONLY | os.O_CREAT)
        try:
            latencies = []
            for _ in range(n):
                started = time.perf_counter()
                os.write(fd, b"x" * 100)
                os.fsync(fd)
                latencies.append((time.perf_counter() - started) * 1000.0)
        finally:
            os.close(fd)
    return statistics.median(latencies)


def measure_commit_latency(n: int = 2000, baseline_n: int = 100, in_process: bool = False) -> dict:
    """Commit latency of group0's settings and of pysyncobj's batching default (baseline_n commands), and the
    disk's fsync floor measured in the same run (group0 syncs its journal before an append or its reply leaves)."""
    fsync_ms = fsync_floor_ms()
    tuned = measure_cluster(n, {}, in_process)
    baseline = measure_cluster(baseline_n, BASELINE_OVERRIDES, in_process)
    speedup = {role: baseline[role]["p50_ms"] / tuned[role]["p50_ms"] for role in ("leader", "follower")}
    return {"members": len(MEMBER_IDS), "mode": "in-process" if in_process else "process-per-member",
            "fsync_p50_ms": fsync_ms, "tuned": tuned, "baseline": baseline, "p50_speedup": speedup}


def print_report(report: dict) -> None:
    print(f"group0 commit latency, {report['members']} members on loopback, {report['mode']}")
    print(f"a plain 100-byte write + fsync here, p50: {report['fsync_p50_ms']:.3f} ms")
    print(f"{'config':<10} {'proposer':<9} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'cmd/s':>8}")
    for config in ("tuned", "baseline"):
        for role in ("leader", "follower"):
            row = report[config][role]
            print(f"{config:<10} {role:<9} {row['n']:>6} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} "
                  f"{row['mean_ms']:>8.3f} {row['commands_per_s']:>8.0f}")
    for role, ratio in report["p50_speedup"].items():
        print(f"p50 speedup over baseline ({role}): {ratio:.0f}x")
    print(f"pysyncobj 'truncating already-applied' warnings (tuned run): {report['tuned']['resent_entry_warnings']}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__,
        epilog="By default every member runs in its own process, as in production; --in-process puts all three "
               "in this process, where they share the GIL. Other benchmarks import measure_commit_latency(n).")
    parser.add_argument("-n", type=int, default=2000, help="proposals per proposer with group0's settings")
    parser.add_argument("--baseline-n", type=int, default=100, help="proposals per proposer for the baseline")
    parser.add_argument("--in-process", action="store_true", help="run all members in this process")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--member", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.member:
        serve_member(json.loads(args.member))
        return
    report = measure_commit_latency(args.n, args.baseline_n, args.in_process)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
