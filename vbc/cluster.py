"""Local development cluster manager: N node processes on 127.0.0.1 recorded in DIR/cluster.json (like ccm)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import grpc

from vbc import client
from vbcpb import vbc_pb2 as pb

HOST = "127.0.0.1"
LOG_NAME = "node.log"
LOCK_NAME = ".cluster.lock"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
KILL_WAIT = 10.0
POLL_INTERVAL = 0.2
LOG_TAIL_LINES = 25
NO_QUORUM_SETTLE = 3.0
# Ports picked when no base port is given: below Linux's ephemeral range (32768-60999), so an outgoing
# connection cannot take a port between the moment it is picked and the moment the node binds it.
AUTO_PORT_RANGE = (20000, 32000)
PARENT_PID_ENV = "VBC_PARENT_PID"
NODE_PLACEHOLDER = "{node}"  # in --storage-url: replaced by each node's id
# A local cluster is for development and tests: its nodes let `vbc inject` switch fault injection on unless
# `vbc cluster up --no-injections` (a node started by hand, or by deploy/, runs without it).
INJECTIONS_FLAG = "--enable-injections"
NO_SPARK_PRESTART_FLAG = "--no-spark-prestart"  # `vbc cluster up --no-spark-prestart`: Spark starts at the first batch
PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Popen objects of the nodes this process started, so their exit is reaped (no zombies) and seen. They are
# kept after the exit: a pid of ours that exited must never be mistaken for a later process reusing it.
_children: dict[int, subprocess.Popen] = {}

ProgressFn = Callable[[str], None]
SpawnFn = Callable[[dict, bool], int]  # (node record, die_with_parent) -> pid


class ClusterError(Exception):
    """A cluster operation that cannot be done; the message says why."""


class ClusterStartError(ClusterError):
    """Nodes that did not come up in time: `problems` maps node id -> reason, `logs` node id -> log tail."""

    def __init__(self, message: str, problems: dict[str, str], logs: dict[str, str]):
        super().__init__(message)
        self.problems = problems
        self.logs = logs

    def report(self) -> str:
        parts = [str(self)]
        for node_id, problem in self.problems.items():
            parts.append(f"--- {node_id}: {problem}")
            if self.logs.get(node_id):
                parts.append(self.logs[node_id].rstrip())
        return "\n".join(parts)


# ------------------------------------------------------------------ ports


def port_is_free(port: int, host: str = HOST) -> bool:
    """Whether a server could listen on host:port now (SO_REUSEADDR, as gRPC and the Raft transport bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port nobody listens on (picked below the ephemeral range when possible)."""
    for _ in range(100):
        port = random.randrange(*AUTO_PORT_RANGE)
        if port_is_free(port, host):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def find_free_block(count: int, host: str = HOST) -> int:
    """The first port of `count` consecutive free ports."""
    low, high = AUTO_PORT_RANGE
    for _ in range(200):
        base = random.randrange(low, high - count)
        if all(port_is_free(base + offset, host) for offset in range(count)):
            return base
    raise ClusterError(f"found no {count} consecutive free ports in {low}-{high}; give --base-port")


def allocate_ports(count: int, base_port: int | None = None, host: str = HOST) -> list[int]:
    """`count` consecutive ports from `base_port` (each checked free), or from a free block when None."""
    if base_port is None:
        base_port = find_free_block(count, host)
    ports = list(range(base_port, base_port + count))
    if ports[-1] > 65535 or base_port < 1:
        raise ClusterError(f"ports {ports[0]}-{ports[-1]} are out of range")
    taken = [port for port in ports if not port_is_free(port, host)]
    if taken:
        raise ClusterError(
            f"port {', '.join(map(str, taken))} on {host} already in use (the cluster needs ports "
            f"{ports[0]}-{ports[-1]}); choose another --base-port or stop what listens there"
        )
    return ports


# ------------------------------------------------------------------ layout and commands


def default_launcher() -> list[str]:
    """The command prefix that runs the vbc command line."""
    return [sys.executable, "-m", "vbc"]


def node_layout(data_dir: Path, count: int, base_port: int | None = None) -> list[dict]:
    """Node records n1..nN: grpc = P + 2(i-1), raft = P + 2(i-1) + 1, data in DIR/nI."""
    ports = allocate_ports(2 * count, base_port)
    nodes = []
    for index in range(count):
        node_dir = data_dir / f"n{index + 1}"
        nodes.append({
            "id": f"n{index + 1}",
            "grpc": f"{HOST}:{ports[2 * index]}",
            "raft": f"{HOST}:{ports[2 * index + 1]}",
            "pid": None,
            "data_dir": str(node_dir),
            "log": str(node_dir / LOG_NAME),
        })
    return nodes


def peers_argument(node: dict, nodes: Iterable[dict]) -> str:
    """The --peers value of `node`: every other node as ID=GRPC/RAFT, comma separated."""
    return ",".join(f"{peer['id']}={peer['grpc']}/{peer['raft']}" for peer in nodes if peer["id"] != node["id"])


def node_command(node: dict, nodes: list[dict], shards: int, storage_url: str | None, launcher: list[str],
                 injections: bool = True, spark_prestart: bool = True) -> list[str]:
    command = [*launcher, "node", "start", "--id", node["id"], "--data-dir", node["data_dir"],
               "--grpc", node["grpc"], "--raft", node["raft"], "--shards", str(shards)]
    peers = peers_argument(node, nodes)
    if peers:
        command += ["--peers", peers]
    if storage_url:
        command += ["--storage-url", storage_url.replace(NODE_PLACEHOLDER, node["id"])]
    return with_spark_prestart(with_injections(command, injections), spark_prestart)


def with_injections(command: list[str], injections: bool) -> list[str]:
    """`command` with --enable-injections at its end, or without it."""
    return [word for word in command if word != INJECTIONS_FLAG] + ([INJECTIONS_FLAG] if injections else [])


def with_spark_prestart(command: list[str], spark_prestart: bool) -> list[str]:
    """`command` without --no-spark-prestart, or with it at its end."""
    return [word for word in command if word != NO_SPARK_PRESTART_FLAG] + ([] if spark_prestart
                                                                           else [NO_SPARK_PRESTART_FLAG])


def new_cluster(data_dir: Path, count: int, shards: int = 1, base_port: int | None = None,
                storage_url: str | None = None, launcher: list[str] | None = None, injections: bool = True,
                spark_prestart: bool = True) -> dict:
    """A cluster description (what cluster.json holds) for `count` fresh nodes; nothing is started."""
    if count < 1:
        raise ClusterError("a cluster needs at least one node")
    if shards < 1:
        raise ClusterError("a node needs at least one shard")
    if storage_url and count > 1 and NODE_PLACEHOLDER not in storage_url:
        raise ClusterError(
            f"every node needs its own database: put {NODE_PLACEHOLDER} in --storage-url "
            f"(e.g. postgresql+psycopg://user@host/vbc_{NODE_PLACEHOLDER}); it is replaced by the node id"
        )
    nodes = node_layout(data_dir, count, base_port)
    for node in nodes:
        node["command"] = node_command(node, nodes, shards, storage_url, launcher or default_launcher(), injections,
                                       spark_prestart)
    return {"host": HOST, "shards": shards, "storage_url": storage_url,
            "base_port": int(nodes[0]["grpc"].rsplit(":", 1)[1]), "nodes": nodes}


# ------------------------------------------------------------------ cluster.json


def cluster_path(data_dir: Path | str) -> Path:
    return Path(data_dir) / client.CLUSTER_FILE


def load_cluster(data_dir: Path | str) -> dict:
    try:
        return client.read_cluster_file(data_dir)
    except client.ClusterFileError as exc:
        raise ClusterError(str(exc)) from None


def save_cluster(data_dir: Path | str, cluster: dict) -> None:
    """Write cluster.json atomically."""
    path = cluster_path(data_dir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(cluster, indent=2) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(data_dir: Path | str):
    """Serialize read-modify-write of cluster.json between processes and threads."""
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(data_dir) / LOCK_NAME, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def update_pid(data_dir: Path | str, node_id: str, pid: int | None) -> None:
    with locked(data_dir):
        cluster = load_cluster(data_dir)
        find_node(cluster, node_id)["pid"] = pid
        save_cluster(data_dir, cluster)


def find_node(cluster: dict, node_id: str) -> dict:
    for node in cluster["nodes"]:
        if node["id"] == node_id:
            return node
    known = ", ".join(node["id"] for node in cluster["nodes"])
    raise ClusterError(f"no node {node_id!r} in the cluster (nodes: {known})")


def log_tail(path: Path | str, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when there is none)."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 64 * 1024))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------ processes


def child_env(die_with_parent: bool) -> dict[str, str]:
    """The environment of a node: vbc importable from any cwd, unbuffered output, optional parent-death kill."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop(PARENT_PID_ENV, None)
    if die_with_parent:
        env[PARENT_PID_ENV] = str(os.getpid())
    return env


def spawn_node(node: dict, die_with_parent: bool = False) -> int:
    """Start `node["command"]` in its own session, output appended to its log; returns the pid."""
    Path(node["data_dir"]).mkdir(parents=True, exist_ok=True)
    with open(node["log"], "ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"==== {stamp} vbc cluster: {shlex.join(node['command'])}\n".encode())
        log.flush()
        process = subprocess.Popen(node["command"], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=child_env(die_with_parent), start_new_session=True)
    _children[process.pid] = process
    return process.pid


def exit_code(pid: int) -> int | None:
    """The exit code of a node this process started, once it exited."""
    process = _children.get(pid)
    return None if process is None else process.poll()


def is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def pid_alive(pid: int | None) -> bool:
    """Whether process `pid` still runs (exited children of this process are reaped, zombies count as gone)."""
    if not pid:
        return False
    process = _children.get(pid)
    if process is not None:
        return process.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not is_zombie(pid)


def process_args(pid: int) -> list[str] | None:
    """The command line of `pid` (None when it cannot be read, e.g. without /proc)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def is_node_process(pid: int, node: dict) -> bool:
    """Whether `pid` is still the process of `node` (guards against a recycled pid from a stale cluster.json)."""
    args = process_args(pid)
    if args is None:
        return pid_alive(pid)
    return node["id"] in args and (not node.get("data_dir") or node["data_dir"] in args)


def running_pid(node: dict) -> int | None:
    """The pid of `node` when its process runs, else None."""
    pid = node.get("pid")
    if pid and pid_alive(pid) and is_node_process(pid, node):
        return pid
    return None


def send_signal(pid: int, sig: int) -> None:
    """Signal one node; SIGKILL also goes to its process group (the session it leads) to take its children."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    if sig == signal.SIGKILL:
        kill_group_leftovers(pid)


def kill_group_leftovers(pid: int) -> None:
    """SIGKILL whatever the node left running in its process group after it exited."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def wait_exit(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until every pid exited or `timeout` passed; returns the pids still running."""
    remaining = [pid for pid in pids if pid_alive(pid)]
    deadline = time.monotonic() + timeout
    while remaining and time.monotonic() < deadline:
        time.sleep(0.05)
        remaining = [pid for pid in remaining if pid_alive(pid)]
    return remaining


def stop_pids(pids: Iterable[int], kill: bool = False, timeout: float = STOP_TIMEOUT) -> dict[int, str]:
    """SIGTERM (or SIGKILL) each pid, wait, SIGKILL stragglers; returns pid -> 'stopped' | 'killed' | 'gone'."""
    pids = list(dict.fromkeys(pids))
    outcome = {pid: "gone" for pid in pids if not pid_alive(pid)}
    live = [pid for pid in pids if pid not in outcome]
    for pid in live:
        send_signal(pid, signal.SIGKILL if kill else signal.SIGTERM)
    stragglers = wait_exit(live, KILL_WAIT if kill else timeout)
    for pid in stragglers:
        send_signal(pid, signal.SIGKILL)
    still_running = wait_exit(stragglers, KILL_WAIT)
    for pid in live:
        kill_group_leftovers(pid)
        outcome[pid] = "killed" if kill or pid in stragglers else "stopped"
        if pid in still_running:
            outcome[pid] = "still running"
    return outcome


# ------------------------------------------------------------------ readiness


@dataclass
class Probe:
    """What one node answered: `ready` = Admin.Status works (it joined group0); `leader` = the leader it knows."""

    answered: bool = False
    ready: bool = False
    leader: str = ""
    error: str = ""


def probe_node(addr: str) -> Probe:
    """Ask Admin.Status (needs the node to have joined), then Internode.LocalStatus (answers from start-up)."""
    try:
        response = client.admin_stub(addr).Status(pb.StatusRequest(), timeout=3.0)
        return Probe(answered=True, ready=True, leader=response.leader)
    except grpc.RpcError as exc:
        status_error = client.error_text(exc)
    try:
        local = client.local_status(addr, timeout=1.0)
        return Probe(answered=True, leader=local["leader"], error=status_error)
    except grpc.RpcError as exc:
        return Probe(error=client.error_text(exc))


def process_problem(node: dict) -> str:
    """Why the process of `node` is not running ('' while it runs)."""
    pid = node.get("pid")
    if pid_alive(pid):
        return ""
    code = exit_code(pid) if pid else None
    return f"process exited (exit code {code})" if code is not None else "process is not running"


def readiness_problem(node: dict, probe: Probe) -> str:
    """Why `node` does not count as up yet ('' when it is ready and knows the leader)."""
    if not probe.answered:
        return f"not answering on {node['grpc']} ({probe.error or 'no answer'})"
    if not probe.ready:
        return f"answers but has not joined the cluster ({probe.error})"
    if not probe.leader:
        return "answers but knows no Raft leader"
    return ""


def start_failure(nodes: list[dict], problems: dict[str, str], reason: str) -> ClusterStartError:
    logs = {node["id"]: log_tail(node["log"]) for node in nodes if node["id"] in problems}
    return ClusterStartError(f"node(s) {', '.join(problems)} {reason}", problems, logs)


def wait_ready(nodes: list[dict], timeout: float = START_TIMEOUT, progress: ProgressFn | None = None) -> str:
    """Wait until every node answers Admin.Status and a leader is elected; returns the leader.

    Gives up early when a node's process exits. Raises ClusterStartError naming the late nodes.
    """
    deadline = time.monotonic() + timeout
    while True:
        dead = {node["id"]: problem for node in nodes if (problem := process_problem(node))}
        if dead:
            raise start_failure(nodes, dead, "exited")
        probes = {node["id"]: probe_node(node["grpc"]) for node in nodes}
        problems = {node["id"]: problem for node in nodes if (problem := readiness_problem(node, probes[node["id"]]))}
        leader = next((probe.leader for probe in probes.values() if probe.leader), "")
        if not problems:
            return leader
        if time.monotonic() >= deadline:
            raise start_failure(nodes, problems, f"did not come up within {timeout:g} s")
        if progress:
            ready = len(nodes) - len(problems)
            progress(f"{ready}/{len(nodes)} nodes ready" + (f", leader {leader}" if leader else ", no leader yet"))
        time.sleep(POLL_INTERVAL)


def wait_answering(node: dict, timeout: float = START_TIMEOUT, settle: float = NO_QUORUM_SETTLE) -> Probe:
    """Wait until a restarted node answers; then, while a leader is known, until it joined the cluster.

    A node that answers but sees no leader for `settle` seconds is accepted (its quorum may still be down,
    e.g. the first node of a full restart). Raises ClusterStartError if it never answers or exits.
    """
    deadline = time.monotonic() + timeout
    leaderless_since: float | None = None
    while True:
        if problem := process_problem(node):
            raise start_failure([node], {node["id"]: problem}, "exited")
        probe = probe_node(node["grpc"])
        now = time.monotonic()
        if probe.ready:
            return probe
        if probe.answered and not probe.leader:
            leaderless_since = leaderless_since or now
            if now - leaderless_since >= settle:
                return probe
        else:
            leaderless_since = None
        if now >= deadline:
            if probe.answered:
                return probe
            raise start_failure([node], {node["id"]: readiness_problem(node, probe)},
                                f"did not answer within {timeout:g} s")
        time.sleep(POLL_INTERVAL)


# ------------------------------------------------------------------ cluster operations


def check_not_running(cluster: dict, data_dir: Path) -> None:
    running = [f"{node['id']} (pid {node['pid']})" for node in cluster["nodes"] if running_pid(node)]
    if running:
        raise ClusterError(f"a cluster is already running in {data_dir}: {', '.join(running)}; "
                           f"stop it with 'vbc cluster down --data-dir {data_dir}'")


def reuse_cluster(data_dir: Path, count: int, shards: int, base_port: int | None, injections: bool = True,
                  spark_prestart: bool = True) -> dict:
    """The recorded cluster of DIR, to restart with its ports, arguments and data (with or without
    --enable-injections and --no-spark-prestart as `injections` and `spark_prestart` say)."""
    cluster = load_cluster(data_dir)
    check_not_running(cluster, data_dir)
    recorded = len(cluster["nodes"])
    if count != recorded:
        raise ClusterError(f"{data_dir} holds a cluster of {recorded} nodes; use --nodes {recorded} or a new --data-dir")
    if shards != cluster.get("shards", shards):
        raise ClusterError(f"{data_dir} holds a cluster with {cluster['shards']} shards per node; "
                           f"use --shards {cluster['shards']} or a new --data-dir")
    if base_port is not None and base_port != cluster.get("base_port", base_port):
        raise ClusterError(f"{data_dir} holds a cluster on base port {cluster['base_port']}; "
                           f"drop --base-port or use a new --data-dir")
    for node in cluster["nodes"]:
        for role in ("grpc", "raft"):
            port = int(node[role].rsplit(":", 1)[1])
            if not port_is_free(port):
                raise ClusterError(f"port {port} ({node['id']} {role}) is already in use; "
                                   f"the cluster in {data_dir} must restart on its recorded ports")
    for node in cluster["nodes"]:
        node["command"] = with_spark_prestart(with_injections(node["command"], injections), spark_prestart)
    return cluster


def start_cluster(data_dir: Path | str, nodes: int = 3, shards: int = 1, base_port: int | None = None,
                  storage_url: str | None = None, timeout: float = START_TIMEOUT, launcher: list[str] | None = None,
                  die_with_parent: bool = False, progress: ProgressFn | None = None,
                  spawn: SpawnFn | None = None, injections: bool = True, spark_prestart: bool = True) -> dict:
    """Start (or restart, when DIR has a cluster.json) a cluster and wait for every node and a leader.

    Returns the cluster description (as saved in cluster.json, plus "leader"). On failure every started
    node is stopped and ClusterError/ClusterStartError is raised. `spawn` replaces spawn_node (e.g. to
    record pids or spawn from a given thread). The nodes run with --enable-injections unless `injections`
    is False, and with --no-spark-prestart when `spark_prestart` is False (a restarted cluster's recorded
    commands are changed to match).
    """
    spawn = spawn or spawn_node
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with locked(data_dir):
        if cluster_path(data_dir).exists():
            cluster = reuse_cluster(data_dir, nodes, shards, base_port, injections, spark_prestart)
        else:
            cluster = new_cluster(data_dir, nodes, shards, base_port, storage_url, launcher, injections, spark_prestart)
        try:
            for node in cluster["nodes"]:
                node["pid"] = spawn(node, die_with_parent)
        except BaseException:
            stop_pids([node["pid"] for node in cluster["nodes"] if node["pid"]], kill=True)
            for node in cluster["nodes"]:
                node["pid"] = None
            raise
        finally:
            save_cluster(data_dir, cluster)
    try:
        cluster["leader"] = wait_ready(cluster["nodes"], timeout, progress=progress)
    except BaseException:
        stop_cluster(data_dir, timeout=5.0)
        raise
    return cluster


def stop_cluster(data_dir: Path | str, timeout: float = STOP_TIMEOUT) -> dict[str, str]:
    """SIGTERM every node, wait, SIGKILL stragglers (data is kept); returns node id -> outcome."""
    with locked(data_dir):
        cluster = load_cluster(data_dir)
        pids = {node["id"]: running_pid(node) for node in cluster["nodes"]}
        outcome_by_pid = stop_pids([pid for pid in pids.values() if pid], timeout=timeout)
        for node in cluster["nodes"]:
            node["pid"] = None
        save_cluster(data_dir, cluster)
    return {node_id: outcome_by_pid.get(pid, "not running") if pid else "not running" for node_id, pid in pids.items()}


def stop_node(data_dir: Path | str, node_id: str, kill: bool = False, timeout: float = STOP_TIMEOUT) -> str:
    """SIGTERM (SIGKILL with kill) one node and wait for its exit; returns 'stopped' | 'killed' | 'not running'."""
    cluster = load_cluster(data_dir)
    node = find_node(cluster, node_id)
    pid = running_pid(node)
    outcome = stop_pids([pid], kill=kill, timeout=timeout)[pid] if pid else "not running"
    update_pid(data_dir, node_id, None)
    return outcome


def start_node(data_dir: Path | str, node_id: str, timeout: float = START_TIMEOUT,
               die_with_parent: bool = False, spawn: SpawnFn | None = None) -> int:
    """Restart one node with its recorded arguments and wait until it answers (see wait_answering); returns its pid."""
    spawn = spawn or spawn_node
    data_dir = Path(data_dir).resolve()
    with locked(data_dir):
        cluster = load_cluster(data_dir)
        node = find_node(cluster, node_id)
        if running_pid(node):
            raise ClusterError(f"{node_id} is already running (pid {node['pid']})")
        for role in ("grpc", "raft"):
            port = int(node[role].rsplit(":", 1)[1])
            if not port_is_free(port):
                raise ClusterError(f"port {port} ({node_id} {role}) is already in use")
        node["pid"] = spawn(node, die_with_parent)
        save_cluster(data_dir, cluster)
    try:
        wait_answering(node, timeout)
    except BaseException:
        stop_pids([node["pid"]], timeout=5.0)
        update_pid(data_dir, node_id, None)
        raise
    return node["pid"]


def add_node(data_dir: Path | str, shards: int | None = None, timeout: float = START_TIMEOUT,
             die_with_parent: bool = False, spawn: SpawnFn | None = None) -> dict:
    """Start one more node that joins the running cluster through its members (`vbc node start --join`); its
    record (with the command that restarts it, joining again) is added to cluster.json. Returns the record."""
    spawn = spawn or spawn_node
    data_dir = Path(data_dir).resolve()
    with locked(data_dir):
        cluster = load_cluster(data_dir)
        node = _next_node(data_dir, cluster)
        template = cluster["nodes"][0]["command"]
        launcher = template[:template.index("node")]
        node["command"] = [*launcher, "node", "start", "--id", node["id"], "--data-dir", node["data_dir"],
                           "--grpc", node["grpc"], "--raft", node["raft"],
                           "--shards", str(shards or cluster.get("shards", 1)),
                           "--join", ",".join(n["grpc"] for n in cluster["nodes"])]
        if cluster.get("storage_url"):
            node["command"] += ["--storage-url", cluster["storage_url"].replace(NODE_PLACEHOLDER, node["id"])]
        node["command"] = with_spark_prestart(with_injections(node["command"], INJECTIONS_FLAG in template),
                                              NO_SPARK_PRESTART_FLAG not in template)
        node["pid"] = spawn(node, die_with_parent)
        cluster["nodes"].append(node)
        save_cluster(data_dir, cluster)
    try:
        wait_answering(node, timeout)
    except BaseException:
        stop_pids([node["pid"]], timeout=5.0)
        update_pid(data_dir, node["id"], None)
        raise
    return node


def _next_node(data_dir: Path, cluster: dict) -> dict:
    """The record of the next node: the first unused id nK, two free ports, its data dir."""
    used = {n["id"] for n in cluster["nodes"]} | set(cluster.get("removed_nodes", []))
    index = next(i for i in range(1, len(used) + 2) if f"n{i}" not in used)
    grpc_port, raft_port = allocate_ports(2)
    node_dir = data_dir / f"n{index}"
    return {"id": f"n{index}", "grpc": f"{HOST}:{grpc_port}", "raft": f"{HOST}:{raft_port}", "pid": None,
            "data_dir": str(node_dir), "log": str(node_dir / LOG_NAME)}


def forget_node(data_dir: Path | str, node_id: str) -> None:
    """A node removed from the cluster: stop its process if it still runs, and take it out of cluster.json (its id
    is kept in "removed_nodes", never given again)."""
    with locked(data_dir):
        cluster = load_cluster(data_dir)
        node = next((n for n in cluster["nodes"] if n["id"] == node_id), None)
        if node is None:
            return
        pid = running_pid(node)
        if pid:
            stop_pids([pid], timeout=STOP_TIMEOUT)
        cluster["nodes"] = [n for n in cluster["nodes"] if n["id"] != node_id]
        cluster["removed_nodes"] = sorted(set(cluster.get("removed_nodes", [])) | {node_id})
        save_cluster(data_dir, cluster)


def stop_on_signals() -> None:
    """Make SIGTERM and SIGINT (even if inherited as ignored) raise KeyboardInterrupt so `finally` blocks run
    (a foreground cluster or the demo then stops its nodes)."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)
