"""`vbc build config`: the cluster's view building settings, shown and changed."""
from __future__ import annotations

import argparse

from vbc import client
from vbc.cli.arguments import add_command, add_command_group, positive_int
from vbc.cli.common import json_line, target_addresses


def add_build_parser(commands, target: argparse.ArgumentParser) -> None:
    build_commands = add_command_group(commands, "build", "view building settings of the cluster", metavar="SETTING")
    config = add_command(build_commands, "config", cmd_build_config, parents=[target],
                         help="show the view building settings, and change those given (kept in group0)")
    config.add_argument("--chunk-rows", type=positive_int, default=0, metavar="N",
                        help="base rows a batch reads and hands to Spark at a time (default 250,000); smaller "
                             "chunks use less memory and lose less work to a restart")
    config.add_argument("--json", action="store_true")


def cmd_build_config(args: argparse.Namespace) -> int:
    settings = client.build_config(target_addresses(args), chunk_rows=args.chunk_rows)
    print(json_line(settings) if args.json else f"chunk rows: {settings['chunk_rows']:,}")
    return 0
