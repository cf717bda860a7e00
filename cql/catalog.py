"""Name resolution for statements: tables and views by name, columns and typed values of a table."""
from __future__ import annotations

from typing import Callable, Protocol, TypeVar

from coordinator.core import types as coltypes
from coordinator.core.commands import Command
from coordinator.core.errors import InvalidArgument
from coordinator.core.schema import Column, Table
from coordinator.core.state import Group0State

from . import ast

T = TypeVar("T")


class Group0Client(Protocol):
    """What the statement layer needs of group0: read the applied state, catch up, propose commands."""

    def read(self, fn: Callable[[Group0State], T]) -> T: ...

    def barrier(self, timeout: float = ...) -> int: ...

    def propose(self, command: Command, timeout: float = ...) -> object: ...


class Catalog:
    """Looks tables and views up in the applied schema, catching up with Raft once before a NOT_FOUND."""

    def __init__(self, group0: Group0Client):
        self._group0 = group0

    def read(self, fn: Callable[[Group0State], T]) -> T:
        return self._group0.read(fn)

    def catch_up(self) -> None:
        """Apply every schema change group0 committed before now (a Raft read barrier)."""
        self._group0.barrier()

    def resolve(self, name: ast.QualifiedName) -> Table:
        """The table or view named; on a miss, wait for this node to catch up with Raft and look again."""
        keyspace = keyspace_of(name)
        found = self._group0.read(lambda s: s.find_table(keyspace, name.name))
        if found is None:
            self._group0.barrier()
            return self._group0.read(lambda s: s.require_table(keyspace, name.name))
        return found

    def writable(self, name: ast.QualifiedName) -> Table:
        table = self.resolve(name)
        if table.view is not None:
            base = self._group0.read(lambda s: s.tables[table.view.base_id])
            raise InvalidArgument(f"{table.qualified_name} is a view: write to its base table {base.qualified_name}")
        return table


def keyspace_of(name: ast.QualifiedName) -> str:
    if name.keyspace is None:
        raise InvalidArgument(f"no keyspace given for {name.name!r}: write it as keyspace.{name.name}")
    return name.keyspace


def require_column(table: Table, column: str) -> Column:
    definition = table.column(column)
    if definition is None:
        raise InvalidArgument(f"unknown column {column!r} in {table.qualified_name}; its columns are "
                              f"{', '.join(c.name for c in table.columns)}")
    return definition


def coerce(table: Table, column: str, value: object) -> object:
    """`value` converted to the type of `column` of `table` (INVALID_ARGUMENT naming the column if it cannot be)."""
    return coltypes.coerce(require_column(table, column).type, value, column)
