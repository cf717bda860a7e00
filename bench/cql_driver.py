"""CQL native protocol benchmark: the Python driver (cassandra-driver) against our gRPC client, same node, same rows.

Run: `.venv/bin/python bench/cql_driver.py [--rows N] [--inserts I] [--connections C]`.
One node (TLS, as `vbc cluster up` makes it; the driver logs in by password, the gRPC client with root's certificate):
- single-row prepared INSERT p50: I inserts through each client, in alternating blocks of 100 so both meet the same
  moments of the machine; ratio = driver / gRPC (target <= 1.2);
- paged scan: N rows (default 1,000,000) loaded with `vbc load`, then `SELECT * FROM b.scan` in pages of 5,000 rows:
  the driver iterating its rows, the gRPC client fetching Arrow pages (`vbc.reads.pages`); ratio = driver rows/s /
  gRPC rows/s (target >= 0.5), best of 3 each;
- C connections (default 100) open at once, each running a query: all answered, and the wall time.
"""
from __future__ import annotations

import argparse
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from cassandra.auth import PlainTextAuthProvider  # noqa: E402
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile  # noqa: E402
from cassandra.policies import RoundRobinPolicy  # noqa: E402
from cassandra.query import SimpleStatement  # noqa: E402

from bench.read_path import vbc  # noqa: E402
from vbc import client, reads  # noqa: E402
from vbc import cluster as cluster_mod  # noqa: E402

PAGE = 5000
BLOCK = 100


def driver_cluster(data_dir: Path, port: int, connections: int = 1) -> Cluster:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(str(data_dir / client.CREDENTIALS_DIR / "ca.crt"))
    context.check_hostname = False
    password = (data_dir / client.CREDENTIALS_DIR / cluster_mod.ROOT_PASSWORD_NAME).read_text().strip()
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=600)
    return Cluster(["127.0.0.1"], port=port, ssl_context=context, protocol_version=4,
                   auth_provider=PlainTextAuthProvider(client.DEFAULT_USER, password),
                   execution_profiles={EXEC_PROFILE_DEFAULT: profile}, connect_timeout=30)


def insert_latencies(address: str, session, count: int) -> tuple[list[float], list[float]]:
    statement = "INSERT INTO b.single (id, name, score) VALUES (?, ?, ?)"
    prepared = session.prepare(statement)
    for i in range(300):  # warm both paths: prepared statements, sessions, caches
        client.execute(address, statement, params=[[-1 - i, "warm", 0.0]])
        session.execute(prepared, (-10_000 - i, "warm", 0.0))
    ours, driver = [], []
    for start in range(0, count, BLOCK):
        for i in range(start, min(start + BLOCK, count)):
            began = time.perf_counter()
            client.execute(address, statement, params=[[i, f"n{i}", i / 3]])
            ours.append(time.perf_counter() - began)
        for i in range(start, min(start + BLOCK, count)):
            began = time.perf_counter()
            session.execute(prepared, (count + i, f"n{i}", i / 3))
            driver.append(time.perf_counter() - began)
    return ours, driver


def scan_rates(address: str, session, rows: int, runs: int = 3) -> tuple[float, float]:
    statement = "SELECT * FROM b.scan"
    ours, driver = [], []
    for _ in range(runs):
        began = time.perf_counter()
        seen = sum(page.rows.num_rows for page in reads.pages(address, statement, page_size=PAGE, timeout=600))
        ours.append(rows / (time.perf_counter() - began))
        assert seen == rows, (seen, rows)
        began = time.perf_counter()
        seen = sum(1 for _ in session.execute(SimpleStatement(statement, fetch_size=PAGE)))
        driver.append(rows / (time.perf_counter() - began))
        assert seen == rows, (seen, rows)
    return max(ours), max(driver)


def many_connections(data_dir: Path, port: int, count: int) -> tuple[int, float]:
    """`count` driver clusters (one connection each) connected at once, each running a query; (answered, seconds)."""
    answered, lock, errors = [0], threading.Lock(), []
    clusters = [driver_cluster(data_dir, port) for _ in range(count)]

    def work(driver: Cluster) -> None:
        try:
            row = driver.connect().execute("SELECT count(*) FROM b.single").one()
            with lock:
                answered[0] += row.count > 0
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(repr(error))

    began = time.perf_counter()
    threads = [threading.Thread(target=work, args=(driver,)) for driver in clusters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - began
    for driver in clusters:
        driver.shutdown()
    if errors:
        print(f"  {len(errors)} connection(s) failed, the first: {errors[0]}")
    return answered[0], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--inserts", type=int, default=2000)
    parser.add_argument("--connections", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vbc-bench-cql-") as tmp:
        data_dir = Path(tmp) / "cluster"
        rows_file = Path(tmp) / "rows.parquet"
        keys = pa.array(range(args.rows), pa.int32())
        pq.write_table(pa.table({"key": keys, "c": pc.remainder(keys, 10), "v": pc.cast(keys, pa.string())}),
                       rows_file)
        vbc("cluster", "up", "--nodes", "1", "--data-dir", str(data_dir), "--detach")
        try:
            target = ("--cluster", str(data_dir))
            vbc("exec", *target, "CREATE KEYSPACE b WITH replication = {'rf': 1} AND tablets = {'initial': 8}")
            vbc("exec", *target, "CREATE TABLE b.single (id int PRIMARY KEY, name text, score double)")
            vbc("exec", *target, "CREATE TABLE b.scan (key int PRIMARY KEY, c int, v text)")
            vbc("load", *target, "b.scan", str(rows_file), "--quiet")
            [address] = client.addresses_from_cluster(data_dir)
            port = int(cluster_mod.load_cluster(data_dir)["nodes"][0]["cql"].rsplit(":", 1)[1])
            driver = driver_cluster(data_dir, port)
            session = driver.connect()
            ours, theirs = insert_latencies(address, session, args.inserts)
            p50_ours, p50_driver = statistics.median(ours), statistics.median(theirs)
            print(f"single-row prepared INSERT p50: driver {p50_driver * 1000:.2f} ms, gRPC client "
                  f"{p50_ours * 1000:.2f} ms; ratio {p50_driver / p50_ours:.2f} (target <= 1.2)")
            rate_ours, rate_driver = scan_rates(address, session, args.rows)
            print(f"paged scan of {args.rows:,} rows (pages of {PAGE:,}): driver {rate_driver:,.0f} rows/s, gRPC client "
                  f"{rate_ours:,.0f} rows/s; ratio {rate_driver / rate_ours:.2f} (target >= 0.5)")
            driver.shutdown()
            answered, seconds = many_connections(data_dir, port, args.connections)
            print(f"{args.connections} connections at once: {answered} answered in {seconds:.1f} s")
        finally:
            cluster_mod.stop_cluster(data_dir)


if __name__ == "__main__":
    main()
