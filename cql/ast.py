"""Immutable AST node classes produced by the CQL parser (standard library only)."""

from __future__ import annotations

from dataclasses import dataclass, field



@dataclass(frozen=True)
class BindMarker:
    """A `?` in the statement text, replaced by a bound value before execution; `position` orders markers."""

    position: int


Literal = int | float | str | bool | None | BindMarker

__all__ = [
    "Literal",
    "BindMarker",
    "QualifiedName",
    "ColumnDef",
    "Relation",
    "CreateKeyspace",
    "AlterKeyspace",
    "CreateTable",
    "AlterTable",
    "CreateView",
    "CreateIndex",
    "Insert",
    "Update",
    "Delete",
    "Select",
    "Batch",
    "DropKeyspace",
    "Use",
    "Describe",
    "DropTable",
    "DropView",
    "DropIndex",
    "PERMISSIONS",
    "RoleResource",
    "CreateRole",
    "AlterRole",
    "DropRole",
    "Grant",
    "Revoke",
    "ListRoles",
    "ListPermissions",
    "Statement",
]


@dataclass(frozen=True)
class QualifiedName:
    """A possibly keyspace-qualified object name; ``keyspace`` is None when bare."""

    keyspace: str | None
    name: str

    def __str__(self) -> str:
        return self.name if self.keyspace is None else f"{self.keyspace}.{self.name}"


@dataclass(frozen=True)
class ColumnDef:
    """A column in CREATE TABLE; ``type`` is normalised (e.g. varchar -> text)."""

    name: str
    type: str


@dataclass(frozen=True)
class Relation:
    """One WHERE restriction.

    ``op`` is one of '=', '!=', '<', '<=', '>', '>=', 'IN' (``value`` is a tuple)
    or 'IS NOT NULL' (``value`` is None).
    """

    column: str
    op: str
    value: Literal | tuple[Literal, ...] | None


@dataclass(frozen=True)
class CreateKeyspace:
    name: str
    replication: dict
    tablets: dict
    if_not_exists: bool


@dataclass(frozen=True)
class AlterKeyspace:
    name: str
    replication: dict


@dataclass(frozen=True)
class CreateTable:
    table: QualifiedName
    columns: tuple[ColumnDef, ...]
    partition_key: tuple[str, ...]
    clustering_key: tuple[str, ...]
    if_not_exists: bool


@dataclass(frozen=True)
class CreateView:
    """CREATE MATERIALIZED VIEW; ``columns`` is None for ``SELECT *``."""

    view: QualifiedName
    base: QualifiedName
    columns: tuple[str, ...] | None
    where: tuple[Relation, ...]
    partition_key: tuple[str, ...]
    clustering_key: tuple[str, ...]
    if_not_exists: bool


@dataclass(frozen=True)
class CreateIndex:
    name: str | None
    table: QualifiedName
    column: str
    if_not_exists: bool


@dataclass(frozen=True)
class Insert:
    table: QualifiedName
    columns: tuple[str, ...]
    values: tuple[Literal, ...]
    timestamp: int | None


@dataclass(frozen=True)
class Update:
    table: QualifiedName
    assignments: tuple[tuple[str, Literal], ...]
    where: tuple[Relation, ...]
    timestamp: int | None


@dataclass(frozen=True)
class Delete:
    table: QualifiedName
    where: tuple[Relation, ...]
    timestamp: int | None


AGGREGATE_FUNCTIONS = ("count", "min", "max", "sum", "avg")


@dataclass(frozen=True)
class SelectAggregate:
    """An aggregate in a SELECT list: ``function`` of AGGREGATE_FUNCTIONS; ``column`` None for COUNT(*)."""

    function: str
    column: str | None = None

    @property
    def name(self) -> str:
        """The result column's name, as Cassandra names it (``count``, ``max(v)``)."""
        return "count" if self.column is None else f"{self.function}({self.column})"


@dataclass(frozen=True)
class Select:
    """SELECT; ``columns`` is None for ``*`` or when ``aggregates`` (then one result row) are selected."""

    table: QualifiedName
    columns: tuple[str, ...] | None
    where: tuple[Relation, ...]
    limit: int | None
    allow_filtering: bool
    allow_stale: bool
    aggregates: tuple[SelectAggregate, ...] = ()

    @property
    def count(self) -> bool:
        """Whether this is SELECT COUNT(*) (and nothing else)."""
        return self.aggregates == (SelectAggregate("count"),)


@dataclass(frozen=True)
class Batch:
    statements: tuple[Insert | Update | Delete, ...]
    timestamp: int | None


@dataclass(frozen=True)
class Use:
    """USE: the keyspace of a connection's names written without one (CQL's native protocol)."""

    keyspace: str


@dataclass(frozen=True)
class Describe:
    """DESCRIBE: `kind` keyspaces, keyspace, tables, table, index, view, cluster, schema, types, functions,
    aggregates or any (a keyspace, table, index or view by name)."""

    kind: str
    keyspace: str | None = None
    name: QualifiedName | None = None


@dataclass(frozen=True)
class DropKeyspace:
    name: str
    if_exists: bool


@dataclass(frozen=True)
class AlterTable:
    """ALTER TABLE ... ADD: regular columns appended to a base table."""

    table: QualifiedName
    add: tuple[ColumnDef, ...]


@dataclass(frozen=True)
class DropTable:
    table: QualifiedName
    if_exists: bool


@dataclass(frozen=True)
class DropView:
    view: QualifiedName
    if_exists: bool


@dataclass(frozen=True)
class DropIndex:
    index: QualifiedName
    if_exists: bool


PERMISSIONS = ("SELECT", "MODIFY", "CREATE", "ALTER", "DROP")


@dataclass(frozen=True)
class RoleResource:
    """What a permission is granted on: every keyspace, one keyspace, or one table (or view)."""

    keyspace: str | None = None  # None: ALL KEYSPACES
    table: str | None = None  # None: the whole keyspace


@dataclass(frozen=True)
class CreateRole:
    """CREATE ROLE; an option not given is None. The password is left out of the repr."""

    name: str
    password: str | None = field(repr=False)
    login: bool | None
    superuser: bool | None
    if_not_exists: bool


@dataclass(frozen=True)
class AlterRole:
    """ALTER ROLE; an option not given (left unchanged) is None. The password is left out of the repr."""

    name: str
    password: str | None = field(repr=False)
    login: bool | None
    superuser: bool | None


@dataclass(frozen=True)
class DropRole:
    name: str
    if_exists: bool


@dataclass(frozen=True)
class Grant:
    """GRANT; ``permissions`` are names from PERMISSIONS (ALL gives all five, in that order)."""

    permissions: tuple[str, ...]
    resource: RoleResource
    role: str


@dataclass(frozen=True)
class Revoke:
    permissions: tuple[str, ...]
    resource: RoleResource
    role: str


@dataclass(frozen=True)
class ListRoles:
    pass


@dataclass(frozen=True)
class ListPermissions:
    """LIST permissions; ``resource`` None means on every resource, ``role`` None of every role."""

    permissions: tuple[str, ...]
    resource: RoleResource | None
    role: str | None


Statement = (
    CreateKeyspace
    | AlterKeyspace
    | CreateTable
    | AlterTable
    | CreateView
    | CreateIndex
    | Insert
    | Update
    | Delete
    | Select
    | Batch
    | DropKeyspace
    | Use
    | Describe
    | DropTable
    | DropView
    | DropIndex
    | CreateRole
    | AlterRole
    | DropRole
    | Grant
    | Revoke
    | ListRoles
    | ListPermissions
)
