"""View building benchmark: CREATE MATERIALIZED VIEW -> BUILT on real node processes, against SQLite's own
set-based build of the same rows, measured in the same run.

Run: `.venv/bin/python bench/build.py [--rows N] [--skip-3-nodes] [--skip-coordination]` (default 1,000,000 rows).

- build, 1 node RF 1 and 3 nodes RF 3: the table `tab(key int, c int, v text, PRIMARY KEY (key, c))` with rows
  `(i // 10, i % 10, str(i))`, written straight into each replica's store in the storage layout (loading a
  million rows through CQL is bench/write_path.py's subject, not this one's), then `CREATE MATERIALIZED VIEW ... PRIMARY KEY
  (c, key, v)` and the time until the status says BUILT. Baseline: SQLite's own `INSERT INTO view SELECT ... ON
  CONFLICT DO UPDATE ... WHERE newer` over the same rows in the same layout (bench/bulk.py), once per replica
  (3 nodes RF 3 hold three copies: three times the work, on the same 2 cores), the median of `--baseline-runs`
  builds (default 3) into fresh view tables over the same base rows;
- coordination: a view over an empty table of 256 tablets, RF 3 on 3 nodes of `--shards` shards (768 tasks):
  seconds per task;
- peak memory (VmHWM) of a node process and of its Spark driver JVM after the 1M-row build.
Every node's Spark session is warmed up by a view over 10 rows first (a cold session takes 5-25 s on 2 cores; it
starts once per node, at the node's first batch with rows).
Figures are ratios (ours / baseline) next to the seconds: absolute times are noisy.
"""
from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bulk import BASE, TS, sqlite_set_based_build, view_spec  # noqa: E402
from coordinator.core.tokens import token_of  # noqa: E402
from storage.cells import TableSpec  # noqa: E402
from storage.store import NodeStore, physical_table_name  # noqa: E402
from vbc import client  # noqa: E402
from vbc import cluster as cluster_mod  # noqa: E402

VIEW = ("CREATE MATERIALIZED VIEW b.mv AS SELECT * FROM b.tab "
        "WHERE c IS NOT NULL AND key IS NOT NULL AND v IS NOT NULL PRIMARY KEY (c, key, v)")
BUILD_TIMEOUT = 1800.0


def fill(path: Path, spec: TableSpec, rows: int) -> None:
    """The base rows in the storage layout (setup, not measured)."""
    with NodeStore(f"sqlite:///{path}") as store:
        store.ensure_table(spec)
    tokens = {key: token_of((key,), ("int",)) for key in range(rows // 10 + 1)}
    db = sqlite3.connect(path, isolation_level=None, timeout=60)
    db.execute("BEGIN IMMEDIATE")
    db.executemany(f"INSERT INTO {physical_table_name(spec.table_id)} VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, 0)",
                   ((tokens[i // 10], i // 10, i % 10, str(i), TS + i, TS + i, TS + i, TS + i) for i in range(rows)))
    db.execute("COMMIT")
    db.close()


def baseline(tmp: Path, rows: int, runs: int) -> list[float]:
    """SQLite's set-based build of the view over `rows` base rows of one replica, `runs` times over the same base
    rows (each into a fresh view table); seconds of each."""
    path = tmp / "baseline.db"
    fill(path, BASE, rows)
    times = []
    for _ in range(runs):
        view = view_spec()
        with NodeStore(f"sqlite:///{path}") as store:
            store.ensure_table(view)
        times.append(sqlite_set_based_build(path, view))
    path.unlink()
    return times


def start(tmp: Path, name: str, nodes: int, shards: int = 1) -> tuple[Path, list[str]]:
    data_dir = tmp / name
    cluster = cluster_mod.start_cluster(data_dir, nodes=nodes, shards=shards)
    return data_dir, [node["grpc"] for node in cluster["nodes"]]


def create_base(addresses: list[str], rf: int, tablets: int) -> str:
    client.execute(addresses, f"CREATE KEYSPACE b WITH replication = {{'rf': {rf}}} AND tablets = {{'initial': {tablets}}}")
    client.execute(addresses, "CREATE TABLE b.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    response = client.admin_stub(addresses[0]).Tablets(client.pb.TabletsRequest(table="b.tab"), timeout=10)
    return response.table_id


def warm_up(addresses: list[str], rf: int) -> None:
    """Build a view over a few rows first, so every node's Spark session is running (a cold one takes 5-25 s)."""
    client.execute(addresses, f"CREATE KEYSPACE warm WITH replication = {{'rf': {rf}}} AND tablets = {{'initial': 1}}")
    client.execute(addresses, "CREATE TABLE warm.t (a int, b int, PRIMARY KEY (a))")
    client.execute(addresses, "INSERT INTO warm.t (a, b) VALUES (?, ?)", params=[[i, i] for i in range(10)])
    client.execute(addresses, "CREATE MATERIALIZED VIEW warm.v AS SELECT * FROM warm.t "
                              "WHERE b IS NOT NULL AND a IS NOT NULL PRIMARY KEY (b, a)")
    client.wait_built(addresses, "warm.v", BUILD_TIMEOUT)


def build_seconds(addresses: list[str]) -> float:
    started = time.perf_counter()
    client.execute(addresses, VIEW)
    client.wait_built(addresses, "b.mv", BUILD_TIMEOUT, poll=0.05)
    return time.perf_counter() - started


def peak_memory(pid: int) -> dict[str, int]:
    """Peak resident memory (VmHWM, bytes) of the node process and of its Spark driver JVM (a child)."""
    peaks = {"node": _hwm(pid)}
    for child in _children(pid):
        if "java" in Path(f"/proc/{child}/comm").read_text():
            peaks["spark jvm"] = _hwm(child)
    return peaks


def _hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return children


def bench_build(tmp: Path, nodes: int, rows: int, tablets: int, shards: int) -> dict:
    data_dir, addresses = start(tmp, f"build{nodes}", nodes, shards)
    try:
        table_id = create_base(addresses, rf=nodes, tablets=tablets)
        spec = TableSpec(table_id, BASE.partition_key, BASE.clustering_key, BASE.regular)
        for node in cluster_mod.load_cluster(data_dir)["nodes"]:
            fill(Path(node["data_dir"]) / "storage.db", spec, rows)  # RF = nodes: every node holds every row
        warm_up(addresses, rf=nodes)
        seconds = build_seconds(addresses)
        status = client.status(addresses)
        view = next(v for v in status["views"] if v["name"] == "b.mv")
        scanned = sum((n["worker"] or {}).get("rows_scanned", 0) for n in status["nodes"]) - 10 * nodes  # warm-up
        memory = peak_memory(cluster_mod.load_cluster(data_dir)["nodes"][0]["pid"])
    finally:
        cluster_mod.stop_cluster(data_dir)
    assert view["rows_done"] == rows * nodes == scanned, (view["rows_done"], scanned)
    return {"seconds": seconds, "memory": memory, "tasks": view["tasks_total"]}


def bench_coordination(tmp: Path, tablets: int, shards: int) -> dict:
    data_dir, addresses = start(tmp, "coordination", 3, shards)
    try:
        create_base(addresses, rf=3, tablets=tablets)
        seconds = build_seconds(addresses)
        tasks = next(v for v in client.status(addresses)["views"] if v["name"] == "b.mv")["tasks_total"]
    finally:
        cluster_mod.stop_cluster(data_dir)
    return {"seconds": seconds, "tasks": tasks}


def mib(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tablets", type=int, default=4, help="tablets of the 1M-row base table (default 4)")
    parser.add_argument("--shards", type=int, default=2, help="shards per node: batches run in parallel per shard")
    parser.add_argument("--coordination-tablets", type=int, default=256)
    parser.add_argument("--baseline-runs", type=int, default=3,
                        help="SQLite builds measured; the ratio is to their median (one build varies by 30%%)")
    parser.add_argument("--skip-3-nodes", action="store_true")
    parser.add_argument("--skip-coordination", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vbc-bench-build-") as name:
        tmp = Path(name)
        times = baseline(tmp, args.rows, args.baseline_runs)
        base_seconds = statistics.median(times)
        print(f"baseline: SQLite INSERT..SELECT..ON CONFLICT DO UPDATE..WHERE newer, {args.rows:,} rows: "
              f"{base_seconds:.2f} s (median of {', '.join(f'{t:.2f}' for t in times)})")
        one = bench_build(tmp, 1, args.rows, args.tablets, args.shards)
        print(f"1 node RF 1, {args.shards} shard(s), {args.rows:,} rows, {one['tasks']} tasks: CREATE MATERIALIZED VIEW -> BUILT "
              f"{one['seconds']:.2f} s; ratio {one['seconds'] / base_seconds:.2f} (target <= 2)")
        print("  peak memory: " + ", ".join(f"{k} {mib(v)}" for k, v in one["memory"].items()))
        if not args.skip_3_nodes:
            three = bench_build(tmp, 3, args.rows, args.tablets, args.shards)
            print(f"3 nodes RF 3, {args.shards} shard(s) each, {args.rows:,} rows x 3 replicas, {three['tasks']} tasks: "
                  f"{three['seconds']:.2f} s; ratio to one baseline build {three['seconds'] / base_seconds:.2f} "
                  f"(target <= 6)")
            print("  peak memory (n1): " + ", ".join(f"{k} {mib(v)}" for k, v in three["memory"].items()))
        if not args.skip_coordination:
            coordination = bench_coordination(tmp, args.coordination_tablets, args.shards)
            per_task = coordination["seconds"] / coordination["tasks"] * 1000
            print(f"coordination: empty table, {args.coordination_tablets} tablets RF 3, {args.shards} shard(s) each, "
                  f"{coordination['tasks']} "
                  f"tasks: {coordination['seconds']:.2f} s, {per_task:.2f} ms per task (target <= 5)")


if __name__ == "__main__":
    main()
