"""Runs one statement: schema changes become group0 commands, writes and reads go to the data paths."""
from __future__ import annotations

import functools
import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from coordinator.core import types as coltypes
from coordinator.core.errors import FailedPrecondition, InvalidArgument, error_from_code
from coordinator.core.schema import Column, Filter, Table
from coordinator.core.views import matches
from storage.cells import Cell, Row
from vbc.cql import BindError, ast, bind, parse

from . import metrics
from .injection import Injections
from .mutations import partition_token
from .read_path import ReadCoordinator
from .write_path import WriteCoordinator

DEFAULT_INITIAL_TABLETS = 8
DDL_TIMEOUT = 20.0
MAX_TIMESTAMP = 2**62  # leaves room for view_ts bumps within a signed 64-bit timestamp


@dataclass
class Result:
    """What a statement returns: rows with their columns (name, type), or an acknowledgement message."""

    columns: list[tuple[str, str]] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    message: str = ""


class Executor:
    """Turns statement text into effects on the cluster."""

    def __init__(self, group0, writer: WriteCoordinator, reader: ReadCoordinator, now: Callable[[], int],
                 injections: Injections):
        self._group0 = group0
        self._writer = writer
        self._reader = reader
        self._now = now
        self._injections = injections

    def execute(self, text: str, params: list[list] | None = None) -> Result:
        pages = list(self.execute_pages(text, page_size=None, params=params))
        if len(pages) == 1:
            return pages[0]
        return Result(columns=pages[0].columns, rows=[r for p in pages for r in p.rows])

    def execute_pages(self, text: str, page_size: int | None, params: list[list] | None = None) -> Iterator[Result]:
        statements = _bound(text, params)
        first = statements[0]
        kind = type(first).__name__
        metrics.STATEMENTS.labels(kind).inc()
        with metrics.STATEMENT_SECONDS.labels(kind).time():
            if isinstance(first, _WRITES):
                yield self._write_all(statements)
                return
            if len(statements) > 1:
                raise InvalidArgument(f"{kind} takes at most one set of bind values, got {len(statements)}")
            if isinstance(first, ast.Select):
                yield from self._select(first, page_size)
                return
            yield _HANDLERS[type(first)](self, first)

    # --------------------------------------------------------------- schema

    def _propose(self, command: dict) -> object:
        self._injections.hit("ddl.before_propose")
        command = dict(command, cmd_id=uuid.uuid4().hex)
        outcome = self._group0.propose(command, timeout=DDL_TIMEOUT)
        if not outcome.ok:
            raise error_from_code(outcome.error_code, outcome.error_message)
        return outcome.value

    def _ddl_message(self, verb: str, kind: str, name: str, value: object) -> Result:
        if value == "exists":
            return Result(message=f"{kind} {name} already exists (IF NOT EXISTS): nothing done")
        if value == "absent":
            return Result(message=f"{kind} {name} does not exist (IF EXISTS): nothing done")
        return Result(message=f"{verb} {kind} {name}")

    def _create_keyspace(self, s: ast.CreateKeyspace) -> Result:
        rf = _replication_factor(s.replication)
        tablets = _initial_tablets(s.tablets)
        value = self._propose({"op": "create_keyspace", "name": s.name, "rf": rf, "initial_tablets": tablets,
                               "if_not_exists": s.if_not_exists})
        return self._ddl_message("created", "keyspace", s.name, value)

    def _alter_keyspace(self, s: ast.AlterKeyspace) -> Result:
        rf = _replication_factor(s.replication)
        value = self._propose({"op": "alter_keyspace", "name": s.name, "rf": rf, "id_seed": uuid.uuid4().hex})
        return self._ddl_message("altered", "keyspace", s.name, value)

    def _create_table(self, s: ast.CreateTable) -> Result:
        keyspace = _keyspace_of(s.table)
        value = self._propose({
            "op": "create_table", "id": uuid.uuid4().hex, "keyspace": keyspace, "name": s.table.name,
            "columns": [[c.name, c.type] for c in s.columns], "partition_key": list(s.partition_key),
            "clustering_key": list(s.clustering_key), "if_not_exists": s.if_not_exists,
        })
        return self._ddl_message("created", "table", f"{keyspace}.{s.table.name}", value)

    def _create_view(self, s: ast.CreateView) -> Result:
        keyspace = _keyspace_of(s.view)
        if s.base.keyspace not in (None, keyspace):
            raise InvalidArgument(f"a view must be in the keyspace of its base table ({s.base.keyspace}), not {keyspace}")
        value = self._propose({
            "op": "create_view", "id": uuid.uuid4().hex, "keyspace": keyspace, "name": s.view.name,
            "base": s.base.name, "columns": list(s.columns) if s.columns is not None else None,
            "where": [[r.column, r.op, r.value] for r in s.where], "partition_key": list(s.partition_key),
            "clustering_key": list(s.clustering_key), "if_not_exists": s.if_not_exists,
        })
        return self._ddl_message("created", "materialized view", f"{keyspace}.{s.view.name}", value)

    def _create_index(self, s: ast.CreateIndex) -> Result:
        keyspace = _keyspace_of(s.table)
        name = s.name or f"{s.table.name}_{s.column}_idx"
        value = self._propose({"op": "create_index", "id": uuid.uuid4().hex, "keyspace": keyspace, "name": name,
                               "base": s.table.name, "column": s.column, "if_not_exists": s.if_not_exists})
        return self._ddl_message("created", "index", f"{keyspace}.{name}", value)

    def _drop_keyspace(self, s: ast.DropKeyspace) -> Result:
        value = self._propose({"op": "drop_keyspace", "name": s.name, "if_exists": s.if_exists})
        return self._ddl_message("dropped", "keyspace", s.name, value)

    def _drop_table(self, s: ast.DropTable) -> Result:
        keyspace = _keyspace_of(s.table)
        value = self._propose({"op": "drop_table", "keyspace": keyspace, "name": s.table.name, "if_exists": s.if_exists})
        return self._ddl_message("dropped", "table", f"{keyspace}.{s.table.name}", value)

    def _drop_view(self, s: ast.DropView) -> Result:
        keyspace = _keyspace_of(s.view)
        value = self._propose({"op": "drop_view", "keyspace": keyspace, "name": s.view.name, "if_exists": s.if_exists})
        return self._ddl_message("dropped", "materialized view", f"{keyspace}.{s.view.name}", value)

    def _drop_index(self, s: ast.DropIndex) -> Result:
        keyspace = _keyspace_of(s.index)
        value = self._propose({"op": "drop_view", "keyspace": keyspace, "name": s.index.name, "if_exists": s.if_exists,
                               "is_index": True})
        return self._ddl_message("dropped", "index", f"{keyspace}.{s.index.name}", value)

    # --------------------------------------------------------------- writes

    def _resolve(self, name: ast.QualifiedName) -> Table:
        """The table or view named; on a miss, wait for this node to catch up with Raft and look again."""
        keyspace = _keyspace_of(name)
        found = self._group0.read(lambda s: s.find_table(keyspace, name.name))
        if found is None:
            self._group0.barrier()
            return self._group0.read(lambda s: s.require_table(keyspace, name.name))
        return found

    def _writable(self, name: ast.QualifiedName) -> Table:
        table = self._resolve(name)
        if table.view is not None:
            base = self._group0.read(lambda s: s.tables[table.view.base_id])
            raise InvalidArgument(f"{table.qualified_name} is a view: write to its base table {base.qualified_name}")
        return table

    def _timestamp(self, statement_ts: int | None, batch_ts: int | None = None) -> int:
        ts = statement_ts if statement_ts is not None else batch_ts
        if ts is None:
            return self._now()
        if not 0 < ts <= MAX_TIMESTAMP:
            raise InvalidArgument(f"USING TIMESTAMP {ts} is out of range: use microseconds since the epoch, "
                                  f"between 1 and {MAX_TIMESTAMP}")
        return ts

    def _insert_mutation(self, s: ast.Insert, ts: int) -> tuple[Table, Row]:
        table = self._writable(s.table)
        values = {c: _coerce(table, c, v) for c, v in zip(s.columns, s.values, strict=True)}
        key = _full_key(table, values, "INSERT")
        cells = {c: Cell(v, ts) for c, v in values.items() if c not in table.primary_key}
        return table, Row(token=partition_token(table, values), key=key, marker_ts=ts, cells=cells)

    def _update_mutation(self, s: ast.Update, ts: int) -> tuple[Table, Row]:
        table = self._writable(s.table)
        key_values = _key_equalities(table, s.where, "UPDATE")
        cells = {}
        for column, value in s.assignments:
            if column in table.primary_key:
                raise InvalidArgument(f"UPDATE cannot set primary key column {column!r} of {table.qualified_name}")
            cells[column] = Cell(_coerce(table, column, value), ts)
        key = _full_key(table, key_values, "UPDATE")
        return table, Row(token=partition_token(table, key_values), key=key, marker_ts=ts, cells=cells)

    def _delete_mutation(self, s: ast.Delete, ts: int) -> tuple[Table, Row]:
        table = self._writable(s.table)
        key_values = _key_equalities(table, s.where, "DELETE")
        key = _full_key(table, key_values, "DELETE")
        return table, Row(token=partition_token(table, key_values), key=key, tomb_ts=ts)

    def _mutation(self, statement, ts: int) -> tuple[Table, Row]:
        builders = {ast.Insert: self._insert_mutation, ast.Update: self._update_mutation,
                    ast.Delete: self._delete_mutation}
        return builders[type(statement)](statement, ts)

    def _write_all(self, statements: list) -> Result:
        """INSERT/UPDATE/DELETE/BATCH statements (one per bind-value set) as one write with one timestamp."""
        default_ts = self._now()
        mutations = []
        for statement in statements:
            inner, outer_ts = (statement.statements, statement.timestamp) if isinstance(statement, ast.Batch) else (
                (statement,), None)
            batch_ts = self._timestamp(outer_ts, default_ts)
            mutations.extend(self._mutation(s, self._timestamp(s.timestamp, batch_ts)) for s in inner)
        if mutations:
            self._writer.write(mutations, default_ts)
        if len(statements) == 1 and not isinstance(statements[0], ast.Batch):
            return Result(message="ok")
        return Result(message=f"ok: {len(mutations)} statements applied")

    # --------------------------------------------------------------- reads

    def _select(self, s: ast.Select, page_size: int | None) -> Iterator[Result]:
        table = self._resolve(s.table)
        if table.view is not None and not s.allow_stale:
            self._refuse_unbuilt_view(table)
        columns = _selected_columns(table, s.columns)
        filters = tuple(_filter(table, r) for r in s.where)
        pushed_limit = None if filters or s.count else s.limit
        rows = self._matching_rows(table, filters, pushed_limit)
        rows = (r for r in rows if matches(filters, dict(zip((c.name for c in table.columns), r))))
        if s.count:  # LIMIT applies to the single result row, as in Cassandra since 2.2
            yield Result(columns=[("count", "bigint")], rows=[[sum(1 for _ in rows)]])
            return
        positions = [next(i for i, c in enumerate(table.columns) if c.name == name) for name, _ in columns]
        projected = ([row[i] for i in positions] for row in _limited(rows, s.limit))
        yield from _pages(columns, projected, page_size)

    def _refuse_unbuilt_view(self, view: Table) -> None:
        progress = self._group0.read(lambda s: s.view_progress(view.id))
        if not progress["built"]:
            raise FailedPrecondition(
                f"{view.qualified_name} is being built ({progress['tasks_done']} of {progress['tasks_total']} "
                "build tasks done) and cannot be read yet; wait for it (vbc status), or add ALLOW STALE to read "
                "what it holds now"
            )

    def _matching_rows(self, table: Table, filters: tuple[Filter, ...], limit: int | None) -> Iterator[list]:
        return self._reader.rows(table, partitions=_partition_restrictions(table, filters), limit=limit)


# ------------------------------------------------------------------- helpers


def _keyspace_of(name: ast.QualifiedName) -> str:
    if name.keyspace is None:
        raise InvalidArgument(f"no keyspace given for {name.name!r}: write it as keyspace.{name.name}")
    return name.keyspace


def _replication_factor(options: dict) -> int:
    unknown = set(options) - {"rf", "replication_factor", "class"}
    if unknown:
        raise InvalidArgument(f"unknown replication option(s) {', '.join(sorted(unknown))}; use {{'rf': N}}")
    value = options.get("rf", options.get("replication_factor"))
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"replication needs an integer 'rf' (e.g. {{'rf': 3}}), got {value!r}")
    return value


def _initial_tablets(options: dict) -> int:
    unknown = set(options) - {"initial"}
    if unknown:
        raise InvalidArgument(f"unknown tablets option(s) {', '.join(sorted(unknown))}; use {{'initial': N}}")
    value = options.get("initial", DEFAULT_INITIAL_TABLETS)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value


def _require_column(table: Table, column: str) -> Column:
    definition = table.column(column)
    if definition is None:
        raise InvalidArgument(f"unknown column {column!r} in {table.qualified_name}; its columns are "
                              f"{', '.join(c.name for c in table.columns)}")
    return definition


def _coerce(table: Table, column: str, value: object) -> object:
    return coltypes.coerce(_require_column(table, column).type, value, column)


def _full_key(table: Table, values: dict, statement: str) -> tuple:
    missing = [c for c in table.primary_key if values.get(c) is None]
    if missing:
        raise InvalidArgument(f"{statement} on {table.qualified_name} needs the full primary key "
                              f"({', '.join(table.primary_key)}); missing: {', '.join(missing)}")
    return tuple(values[c] for c in table.primary_key)


def _key_equalities(table: Table, where: tuple[ast.Relation, ...], statement: str) -> dict:
    if not any(r.column in table.partition_key for r in where):
        raise InvalidArgument(f"{statement} on {table.qualified_name} must restrict the partition key "
                              f"({', '.join(table.partition_key)}) with '='")
    values = {}
    for relation in where:
        if relation.column not in table.primary_key or relation.op != "=":
            raise InvalidArgument(f"{statement} WHERE supports only '=' on primary key columns "
                                  f"({', '.join(table.primary_key)}); got {relation.column} {relation.op}")
        values[relation.column] = _coerce(table, relation.column, relation.value)
        if values[relation.column] is None:
            raise InvalidArgument(f"primary key column {relation.column!r} cannot be compared with null")
    return values


def _selected_columns(table: Table, names: tuple[str, ...] | None) -> list[tuple[str, str]]:
    if names is None:
        return [(c.name, c.type) for c in table.columns]
    return [(n, _require_column(table, n).type) for n in names]


def _filter(table: Table, relation: ast.Relation) -> Filter:
    if relation.op == "IS NOT NULL":
        _require_column(table, relation.column)
        return Filter(relation.column, relation.op, None)
    if relation.op == "IN":
        return Filter(relation.column, "IN", tuple(_coerce(table, relation.column, v) for v in relation.value))
    return Filter(relation.column, relation.op, _coerce(table, relation.column, relation.value))


def _partition_restrictions(table: Table, filters: tuple[Filter, ...]) -> list[tuple] | None:
    """The partition keys a query is limited to by '='/IN on every partition key column, or None."""
    choices = []
    for column in table.partition_key:
        term = next((f for f in filters if f.column == column and f.op in ("=", "IN")), None)
        if term is None:
            return None
        options = term.value if term.op == "IN" else (term.value,)
        if any(v is None for v in options):
            raise InvalidArgument(f"partition key column {column!r} cannot be compared with null")
        choices.append(options)
    keys = [()]
    for options in choices:
        keys = [k + (v,) for k in keys for v in dict.fromkeys(options)]
    return keys


def _limited(rows: Iterator, limit: int | None) -> Iterator:
    return itertools.islice(rows, limit) if limit is not None else rows


def _pages(columns: list, rows: Iterator[list], page_size: int | None) -> Iterator[Result]:
    if not page_size:
        yield Result(columns=columns, rows=list(rows))
        return
    page: list = []
    sent = False
    for row in rows:
        page.append(row)
        if len(page) >= page_size:
            yield Result(columns=columns, rows=page)
            page, sent = [], True
    if page or not sent:
        yield Result(columns=columns, rows=page)


_HANDLERS = {
    ast.CreateKeyspace: Executor._create_keyspace,
    ast.AlterKeyspace: Executor._alter_keyspace,
    ast.CreateTable: Executor._create_table,
    ast.CreateView: Executor._create_view,
    ast.CreateIndex: Executor._create_index,
    ast.DropKeyspace: Executor._drop_keyspace,
    ast.DropTable: Executor._drop_table,
    ast.DropView: Executor._drop_view,
    ast.DropIndex: Executor._drop_index,
}
_WRITES = (ast.Insert, ast.Update, ast.Delete, ast.Batch)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> ast.Statement:
    return parse(text)


def _bound(text: str, params: list[list] | None) -> list:
    """The statement once per bind-value set (once, with no values, when none are given)."""
    statement = _parse_cached(text)
    try:
        return [bind(statement, values) for values in (params or [[]])]
    except BindError as error:
        raise InvalidArgument(str(error)) from None
