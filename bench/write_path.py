"""Write-path benchmark: rows/s through a real cluster vs. SQLite and PostgreSQL inserts of the same rows, single-row
latency (beside the same gRPC calls with empty handlers, for a ratio), and Raft commit latency.

Run: `make bench` or `.venv/bin/python bench/write_path.py [--rows N] [--batch B] [--arrow-batch A] [--clients C]
[--repeat R] [--insecure]`; `--compare-tls` measures TLS against `--insecure` instead (3 nodes RF 3, single-row
p50 and Arrow batches, R pairs of fresh clusters). Clusters serve mutual TLS, as `vbc cluster up` does by default.
For 1 node RF 1 and 3 nodes RF 3, each with 0 and 1 materialized view, rows/s of four ways to write the same rows:
`text` (BEGIN BATCH statement text of B INSERTs), `prepared` (one prepared INSERT, B value sets per execution),
`arrow` (the prepared INSERT with A value sets as one Arrow IPC stream), `load` (`vbc load` of a Parquet file, A
rows per execution, its checking pass included; into a table with a view the rows go through the replicas' staging
areas and the load ends once they are visible, so its time includes their processing; `--load-rows N` gives it more
rows than the others; `--methods` picks the ways measured). text/prepared/arrow run C concurrent clients spread over the
nodes; load is one process. Baselines, same rows, same run: SQLite `executemany` (WAL, one transaction per B or A
rows) and, when PostgreSQL 15 is installed, psycopg `executemany` and `COPY` (a table with the same primary key,
and one secondary index for the 1-view rows). Ratios are ours / SQLite `executemany` with the same rows per
transaction: absolute times are noisy. Each of R runs per method (default 5, each into a fresh table) is paired with a
SQLite `executemany` run of the same rows made just before it, and the median of the R ratios is printed (with the
medians of both rates), so neither a stall of the machine nor a method's first-use costs decides a figure. Every
run starts after `os.sync()` and after the cluster has sent its view updates: an fsync of the baseline (a WAL
checkpoint) otherwise waits for the writeback of the cluster's earlier writes (measured: 40% fewer rows/s).
"""
from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from bench import rpc_floor  # noqa: E402
from bench.postgres import PostgresUnavailable, throwaway_server  # noqa: E402
from bench.raft_commit import measure_commit_latency  # noqa: E402
from vbc import client, load  # noqa: E402
from vbc.cluster import start_cluster, stop_cluster  # noqa: E402

CONFIGS = [(1, 1, 0), (1, 1, 1), (3, 3, 0), (3, 3, 1)]  # (nodes, rf, views)
METHODS = ("text", "prepared", "arrow", "load")
COLUMNS = ("id", "name", "score", "grp")


def make_rows(count: int, seed: int = 7) -> list[tuple]:
    rnd = random.Random(seed)
    return [(i, f"name-{rnd.randrange(10**6)}", rnd.random() * 1000, rnd.randrange(100)) for i in range(count)]


def arrow_table(rows: list[tuple]) -> pa.Table:
    return pa.table({name: [r[i] for r in rows] for i, name in enumerate(COLUMNS)},
                    schema=pa.schema([("id", pa.int32()), ("name", pa.string()), ("score", pa.float64()),
                                      ("grp", pa.int32())]))


# ------------------------------------------------------------------ baselines


def sqlite_baseline(rows: list[tuple], batch: int, index: bool = False) -> float:
    """Rows/s of plain SQLite inserts (WAL, one transaction per batch) into a table of the same shape."""
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(Path(tmp) / "baseline.db", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, score REAL, grp INTEGER)")
        if index:
            db.execute("CREATE INDEX t_grp ON t (grp, id)")
        start = time.perf_counter()
        for i in range(0, len(rows), batch):
            db.execute("BEGIN")
            db.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows[i:i + batch])
            db.execute("COMMIT")
        elapsed = time.perf_counter() - start
        db.close()
    return len(rows) / elapsed


def postgres_baselines(rows: list[tuple], batch: int, index: bool) -> dict[str, float] | None:
    """Rows/s of psycopg `executemany` and `COPY` (one transaction per batch); None without PostgreSQL."""
    import psycopg
    try:
        with throwaway_server(fsync=True) as url:
            dsn = url.replace("postgresql+psycopg://", "postgresql://")
            rates = {}
            for way in ("executemany", "copy"):
                with psycopg.connect(dsn, autocommit=False) as conn:
                    conn.execute(f"CREATE TABLE t_{way} (id int PRIMARY KEY, name text, score double precision, "
                                 "grp int)")
                    if index:
                        conn.execute(f"CREATE INDEX ON t_{way} (grp, id)")
                    conn.commit()
                    start = time.perf_counter()
                    for i in range(0, len(rows), batch):
                        _postgres_batch(conn, way, rows[i:i + batch])
                        conn.commit()
                    rates[way] = len(rows) / (time.perf_counter() - start)
            return rates
    except PostgresUnavailable:
        return None


def _postgres_batch(conn, way: str, rows: list[tuple]) -> None:
    with conn.cursor() as cursor:
        if way == "executemany":
            cursor.executemany("INSERT INTO t_executemany VALUES (%s, %s, %s, %s)", rows)
            return
        with cursor.copy("COPY t_copy (id, name, score, grp) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


# ------------------------------------------------------------------ ours


def batch_statement(rows: list[tuple], table: str) -> str:
    inserts = " ".join(f"INSERT INTO {table} (id, name, score, grp) VALUES ({i}, '{n}', {s!r}, {g});"
                       for i, n, s, g in rows)
    return f"BEGIN BATCH {inserts} APPLY BATCH"


def create_table(address: str, table: str, views: int) -> None:
    """The table, and its view once built (over no rows: the writes measured maintain it, they do not race its
    build)."""
    client.execute(address, f"CREATE TABLE {table} (id int, name text, score double, grp int, PRIMARY KEY (id))")
    if views:
        client.execute(address, f"CREATE MATERIALIZED VIEW {table}_by_grp AS SELECT * FROM {table} "
                                "WHERE grp IS NOT NULL AND id IS NOT NULL PRIMARY KEY (grp, id)")
        client.wait_built(address, f"{table}_by_grp", 300)


def method_rate(method: str, addresses: list[str], table: str, rows: list[tuple], batch: int, arrow_batch: int,
                clients: int, tmp: Path) -> float:
    """Rows/s of one way of writing `rows` into `table`."""
    insert = f"INSERT INTO {table} (id, name, score, grp) VALUES (?, ?, ?, ?)"
    if method == "load":
        path = tmp / f"{table}.parquet"
        pq.write_table(arrow_table(rows), path, row_group_size=arrow_batch)
        started = time.perf_counter()
        load.load(addresses, table, path, arrow_batch)
        return len(rows) / (time.perf_counter() - started)
    if method == "text":
        work = [(batch_statement(rows[i:i + batch], table), None) for i in range(0, len(rows), batch)]
    elif method == "prepared":
        work = [(insert, [list(r) for r in rows[i:i + batch]]) for i in range(0, len(rows), batch)]
    else:
        work = [(insert, arrow_table(rows[i:i + arrow_batch])) for i in range(0, len(rows), arrow_batch)]
    return len(rows) / _run_clients(work, addresses, clients)


@dataclass(frozen=True)
class Paired:
    """Medians over the runs of one method: our rows/s, SQLite's rows/s in the run just before, and their ratio."""

    ours: float
    sqlite: float
    ratio: float

    @classmethod
    def of(cls, runs: list[tuple[float, float]]) -> Paired:
        return cls(statistics.median(o for o, _ in runs), statistics.median(b for _, b in runs),
                   statistics.median(o / b for o, b in runs))


def cluster_rates(nodes: int, rf: int, views: int, rows: list[tuple], batch: int, arrow_batch: int,
                  clients: int, repeat: int, insecure: bool = False, methods: tuple[str, ...] = METHODS,
                  spark_prestart: bool = True,
                  load_rows: list[tuple] | None = None) -> tuple[dict[str, Paired], Latencies | None]:
    """Per method, `repeat` runs through one fresh cluster (a table per run), each paired with a SQLite baseline run
    just before it; and single-row latencies (3 nodes only). The cluster serves mutual TLS unless `insecure`; its
    nodes start their Spark sessions at once unless `spark_prestart` is False."""
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        cluster = start_cluster(tmp / "cluster", nodes=nodes, die_with_parent=True, insecure=insecure,
                                spark_prestart=spark_prestart)
        try:
            addresses = [n["grpc"] for n in cluster["nodes"]]
            client.execute(addresses[0], f"CREATE KEYSPACE bench WITH replication = {{'rf': {rf}}} "
                                         "AND tablets = {'initial': 8}")

            def run_once(method: str, run: int) -> tuple[float, float]:
                rows_ = load_rows if method == "load" and load_rows else rows
                table = f"bench.t_{method}_{run}"
                create_table(addresses[0], table, views)
                os.sync()
                baseline = sqlite_baseline(rows_, batch if method in ("text", "prepared") else arrow_batch, bool(views))
                os.sync()
                rate = method_rate(method, addresses, table, rows_, batch, arrow_batch, clients, tmp)
                written = client.query(addresses[0], f"SELECT COUNT(*) FROM {table}")[0]["count"]
                assert written == len(rows_), f"{method}: expected {len(rows_)} rows, found {written}"
                wait_for_view_updates(addresses)
                return rate, baseline

            rates = {method: Paired.of([run_once(method, run) for run in range(repeat)]) for method in methods}
            latencies = None
            if nodes == 3:
                os.sync()  # the runs above left the machine writing back their pages
                latencies = single_row_latencies(addresses[0], views)
            return rates, latencies
        finally:
            stop_cluster(tmp / "cluster")


def wait_for_view_updates(addresses: list[str], timeout: float = 300.0) -> None:
    """Return once no node has view updates left to send, so the next run (and its baseline) does not share the
    machine with this one's view maintenance."""
    deadline = time.monotonic() + timeout
    while any(node["pending_view_updates"] for node in client.status(addresses)["nodes"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"view updates still pending after {timeout:.0f} s")
        time.sleep(0.05)


@dataclass(frozen=True)
class Latencies:
    """Seconds per single-row INSERT, and per call of the same pattern with empty handlers (bench/rpc_floor.py)
    taken beside them."""

    inserts: list[float]
    floor: list[float]


def single_row_latencies(address: str, views: int, count: int = 1500, warm_up: int = 500,
                         block: int = 100) -> Latencies:
    """Single-row INSERTs through the (cached) prepared statement, one client, after `warm_up` uncounted ones (steady
    state: right after the bulk runs, in one run, the first 500 of 1,500 had p50 2.74 ms and the last 500 1.87 ms).

    Blocks of `block` INSERTs alternate with blocks of as many calls through `bench/rpc_floor.py`'s empty
    coordinator and replicas, gRPC's price of the same calls at that moment: the ratio does not move with the
    machine as the milliseconds do."""
    create_table(address, "bench.single", views)
    insert = "INSERT INTO bench.single (id, name, score, grp) VALUES (?, ?, ?, ?)"
    with rpc_floor.floor_call() as floor_call:
        for i in range(warm_up):
            client.execute(address, insert, params=[[-1 - i, "warm", 0.0, 0]])
            floor_call()
        latencies = Latencies([], [])
        for start in range(0, count, block):
            for i in range(start, min(start + block, count)):
                values = [[i, f"n{i}", i / 3, i % 100]]
                latencies.inserts.append(rpc_floor.timed(client.execute, address, insert, params=values))
            for _ in range(start, min(start + block, count)):
                latencies.floor.append(rpc_floor.timed(floor_call))
        return latencies


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


def compare_tls(rows: list[tuple], args: argparse.Namespace) -> None:
    """TLS against plaintext on 3 nodes RF 3, no view: single-row INSERT p50 and Arrow batch rows/s, `args.repeat`
    pairs of fresh clusters (TLS first, then plaintext), and the medians of the per-pair ratios. No view is built,
    so the nodes start no Spark JVM beside the measurement (--no-spark-prestart)."""
    p50s, rates = {True: [], False: []}, {True: [], False: []}
    for _ in range(args.repeat):
        for insecure in (False, True):
            paired, latencies = cluster_rates(3, 3, 0, rows, args.batch, args.arrow_batch, args.clients, 1,
                                              insecure, methods=("arrow",), spark_prestart=False)
            p50s[insecure].append(statistics.median(latencies.inserts))
            rates[insecure].append(paired["arrow"].ours)
    p50_ratios = [tls / plain for tls, plain in zip(p50s[False], p50s[True])]
    rate_ratios = [tls / plain for tls, plain in zip(rates[False], rates[True])]
    print("\nTLS against --insecure, 3 nodes RF 3, no view, " + f"{args.repeat} pairs of clusters:")
    print("  single-row prepared INSERT p50: TLS " + ", ".join(f"{v * 1000:.2f}" for v in p50s[False]) + " ms; insecure "
          + ", ".join(f"{v * 1000:.2f}" for v in p50s[True]) + f" ms; ratio {statistics.median(p50_ratios):.2f} "
          "(target <= 1.3)")
    print("  Arrow batches: TLS " + ", ".join(f"{v:,.0f}" for v in rates[False]) + " rows/s; insecure "
          + ", ".join(f"{v:,.0f}" for v in rates[True]) + f" rows/s; ratio {statistics.median(rate_ratios):.2f} "
          "(target >= 0.9)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=200, help="INSERTs per BATCH text / value sets per execution")
    parser.add_argument("--arrow-batch", type=int, default=5_000, help="rows per Arrow execution and per load batch")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5, help="runs per method; medians are printed")
    parser.add_argument("--raft-n", type=int, default=1000, help="Raft commands for the latency figure (0: skip it)")
    parser.add_argument("--configs", default=",".join(f"{n}/{rf}/{v}" for n, rf, v in CONFIGS),
                        help="nodes/rf/views of each cluster to measure, comma separated (default: all four)")
    parser.add_argument("--insecure", action="store_true", help="clusters serve plaintext gRPC (default: mutual TLS)")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"ways of writing to measure, comma separated (default: {','.join(METHODS)})")
    parser.add_argument("--load-rows", type=int, default=0,
                        help="rows of the `load` way (default: --rows); a staged load's fixed cost (its tasks' "
                             "round trip) weighs less on more rows")
    parser.add_argument("--compare-tls", action="store_true",
                        help="only 3 nodes RF 3: Arrow batches and single-row INSERTs over TLS and with --insecure, "
                             "alternating clusters, and their ratios")
    args = parser.parse_args()
    configs = [tuple(int(part) for part in config.split("/")) for config in args.configs.split(",")]

    rows = make_rows(args.rows)
    methods = tuple(m for m in args.methods.split(",") if m)
    unknown = set(methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown method(s) {', '.join(sorted(unknown))}: use {', '.join(METHODS)}")
    if args.compare_tls:
        compare_tls(rows, args)
        return
    print(f"write path: {args.rows:,} rows (load: {args.load_rows or args.rows:,}, staged into a table with a view); "
          f"text/prepared: {args.batch} per execution, arrow/load: "
          f"{args.arrow_batch} per execution; {args.clients} concurrent clients (load: one process); "
          f"medians of {args.repeat} runs, each paired with a SQLite executemany run of the same rows")
    for nodes, rf, views in configs:
        ours, latencies = cluster_rates(nodes, rf, views, rows, args.batch, args.arrow_batch, args.clients,
                                        args.repeat, args.insecure, methods=methods,
                                        load_rows=make_rows(args.load_rows) if args.load_rows else None)
        pg = postgres_baselines(rows, args.batch, bool(views))
        print(f"\n{nodes} node{'s' if nodes > 1 else ''} RF {rf}, {views} view{'s' if views != 1 else ''}: "
              + (f"PostgreSQL executemany {pg['executemany']:,.0f}, COPY {pg['copy']:,.0f} rows/s ({args.batch}/txn)"
                 if pg else "PostgreSQL not installed"))
        for method in methods:
            paired = ours[method]
            per_txn = args.batch if method in ("text", "prepared") else args.arrow_batch
            print(f"  {method:<9} {paired.ours:>10,.0f} rows/s   SQLite executemany {paired.sqlite:>10,.0f} rows/s "
                  f"({per_txn}/txn)   ratio {paired.ratio:.3f}")
        if latencies:
            p50, p99 = statistics.median(latencies.inserts), statistics.quantiles(latencies.inserts, n=100)[98]
            floor = statistics.median(latencies.floor)
            print(f"  single-row prepared INSERT: p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms; the same gRPC "
                  f"calls with empty handlers (bench/rpc_floor.py, alternating blocks) p50 {floor * 1000:.2f} ms; "
                  f"ratio {p50 / floor:.2f}")

    if args.raft_n <= 0:
        return
    report = measure_commit_latency(args.raft_n, baseline_n=50)
    print(f"\nreplicated Raft command, 3 members on loopback ({report['mode']}), group0 settings vs pysyncobj "
          "defaults:")
    for role in ("leader", "follower"):
        tuned, base = report["tuned"][role], report["baseline"][role]
        print(f"  proposed on the {role:<8}: p50 {tuned['p50_ms']:.2f} ms, p99 {tuned['p99_ms']:.2f} ms "
              f"(defaults: p50 {base['p50_ms']:.1f} ms; {report['p50_speedup'][role]:.0f}x faster)")


if __name__ == "__main__":
    main()
