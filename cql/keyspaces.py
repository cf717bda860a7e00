"""A connection's keyspace (CQL's USE) given to the names its statements write without one."""
from __future__ import annotations

import dataclasses

from . import ast

DATA_CENTER = "datacenter1"  # the cluster is one data center, under Cassandra's default name
SYSTEM_KEYSPACES = ("system", "system_schema", "system_virtual_schema", "system_auth", "system_distributed",
                    "system_traces")


def in_keyspace(statement: ast.Statement, keyspace: str | None) -> ast.Statement:
    """`statement` with every table, view and index name that names no keyspace put in `keyspace` (None: as is)."""
    return statement if keyspace is None else _qualified(statement, keyspace)


def _qualified(node, keyspace: str):
    if isinstance(node, ast.QualifiedName):
        return node if node.keyspace is not None else ast.QualifiedName(keyspace, node.name)
    if isinstance(node, ast.RoleResource):
        return node if node.keyspace is not None or node.table is None else ast.RoleResource(keyspace, node.table)
    if isinstance(node, tuple):
        items = tuple(_qualified(item, keyspace) for item in node)
        return node if all(a is b for a, b in zip(items, node)) else items
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        changed = {}
        for field in dataclasses.fields(node):
            value = getattr(node, field.name)
            qualified = _qualified(value, keyspace)
            if qualified is not value:
                changed[field.name] = qualified
        return dataclasses.replace(node, **changed) if changed else node
    return node
