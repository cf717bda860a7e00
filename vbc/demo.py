"""`make demo` / `vbc demo`: a 3-node cluster builds a view and an index over 100,000 rows while a writer writes,
survives a leader `kill -9` in the middle, and proves the result with `vbc check`."""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import threading
import time
from pathlib import Path

import grpc
import pyarrow as pa
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.text import Text

from vbc import client
from vbc import cluster as cluster_mod
from vbc import render

CUSTOMERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
STATUSES = ["new", "paid", "shipped", "returned"]
DEFAULT_ROWS = 100_000
LOAD_CHUNK = 10_000
VIEW = "demo.orders_by_customer"
INDEX = "demo.orders_status_idx"
KILL_AT_PROGRESS = 0.3  # the leader is killed once the slower build passed this
POLL = 0.5
SETTLE_TIMEOUT = 60.0
SPARK_READY_TIMEOUT = 180.0

TABLE_SCHEMA = [
    "CREATE KEYSPACE demo WITH replication = {'rf': 3} AND tablets = {'initial': 8}",
    "CREATE TABLE demo.orders (id int, customer text, amount double, status text, PRIMARY KEY (id))",
]
VIEW_SCHEMA = [
    f"CREATE MATERIALIZED VIEW {VIEW} AS SELECT * FROM demo.orders "
    "WHERE customer IS NOT NULL AND id IS NOT NULL PRIMARY KEY (customer, id)",
    "CREATE INDEX orders_status_idx ON demo.orders (status)",
]
INSERT = "INSERT INTO demo.orders (id, customer, amount, status) VALUES (?, ?, ?, ?)"

console = render.stdout_console()


def step(text: str) -> None:
    console.print(Text.assemble(("==> ", "bold cyan"), (text, "bold")))


def note(text: str, style: str = "dim") -> None:
    console.print(Text(f"    {text}", style=style))


def order(order_id: int) -> list:
    return [order_id, CUSTOMERS[order_id % len(CUSTOMERS)], round(order_id * 1.37, 2), STATUSES[order_id % len(STATUSES)]]


def orders(first: int, end: int) -> pa.Table:
    """Orders `first` .. `end - 1` as Arrow columns, one per `?` of INSERT."""
    rows = [order(i) for i in range(first, end)]
    types = (pa.int32(), pa.string(), pa.float64(), pa.string())
    return pa.table([pa.array([row[i] for row in rows], kind) for i, kind in enumerate(types)],
                    names=["id", "customer", "amount", "status"])


# ------------------------------------------------------------------ the cluster


def prepare_data_dir(data_dir: Path) -> None:
    """Stop a demo cluster left running in `data_dir`, then wipe it."""
    if cluster_mod.cluster_path(data_dir).exists():
        try:
            cluster_mod.stop_cluster(data_dir, timeout=10.0)
        except cluster_mod.ClusterError:
            pass
    shutil.rmtree(data_dir, ignore_errors=True)


def start(data_dir: Path, nodes: int, shards: int) -> dict:
    step(f"starting a {nodes}-node cluster ({shards} shard(s) per node) in {data_dir}")
    with console.status("waiting for the nodes and a Raft leader ...") as spinner:
        cluster = cluster_mod.start_cluster(data_dir, nodes=nodes, shards=shards,
                                            progress=lambda message: spinner.update(message))
    for node in cluster["nodes"]:
        note(f"{node['id']}: grpc {node['grpc']}, raft {node['raft']}, pid {node['pid']}, log {node['log']}")
    note(f"leader: {cluster['leader']}")
    return cluster


def run_statements(addresses: list[str], statements: list[str]) -> None:
    for index, statement in enumerate(statements):
        address = addresses[index % len(addresses)]
        client.execute(address, statement)
        note(f"{address}: {statement}")


def load(addresses: list[str], rows: int) -> float:
    """Insert `rows` orders in prepared-value chunks round-robin over the nodes; the seconds it took."""
    step(f"loading {rows:,} orders (a prepared INSERT with {LOAD_CHUNK:,} value sets per call as one Arrow batch, "
         "round-robin over the nodes)")
    started = time.monotonic()
    with Progress(TextColumn("loading"), BarColumn(), TaskProgressColumn(), TextColumn("{task.completed:,} rows"),
                  console=console, transient=True) as progress:
        task = progress.add_task("load", total=rows)
        for n, first in enumerate(range(1, rows + 1, LOAD_CHUNK)):
            chunk = orders(first, min(first + LOAD_CHUNK, rows + 1))
            client.execute(addresses[n % len(addresses)], INSERT, params=chunk, timeout=120.0)
            progress.advance(task, chunk.num_rows)
    seconds = time.monotonic() - started
    note(f"{rows:,} rows in {seconds:.1f} s ({rows / seconds:,.0f} rows/s)")
    return seconds


def wait_spark_ready(addresses: list[str]) -> float:
    """Wait until every node's Spark session is ready (each node starts it in the background when it starts);
    the seconds waited here."""
    step("waiting for every node's Spark session (each node starts and warms it up in the background)")
    started = time.monotonic()
    with console.status("Spark starting ...") as spinner:
        while True:
            nodes = client.status(addresses)["nodes"]
            workers = {node["id"]: node.get("worker") or {} for node in nodes}
            if all(w.get("spark_state") in ("ready", "failed", "off") for w in workers.values()):
                break
            if time.monotonic() - started > SPARK_READY_TIMEOUT:
                note(f"not every session is ready after {SPARK_READY_TIMEOUT:g} s; building anyway", style="yellow")
                break
            spinner.update(", ".join(f"{node}: {w.get('spark_state', '?')}" for node, w in workers.items()))
            time.sleep(POLL)
    waited = time.monotonic() - started
    note(", ".join(f"{node}: {w.get('spark_state')} ({w.get('spark_start_s', 0):.1f} s after its start)"
                   for node, w in workers.items()) + f"; waited {waited:.1f} s after the load")
    return waited


# ------------------------------------------------------------------ the writer


class Writer(threading.Thread):
    """Keeps inserting, updating (moving view rows to another customer) and deleting orders during the build."""

    def __init__(self, addresses: list[str], rows: int, seed: int = 7):
        super().__init__(name="demo-writer", daemon=True)
        self._addresses = addresses
        self._rows = rows
        self._rng = random.Random(seed)
        self._stopping = threading.Event()
        self.writes = 0
        self.failures = 0
        self._next_id = rows + 1

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                client.execute(self._rng.sample(self._addresses, len(self._addresses)), self._statement(),
                               timeout=10.0)
                self.writes += 1
            except grpc.RpcError:
                self.failures += 1  # a node being killed: the next write goes elsewhere
                self._stopping.wait(0.05)

    def _statement(self) -> str:
        choice = self._rng.random()
        if choice < 0.4:
            values = order(self._next_id)
            self._next_id += 1
            return (f"INSERT INTO demo.orders (id, customer, amount, status) "
                    f"VALUES ({values[0]}, '{values[1]}', {values[2]!r}, '{values[3]}')")
        target = self._rng.randint(1, self._rows)
        if choice < 0.85:
            return (f"UPDATE demo.orders SET customer = '{self._rng.choice(CUSTOMERS)}', "
                    f"status = '{self._rng.choice(STATUSES)}' WHERE id = {target}")
        return f"DELETE FROM demo.orders WHERE id = {target}"

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=15.0)


# ------------------------------------------------------------------ the build


def build_columns() -> tuple:
    return (TextColumn("{task.description:<28}"), BarColumn(), TaskProgressColumn(),
            TextColumn("{task.fields[tasks]}"), TextColumn("{task.fields[rows]}"), TextColumn("{task.fields[eta]}"))


def update_bars(progress: Progress, bars: dict[str, int], views: dict[str, dict]) -> None:
    for name, bar in bars.items():
        view = views.get(name)
        if view is None:
            continue
        rate = f"{view['rows_per_s']:,.0f} rows/s" if view["rows_per_s"] else ""
        eta = "built" if view["state"] == "BUILT" else f"ETA {render.duration_text(view['eta_s'])}"
        progress.update(bar, completed=view["progress"], tasks=f"{view['tasks_done']}/{view['tasks_total']} tasks",
                        rows=f"{view['rows_done']:,} rows scanned {rate}", eta=eta)


def build_views(data_dir: Path, addresses: list[str], kill_leader: bool, timeout: float) -> float:
    """Create the view and the index, draw their progress, kill -9 the leader midway; the seconds to BUILT."""
    step("creating a materialized view and an index while the writer writes")
    started = time.monotonic()
    run_statements(addresses, VIEW_SCHEMA)
    killed = not kill_leader
    with Progress(*build_columns(), console=console) as progress:
        bars = {name: progress.add_task(name, total=1.0, tasks="", rows="", eta="") for name in (VIEW, INDEX)}
        while True:
            views = {v["name"]: v for v in client.status(addresses, views_only=True)["views"]}  # no node probes
            update_bars(progress, bars, views)
            states = [views[name]["state"] for name in bars if name in views]
            if len(states) == len(bars) and all(state == "BUILT" for state in states):
                break
            if not killed and min(views[name]["progress"] for name in bars) >= KILL_AT_PROGRESS:
                killed = True
                kill_and_restart_leader(data_dir, addresses, progress)
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"the views were not built within {timeout:g} s")
            time.sleep(POLL)
    return time.monotonic() - started


def kill_and_restart_leader(data_dir: Path, addresses: list[str], progress: Progress) -> None:
    leader = client.status(addresses, views_only=True)["leader"]
    progress.console.print(Text.assemble(("==> ", "bold magenta"),
                                         (f"kill -9 of the Raft leader {leader} in the middle of the build", "bold")))
    cluster_mod.stop_node(data_dir, leader, kill=True)
    progress.console.print(Text(f"    {leader} killed; a new leader's view building loop picks up from group0",
                                style="dim"))
    threading.Thread(target=_restart, args=(data_dir, leader, progress), daemon=True).start()


def _restart(data_dir: Path, node_id: str, progress: Progress) -> None:
    try:
        cluster_mod.start_node(data_dir, node_id)
        progress.console.print(Text(f"    {node_id} restarted; its worker answers finished tasks from its ledger",
                                    style="dim"))
    except cluster_mod.ClusterError as error:
        progress.console.print(Text(f"    {node_id} did not restart: {error}", style="red"))


# ------------------------------------------------------------------ the proof


def wait_settled(addresses: list[str]) -> None:
    """Wait until every node is up and every outbox of view updates is empty."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while time.monotonic() < deadline:
        nodes = client.status(addresses)["nodes"]
        if all(n["alive"] and n["pending_view_updates"] == 0 for n in nodes):
            return
        time.sleep(POLL)
    raise TimeoutError(f"view updates still pending after {SETTLE_TIMEOUT:g} s")


def check(addresses: list[str]) -> bool:
    ok = True
    for name in (VIEW, INDEX):
        step(f"vbc check {name}")
        result = client.check(addresses, name)
        console.print(render.check_report(result))
        ok = ok and result["consistent"]
    step("reading through the view and the index (no ALLOW STALE: they are built)")
    alice = client.query(addresses, f"SELECT * FROM {VIEW} WHERE customer = 'alice' LIMIT 3")
    paid = client.query(addresses, "SELECT * FROM demo.orders WHERE status = 'paid' LIMIT 3")
    note(f"alice's first orders: {[row['id'] for row in alice]}; some paid orders: {[row['id'] for row in paid]}")
    return ok


def build_time_text(nodes: list[dict]) -> str:
    """Where the build's time went: the slowest Spark start, then the batches' phases summed over the nodes."""
    workers = [node["worker"] for node in nodes if node.get("worker")]
    start = max((worker["spark_start_s"] for worker in workers), default=0.0)
    read, spark, merge = (sum(worker[key] for worker in workers) for key in ("read_s", "spark_s", "merge_s"))
    return (f"Spark start {start:.1f} s (at node start, in the background); batches: reads {read:.1f} s, "
            f"Spark {spark:.1f} s, merges {merge:.1f} s (summed over the nodes, since each started)")


def summary(rows: int, load_seconds: float, build_seconds: float, writer: Writer, addresses: list[str]) -> None:
    status = client.status(addresses)
    views = {v["name"]: v for v in status["views"]}
    scanned = sum(views[name]["rows_done"] for name in (VIEW, INDEX))
    step("summary")
    note(f"rows loaded:   {rows:,} in {load_seconds:.1f} s ({rows / load_seconds:,.0f} rows/s)", style="")
    note(f"build:         a view and an index over {rows:,} rows x 3 replicas in {build_seconds:.1f} s "
         f"({scanned:,} base rows scanned, {scanned / build_seconds:,.0f} rows/s)", style="")
    note(f"build time:    {build_time_text(status['nodes'])}", style="")
    note(f"live writes:   {writer.writes:,} during the build ({writer.failures} refused while a node was down)",
         style="")


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vbc demo", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("demo-data"), help="wiped first (default ./demo-data)")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help=f"rows to load (default {DEFAULT_ROWS:,})")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--no-kill", action="store_true", help="do not kill the leader during the build")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the build may take (default 900)")
    return parser.parse_args(argv)


def run_demo(args: argparse.Namespace, data_dir: Path) -> bool:
    cluster = start(data_dir, args.nodes, args.shards)
    addresses = [node["grpc"] for node in cluster["nodes"]]
    step("creating the table")
    run_statements(addresses, TABLE_SCHEMA)
    load_seconds = load(addresses, args.rows)
    wait_spark_ready(addresses)
    writer = Writer(addresses, args.rows)
    step("starting a writer: inserts, updates that move view rows, deletes")
    writer.start()
    try:
        build_seconds = build_views(data_dir, addresses, not args.no_kill and args.nodes > 1, args.timeout)
    finally:
        writer.stop()
    note(f"writer stopped after {writer.writes:,} writes")
    wait_settled(addresses)
    ok = check(addresses)
    summary(args.rows, load_seconds, build_seconds, writer, addresses)
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cluster_mod.stop_on_signals()
    data_dir = args.data_dir.resolve()
    prepare_data_dir(data_dir)
    ok = False
    try:
        ok = run_demo(args, data_dir)
    except cluster_mod.ClusterStartError as exc:
        console.print(Text(f"the cluster did not start: {exc.report()}", style="red"))
    except grpc.RpcError as exc:
        console.print(Text(f"error: {client.error_text(exc)}", style="red"))
    except TimeoutError as exc:
        console.print(Text(f"error: {exc}", style="red"))
    except KeyboardInterrupt:
        console.print(Text("interrupted", style="red"))
    finally:
        if cluster_mod.cluster_path(data_dir).exists():
            step("stopping the cluster (the data stays in " + str(data_dir) + ")")
            for node_id, outcome in cluster_mod.stop_cluster(data_dir).items():
                note(f"{node_id}: {outcome}")
    console.print(Text("demo passed" if ok else "demo FAILED", style="bold green" if ok else "bold red"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
