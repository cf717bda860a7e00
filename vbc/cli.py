"""The `vbc` command line: run a node, manage a local cluster, run statements and inspect a running cluster."""
from __future__ import annotations

import argparse
import getpass
import json
import os
import signal
import sys
import time
from pathlib import Path

import grpc
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from common.processes import end_with_parent
from vbc import client
from vbc import cluster as cluster_mod
from vbc.cluster import stop_on_signals
from vbc.render import (check_report, injection_point_rows, injection_points_table, nodes_table, render_status,
                        result_table, stdout_console, tablets_table)

ADDR_ENV = "VBC_ADDR"
NO_TARGET_MESSAGE = "give --addr HOST:PORT or --cluster DIR"
DEFAULT_WATCH_SECONDS = 2.0
FOREGROUND_REFRESH_SECONDS = 2.0


class UsageError(Exception):
    """A usage problem found after parsing; reported like argparse does (exit status 2)."""


# ------------------------------------------------------------------ argument types


def host_port(text: str) -> str:
    """argparse type for HOST:PORT."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port in 1-65535, got {text!r}")
    return text


def json_params(text: str) -> list[list]:
    """argparse type for --params: a JSON list of lists of scalars."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"--params is not valid JSON: {error}") from None
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
        raise argparse.ArgumentTypeError("--params must be a JSON list of lists, one list of values per execution")
    if any(isinstance(v, (list, dict)) for row in value for v in row):
        raise argparse.ArgumentTypeError("--params values must be numbers, strings, booleans or null")
    if any(type(v) is int and not -(2**63) <= v < 2**63 for row in value for v in row):
        raise argparse.ArgumentTypeError("--params integers must fit in 64 bits")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def parse_peers(text: str) -> dict[str, tuple[str, str]]:
    """--peers ID=GRPC/RAFT,... -> {id: (grpc, raft)}; an empty string means no peers."""
    peers: dict[str, tuple[str, str]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node_id, eq, addresses = item.partition("=")
        grpc_addr, slash, raft_addr = addresses.partition("/")
        if not eq or not slash or not node_id.strip():
            raise argparse.ArgumentTypeError(
                f"bad peer {item!r}: expected ID=GRPC_HOST:PORT/RAFT_HOST:PORT, e.g. n2=127.0.0.1:9044/127.0.0.1:9045"
            )
        node_id = node_id.strip()
        try:
            peer = (host_port(grpc_addr.strip()), host_port(raft_addr.strip()))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"bad peer {item!r}: {exc}") from None
        if node_id in peers:
            raise argparse.ArgumentTypeError(f"peer {node_id!r} is given twice")
        peers[node_id] = peer
    return peers


def absolute_path(text: str) -> Path:
    """argparse type for a directory or file: made absolute now, so it means the same from any working directory."""
    return Path(text).expanduser().resolve()


def storage_url(text: str) -> str:
    """argparse type for --storage-url: a SQLite database file given by a relative path is made absolute."""
    scheme, sep, rest = text.partition(":///")
    if not sep or scheme.split("+")[0] != "sqlite" or not rest or rest.startswith(("/", ":memory:", "file:")):
        return text
    path, query_sep, query = rest.partition("?")
    return f"{scheme}:///{absolute_path(path)}{query_sep}{query}"


def table_name(text: str) -> str:
    keyspace, dot, name = text.partition(".")
    if not dot or not keyspace or not name:
        raise argparse.ArgumentTypeError(f"expected KS.TABLE, got {text!r}")
    return text


# ------------------------------------------------------------------ parser


def target_options() -> argparse.ArgumentParser:
    """The --addr / --cluster options shared by every client command."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_mutually_exclusive_group()
    group.add_argument("--addr", type=host_port, metavar="HOST:PORT", help="gRPC address of any node")
    group.add_argument("--cluster", metavar="DIR", help="data dir of a local cluster (any live node of DIR/cluster.json)")
    parent.add_argument("--credentials", type=absolute_path, metavar="DIR",
                        help="certificates to connect with: ca.crt and client.USER.crt/.key (default: DIR/credentials "
                             "with --cluster, else $VBC_CREDENTIALS, else plaintext)")
    parent.add_argument("--user", metavar="NAME",
                        help="log in as this role by password ($VBC_PASSWORD, else asked on the terminal), through "
                             "the nodes' client ports; ca.crt of --credentials or DIR/credentials verifies the nodes")
    return parent


def add_node_parser(commands) -> None:
    node = commands.add_parser("node", help="run a node")
    node_commands = node.add_subparsers(dest="node_command", metavar="COMMAND", required=True)
    start = node_commands.add_parser("start", help="run one node in the foreground until SIGTERM/SIGINT")
    start.add_argument("--id", required=True, help="node id, e.g. n1")
    start.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    start.add_argument("--grpc", required=True, type=host_port, metavar="HOST:PORT", help="client/admin gRPC address")
    start.add_argument("--raft", required=True, type=host_port, metavar="HOST:PORT", help="Raft address")
    start.add_argument("--client-addr", type=host_port, metavar="HOST:PORT",
                       help="a second gRPC port for password logins (`--user`): TLS without client certificates")
    start.add_argument("--peers", type=parse_peers, default={}, metavar="ID=GRPC/RAFT,...", help="the other nodes")
    start.add_argument("--shards", type=positive_int, default=1, metavar="N")
    start.add_argument("--storage-url", type=storage_url, metavar="URL",
                       help="SQLAlchemy URL of this node's storage (default: SQLite in DATA_DIR/storage.db)")
    start.add_argument("--metrics", metavar="HOST:PORT", help="serve Prometheus metrics over HTTP on this address")
    start.add_argument("--metrics-tls", action="store_true",
                       help="serve the metrics over HTTPS with the node's certificate (node.crt, node.key)")
    start.add_argument("--spark-master", metavar="URL",
                       help="Spark master for view building jobs (default local[N], N = CPUs; e.g. spark://host:7077)")
    start.add_argument("--spark-memory", default="1g", metavar="SIZE",
                       help="memory of the node's Spark driver JVM (spark.driver.memory; default 1g)")
    start.add_argument("--max-statement-bytes", type=positive_int, metavar="N",
                       help="longest statement text accepted, in UTF-8 bytes (default 4 MiB)")
    start.add_argument("--max-value-bytes", type=positive_int, metavar="N",
                       help="largest bind value accepted, in bytes (default 16 MiB)")
    start.add_argument("--max-batch-rows", type=positive_int, metavar="N",
                       help="most value sets or BATCH statements in one execution (default 50,000)")
    start.add_argument("--spark-java-options", metavar="OPTIONS",
                       help="JVM options of the node's Spark driver (default: parallel GC, C1 JIT only; "
                            "'' for the JVM's own defaults)")
    start.add_argument("--enable-injections", action="store_true",
                       help="let `vbc inject` (Admin.Inject) switch fault injection points on: for tests and local "
                            "clusters only, as any host that reaches the gRPC port can then stall or fail the node")
    start.add_argument("--spark-prestart", action=argparse.BooleanOptionalAction, default=True,
                       help="start the Spark session and warm it up in the background when the node starts (default); "
                            "--no-spark-prestart starts it at the first view building batch, so the node holds no JVM "
                            "until it builds")
    start.add_argument("--insecure", action="store_true",
                       help="serve plaintext gRPC: any host that reaches the port can read and write every table and "
                            "act as a node (logged as a warning, shown in vbc status); by default the node serves "
                            "mutual TLS with ca.crt, node.crt and node.key of --certs-dir")
    start.add_argument("--certs-dir", type=absolute_path, metavar="DIR",
                       help="the node's certificates: ca.crt, node.crt, node.key (default: the data directory)")
    start.add_argument("--raft-secret-file", type=Path, metavar="FILE",
                       help="the cluster's Raft secret (`vbc cluster up` writes DIR/raft.secret, mode 0600); the same "
                            "on every node. Default: $VBC_RAFT_PASSWORD")
    start.add_argument("--join", type=lambda text: [host_port(a) for a in text.split(",") if a], metavar="HOST:PORT,...",
                       help="join a running cluster through any of its nodes (gRPC address): this node is admitted "
                            "into the Raft group and starts with its members as peers")
    start.set_defaults(handler=cmd_node_start, parser=start)
    target = target_options()
    for action, text in (("decommission", "move every tablet replica off a live node, then remove it from the cluster"),
                         ("remove", "remove a dead node: its tablet replicas are rebuilt from the surviving ones")):
        leave = node_commands.add_parser(action, parents=[target], help=text)
        leave.add_argument("node_id", metavar="ID")
        leave.add_argument("--no-wait", action="store_true", help="return once the node is marked as leaving")
        leave.add_argument("--timeout", type=positive_float, default=3600.0, metavar="S",
                           help="give up waiting after S seconds (exit status 1; default 3600)")
        leave.set_defaults(handler=cmd_node_leave, parser=leave, dead=action == "remove")


def add_cluster_parser(commands) -> None:
    cluster = commands.add_parser("cluster", help="manage a local development cluster")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)

    up = cluster_commands.add_parser("up", help="start N node processes on 127.0.0.1")
    up.add_argument("--nodes", type=positive_int, required=True, metavar="N")
    up.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    up.add_argument("--shards", type=positive_int, default=1, metavar="S")
    up.add_argument("--base-port", type=positive_int, metavar="P", help="grpc = P+2(i-1), raft = P+2(i-1)+1")
    up.add_argument("--storage-url", type=storage_url, metavar="URL",
                    help="SQLAlchemy URL per node; {node} is replaced by the node id (each node needs its own database)")
    up.add_argument("--detach", action="store_true", help="return once the cluster is up, leaving it running")
    up.add_argument("--no-injections", dest="injections", action="store_false",
                    help="start the nodes without --enable-injections, so `vbc inject` is refused (by default a "
                         "local cluster's nodes run with it)")
    up.add_argument("--no-spark-prestart", dest="spark_prestart", action="store_false",
                    help="start the nodes with --no-spark-prestart: each starts Spark at its first view building batch")
    up.add_argument("--insecure", action="store_true",
                    help="plaintext gRPC without certificates; by default DIR/credentials gets the cluster's CA and the "
                         "client certificate of user root, and each node its node certificate")
    up.add_argument("--root-password-file", type=Path, metavar="FILE",
                    help="the password of the superuser root (its first line), set at the cluster's first start; "
                         "by default a random one, written to DIR/credentials/root.password (mode 0600)")
    up.add_argument("--timeout", type=positive_float, default=cluster_mod.START_TIMEOUT, metavar="S")
    up.set_defaults(handler=cmd_cluster_up, parser=up)

    down = cluster_commands.add_parser("down", help="stop every node (the data is kept)")
    down.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    down.add_argument("--timeout", type=positive_float, default=cluster_mod.STOP_TIMEOUT, metavar="S")
    down.set_defaults(handler=cmd_cluster_down, parser=down)

    stop = cluster_commands.add_parser("stop-node", help="stop one node")
    stop.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    stop.add_argument("id", metavar="ID")
    stop.add_argument("--kill", action="store_true", help="SIGKILL instead of SIGTERM")
    stop.add_argument("--timeout", type=positive_float, default=cluster_mod.STOP_TIMEOUT, metavar="S")
    stop.set_defaults(handler=cmd_cluster_stop_node, parser=stop)

    start = cluster_commands.add_parser("start-node", help="restart one node with its recorded arguments")
    start.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    start.add_argument("id", metavar="ID")
    start.add_argument("--timeout", type=positive_float, default=cluster_mod.START_TIMEOUT, metavar="S")
    start.set_defaults(handler=cmd_cluster_start_node, parser=start)

    add = cluster_commands.add_parser("add-node", help="start one more node that joins the running cluster")
    add.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    add.add_argument("--shards", type=positive_int, metavar="S", help="default: as the cluster's other nodes")
    add.add_argument("--timeout", type=positive_float, default=cluster_mod.START_TIMEOUT, metavar="S")
    add.set_defaults(handler=cmd_cluster_add_node, parser=add)


def add_client_parsers(commands) -> None:
    target = target_options()

    execute = commands.add_parser("exec", parents=[target], help="run one CQL statement")
    execute.add_argument("statement", metavar="STATEMENT", help="the statement, or - to read it from stdin")
    execute.add_argument("--json", action="store_true", help="one JSON object per result row")
    execute.add_argument("--params", type=json_params, metavar="JSON",
                         help="values for the ? bind markers: a JSON list of lists, one list per execution "
                              "(e.g. '[[1, \"a\"], [2, \"b\"]]')")
    execute.add_argument("--timeout", type=positive_float, default=client.DEFAULT_TIMEOUT, metavar="S",
                         help="seconds the statement may take, all its rows included (default %(default)s); past "
                              "it the statement ends with DEADLINE_EXCEEDED saying how far it got")
    execute.add_argument("--trace", action="store_true",
                         help="print how a SELECT read its rows (partitions, an index, or a scan) on stderr")
    execute.set_defaults(handler=cmd_exec, parser=execute)

    load = commands.add_parser("load", parents=[target], help="load a CSV or Parquet file into a table")
    load.add_argument("table", type=table_name, metavar="KS.TABLE")
    load.add_argument("file", type=Path, metavar="FILE", help="a .csv (header line with column names) or .parquet file")
    load.add_argument("--batch-rows", type=positive_int, default=20_000, metavar="N",
                      help="rows per execution (default 20,000)")
    load.add_argument("--quiet", action="store_true", help="no progress bar")
    load.set_defaults(handler=cmd_load, parser=load)

    status = commands.add_parser("status", parents=[target], help="cluster, node and view-building status")
    status.add_argument("--json", action="store_true")
    status.add_argument("--watch", type=positive_float, nargs="?", const=DEFAULT_WATCH_SECONDS, metavar="SECONDS",
                        help=f"refresh every SECONDS (default {DEFAULT_WATCH_SECONDS:g}) until Ctrl-C")
    status.set_defaults(handler=cmd_status, parser=status)

    tablets = commands.add_parser("tablets", parents=[target], help="the tablets of a table")
    tablets.add_argument("table", type=table_name, metavar="KS.TABLE")
    tablets.add_argument("--json", action="store_true", help="one JSON object per tablet")
    tablets.set_defaults(handler=cmd_tablets, parser=tablets)

    tablet = commands.add_parser("tablet", help="tablet operations (move)")
    tablet_commands = tablet.add_subparsers(dest="tablet_command", metavar="OPERATION", required=True)
    move = tablet_commands.add_parser("move", parents=[target],
                                      help="move one replica of a tablet to another node or shard, streaming its rows")
    move.add_argument("table", type=table_name, metavar="KS.TABLE")
    move.add_argument("tablet", type=int, metavar="TABLET", help="the tablet's number (see `vbc tablets`)")
    move.add_argument("from_replica", metavar="FROM", help="the replica that leaves: NODE or NODE:SHARD")
    move.add_argument("to_replica", metavar="TO", help="where it goes: NODE or NODE:SHARD (default: least loaded shard)")
    move.add_argument("--no-wait", action="store_true", help="print the migration's id and return at once")
    move.add_argument("--timeout", type=positive_float, default=3600.0, metavar="S",
                      help="give up waiting after S seconds (exit status 1; default 3600)")
    move.add_argument("--json", action="store_true", help="print the migration's final state as JSON")
    move.set_defaults(handler=cmd_tablet_move, parser=move)
    for action, text in (("split", "double a table's tablets (each splits in two on the same replicas)"),
                         ("merge", "halve a table's tablets (pairs first move onto the same replicas)")):
        resize = tablet_commands.add_parser(action, parents=[target], help=text)
        resize.add_argument("table", type=table_name, metavar="KS.TABLE")
        resize.add_argument("--no-wait", action="store_true", help="return once the change is requested")
        resize.add_argument("--timeout", type=positive_float, default=3600.0, metavar="S",
                            help="give up waiting after S seconds (exit status 1; default 3600)")
        resize.set_defaults(handler=cmd_tablet_resize, parser=resize, merge=action == "merge")

    balance = commands.add_parser("balancer", parents=[target],
                                  help="the tablet load balancer: spreads replicas evenly over nodes and shards")
    balance.add_argument("action", choices=("on", "off", "status"), nargs="?", default="status")
    balance.add_argument("--json", action="store_true")
    balance.set_defaults(handler=cmd_balancer, parser=balance)

    demo = commands.add_parser("demo", help="a 3-node cluster builds a view and an index online, through a leader "
                                            "kill -9 (what `make demo` runs; `vbc demo --help`)", add_help=False)
    demo.set_defaults(handler=demo_elsewhere, parser=demo)

    wait = commands.add_parser("wait-built", parents=[target], help="wait until a view or index is built")
    wait.add_argument("view", type=table_name, metavar="KS.VIEW")
    wait.add_argument("--timeout", type=positive_float, default=600.0, metavar="S",
                      help="give up after S seconds (exit status 1; default 600)")
    wait.add_argument("--json", action="store_true", help="print the view's final status as JSON")
    wait.set_defaults(handler=cmd_wait_built, parser=wait)

    check = commands.add_parser("check", parents=[target],
                                help="compare a view with its function of the base table (exit 1 on differences)")
    check.add_argument("view", type=table_name, metavar="KS.VIEW")
    check.add_argument("--json", action="store_true")
    check.add_argument("--examples", type=positive_int, default=5, metavar="N", help="examples per kind (default 5)")
    check.add_argument("--timeout", type=positive_float, default=600.0, metavar="S")
    check.set_defaults(handler=cmd_check, parser=check)

    archive = commands.add_parser(
        "spark-archive", help="make this installation's Spark class-data archive now (about a minute, once): driver "
                              "JVMs then start in about half the time; nodes otherwise make it after their first start")
    archive.add_argument("--spark-java-options", metavar="OPTIONS",
                         help="the JVM options of the nodes that will use it (default: the nodes' default)")
    archive.set_defaults(handler=cmd_spark_archive, parser=archive)

    inject = commands.add_parser("inject", parents=[target], help="error injection points of a running node")
    inject.add_argument("name", nargs="?", metavar="NAME", help="injection point")
    inject.add_argument("--node", metavar="ID", help="act on this node (default: the node connected to)")
    action = inject.add_mutually_exclusive_group(required=True)
    action.add_argument("--enable", action="store_true")
    action.add_argument("--disable", action="store_true")
    action.add_argument("--wait-hit", type=positive_float, metavar="SECONDS",
                        help="exit 0 once the point was hit, 1 after SECONDS without a hit")
    action.add_argument("--list", action="store_true", help="list the injection points")
    inject.add_argument("--one-shot", action="store_true", help="with --enable: disable after the first hit")
    inject.add_argument("--mode", choices=["fail", "pause"],
                        help="with --enable: fail or pause (default: the point's own mode, which follows its name; --list shows it)")
    inject.add_argument("--json", action="store_true")
    inject.set_defaults(handler=cmd_inject, parser=inject)


def add_certs_parser(commands) -> None:
    certs = commands.add_parser("certs", help="certificates of a secure cluster: a CA, node and client certificates")
    certs_commands = certs.add_subparsers(dest="certs_command", metavar="COMMAND", required=True)
    lifetime = argparse.ArgumentParser(add_help=False)
    lifetime.add_argument("--lifetime-days", type=positive_int, metavar="N",
                          help="days the certificate is valid (default: 10 years for a CA, 5 for the others)")
    lifetime.add_argument("--overwrite", action="store_true", help="replace the files if they exist")
    lifetime.add_argument("--ca-key", type=absolute_path, metavar="PATH",
                          help="the CA's private key (default: DIR/ca.key); keep it apart from what nodes and "
                               "clients are given, e.g. in a folder only you can read")

    create_ca = certs_commands.add_parser("create-ca", parents=[lifetime],
                                          help="make the cluster's CA: DIR/ca.crt and its key (DIR/ca.key, or "
                                               "--ca-key PATH: keep it apart)")
    create_ca.add_argument("directory", type=absolute_path, metavar="DIR")
    create_ca.set_defaults(handler=cmd_certs, certs_action=certs_create_ca, parser=create_ca)

    create_node = certs_commands.add_parser("create-node", parents=[lifetime],
                                            help="make node.crt and node.key for a node, signed by DIR's CA")
    create_node.add_argument("directory", type=absolute_path, metavar="DIR", help="the directory of the CA")
    create_node.add_argument("node_id", metavar="NODE_ID")
    create_node.add_argument("--host", dest="hosts", action="append", required=True, metavar="H",
                             help="an IP address or DNS name the node is reached at (repeat for each)")
    create_node.add_argument("--out", type=absolute_path, metavar="OUTDIR",
                             help="write the files here, with a copy of ca.crt (default: DIR)")
    create_node.set_defaults(handler=cmd_certs, certs_action=certs_create_node, parser=create_node)

    create_client = certs_commands.add_parser("create-client", parents=[lifetime],
                                              help="make client.USER.crt and client.USER.key, signed by DIR's CA")
    create_client.add_argument("directory", type=absolute_path, metavar="DIR", help="the directory of the CA")
    create_client.add_argument("user", metavar="USER")
    create_client.add_argument("--out", type=absolute_path, metavar="OUTDIR",
                               help="write the files here, with a copy of ca.crt (default: DIR)")
    create_client.set_defaults(handler=cmd_certs, certs_action=certs_create_client, parser=create_client)

    listing = certs_commands.add_parser("list", help="the certificates of a directory: kind, name, hosts, expiry")
    listing.add_argument("directory", type=absolute_path, metavar="DIR")
    listing.set_defaults(handler=cmd_certs, certs_action=certs_list, parser=listing)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vbc", description="vbc: materialized views over tablet-partitioned tables")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_node_parser(commands)
    add_cluster_parser(commands)
    add_client_parsers(commands)
    add_certs_parser(commands)
    return parser


def demo_elsewhere(args: argparse.Namespace) -> int:
    """`vbc demo` has its own parser and module (vbc/__main__.py hands it to vbc.demo); this parser only lists it."""
    raise UsageError("the demo runs through vbc.__main__ (the vbc command, python -m vbc) or python -m vbc.demo")


def main(argv: list[str] | None = None) -> int:
    """Every `vbc` command but `vbc demo` (see vbc/__main__.py); returns the exit status (2 on usage errors)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        try:
            return run(args)
        except UsageError as exc:
            args.parser.error(str(exc))  # prints the command's usage line, exits with status 2
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run the chosen command, turning operation errors into `error: ...` on stderr and exit status 1."""
    try:
        return args.handler(args) or 0
    except grpc.RpcError as exc:
        print(f"error: {client.error_text(exc)}", file=sys.stderr)
        if exc.code() == grpc.StatusCode.UNAVAILABLE and not client.has_credentials():
            print("hint: nodes serve TLS unless started with --insecure: connect with --cluster DIR (its "
                  "DIR/credentials), --credentials DIR or $VBC_CREDENTIALS", file=sys.stderr)
        elif exc.code() == grpc.StatusCode.UNAVAILABLE and getattr(args, "user", None) \
                and not getattr(args, "cluster", None):
            print(f"hint: --user logs in by password on a node's client port (`vbc node start --client-addr`; "
                  f"\"client\" in DIR/cluster.json), not on its gRPC port, which takes certificates only: is "
                  f"{', '.join(named_addresses(args))} a client port? With --cluster DIR, --user finds them",
                  file=sys.stderr)
    except (cluster_mod.ClusterError, client.ClusterFileError, LookupError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 1


# ------------------------------------------------------------------ shared helpers


def target_addresses(args: argparse.Namespace) -> list[str]:
    """The addresses named by --addr, --cluster or $VBC_ADDR (comma separated), connected to with --credentials,
    or logged in to with --user."""
    if getattr(args, "user", None):
        return login_addresses(args)
    addresses = named_addresses(args)
    if getattr(args, "credentials", None):
        client.use_credentials(client.credentials_from(args.credentials), addresses)
    return addresses


def login_addresses(args: argparse.Namespace) -> list[str]:
    """--user: the client ports of --cluster's nodes (or --addr, $VBC_ADDR as given), with a password login."""
    ca_folder = args.credentials or os.environ.get(client.CREDENTIALS_ENV)
    if args.cluster:
        addresses = client.login_addresses_from_cluster(args.cluster)
        ca_folder = ca_folder or Path(args.cluster) / client.CREDENTIALS_DIR
    else:
        addresses = named_addresses(args)
    if not ca_folder:
        raise UsageError("--user needs the cluster's CA certificate: give --credentials DIR (holding ca.crt), "
                         f"${client.CREDENTIALS_ENV}, or --cluster DIR")
    from common.certs import CertificateError
    try:
        credentials = client.login_credentials(args.user, login_password(args.user), ca_folder)
    except CertificateError as error:
        raise UsageError(str(error)) from None
    client.use_credentials(credentials, addresses)
    return addresses


def given_root_password(args: argparse.Namespace) -> str | None:
    """The first line of --root-password-file (None when not given)."""
    if args.root_password_file is None:
        return None
    if args.insecure:
        raise UsageError("--root-password-file needs a secure cluster: an --insecure one has no logins")
    try:
        lines = args.root_password_file.read_text().splitlines()
    except OSError as error:
        raise UsageError(f"cannot read --root-password-file: {error.strerror}: {args.root_password_file}") from None
    if not lines or not lines[0]:
        raise UsageError(f"{args.root_password_file} holds no password on its first line")
    return lines[0]


def login_password(user: str) -> str:
    """$VBC_PASSWORD, else asked on the terminal (never an argument: arguments show in `ps`)."""
    password = os.environ.get(client.PASSWORD_ENV)
    if password is None:
        if not sys.stdin.isatty():
            raise UsageError(f"--user {user} needs a password: set ${client.PASSWORD_ENV} or run on a terminal")
        password = getpass.getpass(f"password for {user}: ")
    return password


def named_addresses(args: argparse.Namespace) -> list[str]:
    if args.addr:
        return [args.addr]
    if args.cluster:
        return client.addresses_from_cluster(args.cluster)
    from_env = [a.strip() for a in os.environ.get(ADDR_ENV, "").split(",") if a.strip()]
    if from_env:
        return from_env
    raise UsageError(NO_TARGET_MESSAGE)


def json_line(document: object) -> str:
    return json.dumps(document, ensure_ascii=False)


# ------------------------------------------------------------------ vbc node start


def die_with_parent() -> None:
    """When started by a test harness ($VBC_PARENT_PID), get SIGKILLed if that process dies (Linux)."""
    parent = os.environ.get(cluster_mod.PARENT_PID_ENV)
    if parent:
        end_with_parent(int(parent))


def node_limits(args: argparse.Namespace):
    """The request size limits of `vbc node start` (cql.limits.Limits; its defaults where no flag was given)."""
    from cql.limits import Limits
    given = {name: getattr(args, name) for name in ("max_statement_bytes", "max_value_bytes", "max_batch_rows")}
    return Limits(**{name: value for name, value in given.items() if value is not None})


def cmd_node_start(args: argparse.Namespace) -> int:
    if args.id in args.peers:
        raise UsageError(f"--peers lists the node itself ({args.id})")
    addresses = [args.grpc, args.raft] + ([args.client_addr] if args.client_addr else [])
    addresses += [a for peer in args.peers.values() for a in peer]
    if len(set(addresses)) != len(addresses):
        raise UsageError("every --grpc, --raft and peer address must be distinct")
    die_with_parent()
    try:
        from node.wiring import NodeConfig, serve
    except ModuleNotFoundError as exc:
        if exc.name != "node.wiring":
            raise
        print("error: the node daemon (node.wiring) is not installed", file=sys.stderr)
        return 1
    peers = dict(args.peers)
    secret = raft_secret(args.raft_secret_file)
    if not args.insecure:  # this process's own calls to the cluster go with the node's certificate
        from common.certs import CertificateError
        from node.security import channel_credentials, load_node_material
        try:
            client.use_credentials(channel_credentials(load_node_material(args.certs_dir or args.data_dir)))
        except CertificateError as error:
            print(f"error: node {args.id} cannot start: {error}", file=sys.stderr)
            return 1
    try:
        if args.join:
            refuse_other_secret(secret, args.join)
            peers.update(client.join_cluster(args.join, args.id, args.grpc, args.raft, args.shards))
        elif peers:
            refuse_if_removed(args.id, [grpc for grpc, _ in peers.values()])
            refuse_other_secret(secret, [grpc for grpc, _ in peers.values()])
    except (grpc.RpcError, NodeRemoved, WrongSecret) as error:
        message = client.error_text(error) if isinstance(error, grpc.RpcError) else str(error)
        print(f"error: node {args.id} cannot start: {message}", file=sys.stderr)
        return 1
    args.data_dir.mkdir(parents=True, exist_ok=True)
    config = NodeConfig(node_id=args.id, data_dir=args.data_dir, grpc_addr=args.grpc, raft_addr=args.raft,
                        peers=peers, shards=args.shards, storage_url=args.storage_url, raft_password=secret,
                        insecure=args.insecure, certs_dir=args.certs_dir, client_addr=args.client_addr,
                        metrics_addr=args.metrics, metrics_tls=args.metrics_tls, spark_memory=args.spark_memory,
                        limits=node_limits(args), enable_injections=args.enable_injections,
                        spark_prestart=args.spark_prestart,
                        **({"spark_master": args.spark_master} if args.spark_master else {}),
                        **({"spark_java_options": args.spark_java_options}
                           if args.spark_java_options is not None else {}))
    from coordinator.raft_storage import CorruptRaftFile
    try:
        serve(config)
    except CorruptRaftFile as error:
        print(f"error: node {args.id} cannot start: {error}", file=sys.stderr)
        return 1
    return 0


class NodeRemoved(Exception):
    """The node's id was removed from the cluster: it may not start again."""


class WrongSecret(Exception):
    """The node's Raft secret is not the cluster's: it could never join its Raft group."""


def raft_secret(path: Path | None) -> str:
    """The Raft secret from `path`, else $VBC_RAFT_PASSWORD; a node has no default."""
    if path is not None:
        try:
            secret = path.read_text().strip()
        except OSError as error:
            raise UsageError(f"cannot read the Raft secret file {path}: {error.strerror}") from None
        if not secret:
            raise UsageError(f"the Raft secret file {path} is empty")
        return secret
    secret = os.environ.get("VBC_RAFT_PASSWORD", "")
    if not secret:
        raise UsageError("no Raft secret: give --raft-secret-file FILE (`vbc cluster up` writes DIR/raft.secret) or set "
                         "VBC_RAFT_PASSWORD, the same on every node of the cluster")
    return secret


def refuse_other_secret(secret: str, peer_addresses: list[str]) -> None:
    """WrongSecret when a reachable peer holds another Raft secret (no peer answering: nothing to compare)."""
    from coordinator.raft import secret_fingerprint
    mine = secret_fingerprint(secret)
    for address in peer_addresses:
        try:
            theirs = client.local_status(address, timeout=3.0).get("raft_secret_fingerprint", "")
        except grpc.RpcError:
            continue
        if theirs and theirs != mine:
            raise WrongSecret(f"this node's Raft secret (fingerprint {mine}) is not the one of the node at {address} "
                              f"(fingerprint {theirs}): it could not join the cluster's Raft group; start it with the "
                              "cluster's secret (the file DIR/raft.secret of `vbc cluster up`, or the VBC_RAFT_PASSWORD "
                              "the other nodes have)")


def refuse_if_removed(node_id: str, peer_addresses: list[str]) -> None:
    """NodeRemoved when a reachable peer says `node_id` was removed (no peer answering: nothing to say)."""
    try:
        state = client.node_state(peer_addresses, node_id, timeout=3.0)["state"]
    except grpc.RpcError:
        return
    if state == "removed":
        raise NodeRemoved(f"node {node_id} was removed from the cluster; its id and data directory cannot be used "
                          "again: start a new node with a new id and an empty data directory (--join HOST:PORT)")


def cmd_node_leave(args: argparse.Namespace) -> int:
    addresses = [a for a in target_addresses(args) if not args.cluster
                 or a != client.node_address_from_cluster(args.cluster, args.node_id)]
    started = client.decommission(addresses, args.node_id, dead=args.dead)
    print(f"node {args.node_id}: {started['state']}, {started['replicas']} tablet replica(s) to move", file=sys.stderr)
    if args.no_wait:
        return 0
    shown: set[int] = set()

    def show(current: dict) -> None:
        if current["replicas"] not in shown and current["state"] not in ("removed", "unknown"):
            shown.add(current["replicas"])
            print(f"node {args.node_id}: {current['replicas']} tablet replica(s) left", file=sys.stderr)

    try:
        client.wait_node_removed(addresses, args.node_id, args.timeout, on_progress=show)
    except TimeoutError as exc:
        print(f"error: {exc}; it goes on in the background (`vbc status` lists the migrations)", file=sys.stderr)
        return 1
    if args.cluster:
        cluster_mod.forget_node(args.cluster, args.node_id)
    print(f"node {args.node_id} removed from the cluster")
    return 0


# ------------------------------------------------------------------ vbc cluster ...


def start_failure(exc: cluster_mod.ClusterStartError) -> int:
    print(f"error: {exc.report()}", file=sys.stderr)
    return 1


def cmd_cluster_up(args: argparse.Namespace) -> int:
    root_password = given_root_password(args)
    console = stdout_console()
    stop_on_signals()
    try:
        with console.status(f"starting {args.nodes} node(s) in {args.data_dir} ...") as spinner:
            cluster = cluster_mod.start_cluster(
                args.data_dir, nodes=args.nodes, shards=args.shards, base_port=args.base_port,
                storage_url=args.storage_url, timeout=args.timeout, injections=args.injections,
                spark_prestart=args.spark_prestart, insecure=args.insecure, root_password=root_password,
                progress=lambda message: spinner.update(f"starting: {message}"),
            )
    except cluster_mod.ClusterStartError as exc:
        return start_failure(exc)
    console.print(nodes_table(cluster["nodes"]))
    console.print(Text(f"cluster is up, leader {cluster['leader']}"))
    if args.detach:
        console.print(Text(f"stop it with: vbc cluster down --data-dir {args.data_dir}"))
        return 0
    return run_in_foreground(console, args.data_dir, cluster)


def not_running(nodes: list[dict]) -> list[str]:
    """'ID (exit code N)' or 'ID' for each node whose process does not run."""
    stopped = []
    for node in nodes:
        if not cluster_mod.pid_alive(node["pid"]):
            code = cluster_mod.exit_code(node["pid"]) if node["pid"] else None
            stopped.append(node["id"] if code is None else f"{node['id']} (exit code {code})")
    return stopped


def foreground_view(addresses: list[str], nodes: list[dict]):
    exited = not_running(nodes)
    parts = []
    try:
        parts.append(render_status(client.status(addresses, timeout=5.0)))
    except grpc.RpcError as exc:
        parts.append(Text(f"status unavailable: {client.error_text(exc)}", style="red"))
    if exited:
        parts.append(Text(f"not running: {', '.join(exited)} (see node.log)", style="red"))
    parts.append(Text("Ctrl-C stops the cluster", style="dim"))
    return Group(*parts)


def current_nodes(data_dir: Path, fallback: list[dict]) -> list[dict]:
    """The nodes of cluster.json (pids change with stop-node/start-node), else `fallback`."""
    try:
        return cluster_mod.load_cluster(data_dir)["nodes"]
    except cluster_mod.ClusterError:
        return fallback


def status_line(addresses: list[str], nodes: list[dict]) -> str:
    """A one-line summary of the cluster for a foreground cluster without a terminal."""
    exited = not_running(nodes)
    try:
        document = client.status(addresses, timeout=5.0)
    except grpc.RpcError as exc:
        summary = f"status unavailable: {client.error_text(exc)}"
    else:
        alive = sum(1 for node in document["nodes"] if node["alive"])
        building = sum(1 for view in document["views"] if view["state"] != "BUILT")
        summary = (f"leader {document['leader'] or '(none)'}, {alive}/{len(document['nodes'])} nodes alive, "
                   f"{len(document['views'])} views ({building} building)")
    return summary + (f"; not running: {', '.join(exited)}" if exited else "")


def run_in_foreground(console: Console, data_dir: Path, cluster: dict) -> int:
    """Show the status until Ctrl-C/SIGTERM, then stop the nodes."""
    addresses = [node["grpc"] for node in cluster["nodes"]]
    try:
        if console.is_terminal:
            with Live(foreground_view(addresses, cluster["nodes"]), console=console, auto_refresh=False) as live:
                while True:
                    time.sleep(FOREGROUND_REFRESH_SECONDS)
                    live.update(foreground_view(addresses, current_nodes(data_dir, cluster["nodes"])), refresh=True)
        else:
            print("Ctrl-C or SIGTERM stops the cluster", flush=True)
            last = ""
            while True:
                line = status_line(addresses, current_nodes(data_dir, cluster["nodes"]))
                if line != last:
                    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)
                    last = line
                time.sleep(FOREGROUND_REFRESH_SECONDS)
    except KeyboardInterrupt:
        pass
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
        print_stop_outcome(console, cluster_mod.stop_cluster(data_dir))
    return 0


def print_stop_outcome(console: Console, outcome: dict[str, str]) -> None:
    for node_id, what in outcome.items():
        console.print(Text(f"{node_id}: {what}"))


def cmd_cluster_down(args: argparse.Namespace) -> int:
    print_stop_outcome(stdout_console(), cluster_mod.stop_cluster(args.data_dir, timeout=args.timeout))
    return 0


def cmd_cluster_stop_node(args: argparse.Namespace) -> int:
    outcome = cluster_mod.stop_node(args.data_dir, args.id, kill=args.kill, timeout=args.timeout)
    print(f"{args.id}: {outcome}")
    return 0


def cmd_cluster_add_node(args: argparse.Namespace) -> int:
    try:
        node = cluster_mod.add_node(args.data_dir, shards=args.shards, timeout=args.timeout)
    except cluster_mod.ClusterStartError as exc:
        return start_failure(exc)
    print(f"{node['id']}: joined (pid {node['pid']}, grpc {node['grpc']}, raft {node['raft']})")
    return 0


def cmd_cluster_start_node(args: argparse.Namespace) -> int:
    try:
        pid = cluster_mod.start_node(args.data_dir, args.id, timeout=args.timeout)
    except cluster_mod.ClusterStartError as exc:
        return start_failure(exc)
    node = cluster_mod.find_node(cluster_mod.load_cluster(args.data_dir), args.id)
    print(f"{args.id}: started (pid {pid}, grpc {node['grpc']})")
    return 0


# ------------------------------------------------------------------ vbc exec


def read_statement(text: str) -> str:
    statement = sys.stdin.read() if text == "-" else text
    if not statement.strip():
        raise UsageError("the statement is empty")
    return statement


def result_json_lines(columns: list[str], rows: list[list], message: str) -> list[str]:
    """--json output: one object per row, or {"message": ...} for an answer without columns."""
    if not columns:
        return [json_line({"message": message})]
    return [json_line(dict(zip(columns, row))) for row in rows]


def cmd_exec(args: argparse.Namespace) -> int:
    addresses = target_addresses(args)
    statement = read_statement(args.statement)
    if client.is_read(statement):
        return exec_select(args, addresses, statement)
    response = client.execute_response(addresses, statement, timeout=args.timeout, params=args.params)
    columns, rows, message = client.result_from_response(response)
    if args.json:
        for line in result_json_lines(columns, rows, message):
            print(line)
        return 0
    if not columns:
        print(message or "ok")
        return 0
    console = stdout_console()
    console.print(result_table(columns, [c.type for c in response.columns], rows))
    console.print(Text(f"({len(rows)} row{'' if len(rows) == 1 else 's'})", style="dim"))
    return 0


def exec_select(args: argparse.Namespace, addresses: list[str], statement: str) -> int:
    """A SELECT's rows as its pages arrive: JSON lines written page by page (bounded memory), or one table."""
    from vbc import reads
    columns, table_rows = [], []
    for position, page in enumerate(reads.stream(addresses, statement, params=args.params, timeout=args.timeout)):
        if position == 0 and args.trace and page.plan:
            print(f"plan: {page.plan}", file=sys.stderr)
        columns = page.columns
        rows = page_rows(page)
        if args.json:
            names = [name for name, _ in columns]
            sys.stdout.write("".join(json_line(dict(zip(names, row))) + "\n" for row in rows))
        else:
            table_rows.extend(rows)
    if args.json:
        sys.stdout.flush()
        return 0
    console = stdout_console()
    console.print(result_table([name for name, _ in columns], [kind for _, kind in columns], table_rows))
    console.print(Text(f"({len(table_rows)} row{'' if len(table_rows) == 1 else 's'})", style="dim"))
    return 0


def page_rows(page) -> list[list]:
    if page.rows is None:
        return []
    return [list(row) for row in zip(*(column.to_pylist() for column in page.rows.columns))]


# ------------------------------------------------------------------ vbc load


def cmd_load(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from vbc import load
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]} rows/s"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), disable=args.quiet, transient=True) as bar:
        task = bar.add_task(f"checking {args.file.name}", total=None, rate="-")
        sending_since = [time.monotonic()]

        def on_total(total: int) -> None:
            sending_since[0] = time.monotonic()
            bar.update(task, description=f"loading {args.file.name}", total=total)

        def advance(rows: int) -> None:
            done = bar.tasks[0].completed + rows
            rate = done / max(time.monotonic() - sending_since[0], 1e-9)
            bar.update(task, completed=done, rate=f"{rate:,.0f}")

        try:
            committed, seconds = load.load(target_addresses(args), args.table, args.file, args.batch_rows,
                                           on_total, advance)
        except load.LoadError as error:
            bar.stop()
            print(f"error: {error}", file=sys.stderr)
            print(f"{error.committed:,} rows were committed before the error" if error.committed
                  else "nothing was written", file=sys.stderr)
            return 1
    print(f"loaded {committed:,} rows into {args.table} in {seconds:.1f} s ({committed / max(seconds, 1e-9):,.0f} "
          "rows/s)")
    return 0


# ------------------------------------------------------------------ vbc status


def watch_status(addresses: list[str], as_json: bool, seconds: float) -> int:
    """Re-render the status every `seconds` until Ctrl-C."""
    console = stdout_console()

    def view():
        try:
            return render_status(client.status(addresses))
        except grpc.RpcError as exc:
            return Text(f"error: {client.error_text(exc)}", style="red")

    try:
        if as_json:
            while True:
                try:
                    print(json_line(client.status(addresses)), flush=True)
                except grpc.RpcError as exc:
                    print(f"error: {client.error_text(exc)}", file=sys.stderr, flush=True)
                time.sleep(seconds)
        with Live(view(), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(seconds)
                live.update(view(), refresh=True)
    except KeyboardInterrupt:
        if not as_json and not console.is_terminal:
            console.line()
        return 0


def cmd_status(args: argparse.Namespace) -> int:
    addresses = target_addresses(args)
    if args.watch is not None:
        return watch_status(addresses, args.json, args.watch)
    document = client.status(addresses)
    if args.json:
        print(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        stdout_console().print(render_status(document))
    return 0


# ------------------------------------------------------------------ vbc wait-built, vbc check


def cmd_wait_built(args: argparse.Namespace) -> int:
    try:
        view = client.wait_built(target_addresses(args), args.view, args.timeout)
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(view, indent=2, ensure_ascii=False))
    else:
        print(f"{args.view} is built ({view['tasks_total']} tasks, {view['rows_done']:,} rows scanned)")
    return 0


def cmd_spark_archive(args: argparse.Namespace) -> int:
    import logging

    from worker.spark_session import SparkConfig
    from worker.spark_warmup import make_class_archive

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config = SparkConfig() if args.spark_java_options is None else SparkConfig(java_options=args.spark_java_options)
    archive, outcome = make_class_archive(config)
    print(f"spark class-data archive {outcome}")
    return 0 if archive is not None else 1


def cmd_check(args: argparse.Namespace) -> int:
    result = client.check(target_addresses(args), args.view, args.examples, args.timeout)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        stdout_console().print(check_report(result))
    return 0 if result["consistent"] else 1


# ------------------------------------------------------------------ vbc tablets


def cmd_tablets(args: argparse.Namespace) -> int:
    tablets = client.tablets(target_addresses(args), args.table)
    if args.json:
        for tablet in tablets:
            print(json_line(tablet))
    else:
        stdout_console().print(tablets_table(args.table, tablets))
    return 0


def cmd_tablet_move(args: argparse.Namespace) -> int:
    addresses = target_addresses(args)
    migration_id = client.move_tablet(addresses, args.table, args.tablet, args.from_replica, args.to_replica)
    if args.no_wait:
        print(migration_id)
        return 0
    shown: list[str] = []  # stages printed so far
    live = sys.stderr.isatty() and not args.json  # a terminal: the streaming line updates in place

    def show_stage(current: dict) -> None:
        stage = current["stage"]
        if args.json or not stage:
            return
        if stage not in shown:
            if live and shown and shown[-1] == "streaming":
                print(file=sys.stderr)
            shown.append(stage)
            print(f"migration {migration_id[:8]}: {stage}", end="" if live and stage == "streaming" else "\n",
                  file=sys.stderr, flush=True)
        if live and stage == "streaming":
            rate = f", {current['rows_per_s']:,.0f} rows/s" if current.get("rows_per_s") else ""
            print(f"\rmigration {migration_id[:8]}: streaming, {current.get('rows_streamed', 0):,} rows{rate}   ",
                  end="", file=sys.stderr, flush=True)

    try:
        result = client.wait_migration(addresses, migration_id, args.timeout, on_progress=show_stage)
    except TimeoutError as exc:
        print(f"error: {exc}; it goes on in the background (`vbc tablets {args.table}` shows its stage)",
              file=sys.stderr)
        return 1
    if args.json:
        print(json_line(result))
    elif result["state"] == "done":
        print(f"moved tablet {args.tablet} of {args.table} from {args.from_replica} to {args.to_replica}")
    if result["state"] != "done":
        print(f"error: migration {migration_id} {result['state']}: {result['reason'] or 'no reason recorded'}; "
              f"tablet {args.tablet} stays on {args.from_replica}", file=sys.stderr)
        return 1
    return 0


def cmd_balancer(args: argparse.Namespace) -> int:
    result = client.balancer(target_addresses(args), args.action)
    if args.json:
        print(json_line(result))
        return 0
    loads = ", ".join(f"{node} {count}" for node, count in result["loads"].items())
    print(f"balancer {'on' if result['enabled'] else 'off'}; tablet replicas per node: {loads}; "
          f"{result['migrations']} migration(s) in progress")
    return 0


def cmd_tablet_resize(args: argparse.Namespace) -> int:
    addresses = target_addresses(args)
    now, target = client.resize_tablets(addresses, args.table, args.merge)
    if args.no_wait or now == target:
        print(f"{args.table}: {now} tablets" + ("" if now == target else f", merging to {target}"))
        return 0
    shown: set[int] = set()

    def show_moves(tablets: list[dict]) -> None:
        moving = sum(1 for t in tablets if t.get("stage"))
        if moving and moving not in shown:
            shown.add(moving)
            print(f"{args.table}: {moving} tablet(s) moving to share replicas before the merge", file=sys.stderr)

    try:
        client.wait_tablet_count(addresses, args.table, target, args.timeout, on_progress=show_moves)
    except TimeoutError as exc:
        print(f"error: {exc}; the merge goes on in the background", file=sys.stderr)
        return 1
    print(f"{args.table}: {target} tablets")
    return 0


# ------------------------------------------------------------------ vbc inject


def check_inject_arguments(args: argparse.Namespace) -> None:
    if not args.list and not args.name:
        raise UsageError("give the injection point NAME (or --list)")
    if (args.one_shot or args.mode) and not args.enable:
        raise UsageError("--one-shot and --mode go with --enable")


def inject_target(args: argparse.Namespace, addresses: list[str]) -> list[str]:
    """The node to act on: --node ID resolved through cluster.json or Admin.Status, else the connected node."""
    if not args.node:
        return addresses
    if args.cluster:
        address = client.node_address_from_cluster(args.cluster, args.node)
        if address:
            return [address]
    return [client.node_address(addresses, args.node)]


def cmd_inject(args: argparse.Namespace) -> int:
    check_inject_arguments(args)
    target = inject_target(args, target_addresses(args))
    if args.list:
        result = client.inject(target, args.name or "", "list")
        if args.json:
            print(json_line({**result, "points": injection_point_rows(result)}))
        else:
            stdout_console().print(injection_points_table(result))
            if not result["injections_enabled"]:
                print(f"fault injection is disabled on {result['node'] or target[0]}: "
                      "start the node with --enable-injections to switch these points on")
        return 0
    if args.wait_hit is not None:
        return wait_for_hit(target, args)
    action = "enable" if args.enable else "disable"
    result = client.inject(target, args.name, action, mode=args.mode or "", one_shot=args.one_shot)
    if args.json:
        print(json_line(result))
    elif args.enable:
        details = f"mode {enabled_mode(result, args.name, args.mode)}" + (", one-shot" if args.one_shot else "")
        print(f"{args.name}: enabled on {result['node'] or target[0]} ({details})")
    else:
        print(f"{args.name}: disabled on {result['node'] or target[0]}")
    return 0


def enabled_mode(result: dict, name: str, asked: str | None) -> str:
    """The mode `name` was enabled in: as the node lists it, else as asked, else the point's default."""
    listed = [point["mode"] for point in result["points"] if point["name"] == name and point["mode"]]
    return (listed or [asked or "the point's default"])[0]


def wait_for_hit(target: list[str], args: argparse.Namespace) -> int:
    try:
        result = client.inject(target, args.name, "wait_hit", timeout=args.wait_hit)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
        result = {"node": "", "hit": False, "points": []}
    if args.json:
        print(json_line(result))
    if result["hit"]:
        if not args.json:
            print(f"{args.name}: hit on {result['node'] or target[0]}")
        return 0
    print(f"{args.name}: not hit within {args.wait_hit:g} s", file=sys.stderr)
    return 1


# ------------------------------------------------------------------ vbc certs


def cmd_certs(args: argparse.Namespace) -> int:
    """Run a `vbc certs` command. common.certs is imported here: cryptography's x509 takes ~45 ms to load."""
    from common.certs import CertificateError

    try:
        return args.certs_action(args)
    except CertificateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def lifetime_option(args: argparse.Namespace) -> dict:
    """lifetime_days for the certs functions when --lifetime-days is given (their own defaults otherwise)."""
    return {} if args.lifetime_days is None else {"lifetime_days": args.lifetime_days}


def certs_create_ca(args: argparse.Namespace) -> int:
    from common import certs

    cert_path = certs.create_ca(args.directory, overwrite=args.overwrite, ca_key=args.ca_key,
                                **lifetime_option(args))
    print(f"CA: {cert_path} and {certs.ca_key_path(args.directory, args.ca_key)} (the key signs every certificate "
          "of the cluster: keep it away from the nodes and clients)")
    return 0


def certs_create_node(args: argparse.Namespace) -> int:
    from common import certs

    cert_path, key_path = certs.create_node_cert(args.directory, args.node_id, args.hosts, out_dir=args.out,
                                                 overwrite=args.overwrite, ca_key=args.ca_key,
                                                 **lifetime_option(args))
    print(f"node {args.node_id}: {cert_path} and {key_path}, for hosts {', '.join(certs.unique(args.hosts))}")
    return 0


def certs_create_client(args: argparse.Namespace) -> int:
    from common import certs

    cert_path, key_path = certs.create_client_cert(args.directory, args.user, out_dir=args.out,
                                                   overwrite=args.overwrite, ca_key=args.ca_key,
                                                   **lifetime_option(args))
    print(f"client {args.user}: {cert_path} and {key_path}")
    return 0


def certs_list(args: argparse.Namespace) -> int:
    from common import certs

    now = time.time()
    for info in certs.list_certificates(args.directory):
        print(certificate_line(info, now))
    return 0


def certificate_line(info, now: float) -> str:
    """One line of `vbc certs list`: file, kind and name, hosts, expiry, subject."""
    if info.kind == "invalid":
        return f"{info.file.name}: invalid: {info.problem}"
    who = f"{info.kind} {info.name}" if info.name else info.kind
    hosts = f", hosts {' '.join(info.hosts)}" if info.hosts else ""
    expired = "EXPIRED" if info.expires.timestamp() <= now else "expires"
    return f"{info.file.name}: {who}{hosts}, {expired} {info.expires:%Y-%m-%d %H:%M} UTC ({info.subject})"
