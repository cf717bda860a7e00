"""`vbc tablets`, `vbc tablet move|split|merge` and `vbc balancer`: a table's tablets and where their replicas are."""
from __future__ import annotations

import argparse
import sys

from vbc import client
from vbc.cli.arguments import add_command, add_command_group, positive_float, table_name
from vbc.cli.common import json_line, target_addresses
from vbc.render import stdout_console, tablets_table


def add_tablets_parsers(commands, target: argparse.ArgumentParser) -> None:
    """`vbc tablets`, `vbc tablet ...` and `vbc balancer`, in this order."""
    add_tablets_parser(commands, target)
    add_tablet_parsers(commands, target)
    add_balancer_parser(commands, target)


def add_tablets_parser(commands, target: argparse.ArgumentParser) -> None:
    tablets = add_command(commands, "tablets", cmd_tablets, parents=[target], help="the tablets of a table")
    tablets.add_argument("table", type=table_name, metavar="KS.TABLE")
    tablets.add_argument("--json", action="store_true", help="one JSON object per tablet")


def add_tablet_parsers(commands, target: argparse.ArgumentParser) -> None:
    tablet_commands = add_command_group(commands, "tablet", "tablet operations (move)", metavar="OPERATION")
    move = add_command(tablet_commands, "move", cmd_tablet_move, parents=[target],
                       help="move one replica of a tablet to another node or shard, streaming its rows")
    move.add_argument("table", type=table_name, metavar="KS.TABLE")
    move.add_argument("tablet", type=int, metavar="TABLET", help="the tablet's number (see `vbc tablets`)")
    move.add_argument("from_replica", metavar="FROM", help="the replica that leaves: NODE or NODE:SHARD")
    move.add_argument("to_replica", metavar="TO", help="where it goes: NODE or NODE:SHARD (default: least loaded shard)")
    move.add_argument("--no-wait", action="store_true", help="print the migration's id and return at once")
    move.add_argument("--timeout", type=positive_float, default=3600.0, metavar="S",
                      help="give up waiting after S seconds (exit status 1; default 3600)")
    move.add_argument("--json", action="store_true", help="print the migration's final state as JSON")
    for action, text in (("split", "double a table's tablets (each splits in two on the same replicas)"),
                         ("merge", "halve a table's tablets (pairs first move onto the same replicas)")):
        resize = add_command(tablet_commands, action, cmd_tablet_resize, parents=[target], help=text)
        resize.add_argument("table", type=table_name, metavar="KS.TABLE")
        resize.add_argument("--no-wait", action="store_true", help="return once the change is requested")
        resize.add_argument("--timeout", type=positive_float, default=3600.0, metavar="S",
                            help="give up waiting after S seconds (exit status 1; default 3600)")
        resize.set_defaults(merge=action == "merge")


def add_balancer_parser(commands, target: argparse.ArgumentParser) -> None:
    balance = add_command(commands, "balancer", cmd_balancer, parents=[target],
                          help="the tablet load balancer: spreads replicas evenly over nodes and shards")
    balance.add_argument("action", choices=("on", "off", "status"), nargs="?", default="status")
    balance.add_argument("--json", action="store_true")


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
