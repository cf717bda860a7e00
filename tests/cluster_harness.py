"""Real local vbc clusters for integration tests (the `vbc cluster` manager in-process); never leaves a node behind."""
from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence, TypeVar

try:
    import vbc  # noqa: F401
except ImportError:  # run without an installed vbc: use the checkout this file lives in
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from vbc import client
from vbc import cluster as cluster_mod
from vbc.cluster import free_port, port_is_free  # noqa: F401 - re-exported for tests

T = TypeVar("T")

START_TIMEOUT = 60.0
STOP_GRACE = 10.0
LOG_LINES_ON_FAILURE = 40

# Nodes are spawned from this one long-lived thread: they get SIGKILLed by the kernel if the test process
# dies (PR_SET_PDEATHSIG, which follows the spawning *thread*), even when no `finally` gets to run.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vbc-node-spawner")
_ALL_PIDS: set[int] = set()
_ALL_PIDS_LOCK = threading.Lock()


def _kill_everything_left() -> None:
    """Last resort at interpreter exit: SIGKILL every node any LocalCluster of this process started."""
    with _ALL_PIDS_LOCK:
        pids = list(_ALL_PIDS)
    cluster_mod.stop_pids([pid for pid in pids if cluster_mod.pid_alive(pid)], kill=True)


atexit.register(_kill_everything_left)


class LocalCluster:
    """N real node processes on 127.0.0.1 with free ports, started by the `vbc cluster up` code.

    Use as a context manager; on exit every process it ever started (restarts included) is stopped
    (SIGTERM, then SIGKILL of its process group after a grace period), even when the test failed. When the
    test failed the tail of every node.log is printed to stderr (pytest shows it with the failure).
    """

    def __init__(self, nodes: int = 3, data_dir: str | Path | None = None, shards: int = 1,
                 storage_url: str | None = None, start_timeout: float = START_TIMEOUT,
                 launcher: list[str] | None = None, injections: bool = True, spark_prestart: bool = True,
                 secure: bool = False, root_password: str | None = None, spark_options: Sequence[str] = ()):
        self.size = nodes
        self.root_password = root_password  # root's password in a secure cluster (else a random one)
        self.launcher = launcher  # command prefix instead of `python -m vbc` (offline tests use a fake node)
        self.injections = injections  # nodes run with --enable-injections (what the fault tests use)
        self.spark_prestart = spark_prestart  # False: nodes run with --no-spark-prestart
        self.secure = secure  # mutual TLS (DATA_DIR/credentials); else --insecure, for tests not about security
        self.shards = shards
        self.spark_options = list(spark_options)  # `vbc node start` Spark options of every node
        self.storage_url = storage_url
        self.start_timeout = start_timeout
        self._own_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="vbc-cluster-") if data_dir is None else data_dir).resolve()
        self.leader_at_start = ""
        self._pids: list[int] = []
        self._last_nodes: list[dict] = []
        self._closed = False

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close(failed=exc_type is not None)
        return False

    def start(self) -> "LocalCluster":
        """Start the nodes and wait until each answers and a leader is elected."""
        try:
            description = cluster_mod.start_cluster(
                self.data_dir, nodes=self.size, shards=self.shards, storage_url=self.storage_url,
                timeout=self.start_timeout, launcher=self.launcher, die_with_parent=True, spawn=self._spawn,
                injections=self.injections, spark_prestart=self.spark_prestart, insecure=not self.secure,
                root_password=self.root_password, spark_options=self.spark_options)
        except BaseException as error:
            self._closed = True
            self._stop_all()
            if isinstance(error, cluster_mod.ClusterStartError):
                raise RuntimeError(f"local cluster did not start:\n{error.report()}") from None
            raise
        self.leader_at_start = description["leader"]
        self._last_nodes = description["nodes"]
        return self

    def close(self, failed: bool = False) -> None:
        """Stop every process this cluster started; keep the data dir when `failed` (or when it was given)."""
        if self._closed:
            return
        self._closed = True
        try:
            if failed:
                self.print_logs()
        finally:
            self._stop_all()
        if self._own_dir and not failed:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _spawn(self, node: dict, die_with_parent: bool) -> int:
        pid = _SPAWNER.submit(cluster_mod.spawn_node, node, die_with_parent).result()
        self._pids.append(pid)
        with _ALL_PIDS_LOCK:
            _ALL_PIDS.add(pid)
        return pid

    def _stop_all(self) -> None:
        cluster_mod.stop_pids(self._pids, timeout=STOP_GRACE)
        with _ALL_PIDS_LOCK:
            _ALL_PIDS.difference_update(pid for pid in self._pids if not cluster_mod.pid_alive(pid))

    @property
    def pids(self) -> list[int]:
        """Every pid this cluster started, restarts included."""
        return list(self._pids)

    # ------------------------------------------------------------ nodes

    @property
    def nodes(self) -> list[dict]:
        """The nodes as in cluster.json: dicts with id, grpc, raft, pid (None when stopped), data_dir, log."""
        try:
            self._last_nodes = cluster_mod.load_cluster(self.data_dir)["nodes"]
        except cluster_mod.ClusterError:
            pass
        return [dict(node) for node in self._last_nodes]

    def node(self, node_id: str) -> dict:
        for node in self.nodes:
            if node["id"] == node_id:
                return node
        raise KeyError(f"no node {node_id!r} in the cluster")

    def addr(self, node_id: str) -> str:
        """The gRPC address of a node."""
        return self.node(node_id)["grpc"]

    def addresses(self, node: str | None = None) -> list[str]:
        """[address of `node`], or every node's address with the running ones first."""
        if node is not None:
            return [self.addr(node)]
        nodes = self.nodes
        running = [n["grpc"] for n in nodes if cluster_mod.pid_alive(n["pid"])]
        return running + [n["grpc"] for n in nodes if n["grpc"] not in running]

    def is_running(self, node_id: str) -> bool:
        """Whether the node runs (False for a node no longer in cluster.json: removed from the cluster)."""
        node = next((n for n in self.nodes if n["id"] == node_id), None)
        return node is not None and cluster_mod.pid_alive(node["pid"])

    def stop_node(self, node_id: str, kill: bool = False, timeout: float = cluster_mod.STOP_TIMEOUT) -> str:
        """SIGTERM (SIGKILL with kill) a node and wait for its exit; returns 'stopped' | 'killed' | 'not running'."""
        return cluster_mod.stop_node(self.data_dir, node_id, kill=kill, timeout=timeout)

    def start_node(self, node_id: str, timeout: float = START_TIMEOUT) -> int:
        """Restart a node with its ports, arguments and data; waits until it answers. Returns the new pid."""
        return cluster_mod.start_node(self.data_dir, node_id, timeout=timeout, die_with_parent=True,
                                      spawn=self._spawn)

    def add_node(self, timeout: float = START_TIMEOUT) -> dict:
        """Start one more node that joins the cluster (`vbc cluster add-node`); its record in cluster.json."""
        return cluster_mod.add_node(self.data_dir, timeout=timeout, die_with_parent=True, spawn=self._spawn)

    def restart_node(self, node_id: str, kill: bool = False) -> int:
        self.stop_node(node_id, kill=kill)
        return self.start_node(node_id)

    def log(self, node_id: str) -> str:
        """The whole node.log of a node."""
        try:
            return Path(self.node(node_id)["log"]).read_text(errors="replace")
        except OSError:
            return ""

    def print_logs(self, lines: int = LOG_LINES_ON_FAILURE) -> None:
        """The tail of every node.log, to stderr."""
        print(f"\n==== local cluster in {self.data_dir}", file=sys.stderr)
        for node in self.nodes:
            print(f"---- {node['id']} ({node['grpc']}) {node['log']}", file=sys.stderr)
            print(cluster_mod.log_tail(node["log"], lines), file=sys.stderr)
        removed = cluster_mod.load_cluster(self.data_dir).get("removed_nodes", [])
        for node_id in removed:  # taken out of cluster.json; their logs often tell why
            path = self.data_dir / node_id / cluster_mod.LOG_NAME
            print(f"---- {node_id} (removed) {path}", file=sys.stderr)
            print(cluster_mod.log_tail(path, lines), file=sys.stderr)

    # ------------------------------------------------------------ client calls

    def execute(self, statement: str, node: str | None = None, timeout: float = client.DEFAULT_TIMEOUT):
        """(columns, rows, message) of a statement run on `node`, or on any running node."""
        return client.execute(self.addresses(node), statement, timeout)

    def query(self, statement: str, node: str | None = None, timeout: float = client.DEFAULT_TIMEOUT) -> list[dict]:
        """The rows of a SELECT as {column: value} dicts."""
        return client.query(self.addresses(node), statement, timeout)

    def status(self, node: str | None = None) -> dict:
        """Admin.Status (the `vbc status --json` shape) from `node` or any running node."""
        return client.status(self.addresses(node))

    def tablets(self, table: str, node: str | None = None) -> list[dict]:
        return client.tablets(self.addresses(node), table)

    def inject(self, name: str, node: str, action: str = "enable", **options) -> dict:
        """Admin.Inject on one node (see vbc.client.inject for the options)."""
        return client.inject(self.addr(node), name, action, **options)

    def leader(self, node: str | None = None) -> str:
        return self.status(node)["leader"]

    # ------------------------------------------------------------ waiting

    def wait_until(self, predicate: Callable[[], T], timeout: float = 30.0, message: str = "condition",
                   interval: float = 0.1) -> T:
        return wait_until(predicate, timeout, message, interval)

    def wait_for_leader(self, timeout: float = 30.0, exclude: tuple[str, ...] | list[str] = ()) -> str:
        """A leader known to the running nodes, not one of `exclude`."""
        def leader():
            found = self.leader()
            return found if found and found not in exclude else ""
        return self.wait_until(leader, timeout, f"a Raft leader (not {', '.join(exclude) or '-'})")

    def wait_view_built(self, view: str, timeout: float = 60.0) -> dict:
        """The status entry of `view` ("ks.name") once its state is BUILT."""
        def built():
            return next((v for v in self.status()["views"] if v["name"] == view and v["state"] == "BUILT"), None)
        return self.wait_until(built, timeout, f"view {view} to be BUILT")

    def wait_views_flushed(self, timeout: float = 30.0) -> None:
        """Every node alive with no pending view updates."""
        self.wait_until(lambda: all(n["alive"] and n["pending_view_updates"] == 0 for n in self.status()["nodes"]),
                        timeout, "view update queues to drain")


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.RpcError):
        return client.error_text(error)
    return f"{type(error).__name__}: {error}"


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, message: str = "condition",
               interval: float = 0.1) -> T:
    """Poll `predicate` until it returns something truthy (returned); exceptions count as not yet.

    Raises AssertionError naming `message` (and the last exception) after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last_error = None
        except Exception as error:  # noqa: BLE001 - a node may be down or starting
            last_error = error
        if time.monotonic() >= deadline:
            detail = f"; last error: {_describe(last_error)}" if last_error else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {message}{detail}")
        time.sleep(interval)
