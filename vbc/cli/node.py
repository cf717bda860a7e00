"""`vbc node start|decommission|remove`: run one node in the foreground, or take a node out of its cluster."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import grpc

from common.processes import end_with_parent
from vbc import client
from vbc import cluster as cluster_mod
from vbc.cli.arguments import (absolute_path, add_command, add_command_group, host_port, parse_peers,
                               positive_float, positive_int, spark_connect_url, storage_url, target_options)
from vbc.cli.common import UsageError, target_addresses


def add_node_parser(commands) -> None:
    node_commands = add_command_group(commands, "node", "run a node")
    add_node_start_parser(node_commands)
    add_node_leave_parsers(node_commands)


def add_node_start_parser(node_commands) -> None:
    start = add_command(node_commands, "start", cmd_node_start,
                        help="run one node in the foreground until SIGTERM/SIGINT")
    start.add_argument("--id", required=True, help="node id, e.g. n1")
    start.add_argument("--data-dir", required=True, type=absolute_path, metavar="DIR")
    start.add_argument("--grpc", required=True, type=host_port, metavar="HOST:PORT", help="client/admin gRPC address")
    start.add_argument("--raft", required=True, type=host_port, metavar="HOST:PORT", help="Raft address")
    start.add_argument("--client-addr", type=host_port, metavar="HOST:PORT",
                       help="a second gRPC port for password logins (`--user`): TLS without client certificates")
    start.add_argument("--cql", type=host_port, metavar="HOST:PORT",
                       help="serve CQL's native protocol (v4: cqlsh, the Cassandra and ScyllaDB drivers) here: TLS "
                            "with the node's certificate, password logins")
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
    start.add_argument("--spark-remote", type=spark_connect_url, metavar="sc://HOST:PORT",
                       help="run view building jobs through this Spark Connect server instead (the node then starts no "
                            "JVM of its own)")
    start.add_argument("--spark-driver-host", metavar="HOST",
                       help="the address a Spark cluster's executors reach this node's driver at, which it binds "
                            "(default: the host of --grpc; local masters always use 127.0.0.1)")
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


def add_node_leave_parsers(node_commands) -> None:
    """`vbc node decommission` (a live node) and `vbc node remove` (a dead one)."""
    target = target_options()
    for action, text in (("decommission", "move every tablet replica off a live node, then remove it from the cluster"),
                         ("remove", "remove a dead node: its tablet replicas are rebuilt from the surviving ones")):
        leave = add_command(node_commands, action, cmd_node_leave, parents=[target], help=text)
        leave.add_argument("node_id", metavar="ID")
        leave.add_argument("--no-wait", action="store_true", help="return once the node is marked as leaving")
        leave.add_argument("--timeout", type=positive_float, default=3600.0, metavar="S",
                           help="give up waiting after S seconds (exit status 1; default 3600)")
        leave.set_defaults(dead=action == "remove")


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
    if args.spark_master and args.spark_remote:
        raise UsageError("--spark-master and --spark-remote are alternatives: the jobs run in a driver of this node's, "
                         "or through a Spark Connect server")
    if args.cql and args.cql.rpartition(":")[0].strip("[]") in ("0.0.0.0", "::", ""):
        raise UsageError("--cql needs the address clients reach (drivers are told it in system.peers), not a "
                         "wildcard such as 0.0.0.0")
    addresses = [args.grpc, args.raft] + [a for a in (args.client_addr, args.cql) if a]
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
                        insecure=args.insecure, certs_dir=args.certs_dir, client_addr=args.client_addr, cql_addr=args.cql,
                        metrics_addr=args.metrics, metrics_tls=args.metrics_tls, spark_memory=args.spark_memory,
                        limits=node_limits(args), enable_injections=args.enable_injections,
                        spark_prestart=args.spark_prestart,
                        spark_driver_host=args.spark_driver_host, spark_remote=args.spark_remote,
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
