"""The `vbc` argument parser, and the run of a parsed command (its errors rendered as `error: ...`, exit status 1)."""
from __future__ import annotations

import argparse
import sys

import grpc

from vbc import client
from vbc import cluster as cluster_mod
from vbc.cli.admin import add_inject_parser, add_spark_archive_parser
from vbc.cli.arguments import add_command, target_options
from vbc.cli.build import add_build_parsers
from vbc.cli.certs import add_certs_parser
from vbc.cli.cluster import add_cluster_parser
from vbc.cli.common import UsageError, named_addresses
from vbc.cli.cql_shell import add_cql_parser
from vbc.cli.data import add_exec_parser, add_load_parser
from vbc.cli.node import add_node_parser
from vbc.cli.status import add_check_parser, add_status_parser, add_wait_built_parser
from vbc.cli.tablets import add_tablets_parsers


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vbc", description="vbc: materialized views over tablet-partitioned tables")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_node_parser(commands)
    add_cluster_parser(commands)
    add_client_parsers(commands)
    add_certs_parser(commands)
    return parser


def add_client_parsers(commands) -> None:
    """The commands that talk to a running cluster, in the order `vbc --help` lists them."""
    target = target_options()
    add_exec_parser(commands, target)
    add_cql_parser(commands)
    add_load_parser(commands, target)
    add_status_parser(commands, target)
    add_tablets_parsers(commands, target)
    add_build_parsers(commands, target)
    add_demo_parser(commands)
    add_wait_built_parser(commands, target)
    add_check_parser(commands, target)
    add_spark_archive_parser(commands)
    add_inject_parser(commands, target)


def add_demo_parser(commands) -> None:
    add_command(commands, "demo", demo_elsewhere, add_help=False,
                help="a 3-node cluster builds a view and an index online, through a leader kill -9 (what `make demo` "
                     "runs; `vbc demo --help`)")


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
