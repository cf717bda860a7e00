"""How the `vbc` command line and the demo draw things on a terminal: rich tables, status, progress and check reports."""
from __future__ import annotations

import os
import sys

from rich.console import Console, Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from common.injection import default_mode


def stdout_console() -> Console:
    """A console on the current stdout; wide when not a terminal so tables are not squeezed in pipes."""
    if sys.stdout.isatty():
        return Console()
    return Console(file=sys.stdout, width=int(os.environ.get("COLUMNS", 0)) or 240)


def cell(value: object) -> Text:
    """A table cell for a Python value (no markup interpretation)."""
    if value is None:
        return Text("null", style="dim")
    if isinstance(value, bool):
        return Text("true" if value else "false")
    return Text(str(value))


def nodes_table(nodes: list[dict]) -> Table:
    table = Table(title="nodes", title_justify="left")
    for column in ("id", "grpc", "raft", "pid", "log"):
        table.add_column(column)
    for node in nodes:
        table.add_row(*(cell(node.get(key)) for key in ("id", "grpc", "raft", "pid", "log")))
    return table


def result_table(columns: list[str], types: list[str], rows: list[list]) -> Table:
    table = Table()
    for name, column_type in zip(columns, types):
        table.add_column(Text.assemble(name, (f" {column_type}", "dim")) if column_type else Text(name))
    for row in rows:
        table.add_row(*(cell(value) for value in row))
    return table


def tablets_table(table: str, tablets: list[dict]) -> Table:
    rendered = Table(title=f"tablets of {table}", title_justify="left")
    moving = any(tablet.get("stage") for tablet in tablets)
    for column in ("tablet", "first_token", "last_token", "replicas") + (("migration",) if moving else ()):
        rendered.add_column(column, justify="right" if column not in ("replicas", "migration") else "left")
    for tablet in tablets:
        row = [cell(tablet["tablet"]), cell(tablet["first_token"]), cell(tablet["last_token"]),
               Text(", ".join(tablet["replicas"]))]
        if moving:
            row.append(Text(tablet_migration_cell(tablet)))
        rendered.add_row(*row)
    return rendered


def tablet_migration_cell(tablet: dict) -> str:
    """"leaving -> pending (stage)", with the reason after the stage while the move rolls back; "" if it stays."""
    if not tablet.get("stage"):
        return ""
    because = f": {tablet['reason']}" if tablet.get("reason") else ""
    return f"{tablet['leaving']} -> {tablet['pending']} ({tablet['stage']}{because})"


INJECTION_COLUMNS = ("name", "enabled", "mode", "default_mode", "one_shot", "hits")


def injection_point_rows(result: dict) -> list[dict]:
    """The listed points, each with its default mode (from this client's list of points; "" if unknown here)."""
    return [{**point, "default_mode": default_mode(point["name"])} for point in result["points"]]


def injection_points_table(result: dict) -> Table:
    table = Table(title=f"injection points of {result['node'] or 'the node'}", title_justify="left")
    for column in INJECTION_COLUMNS:
        table.add_column(column)
    for point in injection_point_rows(result):
        table.add_row(*(cell(point[column]) for column in INJECTION_COLUMNS))
    return table


def progress_cell(progress: float) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_row(ProgressBar(total=1.0, completed=max(0.0, min(progress, 1.0)), width=20), Text(f"{progress:6.1%}"))
    return grid


def worker_text(worker: dict | None) -> Text:
    if not worker:
        return Text("")
    text = Text(f"{worker['batches_running']} running, {worker['tasks_finished']} tasks, "
                f"{worker['rows_scanned']:,} rows, {worker['spark_jobs']} spark jobs")
    if worker.get("tablet_scans"):
        text.append(f" (read {worker.get('read_s', 0.0):.1f}s, spark {worker.get('spark_s', 0.0):.1f}s, "
                    f"merge {worker.get('merge_s', 0.0):.1f}s"
                    + (f", throttled {worker['throttled_s']:.1f}s" if worker.get("throttled_s") else "") + ")")
    if worker.get("view_rows_repaired"):
        text.append(f", {worker['view_rows_repaired']:,} stale view rows repaired")
    if worker.get("view_rows_kept"):
        text.append(f", {worker['view_rows_kept']:,} view rows kept for unreachable replicas")
    if worker["batches_failed"]:
        text.append(f", {worker['batches_failed']} failed", style="red")
    return text


SPARK_STATE_STYLES = {"ready": "green", "starting": "yellow", "warming": "yellow", "failed": "bold red", "off": "dim"}


def spark_text(worker: dict | None) -> Text:
    """The node's Spark session: its state, and the seconds its start took once it is up."""
    state = (worker or {}).get("spark_state", "")
    if not state:
        return Text("")
    text = Text(state, style=SPARK_STATE_STYLES.get(state, ""))
    if state == "ready" and worker.get("spark_start_s"):
        text.append(f" {worker['spark_start_s']:.1f}s", style="dim")
    return text


def spark_error_lines(nodes: list[dict]) -> list[Text]:
    """One line per node whose Spark session failed to start (or to warm up)."""
    lines = []
    for node in nodes:
        worker = node.get("worker") or {}
        if worker.get("spark_error"):
            lines.append(Text(f"{node['id']}: spark {worker['spark_state']}: {worker['spark_error']}", style="red"))
    return lines


def duration_text(seconds: float) -> str:
    if seconds < 0:
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


STATE_STYLES = {"BUILT": "green", "PAUSED": "blue"}


def rate_text(view: dict) -> Text:
    if view["state"] in ("BUILT", "PAUSED"):
        return Text(f"{view.get('rows_done', 0):,} rows")
    rate = view.get("rows_per_s", 0.0)
    return Text(f"{view.get('rows_done', 0):,} rows" + (f", {rate:,.0f}/s" if rate else "")
                + f", ETA {duration_text(view.get('eta_s', -1.0))}")


def hosts_text(hosts: dict[str, str]) -> Text:
    text = Text()
    for index, (node_id, state) in enumerate(sorted(hosts.items())):
        if index:
            text.append(" ")
        text.append(f"{node_id}:{state}", style="green" if state == "SUCCESS" else "yellow")
    return text


def status_nodes_table(nodes: list[dict], leader: str) -> Table:
    table = Table(title="nodes", title_justify="left")
    for column in ("id", "grpc", "raft", "alive", "shards", "schema", "pending view updates", "spark", "worker"):
        table.add_column(column, no_wrap=column in ("id", "spark"))
    for node in sorted(nodes, key=lambda n: (len(n["id"]), n["id"])):
        name = Text(node["id"] + (" (leader)" if node["id"] == leader else ""))
        alive = Text("up", style="green") if node["alive"] else Text("DOWN", style="bold red")
        if node.get("insecure"):
            alive = Text.assemble(alive, (" INSECURE", "bold yellow"))
        table.add_row(name, cell(node["grpc"]), cell(node.get("raft", "")), alive, cell(node.get("shards", "")),
                      cell(node.get("schema_version", "")), cell(node.get("pending_view_updates", "")),
                      spark_text(node.get("worker")), worker_text(node.get("worker")))
    return table


def status_views_table(views: list[dict]) -> Table:
    table = Table(title="views", title_justify="left")
    for column in ("name", "base", "kind", "state", "tasks", "progress", "rows", "hosts"):
        table.add_column(column, no_wrap=column in ("name", "progress"))
    for view in views:
        state = Text(view["state"], style=STATE_STYLES.get(view["state"], "yellow"))
        table.add_row(cell(view["name"]), cell(view["base"]), Text("index" if view.get("is_index") else "view"), state,
                      Text(f"{view['tasks_done']}/{view['tasks_total']}"), progress_cell(view["progress"]),
                      rate_text(view), hosts_text(view["hosts"]))
    return table


def view_error_lines(views: list[dict]) -> list[Text]:
    """One line per (view, node) whose batches keep failing: the node, how many in a row, the last error."""
    lines = []
    for view in views:
        for error in view.get("errors", ()):
            attempts = error["attempts"]
            lines.append(Text(f"{view['name']}: {attempts} batch{'es' if attempts != 1 else ''} failed in a row on "
                              f"{error['node']}: {error['error']}", style="red"))
    return lines


def view_waiting_lines(views: list[dict]) -> list[Text]:
    """One line per view whose build waits for view rows kept in an outbox to reach their view replica."""
    lines = []
    for view in views:
        for held in view.get("held", ()):
            lines.append(Text(f"{view['name']}: waits for node {held['target']} to receive the view rows node "
                              f"{held['holder']} keeps for it (it could not be reached)", style="yellow"))
    return lines


def render_status(document: dict) -> Group:
    """A readable rendering of `client.status()`."""
    header = Text.assemble(("leader ", "bold"), document["leader"] or "(none)", ("  term ", "bold"), str(document["term"]))
    if document.get("schema_version") is not None:
        header.append_text(Text.assemble(("  schema ", "bold"), str(document["schema_version"])))
    if document.get("answered_by"):
        header.append_text(Text.assemble(("  answered by ", "bold"), document["answered_by"]))
    parts = [header, status_nodes_table(document["nodes"], document["leader"]), *spark_error_lines(document["nodes"])]
    parts.append(status_views_table(document["views"]) if document["views"] else Text("no views", style="dim"))
    parts += view_error_lines(document["views"]) + view_waiting_lines(document["views"])
    if document.get("migrations"):
        parts.append(status_migrations_table(document["migrations"]))
    parts += staging_lines(document.get("staging", ()))
    return Group(*parts)


def staging_lines(staging) -> list[Text]:
    """One line per table whose bulk-loaded rows are not visible yet (they wait in its replicas' staging areas)."""
    return [Text(f"{table['table']}: {table.get('rows', 0):,} bulk-loaded rows (all replicas) being processed, "
                 f"{table['tasks']} process_staging task(s) left on {', '.join(table['replicas'])}", style="cyan")
            for table in staging]


def status_migrations_table(migrations: list[dict]) -> Table:
    """Tablet migrations in progress: which replica goes where, the stage, rows streamed and their rate, and (a column
    shown once one rolls back) why it rolls back."""
    table = Table(title="tablet migrations", title_justify="left")
    for column in ("table", "tablet", "kind", "from", "to", "stage", "rows streamed"):
        table.add_column(column, no_wrap=True)
    rolling_back = any(migration.get("reason") for migration in migrations)
    if rolling_back:
        table.add_column("reason", style="yellow")
    for migration in migrations:
        rate = f" ({migration['rows_per_s']:,.0f}/s)" if migration.get("rows_per_s") else ""
        row = [cell(migration["table"]), cell(migration["tablet"]), cell(migration.get("kind") or "move"),
               cell(migration["leaving"] if migration.get("kind") != "add" else ""),
               cell(migration["pending"] if migration.get("kind") != "remove" else ""),
               cell(migration["stage"]), Text(f"{migration.get('rows_streamed', 0):,}{rate}")]
        table.add_row(*row, *([Text(migration.get("reason") or "")] if rolling_back else []))
    return table


def check_report(result: dict) -> Group:
    verdict = (Text("consistent", style="bold green") if result["consistent"]
               else Text("INCONSISTENT", style="bold red"))
    header = Text.assemble((f"{result['view']} ", "bold"), verdict, f"  ({result['state']}) ",
                           f"{result['base_rows']:,} base rows, {result['view_rows']:,} view rows, "
                           f"{result['replicas_checked']} view tablet replicas in {result['seconds']:.1f}s")
    counts = Text(f"missing {result['missing']}, extra {result['extra']}, different {result['different']}")
    parts = [header, counts]
    if result["examples"]:
        table = Table(title="examples", title_justify="left")
        for column in ("kind", "replica", "key", "expected", "found"):
            table.add_column(column)
        for example in result["examples"]:
            table.add_row(*(Text(example[c]) for c in ("kind", "replica", "key", "expected", "found")))
        parts.append(table)
    if result["state"] != "BUILT" and not result["consistent"]:
        parts.append(Text("the view is still building: differences are expected until it is built", style="yellow"))
    return Group(*parts)
