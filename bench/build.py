"""View building benchmark on the path users take: `vbc cluster up`, `vbc load`, `CREATE MATERIALIZED VIEW`,
`vbc wait-built`, against SQLite's own set-based build of the same rows, measured in the same run.

Run: `.venv/bin/python bench/build.py [--rows N] [--runs R] [--skip-cold] [--skip-3-nodes] [--skip-coordination]`
(default 1,000,000 rows, 2 runs of the main figure).

The table is `b.tab(key int, c int, v text, PRIMARY KEY (key, c))`, 8 tablets, with rows `(i // 10, i % 10,
str(i))` loaded from a Parquet file by `vbc load`; the view is `PRIMARY KEY (c, key, v)`. Each figure is the
seconds from `vbc exec "CREATE MATERIALIZED VIEW ..."` to the end of `vbc wait-built` (both run as commands,
as a user runs them), on a fresh cluster from `vbc cluster up --shards 2` (every node's defaults):

- **user's path, 1 node**: the view is created 45 s after `vbc cluster up` started the node (`--settle`): the
  node had the time any real cluster has between its start and its first `CREATE`; `--runs` fresh clusters;
- **cold, 1 node**: the view is created right after the load;
- **3 nodes RF 3**: the user's path on three nodes (three copies of every row, on the same 2 cores).

Baseline: SQLite's own `INSERT INTO view SELECT ... ON CONFLICT DO UPDATE ... WHERE newer` over the same rows in
the storage layout (bench/bulk.py), the median of `--baseline-runs` builds into fresh view tables. The ratio is
ours / baseline; 3 nodes are compared with one baseline build. The per-phase seconds (read, Spark, merge, summed
over batches and shards) come from `vbc status`.

A driver JVM starts from the machine's Spark class-data archive once a node has made it (worker/spark_class_cache.py:
in the background after a node's first warm-up, once per machine, Spark and Java): each figure says whether the
archive was there when its cluster started. A machine's very first cluster starts without it.

`--direct` measures the former variant instead, labelled as such: rows written straight into each replica's
store and every node's Spark warmed by a 10-row view first (a case no user meets).
`--skip-coordination` skips the coordination figure: a view over an empty table of 256 tablets, RF 3 on 3 nodes
(768 tasks), seconds per task, once every node's Spark session is ready.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench.bulk import BASE, TS, sqlite_set_based_build, view_spec  # noqa: E402
from coordinator.core.tokens import token_of  # noqa: E402
from storage.cells import TableSpec  # noqa: E402
from storage.store import NodeStore  # noqa: E402
from storage.upsert import physical_table_name  # noqa: E402
from vbc import client  # noqa: E402
from vbc import cluster as cluster_mod  # noqa: E402
from worker.spark_class_cache import cache_directory  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VIEW = ("CREATE MATERIALIZED VIEW b.mv AS SELECT * FROM b.tab "
        "WHERE c IS NOT NULL AND key IS NOT NULL AND v IS NOT NULL PRIMARY KEY (c, key, v)")
BUILD_TIMEOUT = 1800.0


# ------------------------------------------------------------------ the baseline


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


# ------------------------------------------------------------------ the user's path


def vbc(*args: str, timeout: float = BUILD_TIMEOUT) -> str:
    """Run one `vbc` command as a user does; its standard output."""
    done = subprocess.run([sys.executable, "-m", "vbc", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"vbc {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def write_rows(path: Path, rows: int) -> Path:
    """The rows `(i // 10, i % 10, str(i))` as a Parquet file for `vbc load`."""
    keys = pa.array(range(rows), pa.int32())
    table = pa.table({"key": pa.compute.divide(keys, 10), "c": pa.compute.remainder(keys, 10),
                      "v": pa.compute.cast(keys, pa.string())})
    pq.write_table(table, path)
    return path


def user_path(tmp: Path, name: str, nodes: int, rows_file: Path, shards: int, settle: float) -> dict:
    """A fresh cluster, the rows loaded with `vbc load`, the view created `settle` s after the cluster started
    (at once when 0); the seconds from CREATE to BUILT and the per-phase seconds of the build."""
    data_dir = tmp / name
    archived = class_archive_present()
    started = time.monotonic()
    vbc("cluster", "up", "--nodes", str(nodes), "--data-dir", str(data_dir), "--shards", str(shards), "--detach")
    try:
        target = ("--cluster", str(data_dir))
        vbc("exec", *target, f"CREATE KEYSPACE b WITH replication = {{'rf': {nodes}}} AND tablets = {{'initial': 8}}")
        vbc("exec", *target, "CREATE TABLE b.tab (key int, c int, v text, PRIMARY KEY (key, c))")
        load_started = time.monotonic()
        vbc("load", *target, "b.tab", str(rows_file), "--quiet")
        loaded = time.monotonic() - load_started
        time.sleep(max(0.0, started + settle - time.monotonic()))  # the scenario: a node that has been up a while
        reset_peak_memory(cluster_mod.load_cluster(data_dir)["nodes"][0]["pid"])
        build_started = time.perf_counter()
        vbc("exec", *target, VIEW)
        vbc("wait-built", *target, "b.mv", "--timeout", str(BUILD_TIMEOUT))
        seconds = time.perf_counter() - build_started
        status = json.loads(vbc("status", *target, "--json"))
        memory = peak_memory(cluster_mod.load_cluster(data_dir)["nodes"][0]["pid"])
    finally:
        cluster_mod.stop_cluster(data_dir)
    view = next(v for v in status["views"] if v["name"] == "b.mv")
    return {"seconds": seconds, "load_seconds": loaded, "rows_done": view["rows_done"], "archived": archived,
            "tasks": view["tasks_total"], "phases": phases(status), "batches": batch_lines(data_dir),
            "memory": memory}


def class_archive_present() -> bool:
    directory = cache_directory()
    return directory is not None and any(directory.glob("*.jsa"))


def phases(status: dict) -> dict[str, float]:
    """Seconds spent reading, in Spark and merging, summed over the nodes (absent before they were counted)."""
    workers = [node.get("worker") or {} for node in status["nodes"]]
    return {phase: sum(w.get(f"{phase}_s", 0.0) for w in workers) for phase in ("read", "spark", "merge")
            if any(f"{phase}_s" in w for w in workers)}


def batch_lines(data_dir: Path) -> list[str]:
    """The node logs' per-batch lines (rows, read, spark, merge seconds) of the build."""
    lines = []
    for node in cluster_mod.load_cluster(data_dir)["nodes"]:
        lines += [f"{node['id']}: {line.split(': ', 1)[1]}" for line in Path(node["log"]).read_text().splitlines()
                  if "worker.build_job: batch " in line and " b.tab " in line]
    return lines


# ------------------------------------------------------------------ the former, direct variant


def direct_build(tmp: Path, nodes: int, rows: int, tablets: int, shards: int) -> dict:
    """Rows written straight into every replica's store, every node's Spark warmed by a 10-row view first."""
    data_dir = tmp / f"direct{nodes}"
    addresses = [n["grpc"] for n in cluster_mod.start_cluster(data_dir, nodes=nodes, shards=shards)["nodes"]]
    try:
        client.execute(addresses, f"CREATE KEYSPACE b WITH replication = {{'rf': {nodes}}} "
                                  f"AND tablets = {{'initial': {tablets}}}")
        client.execute(addresses, "CREATE TABLE b.tab (key int, c int, v text, PRIMARY KEY (key, c))")
        table_id = client.admin_stub(addresses[0]).Tablets(client.pb.TabletsRequest(table="b.tab"), timeout=10).table_id
        spec = TableSpec(table_id, BASE.partition_key, BASE.clustering_key, BASE.regular)
        for node in cluster_mod.load_cluster(data_dir)["nodes"]:
            fill(Path(node["data_dir"]) / "storage.db", spec, rows)
        warm_up(addresses, rf=nodes)
        started = time.perf_counter()
        client.execute(addresses, VIEW)
        client.wait_built(addresses, "b.mv", BUILD_TIMEOUT, poll=0.05)
        seconds = time.perf_counter() - started
        status = client.status(addresses)
        memory = peak_memory(cluster_mod.load_cluster(data_dir)["nodes"][0]["pid"])
    finally:
        cluster_mod.stop_cluster(data_dir)
    view = next(v for v in status["views"] if v["name"] == "b.mv")
    return {"seconds": seconds, "rows_done": view["rows_done"], "tasks": view["tasks_total"], "memory": memory}


def warm_up(addresses: list[str], rf: int) -> None:
    client.execute(addresses, f"CREATE KEYSPACE warm WITH replication = {{'rf': {rf}}} AND tablets = {{'initial': 1}}")
    client.execute(addresses, "CREATE TABLE warm.t (a int, b int, PRIMARY KEY (a))")
    client.execute(addresses, "INSERT INTO warm.t (a, b) VALUES (?, ?)", params=[[i, i] for i in range(10)])
    client.execute(addresses, "CREATE MATERIALIZED VIEW warm.v AS SELECT * FROM warm.t "
                              "WHERE b IS NOT NULL AND a IS NOT NULL PRIMARY KEY (b, a)")
    client.wait_built(addresses, "warm.v", BUILD_TIMEOUT)


def peak_memory(pid: int) -> dict[str, int]:
    """Peak resident memory (VmHWM, bytes) of the node process and of its Spark driver JVM (a child)."""
    return {name: _hwm(process) for name, process in _node_processes(pid).items()}


def reset_peak_memory(pid: int) -> None:
    """Start the node's and its JVM's peaks afresh (Linux: `clear_refs` 5), so that they measure the build alone and
    not the load before it."""
    for process in _node_processes(pid).values():
        Path(f"/proc/{process}/clear_refs").write_text("5")


def _node_processes(pid: int) -> dict[str, int]:
    processes = {"node": pid}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (int(c) for c in (task / "children").read_text().split()):
            if "java" in Path(f"/proc/{child}/comm").read_text():
                processes["spark jvm"] = child
    return processes


def _hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


# ------------------------------------------------------------------ coordination


def wait_spark_ready(addresses: list[str], timeout: float = 300.0) -> None:
    """Until every node's Spark session finished starting (the coordination figure is not about JVM starts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = [node.get("worker") or {} for node in client.status(addresses)["nodes"]]
        if all(w.get("spark_state") in ("ready", "failed", "off") for w in workers):
            return
        time.sleep(0.5)
    raise TimeoutError("the nodes' Spark sessions did not get ready")


def bench_coordination(tmp: Path, tablets: int, shards: int) -> dict:
    data_dir = tmp / "coordination"
    addresses = [n["grpc"] for n in cluster_mod.start_cluster(data_dir, nodes=3, shards=shards)["nodes"]]
    try:
        wait_spark_ready(addresses)
        client.execute(addresses, f"CREATE KEYSPACE b WITH replication = {{'rf': 3}} AND tablets = {{'initial': {tablets}}}")
        client.execute(addresses, "CREATE TABLE b.tab (key int, c int, v text, PRIMARY KEY (key, c))")
        started = time.perf_counter()
        client.execute(addresses, VIEW)
        client.wait_built(addresses, "b.mv", BUILD_TIMEOUT, poll=0.05)
        seconds = time.perf_counter() - started
        tasks = next(v for v in client.status(addresses)["views"] if v["name"] == "b.mv")["tasks_total"]
    finally:
        cluster_mod.stop_cluster(data_dir)
    return {"seconds": seconds, "tasks": tasks}


# ------------------------------------------------------------------ report


def report(label: str, result: dict, base_seconds: float, rows: int, copies: int, target: float) -> None:
    assert result["rows_done"] == rows * copies, (label, result["rows_done"], rows * copies)
    ratio = result["seconds"] / base_seconds
    loaded = f", loaded in {result['load_seconds']:.1f} s" if "load_seconds" in result else ""
    if "archived" in result:
        loaded += f", JVM class-data archive {'present' if result['archived'] else 'absent'}"
    print(f"{label}: {result['tasks']} tasks{loaded}; CREATE -> BUILT {result['seconds']:.2f} s, "
          f"{rows * copies / result['seconds']:,.0f} rows/s; ratio {ratio:.2f} (target <= {target:g})")
    if result.get("phases"):
        print("  time in batches (all shards and nodes): " +
              ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in result["phases"].items()))
    for line in result.get("batches", []):
        print(f"  {line}")
    if "memory" in result:
        print("  peak memory (n1, from CREATE on): " + ", ".join(f"{k} {v / 2**20:,.0f} MiB"
                                                          for k, v in result["memory"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2, help="fresh 1-node clusters measured on the user's path")
    parser.add_argument("--shards", type=int, default=2, help="shards per node (default 2)")
    parser.add_argument("--settle", type=float, default=45.0,
                        help="seconds between the node's start and CREATE on the user's path (default 45)")
    parser.add_argument("--baseline-runs", type=int, default=3,
                        help="SQLite builds measured; the ratio is to their median (one build varies by 30%%)")
    parser.add_argument("--skip-cold", action="store_true")
    parser.add_argument("--skip-3-nodes", action="store_true")
    parser.add_argument("--skip-coordination", action="store_true")
    parser.add_argument("--coordination-tablets", type=int, default=256)
    parser.add_argument("--direct", action="store_true",
                        help="the former variant: rows written straight into the stores, Spark warmed by a tiny view")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vbc-bench-build-") as name:
        tmp = Path(name)
        times = baseline(tmp, args.rows, args.baseline_runs)
        base_seconds = statistics.median(times)
        print(f"baseline: SQLite INSERT..SELECT..ON CONFLICT DO UPDATE..WHERE newer, {args.rows:,} rows: "
              f"{base_seconds:.2f} s (median of {', '.join(f'{t:.2f}' for t in times)})")
        if args.direct:
            for nodes in (1,) if args.skip_3_nodes else (1, 3):
                report(f"direct writes, warmed Spark (not a user's path), {nodes} node(s) RF {nodes}",
                       direct_build(tmp, nodes, args.rows, 4, args.shards), base_seconds, args.rows, nodes,
                       2 if nodes == 1 else 6)
        else:
            rows_file = write_rows(tmp / "rows.parquet", args.rows)
            for run in range(1, args.runs + 1):
                report(f"user's path, 1 node, run {run}, CREATE {args.settle:g} s after start",
                       user_path(tmp, f"user{run}", 1, rows_file, args.shards, args.settle),
                       base_seconds, args.rows, 1, 2)
            if not args.skip_cold:
                report("cold, 1 node, CREATE right after the load",
                       user_path(tmp, "cold", 1, rows_file, args.shards, 0.0), base_seconds, args.rows, 1, 3)
            if not args.skip_3_nodes:
                report(f"user's path, 3 nodes RF 3, CREATE {args.settle:g} s after start",
                       user_path(tmp, "three", 3, rows_file, args.shards, args.settle), base_seconds, args.rows, 3, 6)
        if not args.skip_coordination:
            coordination = bench_coordination(tmp, args.coordination_tablets, args.shards)
            per_task = coordination["seconds"] / coordination["tasks"] * 1000
            print(f"coordination: empty table, {args.coordination_tablets} tablets RF 3, {args.shards} shard(s) each, "
                  f"{coordination['tasks']} tasks: {coordination['seconds']:.2f} s, {per_task:.2f} ms per task "
                  "(target <= 5)")


if __name__ == "__main__":
    main()
