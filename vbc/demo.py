"""`make demo`: a 3-node local cluster, a table with a materialized view and an index, writes, and a view check."""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import grpc
from rich.progress import Progress
from rich.text import Text

from vbc import cli, client
from vbc import cluster as cluster_mod

CUSTOMERS = ["alice", "bob", "carol", "dave", "erin"]
STATUSES = ["new", "paid", "shipped"]
ROWS = 200
SINGLE_INSERTS = 100
BATCH_SIZE = 25
MOVED_TO_ALICE = [2, 3, 4, 7, 8]        # their customer changes to alice: the view row moves partition
MOVED_FROM_ALICE = [5, 10]              # alice's orders handed to frank
DELETED = [190, 191, 192, 193, 194]
CHECK_TIMEOUT = 30.0
ALICE_QUERY = "SELECT * FROM demo.orders_by_customer WHERE customer = 'alice' ALLOW STALE"

SCHEMA = [
    "CREATE KEYSPACE demo WITH replication = {'rf': 3} AND tablets = {'initial': 4}",
    "CREATE TABLE demo.orders (id int, customer text, amount double, status text, PRIMARY KEY (id))",
    "CREATE MATERIALIZED VIEW demo.orders_by_customer AS SELECT * FROM demo.orders "
    "WHERE customer IS NOT NULL AND id IS NOT NULL PRIMARY KEY (customer, id)",
    "CREATE INDEX ON demo.orders (status)",
]

console = cli.stdout_console()


def step(text: str) -> None:
    console.print(Text.assemble(("==> ", "bold cyan"), (text, "bold")))


def note(text: str) -> None:
    console.print(Text(f"    {text}", style="dim"))


def order(order_id: int) -> dict:
    return {"id": order_id, "customer": CUSTOMERS[order_id % len(CUSTOMERS)],
            "amount": round(order_id * 1.37, 2), "status": STATUSES[order_id % len(STATUSES)]}


def insert_statement(row: dict) -> str:
    return (f"INSERT INTO demo.orders (id, customer, amount, status) "
            f"VALUES ({row['id']}, '{row['customer']}', {row['amount']!r}, '{row['status']}')")


# ------------------------------------------------------------------ steps


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


def create_schema(addresses: list[str]) -> None:
    step("creating the schema (through different nodes)")
    for index, statement in enumerate(SCHEMA):
        address = addresses[index % len(addresses)]
        _, _, message = client.execute(address, statement)
        note(f"{address}: {statement}")
        note(f"  -> {message}")


def write_orders(addresses: list[str]) -> dict[int, dict]:
    """200 orders: single INSERTs and BATCHes, round-robin over the nodes; returns them by id."""
    step(f"writing {ROWS} orders round-robin through {len(addresses)} nodes")
    orders = {i: order(i) for i in range(1, ROWS + 1)}
    ids = sorted(orders)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("writing", total=ROWS)
        for n, order_id in enumerate(ids[:SINGLE_INSERTS]):
            client.execute(addresses[n % len(addresses)], insert_statement(orders[order_id]))
            progress.advance(task)
        rest = ids[SINGLE_INSERTS:]
        for n, first in enumerate(range(0, len(rest), BATCH_SIZE)):
            chunk = rest[first:first + BATCH_SIZE]
            batch = "BEGIN BATCH " + " ".join(insert_statement(orders[i]) + ";" for i in chunk) + " APPLY BATCH"
            client.execute(addresses[n % len(addresses)], batch)
            progress.advance(task, len(chunk))
    note(f"{SINGLE_INSERTS} single INSERTs and {len(rest) // BATCH_SIZE} BATCHes of {BATCH_SIZE}")
    return orders


def update_and_delete(addresses: list[str], orders: dict[int, dict]) -> None:
    step("changing the customer of a few orders (their view rows move) and deleting a few")
    changes = [(i, "alice") for i in MOVED_TO_ALICE] + [(i, "frank") for i in MOVED_FROM_ALICE]
    for n, (order_id, customer) in enumerate(changes):
        client.execute(addresses[n % len(addresses)],
                       f"UPDATE demo.orders SET customer = '{customer}' WHERE id = {order_id}")
        orders[order_id]["customer"] = customer
    note(f"moved orders {MOVED_TO_ALICE} to alice and {MOVED_FROM_ALICE} from alice to frank")
    for n, order_id in enumerate(DELETED):
        client.execute(addresses[n % len(addresses)], f"DELETE FROM demo.orders WHERE id = {order_id}")
        del orders[order_id]
    note(f"deleted orders {DELETED}")


def view_key(row: dict) -> tuple:
    return row["customer"], row["id"], row["amount"], row["status"]


def view_matches_base(addresses: list[str]) -> tuple[bool, int, str]:
    """(whole view and alice's partition == what a full base SELECT implies, view rows, difference)."""
    base = client.query(addresses, "SELECT * FROM demo.orders")
    view = client.query(addresses, "SELECT * FROM demo.orders_by_customer ALLOW STALE")
    alice = client.query(addresses, ALICE_QUERY)
    expected = {view_key(r) for r in base if r["customer"] is not None and r["id"] is not None}
    got = {view_key(r) for r in view}
    expected_alice = {key for key in expected if key[0] == "alice"}
    got_alice = {view_key(r) for r in alice}
    if got == expected and len(view) == len(expected) and got_alice == expected_alice and len(alice) == len(got_alice):
        return True, len(view), ""
    return False, len(view), (f"missing {sorted(expected - got)[:5]}, unexpected {sorted(got - expected)[:5]}, "
                              f"alice: missing {sorted(expected_alice - got_alice)[:5]}, "
                              f"unexpected {sorted(got_alice - expected_alice)[:5]}")


def check_view(addresses: list[str], orders: dict[int, dict]) -> bool:
    step("reading the view back")
    note("views report BUILDING until the view building coordinator (next milestone) builds them, "
         "so the demo reads them with ALLOW STALE")
    columns, rows, _ = client.execute(addresses, ALICE_QUERY)
    console.print(cli.result_table(columns, [""] * len(columns), rows))
    expected_alice = sorted(i for i, row in orders.items() if row["customer"] == "alice")
    got_alice = sorted(dict(zip(columns, row))["id"] for row in rows)
    note(f"alice has {len(got_alice)} orders in the view, the demo expects {len(expected_alice)}")
    step("checking that the view equals what the base table implies")
    deadline = time.monotonic() + CHECK_TIMEOUT
    while True:
        ok, count, difference = view_matches_base(addresses)
        if ok:
            console.print(Text(f"view is up to date: {count} rows", style="bold green"))
            return True
        if time.monotonic() >= deadline:
            console.print(Text(f"view does NOT match the base after {CHECK_TIMEOUT:g} s: {difference}", style="bold red"))
            return False
        time.sleep(0.5)


def show_status(data_dir: Path) -> None:
    step(f"vbc status --cluster {data_dir}")
    cli.main(["status", "--cluster", str(data_dir)])
    step(f"vbc tablets --cluster {data_dir} demo.orders")
    cli.main(["tablets", "--cluster", str(data_dir), "demo.orders"])


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m vbc.demo", description=__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("demo-data"), help="wiped first (default ./demo-data)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--shards", type=int, default=2)
    return parser.parse_args(argv)


def run_demo(data_dir: Path, nodes: int, shards: int) -> bool:
    cluster = start(data_dir, nodes, shards)
    addresses = [node["grpc"] for node in cluster["nodes"]]
    create_schema(addresses)
    orders = write_orders(addresses)
    update_and_delete(addresses, orders)
    ok = check_view(addresses, orders)
    show_status(data_dir)
    return ok


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cli.stop_on_signals()
    data_dir = args.data_dir.resolve()
    prepare_data_dir(data_dir)
    ok = False
    try:
        ok = run_demo(data_dir, args.nodes, args.shards)
    except cluster_mod.ClusterStartError as exc:
        console.print(Text(f"the cluster did not start: {exc.report()}", style="red"))
    except grpc.RpcError as exc:
        console.print(Text(f"error: {client.error_text(exc)}", style="red"))
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
