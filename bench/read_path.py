"""Read-path benchmark: a full scan as JSON lines through `vbc exec --json`, COUNT(*), and point lookups by partition
key and through a secondary index, each against SQLite over the same stored rows in the same run.

Run: `.venv/bin/python bench/read_path.py [--rows N] [--runs R] [--lookups L] [--skip-3-nodes]`.
One node: N rows (default 1,000,000) loaded with `vbc load` into `b.tab (key int, c int, v text, PRIMARY KEY (key,
c))` with an index on `v`, then
- scan: `vbc exec --json "SELECT * FROM b.tab"` into a file, minus the CLI's start-up (the same command for one
  partition), against Python's `sqlite3` iterating the node's stored rows (live rows, visible values, in stored
  order) and writing the same JSON lines; ratio = SQLite seconds / ours (target >= 0.3); also the CLI's peak RSS;
- COUNT(*): through the Python client, against SQLite's `SELECT count(*)` of the node's stored table (target <= 5x);
- lookups: p50 and p95 of L prepared `SELECT * ... WHERE key = ?` and `... WHERE v = ?` (index) from one client.
Then the lookups again on 3 nodes RF 3 (target p50 <= 2 ms) holding N rows. The node is stopped before SQLite reads
its file, so both read a file at rest from the page cache.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from vbc import client  # noqa: E402
from vbc import cluster as cluster_mod  # noqa: E402

TIMEOUT = 1200.0


def vbc(*args: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "vbc", *args], cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=TIMEOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"vbc {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def timed_cli(args: list[str], out: Path) -> tuple[float, int]:
    """Seconds and peak RSS (KiB: the process's own VmHWM, sampled while it runs; its rusage would also count this
    process, from which it was forked) of one `vbc` command writing its output to `out`."""
    with open(out, "w") as sink:
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-m", "vbc", *args], cwd=ROOT, stdout=sink,
                                   stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
        peak = 0
        while process.poll() is None:
            peak = max(peak, high_water_mark(process.pid))
            time.sleep(0.05)
        seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"vbc {' '.join(args)} failed: {process.stderr.read().decode()}")
    return seconds, peak


def high_water_mark(pid: int) -> int:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in lines if line.startswith("VmHWM:")), 0)


def write_rows(path: Path, rows: int) -> Path:
    keys = pa.array(range(rows), pa.int32())
    pq.write_table(pa.table({"key": pc.divide(keys, 10), "c": pc.remainder(keys, 10),
                             "v": pc.cast(keys, pa.string())}), path)
    return path


def make_cluster(data_dir: Path, nodes: int, rows_file: Path) -> list[str]:
    vbc("cluster", "up", "--nodes", str(nodes), "--data-dir", str(data_dir), "--detach")
    target = ("--cluster", str(data_dir))
    vbc("exec", *target, f"CREATE KEYSPACE b WITH replication = {{'rf': {nodes}}} AND tablets = {{'initial': 8}}")
    vbc("exec", *target, "CREATE TABLE b.tab (key int, c int, v text, PRIMARY KEY (key, c))")
    vbc("load", *target, "b.tab", str(rows_file), "--quiet")
    vbc("exec", *target, "CREATE INDEX tab_v ON b.tab (v)")
    vbc("wait-built", *target, "b.tab_v", "--timeout", str(TIMEOUT))
    return client.addresses_from_cluster(data_dir)


def lookups(addresses: list[str], rows: int, count: int) -> dict[str, dict[str, float]]:
    rnd = random.Random(5)
    figures = {}
    for name, statement, value in (("partition key", "SELECT * FROM b.tab WHERE key = ?", lambda i: i // 10),
                                   ("index", "SELECT * FROM b.tab WHERE v = ?", lambda i: str(i))):
        for _ in range(20):  # prepare, warm the sessions
            client.execute(addresses[0], statement, params=[[value(rnd.randrange(rows))]])
        seconds = []
        for _ in range(count):
            started = time.perf_counter()
            _, found, _ = client.execute(addresses[0], statement, params=[[value(rnd.randrange(rows))]])
            seconds.append(time.perf_counter() - started)
            assert found, statement
        seconds.sort()
        figures[name] = {"p50_ms": statistics.median(seconds) * 1000, "p95_ms": seconds[int(len(seconds) * 0.95)] * 1000}
    return figures


def stored_table(data_dir: Path, table_id: str) -> tuple[Path, str]:
    from storage.upsert import physical_table_name
    return data_dir / "n1" / "storage.db", physical_table_name(table_id)


def sqlite_json_lines(database: Path, table: str, out: Path) -> float:
    """Python sqlite3 reading the stored live rows and writing them as the same JSON lines: seconds."""
    started = time.perf_counter()
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    query = (f'SELECT c_key, c_c, CASE WHEN tomb_ts IS NULL OR ts_v > tomb_ts THEN c_v END FROM "{table}" '
             "WHERE NOT tombstone ORDER BY token, c_key, c_c")
    with open(out, "w") as sink:
        for key, c, v in connection.execute(query):
            sink.write(json.dumps({"key": key, "c": c, "v": v}, ensure_ascii=False) + "\n")
    connection.close()
    return time.perf_counter() - started


def sqlite_count(database: Path, table: str) -> tuple[float, int]:
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    started = time.perf_counter()
    count = connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    seconds = time.perf_counter() - started
    connection.close()
    return seconds, count


def one_node(tmp: Path, rows_file: Path, rows: int, runs: int, count: int) -> dict:
    data_dir = tmp / "one"
    addresses = make_cluster(data_dir, 1, rows_file)
    target = ["--cluster", str(data_dir)]
    results: dict = {"scan": [], "count": [], "cli_peak_mib": 0.0}
    try:
        table_id = _table_id(addresses)
        for _ in range(runs):
            startup, _ = timed_cli(["exec", *target, "--json", "SELECT * FROM b.tab WHERE key = 0"], tmp / "one.json")
            seconds, peak = timed_cli(["exec", *target, "--json", "--timeout", str(TIMEOUT), "SELECT * FROM b.tab"],
                                      tmp / "ours.json")
            lines = sum(1 for _ in open(tmp / "ours.json"))
            assert lines == rows, f"the scan wrote {lines} lines, not {rows}"
            results["scan"].append({"ours": seconds - startup, "startup": startup})
            results["cli_peak_mib"] = max(results["cli_peak_mib"], peak / 1024)
            started = time.perf_counter()
            _, [[counted]], _ = client.execute(addresses, "SELECT COUNT(*) FROM b.tab", timeout=TIMEOUT)
            results["count"].append({"ours": time.perf_counter() - started})
            assert counted == rows, counted
        results["lookups"] = lookups(addresses, rows, count)
    finally:
        cluster_mod.stop_cluster(data_dir)
    database, table = stored_table(data_dir, table_id)
    for scan, counting in zip(results["scan"], results["count"]):
        scan["sqlite"] = sqlite_json_lines(database, table, tmp / "sqlite.json")
        counting["sqlite"], counted = sqlite_count(database, table)
        assert counted == rows
    return results


def _table_id(addresses: list[str]) -> str:
    return client.admin_stub(addresses[0]).Tablets(client.pb.TabletsRequest(table="b.tab"), timeout=10).table_id


def three_nodes(tmp: Path, rows_file: Path, rows: int, count: int) -> dict:
    data_dir = tmp / "three"
    addresses = make_cluster(data_dir, 3, rows_file)
    try:
        return lookups(addresses, rows, count)
    finally:
        cluster_mod.stop_cluster(data_dir)


def report(results: dict, three: dict | None, rows: int) -> None:
    print(f"\nread path, {rows:,} rows, 1 node")
    for run, scan in enumerate(results["scan"], 1):
        print(f"  scan as JSON lines, run {run}: vbc exec --json {scan['ours']:.2f} s (start-up {scan['startup']:.2f} s "
              f"subtracted), Python sqlite3 {scan['sqlite']:.2f} s, ratio {scan['sqlite'] / scan['ours']:.2f} "
              "(target >= 0.3)")
    print(f"  vbc exec --json peak RSS: {results['cli_peak_mib']:.0f} MiB")
    for run, count in enumerate(results["count"], 1):
        print(f"  COUNT(*), run {run}: {count['ours'] * 1000:.0f} ms, SQLite {count['sqlite'] * 1000:.0f} ms, "
              f"{count['ours'] / count['sqlite']:.1f}x (target <= 5x)")
    for name, figures in results["lookups"].items():
        print(f"  lookup by {name}: p50 {figures['p50_ms']:.2f} ms, p95 {figures['p95_ms']:.2f} ms")
    if three:
        print(f"read path, {rows:,} rows, 3 nodes RF 3")
        for name, figures in three.items():
            print(f"  lookup by {name}: p50 {figures['p50_ms']:.2f} ms, p95 {figures['p95_ms']:.2f} ms "
                  "(target p50 <= 2 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lookups", type=int, default=500)
    parser.add_argument("--skip-3-nodes", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vbc-read-bench-") as tmp:
        tmp = Path(tmp)
        rows_file = write_rows(tmp / "rows.parquet", args.rows)
        results = one_node(tmp, rows_file, args.rows, args.runs, args.lookups)
        three = None if args.skip_3_nodes else three_nodes(tmp, rows_file, args.rows, args.lookups)
        report(results, three, args.rows)


if __name__ == "__main__":
    main()
