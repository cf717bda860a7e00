"""`vbc status`, `vbc wait-built` and `vbc check`: the state of a running cluster and of its views."""
from __future__ import annotations

import argparse
import json
import sys
import time

import grpc
from rich.live import Live
from rich.text import Text

from vbc import client
from vbc.cli.arguments import add_command, positive_float, positive_int, table_name
from vbc.cli.common import json_line, target_addresses
from vbc.render import check_report, render_status, stdout_console

DEFAULT_WATCH_SECONDS = 2.0


def add_status_parser(commands, target: argparse.ArgumentParser) -> None:
    status = add_command(commands, "status", cmd_status, parents=[target],
                         help="cluster, node and view-building status")
    status.add_argument("--json", action="store_true")
    status.add_argument("--watch", type=positive_float, nargs="?", const=DEFAULT_WATCH_SECONDS, metavar="SECONDS",
                        help=f"refresh every SECONDS (default {DEFAULT_WATCH_SECONDS:g}) until Ctrl-C")


def add_wait_built_parser(commands, target: argparse.ArgumentParser) -> None:
    wait = add_command(commands, "wait-built", cmd_wait_built, parents=[target],
                       help="wait until a view or index is built")
    wait.add_argument("view", type=table_name, metavar="KS.VIEW")
    wait.add_argument("--timeout", type=positive_float, default=600.0, metavar="S",
                      help="give up after S seconds (exit status 1; default 600)")
    wait.add_argument("--json", action="store_true", help="print the view's final status as JSON")


def add_check_parser(commands, target: argparse.ArgumentParser) -> None:
    check = add_command(commands, "check", cmd_check, parents=[target],
                        help="compare a view with its function of the base table (exit 1 on differences)")
    check.add_argument("view", type=table_name, metavar="KS.VIEW")
    check.add_argument("--json", action="store_true")
    check.add_argument("--examples", type=positive_int, default=5, metavar="N", help="examples per kind (default 5)")
    check.add_argument("--timeout", type=positive_float, default=600.0, metavar="S")


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


def cmd_check(args: argparse.Namespace) -> int:
    result = client.check(target_addresses(args), args.view, args.examples, args.timeout)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        stdout_console().print(check_report(result))
    return 0 if result["consistent"] else 1
