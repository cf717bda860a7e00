"""Prepared statements: parsed and resolved once, bind markers typed by column, invalidated when a table changes.

As CQL drivers use them: `Prepare(text)` gives an id and the name and type of every `?` (in marker order);
`Execute(id, value sets)` runs it. The id is a hash of the text, so every node gives the same id and a client
that meets a node not knowing it (another node, an evicted entry, a restart) prepares it there again. A
prepared statement remembers the tables it resolved; when one of them was dropped or changed (a new table
under the name, another definition), executing it answers FAILED_PRECONDITION "unprepared statement ...",
and the client library prepares it again (re-preparing reports a dropped table as NOT_FOUND).
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.core.errors import FailedPrecondition
from coordinator.core.schema import Table

from . import ast
from .binding import markers
from .catalog import require_column

UNPREPARED = "unprepared statement"  # how an Unprepared error's message starts (the client library looks for it)
CACHE_SIZE = 4096


class Unprepared(FailedPrecondition):
    """The node does not hold this prepared statement (any more): prepare it again."""


@dataclass(frozen=True)
class BindColumn:
    """The column a bind marker's value is for, and its CQL type."""

    name: str
    type: str


@dataclass(frozen=True)
class Prepared:
    id: str
    text: str
    statement: ast.Statement
    tables: tuple[tuple[ast.QualifiedName, Table], ...]  # each table the statement names, as resolved
    bind_columns: tuple[BindColumn, ...]  # in marker order


def statement_id(text: str, keyspace: str | None = None) -> str:
    """The id of the prepared `text` (in a connection's `keyspace`, for names without one): the same on every node."""
    scoped = text if keyspace is None else f"{keyspace}\0{text}"
    return hashlib.sha256(scoped.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _dml_statements(statement: ast.Statement) -> tuple:
    if isinstance(statement, ast.Batch):
        return statement.statements
    if isinstance(statement, (ast.Insert, ast.Update, ast.Delete, ast.Select)):
        return (statement,)
    return ()


def _marker_columns(statement, table: Table) -> dict[int, BindColumn]:
    """Bind marker position -> the column its value is for, in one INSERT/UPDATE/DELETE/SELECT of `table`."""
    pairs: list[tuple[str, object]] = []
    if isinstance(statement, ast.Insert):
        pairs += zip(statement.columns, statement.values)
    if isinstance(statement, ast.Update):
        pairs += statement.assignments
    for relation in getattr(statement, "where", ()):
        values = relation.value if isinstance(relation.value, tuple) else (relation.value,)
        pairs += [(relation.column, v) for v in values]
    return {value.position: BindColumn(column, require_column(table, column).type)
            for column, value in pairs if isinstance(value, ast.BindMarker)}


def prepare(text: str, statement: ast.Statement, resolve: Callable[[ast.Statement], Table],
            keyspace: str | None = None) -> Prepared:
    """The prepared form of parsed `statement` (its names already put in `keyspace`); `resolve(dml statement)` gives
    the table it reads or writes (raising NOT_FOUND or INVALID_ARGUMENT as executing it would)."""
    tables: dict[ast.QualifiedName, Table] = {}
    columns: dict[int, BindColumn] = {}
    for inner in _dml_statements(statement):
        table = resolve(inner)
        tables[inner.table] = table
        columns.update(_marker_columns(inner, table))
    positions = sorted(m.position for m in markers(statement))
    bind = tuple(columns.get(p, BindColumn(f"?{i}", "unknown")) for i, p in enumerate(positions, start=1))
    return Prepared(statement_id(text, keyspace), text, statement, tuple(tables.items()), bind)


def changed_table(prepared: Prepared, find: Callable[[ast.QualifiedName], Table | None]) -> str | None:
    """Why `prepared` is no longer valid (a table it names was dropped or changed), or None."""
    for name, table in prepared.tables:
        current = find(name)
        if current is None:
            return f"table {table.qualified_name} was dropped"
        if current is not table and current != table:
            return f"table {table.qualified_name} changed"
    return None


class PreparedCache:
    """The prepared statements of one node, least recently used evicted past `capacity`. Thread-safe."""

    def __init__(self, capacity: int = CACHE_SIZE):
        self._capacity = capacity
        self._entries: OrderedDict[str, Prepared] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, prepared: Prepared) -> None:
        with self._lock:
            self._entries[prepared.id] = prepared
            self._entries.move_to_end(prepared.id)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def get(self, statement_id: str) -> Prepared:
        """The prepared statement with this id; Unprepared when this node does not hold it."""
        with self._lock:
            prepared = self._entries.get(statement_id)
            if prepared is not None:
                self._entries.move_to_end(statement_id)
                return prepared
        raise Unprepared(f"{UNPREPARED} {statement_id or '(empty id)'}: this node does not hold it (prepared on "
                         "another node, evicted or restarted since); prepare it again")

    def evict(self, statement_id: str) -> None:
        with self._lock:
            self._entries.pop(statement_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
