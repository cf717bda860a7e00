"""`vbc build config` and `vbc view pause|resume`: the cluster's view building settings, and pausing one view's
build."""
from __future__ import annotations

import argparse

from vbc import client
from vbc.cli.arguments import add_command, add_command_group, positive_int, positive_number, table_name
from vbc.cli.common import json_line, target_addresses


def add_build_parsers(commands, target: argparse.ArgumentParser) -> None:
    """`vbc build config` and `vbc view pause|resume`, in this order."""
    add_build_parser(commands, target)
    add_view_parser(commands, target)


def add_build_parser(commands, target: argparse.ArgumentParser) -> None:
    build_commands = add_command_group(commands, "build", "view building settings of the cluster", metavar="SETTING")
    config = add_command(build_commands, "config", cmd_build_config, parents=[target],
                         help="show the view building settings, and change those given (kept in group0)")
    config.add_argument("--chunk-rows", type=positive_int, default=0, metavar="N",
                        help="base rows a batch reads and hands to Spark at a time (default 250,000); smaller "
                             "chunks use less memory and lose less work to a restart")
    config.add_argument("--rate", type=rate, default=None, metavar="ROWS_PER_S|off",
                        help="base rows each node's batches read per second at most, changeable while builds run "
                             "(default off)")
    config.add_argument("--parallel-bases", type=positive_int, default=0, metavar="N",
                        help="how many base tables' views are built at once, in creation order (default 2)")
    config.add_argument("--json", action="store_true")


def add_view_parser(commands, target: argparse.ArgumentParser) -> None:
    view_commands = add_command_group(commands, "view", "a view's (or index's) build", metavar="ACTION")
    for action, text in (("pause", "stop building a view: no new batches, running ones stop at their next chunk; "
                                   "live writes keep maintaining it"),
                         ("resume", "go on building a paused view from its checkpoints")):
        command = add_command(view_commands, action, cmd_view_pause, parents=[target], help=text)
        command.add_argument("view", type=table_name, metavar="KS.VIEW")
        command.set_defaults(paused=action == "pause")


def rate(text: str) -> int:
    """A rate limit in rows per second, or `off` (0)."""
    if text.strip().lower() == "off":
        return 0
    return positive_number(text, int, "a number of rows per second, or off", "a positive number of rows per second")


def cmd_build_config(args: argparse.Namespace) -> int:
    settings = client.build_config(target_addresses(args), chunk_rows=args.chunk_rows, rate_rows_per_s=args.rate,
                                   parallel_bases=args.parallel_bases)
    if args.json:
        print(json_line(settings))
        return 0
    limit = f"{settings['rate_rows_per_s']:,} rows/s per node" if settings["rate_rows_per_s"] else "off"
    print(f"chunk rows: {settings['chunk_rows']:,}\nrate limit: {limit}\nparallel bases: {settings['parallel_bases']}")
    return 0


def cmd_view_pause(args: argparse.Namespace) -> int:
    paused = client.pause_view(target_addresses(args), args.view, args.paused)
    print(f"{args.view}: {'paused' if paused else 'building (resumed)'}")
    return 0
