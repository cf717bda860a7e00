"""Write-path benchmark: rows/s through a real cluster vs. plain SQLite inserts of the same rows, and Raft commit latency.

Run: `make bench` or `.venv/bin/python bench/write_path.py [--rows N] [--batch B] [--clients C]`.
Scenarios: 1 node RF 1 and 3 nodes RF 3, each with 0 and 1 materialized view, writing BATCH statement
text; and the same INSERT with `?` bind markers and one value set per row (parsed once). The baseline is
SQLite's own `executemany` INSERT of the same rows into one WAL-mode table, one transaction per batch,
measured in the same run. Figures are printed as ratios (ours / baseline): absolute times are noisy.
"""
from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.raft_commit import measure_commit_latency  # noqa: E402
from vbc import client  # noqa: E402
from vbc.cluster import start_cluster, stop_cluster  # noqa: E402

SCENARIOS = [(1, 1, 0, False), (1, 1, 1, False), (3, 3, 0, False), (3, 3, 1, False),
             (1, 1, 0, True), (3, 3, 1, True)]  # (nodes, rf, views, bind markers with value sets)
INSERT = "INSERT INTO bench.t (id, name, score, grp) VALUES (?, ?, ?, ?)"


def make_rows(count: int, seed: int = 7) -> list[tuple]:
    rnd = random.Random(seed)
    return [(i, f"name-{rnd.randrange(10**6)}", rnd.random() * 1000, rnd.randrange(100)) for i in range(count)]


def sqlite_baseline(rows: list[tuple], batch: int) -> float:
    """Rows/s of plain SQLite inserts (WAL, one transaction per batch) into a table of the same shape."""
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "baseline.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, score REAL, grp INTEGER)")
        start = time.perf_counter()
        for i in range(0, len(rows), batch):
            db.execute("BEGIN")
            db.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows[i:i + batch])
            db.execute("COMMIT")
        elapsed = time.perf_counter() - start
        db.close()
    return len(rows) / elapsed


def batch_statement(rows: list[tuple]) -> str:
    inserts = " ".join(f"INSERT INTO bench.t (id, name, score, grp) VALUES ({i}, '{n}', {s!r}, {g});"
                       for i, n, s, g in rows)
    return f"BEGIN BATCH {inserts} APPLY BATCH"


def cluster_rate(nodes: int, rf: int, views: int, bound: bool, rows: list[tuple], batch: int, clients: int) -> float:
    """Rows/s written through a fresh cluster by `clients` concurrent clients spread over its nodes."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = start_cluster(Path(tmp), nodes=nodes, die_with_parent=True)
        try:
            addresses = [n["grpc"] for n in cluster["nodes"]]
            client.execute(addresses[0], f"CREATE KEYSPACE bench WITH replication = {{'rf': {rf}}} AND tablets = {{'initial': 8}}")
            client.execute(addresses[0], "CREATE TABLE bench.t (id int, name text, score double, grp int, PRIMARY KEY (id))")
            if views:
                client.execute(addresses[0], "CREATE MATERIALIZED VIEW bench.by_grp AS SELECT * FROM bench.t "
                                             "WHERE grp IS NOT NULL AND id IS NOT NULL PRIMARY KEY (grp, id)")
            if bound:
                statements = [(INSERT, [list(r) for r in rows[i:i + batch]]) for i in range(0, len(rows), batch)]
            else:
                statements = [(batch_statement(rows[i:i + batch]), None) for i in range(0, len(rows), batch)]
            elapsed = _run_clients(statements, addresses, clients)
            written = client.query(addresses[0], "SELECT COUNT(*) FROM bench.t")[0]["count"]
            assert written == len(rows), f"expected {len(rows)} rows, found {written}"
            return len(rows) / elapsed
        finally:
            stop_cluster(Path(tmp))


def _run_clients(statements: list[tuple], addresses: list[str], clients: int) -> float:
    errors: list[str] = []

    def work(worker: int) -> None:
        address = addresses[worker % len(addresses)]
        for statement, params in statements[worker::clients]:
            try:
                client.execute(address, statement, timeout=120, params=params)
            except Exception as error:  # noqa: BLE001 - reported after the run
                errors.append(str(error))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} batches failed, first: {errors[0]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--raft-n", type=int, default=1000, help="Raft commands for the latency figure")
    args = parser.parse_args()

    rows = make_rows(args.rows)
    print(f"write path: {args.rows} rows, BATCH of {args.batch} INSERTs, {args.clients} concurrent clients")
    print(f"{'scenario':<40} {'ours rows/s':>12} {'sqlite rows/s':>14} {'ratio':>8}")
    for nodes, rf, views, bound in SCENARIOS:
        ours = cluster_rate(nodes, rf, views, bound, rows, args.batch, args.clients)
        baseline = sqlite_baseline(rows, args.batch)
        label = (f"{nodes} node{'s' if nodes > 1 else ''} RF {rf}, {views} view{'s' if views != 1 else ''}, "
                 f"{'? + value sets' if bound else 'BATCH text'}")
        print(f"{label:<40} {ours:>12.0f} {baseline:>14.0f} {ours / baseline:>8.3f}")

    report = measure_commit_latency(args.raft_n, baseline_n=50)
    print(f"\nreplicated Raft command, 3 members on loopback ({report['mode']}), group0 settings vs pysyncobj defaults:")
    for role in ("leader", "follower"):
        tuned, base = report["tuned"][role], report["baseline"][role]
        print(f"  proposed on the {role:<8}: p50 {tuned['p50_ms']:.2f} ms, p99 {tuned['p99_ms']:.2f} ms "
              f"(defaults: p50 {base['p50_ms']:.1f} ms; {report['p50_speedup'][role]:.0f}x faster)")


if __name__ == "__main__":
    main()
