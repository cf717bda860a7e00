"""`vbc cluster up|down|stop-node|start-node|add-node`: a local development cluster of node processes."""
from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import grpc
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from vbc import client
from vbc import cluster as cluster_mod
from vbc.cli.arguments import (absolute_path, add_command, add_command_group, positive_float, positive_int,
                               storage_url)
from vbc.cli.common import UsageError
from vbc.cluster import stop_on_signals
from vbc.render import nodes_table, render_status, stdout_console

FOREGROUND_REFRESH_SECONDS = 2.0


def add_cluster_parser(commands) -> None:
    cluster_commands = add_command_group(commands, "cluster", "manage a local development cluster")
    add_cluster_up_parser(cluster_commands)
    add_cluster_node_parsers(cluster_commands)


def add_cluster_up_parser(cluster_commands) -> None:
    up = add_command(cluster_commands, "up", cmd_cluster_up, help="start N node processes on 127.0.0.1")
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
    for option, metavar, text in SPARK_OPTIONS:
        up.add_argument(option, metavar=metavar, help=f"every node's {option} (see `vbc node start --help`): {text}")


SPARK_OPTIONS = (("--spark-master", "URL", "where view building jobs run, e.g. spark://HOST:7077"),
                 ("--spark-remote", "sc://HOST:PORT", "a Spark Connect server that runs the jobs instead"),
                 ("--spark-memory", "SIZE", "the memory of each node's Spark driver JVM"),
                 ("--spark-driver-host", "HOST", "where the Spark cluster's executors reach each node's driver"),
                 ("--spark-java-options", "OPTIONS", "the JVM options of each node's Spark driver"))


def spark_options(args: argparse.Namespace) -> list[str]:
    """The Spark options given to `vbc cluster up`, as `vbc node start` arguments."""
    given = []
    for option, _, _ in SPARK_OPTIONS:
        value = getattr(args, option.removeprefix("--").replace("-", "_"))
        if value is not None:
            given += [option, value]
    return given


def add_cluster_node_parsers(cluster_commands) -> None:
    """`vbc cluster down`, and the commands that stop, restart or add one node."""
    down = add_command(cluster_commands, "down", cmd_cluster_down, help="stop every node (the data is kept)")
    down.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    down.add_argument("--timeout", type=positive_float, default=cluster_mod.STOP_TIMEOUT, metavar="S")

    stop = add_command(cluster_commands, "stop-node", cmd_cluster_stop_node, help="stop one node")
    stop.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    stop.add_argument("id", metavar="ID")
    stop.add_argument("--kill", action="store_true", help="SIGKILL instead of SIGTERM")
    stop.add_argument("--timeout", type=positive_float, default=cluster_mod.STOP_TIMEOUT, metavar="S")

    start = add_command(cluster_commands, "start-node", cmd_cluster_start_node,
                        help="restart one node with its recorded arguments")
    start.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    start.add_argument("id", metavar="ID")
    start.add_argument("--timeout", type=positive_float, default=cluster_mod.START_TIMEOUT, metavar="S")

    add = add_command(cluster_commands, "add-node", cmd_cluster_add_node,
                      help="start one more node that joins the running cluster")
    add.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    add.add_argument("--shards", type=positive_int, metavar="S", help="default: as the cluster's other nodes")
    add.add_argument("--timeout", type=positive_float, default=cluster_mod.START_TIMEOUT, metavar="S")


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
                spark_options=spark_options(args),
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
