"""CQL text -> cql.ast statements: the lark LALR parser, AST building and readable syntax errors."""

from __future__ import annotations

import math
from collections.abc import Mapping
import re
from types import MappingProxyType
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, NoReturn

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternStr

from coordinator.core.errors import InvalidArgument

from .limits import MAX_LIMIT

from .ast import (
    AGGREGATE_FUNCTIONS,
    PERMISSIONS,
    SelectAggregate,
    AlterKeyspace,
    AlterRole,
    AlterTable,
    Batch,
    BindMarker,
    ColumnDef,
    CreateIndex,
    CreateKeyspace,
    CreateRole,
    CreateTable,
    CreateView,
    Delete,
    DropIndex,
    DropKeyspace,
    Use,
    Describe,
    DropRole,
    DropTable,
    DropView,
    Grant,
    Insert,
    ListPermissions,
    ListRoles,
    QualifiedName,
    Relation,
    Revoke,
    RoleResource,
    Select,
    Statement,
    Update,
)

__all__ = ["CqlSyntaxError", "parse", "ALLOWED_TYPES"]


class CqlSyntaxError(InvalidArgument, ValueError):
    """A statement that cannot be parsed; ``str(err)`` is a human-readable message.

    ``line``/``column`` (1-based) locate the problem when known; ``reason`` is the
    message without the position prefix. As an InvalidArgument, it reaches the client as
    INVALID_ARGUMENT with the message ``syntax error: <str(err)>``.
    """

    def __init__(self, reason: str, line: int | None = None, column: int | None = None) -> None:
        self.reason = reason
        self.line = line
        self.column = column
        located = reason if line is None else f"line {line}:{column}: {reason}"
        super().__init__(located)
        self.message = f"syntax error: {located}"

    def __str__(self) -> str:
        return self.args[0]


# Column types accepted by CREATE TABLE, mapped to their canonical name.
_TYPE_ALIASES = {
    "int": "int",
    "bigint": "bigint",
    "text": "text",
    "varchar": "text",
    "boolean": "boolean",
    "double": "double",
    "timestamp": "timestamp",
}
ALLOWED_TYPES = ("int", "bigint", "text", "boolean", "double", "timestamp")

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# --------------------------------------------------------------------------
# Internal building blocks (never escape this module).


@dataclass(frozen=True, slots=True)
class _At:
    """A value plus the source position it came from, for error messages."""

    value: Any
    line: int
    column: int


@dataclass(frozen=True, slots=True)
class _ColumnSpec:
    name: _At
    type: str
    inline_pk: _At | None


@dataclass(frozen=True, slots=True)
class _PrimaryKey:
    partition: tuple[_At, ...]
    clustering: tuple[_At, ...]
    line: int
    column: int


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_STAR = _Marker("*")


@dataclass(frozen=True)
class _TableOptions:
    """A CREATE TABLE's or view's WITH options: (name, value) properties, and lists of (column, ASC|DESC)."""

    items: list


# Cassandra's and ScyllaDB's table options: accepted so their schemas run here, and without effect (the storage is this
# cluster's own), but for the two that would change what a table holds.
TABLE_PROPERTIES = frozenset({
    "additional_write_policy", "bloom_filter_fp_chance", "caching", "cdc", "comment", "compaction", "compression",
    "crc_check_chance", "dclocal_read_repair_chance", "default_time_to_live", "extensions", "gc_grace_seconds",
    "max_index_interval", "memtable_flush_period_in_ms", "min_index_interval", "paxos_grace_seconds", "read_repair",
    "read_repair_chance", "speculative_retry", "tombstone_gc"})


def _check_table_options(options: _TableOptions | None, clustering: tuple[str, ...], where: str) -> None:
    seen: set[str] = set()
    for item in options.items if options is not None else ():
        if isinstance(item, list):
            _check_clustering_order(item, clustering, where)
            continue
        name, value = item
        if name.value in seen:
            _fail(f"option {name.value!r} is given more than once", name)
        seen.add(name.value)
        if name.value not in TABLE_PROPERTIES:
            _fail(f"unknown option {name.value!r} of {where}; known: {', '.join(sorted(TABLE_PROPERTIES))}", name)
        if name.value == "default_time_to_live" and value not in (0, "0"):
            _fail("default_time_to_live can only be 0: rows do not expire here", name)
        if name.value == "cdc" and value not in (False, "false"):
            _fail("cdc can only be false: change data capture is not served", name)


def _check_clustering_order(order: list, clustering: tuple[str, ...], where: str) -> None:
    named = tuple(column.value for column, _ in order)
    if named != clustering[:len(named)] or not named:
        _fail(f"CLUSTERING ORDER BY must name the clustering columns in order ({', '.join(clustering) or 'none'}) "
              f"in {where}", order[0][0])
    for column, direction in order:
        if direction != "ASC":
            _fail(f"descending clustering order is not supported: the rows of a partition are kept in ascending "
                  f"order of {', '.join(clustering)}", column)


class _Aggregates:
    """The aggregates of a SELECT list (then it selects no plain column)."""

    __slots__ = ("items",)

    def __init__(self, items: tuple) -> None:
        self.items = items


def _fail(reason: str, at: Any = None) -> NoReturn:
    if at is None:
        raise CqlSyntaxError(reason)
    raise CqlSyntaxError(reason, at.line, at.column)


def _no_bind_marker(lit: _At, clause: str) -> None:
    if isinstance(lit.value, BindMarker):
        _fail(f"{clause} takes a literal value, not a bind marker (?)", lit)


def _present(children: Iterable[Any]) -> list[Any]:
    """Drop kept punctuation/keyword tokens and absent-optional placeholders."""
    return [c for c in children if c is not None and not isinstance(c, Token)]


def _first_token(children: Iterable[Any]) -> Token:
    return next(c for c in children if isinstance(c, Token))


def _check_unique(names: Iterable[_At], what: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n.value in seen:
            _fail(f"duplicate column {n.value!r}: it appears more than once in {what}", n)
        seen.add(n.value)


def _values(ats: Iterable[_At]) -> tuple[Any, ...]:
    return tuple(a.value for a in ats)


def _column_type(name: _At, type_tok: Any) -> str:
    """The canonical type named by `type_tok` for column `name` (a CqlSyntaxError naming the allowed types)."""
    canonical = _TYPE_ALIASES.get(type_tok.value.lower())
    if canonical is None:
        _fail(
            f"unknown type {type_tok.value!r} for column {name.value!r}; allowed types are "
            + ", ".join(ALLOWED_TYPES)
            + " (varchar is accepted as text)",
            type_tok,
        )
    return canonical


def _qual(at: _At) -> QualifiedName:
    return at.value


def _key_parts(pk: _PrimaryKey) -> tuple[tuple[str, ...], tuple[str, ...]]:
    _check_unique(pk.partition + pk.clustering, "PRIMARY KEY")
    return _values(pk.partition), _values(pk.clustering)


_ROLE_OPTIONS = ("password", "login", "superuser")


def _role_option_value(name: str, lit: _At) -> Any:
    """The value of role option `name`; errors never show it (it may be a password)."""
    if name == "password":
        if isinstance(lit.value, BindMarker):
            _fail("PASSWORD takes a 'string' literal, not a bind marker (?)", lit)
        if type(lit.value) is not str:
            _fail("PASSWORD takes a 'string' literal", lit)
    elif type(lit.value) is not bool:
        _fail(f"{name.upper()} takes true or false", lit)
    return lit.value


def _role_options(opts: Iterable[tuple[_At, _At]]) -> dict[str, Any]:
    """The role options given, by lower-case name (a CqlSyntaxError for an unknown or repeated one)."""
    found: dict[str, Any] = {}
    for name, lit in opts:
        if name.value not in _ROLE_OPTIONS:
            _fail(f"unknown role option {name.value!r}; expected PASSWORD, LOGIN or SUPERUSER", name)
        if name.value in found:
            _fail(f"{name.value.upper()} is given more than once", name)
        found[name.value] = _role_option_value(name.value, lit)
    return found


class _Builder(Transformer):
    """Embedded LALR callbacks building the AST bottom-up.

    Stateless (no attributes are written), so one shared instance is safe to
    use from many threads at once.
    """

    # ---------------------------------------------------------------- atoms
    def ident(self, c: list[Any]) -> _At:
        tok: Token = c[0]
        if tok.type == "NAME":
            name = tok.value.lower()
        else:
            name = tok.value[1:-1].replace('""', '"')
        return _At(name, tok.line, tok.column)

    def qualified_name(self, c: list[Any]) -> _At:
        first, second = c
        if second is None:
            qn = QualifiedName(None, first.value)
        else:
            qn = QualifiedName(first.value, second.value)
        return _At(qn, first.line, first.column)

    def literal(self, c: list[Any]) -> _At:
        tok: Token = c[0]
        kind, text = tok.type, tok.value
        value: Any
        if kind == "INT":
            value = int(text)
        elif kind == "FLOAT":
            value = float(text)
        elif kind == "NAN":
            value = math.nan
        elif kind == "INFINITY":
            value = -math.inf if text.startswith("-") else math.inf
        elif kind == "STRING":
            value = text[1:-1].replace("''", "'")
        elif kind == "TRUE":
            value = True
        elif kind == "FALSE":
            value = False
        elif kind == "BIND":
            value = BindMarker(tok.start_pos)
        else:  # NULL
            value = None
        return _At(value, tok.line, tok.column)

    def if_not_exists(self, c: list[Any]) -> bool:
        return True

    def if_exists(self, c: list[Any]) -> bool:
        return True

    def unlogged(self, c: list[Any]) -> bool:
        return True

    # ------------------------------------------------------------ keyspaces
    def map_entry(self, c: list[Any]) -> tuple[_At, _At]:
        tok, value = c
        return _At(tok.value[1:-1].replace("''", "'"), tok.line, tok.column), value

    def map_literal(self, c: list[Any]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in _present(c):
            if key.value in result:
                _fail(f"duplicate key {key.value!r} in map", key)
            result[key.value] = value.value
        return MappingProxyType(result)  # read-only: parsed statements are cached and shared

    def ks_option(self, c: list[Any]) -> tuple[_At, dict[str, Any]]:
        return c[0], c[1]

    @staticmethod
    def _ks_options(opts: list[tuple[_At, dict[str, Any]]], allowed: tuple[str, ...], stmt: str) -> dict[str, dict]:
        found: dict[str, dict] = {}
        for name, value in opts:
            if name.value not in allowed:
                _fail(
                    f"unknown {stmt} option {name.value!r}; expected "
                    + " or ".join(allowed),
                    name,
                )
            if name.value in found:
                _fail(f"option {name.value!r} given more than once", name)
            if (name.value == "durable_writes") != (not isinstance(value, Mapping)):
                _fail(f"option {name.value!r} " + ("can only be true: every write is durable"
                                                   if name.value == "durable_writes" else "takes a map {...}"), name)
            found[name.value] = value
        found.pop("durable_writes", None)
        return found

    def create_keyspace(self, c: list[Any]) -> CreateKeyspace:
        ine, name, *opts = c
        found = self._ks_options(opts, ("replication", "tablets", "durable_writes"), "keyspace")
        if "replication" not in found:
            _fail(
                f"CREATE KEYSPACE {name.value} needs a replication option, "
                "e.g. WITH replication = {'rf': 3}",
                name,
            )
        return CreateKeyspace(
            name=name.value,
            replication=found["replication"],
            tablets=found.get("tablets", MappingProxyType({})),
            if_not_exists=bool(ine),
        )

    def alter_keyspace(self, c: list[Any]) -> AlterKeyspace:
        name, *opts = c
        found = self._ks_options(opts, ("replication", "durable_writes"), "ALTER KEYSPACE")
        return AlterKeyspace(name=name.value, replication=found["replication"])

    # --------------------------------------------------------------- tables
    def column_def(self, c: list[Any]) -> _ColumnSpec:
        name, type_tok, inline = c
        return _ColumnSpec(name, _column_type(name, type_tok), inline)

    def added_column(self, c: list[Any]) -> _ColumnSpec:
        name, type_tok = c
        return _ColumnSpec(name, _column_type(name, type_tok), None)

    def alter_table(self, c: list[Any]) -> AlterTable:
        table, *added = c
        _check_unique((col.name for col in added), f"ALTER TABLE {table.value}")
        return AlterTable(table=_qual(table),
                          add=tuple(ColumnDef(col.name.value, col.type) for col in added))

    def primary_key(self, c: list[Any]) -> _At:
        tok = _first_token(c)
        return _At("PRIMARY KEY", tok.line, tok.column)

    def partition_key(self, c: list[Any]) -> tuple[_At, ...]:
        return tuple(_present(c))

    def primary_key_clause(self, c: list[Any]) -> _PrimaryKey:
        at, partition, *clustering = _present(c)
        return _PrimaryKey(partition, tuple(clustering), at.line, at.column)

    def table_property(self, c: list[Any]) -> tuple[Token, Any]:
        return c[0], c[1].value if isinstance(c[1], _At) else c[1]

    def clustering_order_option(self, c: list[Any]) -> list[tuple[Token, str]]:
        return c

    def clustering_order(self, c: list[Any]) -> tuple[Token, str]:
        return c[0], (c[1].value.upper() if c[1] is not None else "ASC")

    def table_options(self, c: list[Any]) -> _TableOptions:
        return _TableOptions(c)

    def create_table(self, c: list[Any]) -> CreateTable:
        ine, table, *elements, options = c
        cols = [e for e in elements if isinstance(e, _ColumnSpec)]
        pk_clauses = [e for e in elements if isinstance(e, _PrimaryKey)]
        inline = [col for col in cols if col.inline_pk is not None]
        where = f"CREATE TABLE {table.value}"

        if not cols:
            _fail(f"{where} defines no columns", table)
        _check_unique((col.name for col in cols), where)
        if len(pk_clauses) > 1:
            _fail("PRIMARY KEY is given more than once; use a single PRIMARY KEY (...) clause", pk_clauses[1])
        if len(inline) > 1:
            _fail(
                f"columns {inline[0].name.value!r} and {inline[1].name.value!r} are both marked "
                "PRIMARY KEY; for a compound key write a separate PRIMARY KEY (a, b, ...) clause",
                inline[1].inline_pk,
            )
        if inline and pk_clauses:
            _fail(
                f"column {inline[0].name.value!r} is marked PRIMARY KEY and there is also a separate "
                "PRIMARY KEY (...) clause; use only one of the two",
                pk_clauses[0],
            )
        if inline:
            partition, clustering = (inline[0].name.value,), ()
        elif pk_clauses:
            pk = pk_clauses[0]
            partition, clustering = _key_parts(pk)
            defined = {col.name.value for col in cols}
            for part in pk.partition + pk.clustering:
                if part.value not in defined:
                    _fail(f"PRIMARY KEY column {part.value!r} is not defined in {where}", part)
        else:
            _fail(
                f"{where} has no PRIMARY KEY; add PRIMARY KEY (col, ...) or declare "
                "a column as 'name type PRIMARY KEY'",
                table,
            )
        _check_table_options(options, clustering, where)
        return CreateTable(
            table=_qual(table),
            columns=tuple(ColumnDef(col.name.value, col.type) for col in cols),
            partition_key=partition,
            clustering_key=clustering,
            if_not_exists=bool(ine),
        )

    # ---------------------------------------------------------------- views
    def star(self, c: list[Any]) -> _Marker:
        return _STAR

    def function_name(self, c: list[Any]) -> _At:
        item = c[0]
        return _At(item.value.lower(), item.line, item.column)

    def aggregate_argument(self, c: list[Any]) -> _At:
        item = c[0]
        if isinstance(item, Token):
            return _At(None if item.value == "*" else item.value, item.line, item.column)
        return item

    def aggregate_call(self, c: list[Any]) -> SelectAggregate:
        name, argument = c
        if name.value not in AGGREGATE_FUNCTIONS:
            _fail(f"unknown function {name.value!r}; the aggregates are {', '.join(AGGREGATE_FUNCTIONS)}", name)
        if name.value == "count" and (argument.value is None or argument.value == "1"):
            return SelectAggregate("count")
        if argument.value is None or argument.value.lstrip("-").isdigit():
            _fail(f"{name.value}() takes a column name", argument)
        return SelectAggregate(name.value, argument.value)

    def column_list(self, c: list[Any]) -> list[_At]:
        return _present(c)

    def select_column(self, c: list[Any]) -> str:
        item = c[0]
        return item.value.lower() if isinstance(item, Token) else item.value

    def select_column_list(self, c: list[Any]) -> tuple[str, ...] | _Aggregates:
        aggregates = tuple(x for x in c if isinstance(x, SelectAggregate))
        if not aggregates:
            return tuple(x for x in c if isinstance(x, str))
        if len(aggregates) != len(c):
            _fail("a SELECT list cannot mix aggregates with plain columns (there is no GROUP BY); select either")
        return _Aggregates(aggregates)

    def create_view(self, c: list[Any]) -> CreateView:
        ine, view, columns, base, where, pk, options = c
        if columns is _STAR:
            cols = None
        else:
            _check_unique(columns, "the SELECT list")
            cols = _values(columns)
        partition, clustering = _key_parts(pk)
        _check_table_options(options, clustering, f"CREATE MATERIALIZED VIEW {view.value}")
        return CreateView(
            view=_qual(view),
            base=_qual(base),
            columns=cols,
            where=where or (),
            partition_key=partition,
            clustering_key=clustering,
            if_not_exists=bool(ine),
        )

    def create_index(self, c: list[Any]) -> CreateIndex:
        ine, name, table, column = c
        return CreateIndex(
            name=None if name is None else name.value,
            table=_qual(table),
            column=column.value,
            if_not_exists=bool(ine),
        )

    # ------------------------------------------------------------------ DML
    def value_list(self, c: list[Any]) -> _At:
        values = _present(c)
        return _At(values, values[0].line, values[0].column)

    def using_timestamp(self, c: list[Any]) -> int:
        (lit,) = _present(c)
        _no_bind_marker(lit, "USING TIMESTAMP")
        if type(lit.value) is not int:
            _fail(f"USING TIMESTAMP needs an integer (microseconds), got {lit.value!r}", lit)
        if not _INT64_MIN <= lit.value <= _INT64_MAX:
            _fail(f"USING TIMESTAMP {lit.value} is out of the 64-bit integer range", lit)
        return lit.value

    def insert(self, c: list[Any]) -> Insert:
        table, *columns, values, ts = c
        _check_unique(columns, "the INSERT column list")
        if len(columns) != len(values.value):
            _fail(
                f"INSERT lists {len(columns)} column(s) but {len(values.value)} value(s); "
                "give exactly one value per column",
                values,
            )
        return Insert(
            table=_qual(table),
            columns=_values(columns),
            values=_values(values.value),
            timestamp=ts,
        )

    def assignment(self, c: list[Any]) -> tuple[_At, _At]:
        return c[0], c[1]

    def update(self, c: list[Any]) -> Update:
        table, ts, *assignments, where = c
        _check_unique((col for col, _ in assignments), "SET")
        return Update(
            table=_qual(table),
            assignments=tuple((col.value, val.value) for col, val in assignments),
            where=where,
            timestamp=ts,
        )

    def delete(self, c: list[Any]) -> Delete:
        table, ts, where = c
        return Delete(table=_qual(table), where=where, timestamp=ts)

    def limit_clause(self, c: list[Any]) -> int:
        (lit,) = _present(c)
        _no_bind_marker(lit, "LIMIT")
        if type(lit.value) is not int or not 0 < lit.value <= MAX_LIMIT:
            _fail(f"LIMIT must be an integer between 1 and {MAX_LIMIT}, got {lit.value!r}", lit)
        return lit.value

    def allow_filtering(self, c: list[Any]) -> _At:
        tok = _first_token(c)
        return _At("ALLOW FILTERING", tok.line, tok.column)

    def allow_stale(self, c: list[Any]) -> _At:
        tok = _first_token(c)
        return _At("ALLOW STALE", tok.line, tok.column)

    def select(self, c: list[Any]) -> Select:
        columns, table, where, limit, *allows = c
        seen: set[str] = set()
        for allow in allows:
            if allow.value in seen:
                _fail(f"{allow.value} is given more than once", allow)
            seen.add(allow.value)
        return Select(
            table=_qual(table),
            columns=None if isinstance(columns, (_Marker, _Aggregates)) else columns,
            aggregates=columns.items if isinstance(columns, _Aggregates) else (),
            where=where or (),
            limit=limit,
            allow_filtering="ALLOW FILTERING" in seen,
            allow_stale="ALLOW STALE" in seen,
        )

    # ---------------------------------------------------------------- drops
    def drop_keyspace(self, c: list[Any]) -> DropKeyspace:
        return DropKeyspace(name=c[1].value, if_exists=bool(c[0]))

    def use(self, c: list[Any]) -> Use:
        return Use(keyspace=c[0].value)

    def describe(self, c: list[Any]) -> Describe:
        return c[0]

    def describe_keyspace(self, c: list[Any]) -> Describe:
        return Describe("keyspace", keyspace=c[0].value if c[0] is not None else None)

    def drop_table(self, c: list[Any]) -> DropTable:
        return DropTable(table=_qual(c[1]), if_exists=bool(c[0]))

    def drop_view(self, c: list[Any]) -> DropView:
        return DropView(view=_qual(c[1]), if_exists=bool(c[0]))

    def drop_index(self, c: list[Any]) -> DropIndex:
        return DropIndex(index=_qual(c[1]), if_exists=bool(c[0]))

    # -------------------------------------------------------------- batches
    def batch(self, c: list[Any]) -> Batch:
        # Inner USING TIMESTAMPs are kept as written (None when absent); how they
        # combine with the batch's own timestamp is the executor's decision.
        _unlogged, ts, *statements = c
        return Batch(statements=tuple(statements), timestamp=ts)

    # ------------------------------------------------ roles and permissions
    def role_name(self, c: list[Any]) -> _At:
        item = c[0]
        if isinstance(item, Token):
            return _At(item.value[1:-1].replace("''", "'"), item.line, item.column)
        return item

    def role_option(self, c: list[Any]) -> tuple[_At, _At]:
        return c[0], c[1]

    def create_role(self, c: list[Any]) -> CreateRole:
        ine, name, *opts = c
        found = _role_options(o for o in opts if o is not None)
        return CreateRole(
            name=name.value,
            password=found.get("password"),
            login=found.get("login"),
            superuser=found.get("superuser"),
            if_not_exists=bool(ine),
        )

    def alter_role(self, c: list[Any]) -> AlterRole:
        name, *opts = c
        found = _role_options(opts)
        return AlterRole(
            name=name.value,
            password=found.get("password"),
            login=found.get("login"),
            superuser=found.get("superuser"),
        )

    def drop_role(self, c: list[Any]) -> DropRole:
        return DropRole(name=c[1].value, if_exists=bool(c[0]))

    def permission(self, c: list[Any]) -> tuple[str, ...]:
        kind = _first_token(c).type[1:]
        return PERMISSIONS if kind == "ALL" else (kind,)

    def all_keyspaces(self, c: list[Any]) -> RoleResource:
        return RoleResource()

    def keyspace_resource(self, c: list[Any]) -> RoleResource:
        return RoleResource(keyspace=c[0].value)

    def table_resource(self, c: list[Any]) -> RoleResource:
        (table,) = c
        if table.value.keyspace is None:
            _fail(
                f"table {table.value.name!r} needs its keyspace here: write keyspace.table "
                "(or KEYSPACE name for a whole keyspace)",
                table,
            )
        return RoleResource(keyspace=table.value.keyspace, table=table.value.name)

    def grant(self, c: list[Any]) -> Grant:
        permissions, resource, role = c
        return Grant(permissions=permissions, resource=resource, role=role.value)

    def revoke(self, c: list[Any]) -> Revoke:
        permissions, resource, role = c
        return Revoke(permissions=permissions, resource=resource, role=role.value)

    def list_roles(self, c: list[Any]) -> ListRoles:
        return ListRoles()

    def list_permissions(self, c: list[Any]) -> ListPermissions:
        permissions, resource, role = c
        return ListPermissions(permissions=permissions, resource=resource, role=None if role is None else role.value)

    # ---------------------------------------------------------------- WHERE
    def where_clause(self, c: list[Any]) -> tuple[Relation, ...]:
        return tuple(c)

    def comparison(self, c: list[Any]) -> str:
        return c[0].value

    def rel_compare(self, c: list[Any]) -> Relation:
        column, op, lit = c
        return Relation(column.value, op, lit.value)

    def rel_in(self, c: list[Any]) -> Relation:
        column, *lits = _present(c)
        return Relation(column.value, "IN", _values(lits))

    def rel_not_null(self, c: list[Any]) -> Relation:
        return Relation(c[0].value, "IS NOT NULL", None)

    # ----------------------------------------------------------------- root
    def start(self, c: list[Any]) -> Statement:
        stmt = _present(c)
        if not stmt:
            _fail(
                "empty statement; expected a CQL statement such as SELECT, INSERT, UPDATE, "
                "DELETE, CREATE, ALTER, DROP or BEGIN BATCH"
            )
        return stmt[0]


# --------------------------------------------------------------------------
# Parser construction (once, at import) and error translation.

_GRAMMAR = Path(__file__).with_name("grammar.lark").read_text(encoding="utf-8")

for _kind in ("keyspaces", "tables", "cluster", "schema", "types", "functions", "aggregates"):
    setattr(_Builder, f"describe_{_kind}", lambda self, c, kind=_kind: Describe(kind))
for _kind in ("table", "index", "view", "any"):  # DESCRIBE TABLE ks.t, ..., DESCRIBE name
    setattr(_Builder, f"describe_{_kind}", lambda self, c, kind=_kind: Describe(kind, name=_qual(c[0])))


_LARK = Lark(
    _GRAMMAR,
    parser="lalr",
    lexer="contextual",
    transformer=_Builder(),
    maybe_placeholders=True,
)


def _warm_up_lexers() -> None:
    """Build lark's lazily-compiled per-state scanners now, not racily on first use."""
    lexer = getattr(_LARK.parser, "lexer", None)
    per_state = getattr(lexer, "lexers", {})
    for sub in [*per_state.values(), getattr(lexer, "root_lexer", None)]:
        if sub is not None and hasattr(sub, "scanner"):
            sub.scanner  # noqa: B018 - property access compiles the scanner


_warm_up_lexers()

_IGNORED = frozenset({"WS", "COMMENT"})
_LITERAL_TERMINALS = frozenset({"INT", "FLOAT", "NAN", "INFINITY", "STRING", "TRUE", "FALSE", "NULL", "BIND"})
_WORDS = {
    "NAME": "an identifier",
    "QUOTED_NAME": "an identifier",
    "INT": "an integer",
    "FLOAT": "a number",
    "NAN": "NaN",
    "INFINITY": "Infinity",
    "STRING": "a 'string'",
    "TRUE": "true",
    "FALSE": "false",
    "NULL": "NULL",
    "BIND": "?",
    "$END": "end of input",
}
_ANY_LITERAL = "a literal value (number, 'string', true, false, null or a ? bind marker)"


def _describe(name: str) -> tuple[int, str]:
    """(sort group, plain words) for a terminal name."""
    if name == "$END":
        return 4, _WORDS[name]
    if name in _WORDS:
        return 0, _WORDS[name]
    if name.startswith("_") and name[1:].isalpha():
        return 1, name[1:]  # keyword
    try:
        pattern = _LARK.get_terminal(name).pattern
    except KeyError:
        return 3, name
    if isinstance(pattern, PatternStr):
        return 2, repr(pattern.value)
    return 3, name


def _expected_words(names: Iterable[str]) -> str:
    names = set(names) - _IGNORED
    if {"_CREATE", "_SELECT"} <= names:
        # Start of input: an optional ';' or the end are not useful suggestions.
        names -= {"$END", "SEMICOLON"}
    described: set[tuple[int, str]] = set()
    if _LITERAL_TERMINALS <= names:
        names -= _LITERAL_TERMINALS
        described.add((0, _ANY_LITERAL))
    described.update(_describe(n) for n in names)
    words = [w for _, w in sorted(described)]
    if not words:
        return ""
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


_ROLE_STATEMENT = re.compile(r"\s*(?:create|alter)\s+role\b", re.IGNORECASE)
_QUOTED = re.compile(r"'(?:[^']|'')*'?|\"(?:[^\"]|\"\")*\"?")
_AFTER_PASSWORD = re.compile(r"password\"?\s*=?\s*$", re.IGNORECASE)
_HIDDEN = "input (not shown: it may be a password)"
_HIDDEN_CHARACTER = "character (not shown: it may be part of a password)"


def _secret(text: str) -> bool:
    """Whether `text` may hold a password, so that error messages must not show what it quotes."""
    return _ROLE_STATEMENT.match(text) is not None or "password" in text.lower()


def _masked(text: str) -> str:
    """`text` with every quoted string or name replaced by '***' (or "***")."""
    return _QUOTED.sub(lambda m: m.group()[0] + "***" + m.group()[0], text)


def _near_password(text: str, pos: int) -> bool:
    """Whether what starts at `pos` may be (part of) a password: it follows PASSWORD or is glued to a token."""
    before = text[:pos]
    glued = before[-1:] not in ("", "=", ",", ";", "(", ")") and not before[-1:].isspace()
    return glued or _AFTER_PASSWORD.search(before) is not None


def _shown(text: str, secret: bool = False) -> str:
    if secret:
        text = _masked(text)
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _acceptable(err: UnexpectedInput, text: str, fallback: Iterable[str] | None) -> set[str]:
    """Terminals that really can come next at the point of the error.

    LALR lookahead sets are merged across contexts and the parser may already
    have reduced on a bad token, so the raw set lark reports can be wrong. We
    replay the input up to (not including) the offending token and ask the
    parser what it accepts there. Error path only, so the cost is irrelevant.
    """
    tok = getattr(err, "token", None)
    stop = None if tok is None or tok.type == "$END" else tok.start_pos
    try:
        replay = _LARK.parse_interactive(text)
        try:
            for token in replay.iter_parse():
                if stop is not None and token.start_pos >= stop:
                    break
        except UnexpectedInput:
            pass  # the lexer stopped at the error position; the state is intact
        return set(replay.accepts())
    except Exception:  # e.g. a structural CqlSyntaxError during replay
        pass
    interactive = getattr(err, "interactive_parser", None)
    if interactive is not None:
        try:
            return set(interactive.accepts())
        except Exception:  # pragma: no cover - defensive
            pass
    return set(fallback or ())


def _translate(err: UnexpectedInput, text: str) -> CqlSyntaxError:
    """The readable error for `err`; in a statement that may hold a password, quoted text shows as '***'
    and what may be (part of) the password itself is not shown."""
    secret = _secret(text)
    if isinstance(err, UnexpectedToken):
        tok = err.token
        accepted = _acceptable(err, text, err.expected)
        expected = _expected_words(accepted)
        if tok.type == "$END":
            line = tok.end_line or tok.line or 1
            column = tok.end_column or tok.column or 1
            reason = "unexpected end of input"
        else:
            line, column = tok.line, tok.column
            hidden = secret and _near_password(text, tok.start_pos)
            reason = f"unexpected {_HIDDEN if hidden else _shown(tok.value, secret)}"
        if expected:
            reason += f"; expected {expected}"
        if tok.type == "QUOTED_NAME" and _LITERAL_TERMINALS & accepted:
            reason += " (string literals use single quotes: 'text')"
        return CqlSyntaxError(reason, line, column)
    if isinstance(err, UnexpectedCharacters):
        hidden = secret and _near_password(text, err.pos_in_stream)
        reason = f"unexpected {_HIDDEN_CHARACTER if hidden else f'character {err.char!r}'}"
        if err.char == "'":
            reason = "unterminated string literal (close it with '; write '' for a quote inside)"
        elif err.char == '"':
            reason = 'unterminated or empty quoted identifier (close it with "; write "" for a quote inside)'
        else:
            expected = _expected_words(_acceptable(err, text, err.allowed))
            if expected:
                reason += f"; expected {expected}"
        return CqlSyntaxError(reason, err.line, err.column)
    if isinstance(err, UnexpectedEOF):  # not raised by LALR, kept for safety
        return CqlSyntaxError("unexpected end of input; expected " + _expected_words(err.expected))
    return CqlSyntaxError(str(err))


def parse(text: str) -> Statement:
    """Parse one CQL statement (optional trailing ';') into an AST node.

    Raises CqlSyntaxError (a ValueError) with a ``line L:C: ...`` message when the
    text is not a valid statement. Thread-safe.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse() expects str, got {type(text).__name__}")
    try:
        return _LARK.parse(text)
    except UnexpectedInput as err:
        raise _translate(err, text) from None
