"""`vbc exec` and `vbc load`: run a CQL statement, or load a CSV or Parquet file into a table."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

from vbc import client
from vbc.cli.arguments import add_command, json_params, positive_float, positive_int, table_name
from vbc.cli.common import UsageError, json_line, target_addresses
from vbc.render import result_table, stdout_console


def add_exec_parser(commands, target: argparse.ArgumentParser) -> None:
    execute = add_command(commands, "exec", cmd_exec, parents=[target], help="run one CQL statement")
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


def add_load_parser(commands, target: argparse.ArgumentParser) -> None:
    load = add_command(commands, "load", cmd_load, parents=[target], help="load a CSV or Parquet file into a table")
    load.add_argument("table", type=table_name, metavar="KS.TABLE")
    load.add_argument("file", type=Path, metavar="FILE", help="a .csv (header line with column names) or .parquet file")
    load.add_argument("--batch-rows", type=positive_int, default=20_000, metavar="N",
                      help="rows per execution (default 20,000)")
    load.add_argument("--quiet", action="store_true", help="no progress bar")
    load.add_argument("--no-wait", action="store_true",
                      help="return once the rows are committed; a table with views shows them once its replicas "
                           "processed their staged rows (`vbc status` lists the work left)")


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

        staging: dict = {}

        def waiting(staged: dict) -> None:
            """Staged rows left (every replica's copy): a bar of its own, with their rate and ETA."""
            if not staging:
                staging.update(since=time.monotonic(), total=max(staged["rows"], 1))
                staging["task"] = bar.add_task("processing staged rows", total=staging["total"], rate="-")
                bar.update(task, visible=False)
            done = max(staging["total"] - staged["rows"], 0)
            rate = done / max(time.monotonic() - staging["since"], 1e-9)
            bar.update(staging["task"], completed=done, rate=f"{rate:,.0f}",
                       description=f"processing staged rows ({staged['tasks']} task(s) left)")

        try:
            committed, seconds = load.load(target_addresses(args), args.table, args.file, args.batch_rows,
                                           on_total, advance, wait=not args.no_wait, on_waiting=waiting)
        except load.LoadError as error:
            bar.stop()
            print(f"error: {error}", file=sys.stderr)
            print(f"{error.committed:,} rows were committed before the error" if error.committed
                  else "nothing was written", file=sys.stderr)
            return 1
    print(f"loaded {committed:,} rows into {args.table} in {seconds:.1f} s ({committed / max(seconds, 1e-9):,.0f} "
          "rows/s)")
    return 0
