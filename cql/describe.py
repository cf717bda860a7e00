"""DESCRIBE, answered by the server as Cassandra 4 does (cqlsh sends it): names, or statements that make the schema again.

Pure: the applied `Group0State` in, rows of (keyspace_name, type, name, create_statement) out. The statements are in
this cluster's dialect, so the output of DESCRIBE KEYSPACE runs here as it is (a keyspace's tablets included).
"""
from __future__ import annotations

import math
import re

from coordinator.core.errors import InvalidArgument, NotFound
from coordinator.core.schema import Keyspace, Table
from coordinator.core.state import Group0State

from . import ast
from .result import Result

COLUMNS = [("keyspace_name", "text"), ("type", "text"), ("name", "text"), ("create_statement", "text")]
PARTITIONER = "vbc.TabletPartitioner"  # no driver knows it: token-aware routing stays off (tablets move)
_PLAIN_NAME = re.compile(r"[a-z][a-z0-9_]*")
_RESERVED = {"add", "allow", "alter", "and", "apply", "as", "batch", "begin", "by", "create", "delete", "desc",
             "describe", "drop", "from", "grant", "if", "in", "index", "insert", "into", "is", "key", "keyspace",
             "limit", "modify", "not", "null", "of", "on", "primary", "revoke", "select", "set", "table", "to",
             "update", "use", "using", "values", "view", "where", "with"}


def describe(state: Group0State, statement: ast.Describe, keyspace: str | None, cluster_name: str) -> Result:
    """The rows of `statement`; `keyspace` is the connection's (USE), for DESCRIBE KEYSPACE and TABLES without one."""
    if statement.kind == "cluster":
        return Result(columns=[("cluster", "text"), ("partitioner", "text"), ("snitch", "text")],
                      rows=[[cluster_name, PARTITIONER, "SimpleSnitch"]])
    return Result(columns=COLUMNS, rows=[list(row) for row in _rows(state, statement, keyspace)])


def _rows(state: Group0State, statement: ast.Describe, keyspace: str | None):
    kind = statement.kind
    if kind == "keyspaces":
        return [(k, "keyspace", k, "") for k in sorted(state.keyspaces)]
    if kind == "tables":
        chosen = [keyspace] if keyspace else sorted(state.keyspaces)
        return [(t.keyspace, "table", t.name, "") for t in _objects(state, chosen) if t.view is None]
    if kind in ("types", "functions", "aggregates"):
        return []
    if kind == "schema":
        return [row for name in sorted(state.keyspaces) for row in _keyspace_rows(state, name)]
    if kind == "keyspace":
        name = statement.keyspace or keyspace
        if name is None:
            raise InvalidArgument("DESCRIBE KEYSPACE needs a keyspace name, or one chosen by USE")
        return _keyspace_rows(state, name)
    return _object_rows(state, statement)


def _object_rows(state: Group0State, statement: ast.Describe):
    name = statement.name
    if statement.kind == "any" and name.name in state.keyspaces and (
            name.keyspace is None or state.find_table(name.keyspace, name.name) is None):
        return _keyspace_rows(state, name.name)  # a keyspace first, as Cassandra looks a bare name up
    if name.keyspace is None:
        raise InvalidArgument(f"no keyspace given for {name.name!r}: write it as keyspace.{name.name}, or USE one")
    table = state.find_table(name.keyspace, name.name)
    wanted = {"table": _is_table, "index": _is_index, "view": _is_view, "any": lambda t: True}[statement.kind]
    if table is None or not wanted(table):
        what = {"table": "table", "index": "index", "view": "materialized view", "any": "keyspace, table, index or "
                "materialized view"}[statement.kind]
        raise NotFound(f"no {what} {name}")
    if _is_table(table):
        return [_row(state, table)] + [_row(state, t) for t in _objects(state, [table.keyspace])
                                       if t.view is not None and t.view.base_id == table.id]
    return [_row(state, table)]


def _keyspace_rows(state: Group0State, name: str):
    keyspace = state.keyspaces.get(name)
    if keyspace is None:
        raise NotFound(f"keyspace {name} does not exist")
    tables = _objects(state, [name])
    ordered = [t for t in tables if _is_table(t)] + [t for t in tables if _is_index(t)] + [
        t for t in tables if _is_view(t)]
    return [(name, "keyspace", name, create_keyspace(keyspace))] + [_row(state, t) for t in ordered]


def _objects(state: Group0State, keyspaces: list[str]) -> list[Table]:
    return sorted((t for t in state.tables.values() if t.keyspace in keyspaces), key=lambda t: (t.keyspace, t.name))


def _row(state: Group0State, table: Table) -> tuple[str, str, str, str]:
    if _is_index(table):
        return table.keyspace, "index", table.name, create_index(state, table)
    if _is_view(table):
        return table.keyspace, "materialized_view", table.name, create_view(state, table)
    return table.keyspace, "table", table.name, create_table(table)


def _is_table(table: Table) -> bool:
    return table.view is None


def _is_index(table: Table) -> bool:
    return table.view is not None and table.view.is_index


def _is_view(table: Table) -> bool:
    return table.view is not None and not table.view.is_index


def create_keyspace(keyspace: Keyspace) -> str:
    return (f"CREATE KEYSPACE {quoted(keyspace.name)} WITH replication = {{'class': 'SimpleStrategy', "
            f"'replication_factor': '{keyspace.rf}'}} AND tablets = {{'initial': {keyspace.initial_tablets}}};")


def create_table(table: Table) -> str:
    columns = "".join(f"    {quoted(c.name)} {c.type},\n" for c in table.columns)
    return f"CREATE TABLE {_qualified(table)} (\n{columns}    PRIMARY KEY ({primary_key(table)})\n);"


def create_view(state: Group0State, view: Table) -> str:
    base = state.tables[view.view.base_id]
    every = {c.name for c in view.columns} >= {c.name for c in base.columns}
    selected = "*" if every else ", ".join(quoted(c.name) for c in view.columns)
    where = where_clause(view)
    return (f"CREATE MATERIALIZED VIEW {_qualified(view)} AS\n    SELECT {selected}\n    FROM {_qualified(base)}\n"
            + (f"    WHERE {where}\n" if where else "") + f"    PRIMARY KEY ({primary_key(view)});")


def create_index(state: Group0State, index: Table) -> str:
    base = state.tables[index.view.base_id]
    return f"CREATE INDEX {quoted(index.name)} ON {_qualified(base)} ({quoted(index.partition_key[0])});"


def primary_key(table: Table) -> str:
    partition = ", ".join(quoted(c) for c in table.partition_key)
    partition = partition if len(table.partition_key) == 1 else f"({partition})"
    return ", ".join([partition, *(quoted(c) for c in table.clustering_key)])


def where_clause(view: Table) -> str:
    """A view's WHERE clause as written (its terms in order)."""
    terms = []
    for term in view.view.where:
        if term.op == "IS NOT NULL":
            terms.append(f"{quoted(term.column)} IS NOT NULL")
        elif term.op == "IN":
            terms.append(f"{quoted(term.column)} IN ({', '.join(literal(v) for v in term.value)})")
        else:
            terms.append(f"{quoted(term.column)} {term.op} {literal(term.value)}")
    return " AND ".join(terms)


def literal(value: object) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return "null" if value is None else repr(value)


def quoted(name: str) -> str:
    """`name` as CQL reads it back: bare when lower case and no keyword, else in double quotes."""
    if _PLAIN_NAME.fullmatch(name) and name not in _RESERVED:
        return name
    return '"' + name.replace('"', '""') + '"'


def _qualified(table: Table) -> str:
    return f"{quoted(table.keyspace)}.{quoted(table.name)}"
