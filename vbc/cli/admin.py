"""`vbc inject` and `vbc spark-archive`: a node's fault injection points, this installation's Spark archive."""
from __future__ import annotations

import argparse
import sys

import grpc

from vbc import client
from vbc.cli.arguments import add_command, positive_float
from vbc.cli.common import UsageError, json_line, target_addresses
from vbc.render import injection_point_rows, injection_points_table, stdout_console


def add_spark_archive_parser(commands) -> None:
    archive = add_command(
        commands, "spark-archive", cmd_spark_archive,
        help="make this installation's Spark class-data archive now (about a minute, once): driver JVMs then start in "
             "about half the time; nodes otherwise make it after their first start")
    archive.add_argument("--spark-java-options", metavar="OPTIONS",
                         help="the JVM options of the nodes that will use it (default: the nodes' default)")


def add_inject_parser(commands, target: argparse.ArgumentParser) -> None:
    inject = add_command(commands, "inject", cmd_inject, parents=[target],
                         help="error injection points of a running node")
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


def cmd_spark_archive(args: argparse.Namespace) -> int:
    import logging

    from worker.spark_session import SparkConfig
    from worker.spark_warmup import make_class_archive

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    config = SparkConfig() if args.spark_java_options is None else SparkConfig(java_options=args.spark_java_options)
    archive, outcome = make_class_archive(config)
    print(f"spark class-data archive {outcome}")
    return 0 if archive is not None else 1


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
