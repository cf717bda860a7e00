"""Which permission on which resource a statement needs (Cassandra's rules), checked before it runs.

Reads need SELECT on the table (a view's or an index's base table: a view is read with its base's grants), writes
MODIFY on it; CREATE KEYSPACE needs CREATE on ALL KEYSPACES, CREATE TABLE CREATE on its keyspace; ALTER and DROP
of a keyspace or table need ALTER or DROP on it; creating or dropping a view or index needs ALTER on its base.
"""
from __future__ import annotations

from coordinator.core import auth
from coordinator.core.auth import ALL_KEYSPACES, Principal, Resource
from coordinator.core.errors import PermissionDenied

from . import ast
from .catalog import Catalog, keyspace_of
from .roles import ROLE_STATEMENTS


class StatementAuthorization:
    """Refuses a statement its principal lacks a permission for (PERMISSION_DENIED naming what is missing)."""

    def __init__(self, catalog: Catalog):
        self._catalog = catalog

    def check(self, principal: Principal, statement: ast.Statement) -> None:
        if principal.unrestricted:
            return
        for permission, resource in self._needs(statement):
            self._catalog.read(lambda state: auth.authorize(state, principal, permission, resource))

    def _needs(self, s: ast.Statement) -> list[tuple[str, Resource]]:
        if isinstance(s, (ast.Use, ast.Describe)):
            return []  # the schema is every login's to read, as in Cassandra
        if isinstance(s, ast.Select):
            return [("SELECT", self._base_of(s.table))]
        if isinstance(s, (ast.Insert, ast.Update, ast.Delete)):
            return [("MODIFY", _table(s.table))]
        if isinstance(s, ast.Batch):
            return [("MODIFY", _table(inner.table)) for inner in s.statements]
        if isinstance(s, ast.CreateKeyspace):
            return [("CREATE", ALL_KEYSPACES)]
        if isinstance(s, (ast.AlterKeyspace, ast.DropKeyspace)):
            return [(_verb(s), (s.name, None))]
        if isinstance(s, ast.CreateTable):
            return [("CREATE", (keyspace_of(s.table), None))]
        if isinstance(s, (ast.AlterTable, ast.DropTable)):
            return [(_verb(s), _table(s.table))]
        if isinstance(s, ast.CreateView):
            return [("ALTER", (keyspace_of(s.view), s.base.name))]
        if isinstance(s, ast.CreateIndex):
            return [("ALTER", _table(s.table))]
        if isinstance(s, ast.DropView):
            return [("ALTER", self._base_of(s.view, missing=(keyspace_of(s.view), None)))]
        if isinstance(s, ast.DropIndex):
            return [("ALTER", self._base_of(s.index, missing=(keyspace_of(s.index), None)))]
        if isinstance(s, ROLE_STATEMENTS):
            return []  # role statements check their own rules (cql.roles)
        raise PermissionDenied(f"{type(s).__name__} is not open to anyone but the cluster: no permission rule "
                               "names it")

    def _base_of(self, name: ast.QualifiedName, missing: Resource | None = None) -> Resource:
        """The table `name` reads from: itself, or a view's base table; `missing` (default: the name as a table)
        when no such table or view exists, after catching up with group0 once."""
        keyspace = keyspace_of(name)
        found = self._catalog.read(lambda state: _base_name(state, keyspace, name.name))
        if found is None:
            self._catalog.catch_up()
            found = self._catalog.read(lambda state: _base_name(state, keyspace, name.name))
        if found is None:
            return missing or (keyspace, name.name)
        return (keyspace, found)


def _base_name(state, keyspace: str, name: str) -> str | None:
    table = state.find_table(keyspace, name)
    if table is None or table.view is None:
        return None if table is None else table.name
    base = state.tables.get(table.view.base_id)
    return None if base is None else base.name


def _table(name: ast.QualifiedName) -> Resource:
    return (keyspace_of(name), name.name)


def _verb(statement: ast.Statement) -> str:
    return "DROP" if type(statement).__name__.startswith("Drop") else "ALTER"
