"""The system tables CQL drivers and cqlsh read (system.local, system.peers, system_schema.*), made from group0's state.

Pure: the node's applied `Group0State` and who is asking in, rows out. A driver reads them on connect and after
every schema change: `system.local` and `system.peers_v2` (or `system.peers`) for the nodes, where each node's native
protocol address is its `cql` address in group0; `system_schema.*` for keyspaces, tables, columns, views and indexes.
The partitioner is named `vbc.TabletPartitioner`, which no driver knows: tablets move, so a driver's token ring could
not say where a key lives, and an unknown partitioner turns its token-aware routing off (every node coordinates any
statement). A peer's `schema_version` is this node's: a schema statement answers once every node applied it (or
says which did not).
"""
from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from coordinator.core.errors import InvalidArgument
from coordinator.core.schema import NODE_NORMAL, Node, Table
from coordinator.core.state import Group0State

from . import ast
from .describe import PARTITIONER, where_clause
from .keyspaces import DATA_CENTER, SYSTEM_KEYSPACES
from .result import Result

RELEASE_VERSION = "4.0.11"  # 4 and above: cqlsh sends DESCRIBE to the server (cql.describe answers it)
CQL_VERSION = "3.4.5"
RACK = "rack1"
_NAMESPACE = uuid.UUID("6f1c3c53-5a0e-4c47-9a55-3f0c9b1d7a10")
_STRATEGY = "org.apache.cassandra.locator.SimpleStrategy"
_LOCAL_STRATEGY = "org.apache.cassandra.locator.LocalStrategy"
_SCHEMA_KEYSPACES = ("system", "system_auth", "system_schema")  # described to drivers (cqlsh needs their tables)
# Cassandra's table options at their defaults: a driver writes them in a table's CREATE statement (export_as_string),
# and CREATE TABLE accepts them (they have no effect here)
_TABLE_OPTIONS = {
    "bloom_filter_fp_chance": ("double", 0.01), "caching": ("map<text, text>", {"keys": "ALL",
                                                                               "rows_per_partition": "ALL"}),
    "comment": ("text", ""), "compaction": ("map<text, text>", {}), "compression": ("map<text, text>", {}),
    "crc_check_chance": ("double", 1.0), "default_time_to_live": ("int", 0), "gc_grace_seconds": ("int", 864000),
    "max_index_interval": ("int", 2048), "memtable_flush_period_in_ms": ("int", 0), "min_index_interval": ("int", 128),
    "speculative_retry": ("text", "99PERCENTILE"),
}


@dataclass(frozen=True)
class Asker:
    """The node a statement reached, and the cluster's name."""

    node_id: str
    cluster_name: str = "vbc"


def is_system(name: ast.QualifiedName) -> bool:
    return name.keyspace in SYSTEM_KEYSPACES


def select(state: Group0State, asker: Asker, statement: ast.Select) -> Result:
    """A SELECT of a system table: equality and IN restrictions on any column, the columns named, a LIMIT."""
    columns, rows = _table(state, asker, statement.table)
    names = [name for name, _ in columns]
    if statement.aggregates:
        raise InvalidArgument(f"{statement.table} is a system table: it takes no aggregates")
    for relation in statement.where:
        if relation.column not in names:
            raise InvalidArgument(f"Undefined column name {relation.column} in {statement.table}")
        rows = [row for row in rows if _matches(row[relation.column], relation)]
    chosen = names if statement.columns is None else list(statement.columns)
    unknown = [name for name in chosen if name not in names]
    if unknown:
        raise InvalidArgument(f"Undefined column name {unknown[0]} in {statement.table}")
    types = dict(columns)
    rows = rows[:statement.limit] if statement.limit is not None else rows
    return Result(columns=[(name, types[name]) for name in chosen], rows=[[row[n] for n in chosen] for row in rows])


def _matches(value: object, relation: ast.Relation) -> bool:
    if relation.op == "=":
        return value == relation.value
    if relation.op == "IN":
        return value in relation.value
    raise InvalidArgument(f"system tables are restricted by = and IN only, not {relation.op}")


def _table(state: Group0State, asker: Asker, name: ast.QualifiedName) -> tuple[list[tuple[str, str]], list[dict]]:
    table = _TABLES.get((name.keyspace, name.name))
    if table is None:
        raise InvalidArgument(f"unconfigured table {name.name} in system keyspace {name.keyspace}")
    return list(table.columns), list(table.rows(state, asker))


# ------------------------------------------------------------------ nodes


def host_id(node_id: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"node/{node_id}"))


def schema_version(state: Group0State) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"schema/{state.schema_version}"))


def _token(node_id: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"token/{node_id}").int % 2**63)


def _native_address(node: Node) -> tuple[str, int] | None:
    """The node's CQL host (an IP address) and port, if it serves CQL."""
    if not node.cql:
        return None
    host, _, port = node.cql.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return host, int(port)


def _node_columns(node: Node, state: Group0State) -> dict:
    host, port = _native_address(node) or ("0.0.0.0", 0)
    return {"data_center": DATA_CENTER, "rack": RACK, "host_id": host_id(node.id), "release_version": RELEASE_VERSION,
            "schema_version": schema_version(state), "tokens": {_token(node.id)}, "_host": host, "_port": port}


_LOCAL = [("key", "text"), ("bootstrapped", "text"), ("broadcast_address", "inet"), ("cluster_name", "text"),
          ("cql_version", "text"), ("data_center", "text"), ("host_id", "uuid"), ("listen_address", "inet"),
          ("native_protocol_version", "text"), ("partitioner", "text"), ("rack", "text"), ("release_version", "text"),
          ("rpc_address", "inet"), ("rpc_port", "int"), ("schema_version", "uuid"), ("tokens", "set<text>")]
_PEERS = [("peer", "inet"), ("data_center", "text"), ("host_id", "uuid"), ("preferred_ip", "inet"), ("rack", "text"),
          ("release_version", "text"), ("rpc_address", "inet"), ("native_port", "int"), ("schema_version", "uuid"),
          ("tokens", "set<text>")]
_PEERS_V2 = [("peer", "inet"), ("peer_port", "int"), ("data_center", "text"), ("host_id", "uuid"),
             ("native_address", "inet"), ("native_port", "int"), ("preferred_ip", "inet"), ("preferred_port", "int"),
             ("rack", "text"), ("release_version", "text"), ("schema_version", "uuid"), ("tokens", "set<text>")]


def _local(state: Group0State, asker: Asker):
    node = state.nodes.get(asker.node_id)
    row = _node_columns(node, state) if node is not None else {
        "data_center": DATA_CENTER, "rack": RACK, "host_id": host_id(asker.node_id), "release_version": RELEASE_VERSION,
        "schema_version": schema_version(state), "tokens": {_token(asker.node_id)}, "_host": "0.0.0.0", "_port": 0}
    row.update(key="local", bootstrapped="COMPLETED", broadcast_address=row["_host"], cluster_name=asker.cluster_name,
               cql_version=CQL_VERSION, listen_address=row["_host"], native_protocol_version="4",
               partitioner=PARTITIONER, rpc_address=row["_host"], rpc_port=row["_port"])
    return [row]


def _peer_rows(state: Group0State, asker: Asker) -> Iterable[dict]:
    """Every other node that serves CQL and is part of the cluster (not being removed)."""
    for node in sorted(state.nodes.values(), key=lambda n: n.id):
        if node.id != asker.node_id and node.state == NODE_NORMAL and _native_address(node) is not None:
            row = _node_columns(node, state)
            row.update(peer=row["_host"], preferred_ip=row["_host"], rpc_address=row["_host"],
                       native_address=row["_host"], native_port=row["_port"], peer_port=row["_port"],
                       preferred_port=row["_port"])
            yield row


# ------------------------------------------------------------------ schema


@dataclass(frozen=True)
class _SystemTable:
    columns: tuple[tuple[str, str], ...]  # the first `keys` of them are its primary key (the first: partition key)
    rows: Callable[[Group0State, Asker], Iterable[dict]]
    keys: int = 1


def _keyspaces(state: Group0State, asker: Asker):
    system = [{"keyspace_name": name, "durable_writes": True, "replication": {"class": _LOCAL_STRATEGY}}
              for name in _SCHEMA_KEYSPACES]
    return system + [{"keyspace_name": k.name, "durable_writes": True,
                      "replication": {"class": _STRATEGY, "replication_factor": str(k.rf)}}
                     for k in sorted(state.keyspaces.values(), key=lambda k: k.name)]


def _user_tables(state: Group0State) -> list[Table]:
    return sorted((t for t in state.tables.values() if t.keyspace in state.keyspaces),
                  key=lambda t: (t.keyspace, t.name))


def _system_tables() -> list[tuple[str, str, _SystemTable]]:
    return [(keyspace, name, table) for (keyspace, name), table in sorted(_TABLES.items())
            if keyspace in _SCHEMA_KEYSPACES]


def _options(keyspace: str, table_id: str) -> dict:
    return {"keyspace_name": keyspace, "id": str(uuid.uuid5(_NAMESPACE, f"table/{table_id}")), "extensions": {},
            **{name: value for name, (_, value) in _TABLE_OPTIONS.items()}}


def _tables(state: Group0State, asker: Asker):
    system = [{**_options(keyspace, f"{keyspace}.{name}"), "table_name": name, "flags": {"compound"}}
              for keyspace, name, _ in _system_tables()]
    return system + [{**_options(t.keyspace, t.id), "table_name": t.name, "flags": {"compound"}}
                     for t in _user_tables(state) if t.view is None]


def _views(state: Group0State, asker: Asker):
    for view in _user_tables(state):
        base = state.tables.get(view.view.base_id) if view.view is not None and not view.view.is_index else None
        if base is not None:
            yield {**_options(view.keyspace, view.id), "view_name": view.name, "base_table_name": base.name,
                   "base_table_id": str(uuid.uuid5(_NAMESPACE, f"table/{base.id}")),
                   "include_all_columns": {c.name for c in view.columns} >= {c.name for c in base.columns},
                   "where_clause": where_clause(view)}


def _columns(state: Group0State, asker: Asker):
    for keyspace, name, table in _system_tables():
        for position, (column, kind) in enumerate(table.columns):
            role = ("partition_key", 0) if position == 0 else (
                ("clustering", position - 1) if position < table.keys else ("regular", -1))
            yield _column_row(keyspace, name, column, kind, *role)
    for table in _user_tables(state):
        if table.view is None or not table.view.is_index:
            for column in table.columns:
                yield _column_row(table.keyspace, table.name, column.name, column.type, *_column_kind(table, column.name))


def _column_row(keyspace: str, table: str, column: str, kind_of_value: str, kind: str, position: int) -> dict:
    return {"keyspace_name": keyspace, "table_name": table, "column_name": column,
            "clustering_order": "asc" if kind == "clustering" else "none", "column_name_bytes": column.encode(),
            "kind": kind, "position": position, "type": kind_of_value}


def _column_kind(table: Table, name: str) -> tuple[str, int]:
    if name in table.partition_key:
        return "partition_key", table.partition_key.index(name)
    if name in table.clustering_key:
        return "clustering", table.clustering_key.index(name)
    return "regular", -1


def _indexes(state: Group0State, asker: Asker):
    for index in _user_tables(state):
        base = state.tables.get(index.view.base_id) if index.view is not None and index.view.is_index else None
        if base is not None:
            yield {"keyspace_name": index.keyspace, "table_name": base.name, "index_name": index.name,
                   "kind": "COMPOSITES", "options": {"target": index.partition_key[0]}}


def _none(state: Group0State, asker: Asker):
    return []


_NAME_COLUMNS = (("keyspace_name", "text"), ("table_name", "text"))
_OPTION_COLUMNS = (("id", "uuid"), ("extensions", "map<text, blob>"),
                   *((name, kind) for name, (kind, _) in _TABLE_OPTIONS.items()))
_TABLES = {
    ("system", "local"): _SystemTable(tuple(_LOCAL), _local),
    ("system", "peers"): _SystemTable(tuple(_PEERS), _peer_rows),
    ("system", "peers_v2"): _SystemTable(tuple(_PEERS_V2), _peer_rows, keys=2),
    ("system_schema", "keyspaces"): _SystemTable(
        (("keyspace_name", "text"), ("durable_writes", "boolean"), ("replication", "map<text, text>")), _keyspaces),
    ("system_schema", "tables"): _SystemTable((*_NAME_COLUMNS, ("flags", "set<text>"), *_OPTION_COLUMNS), _tables,
                                              keys=2),
    ("system_schema", "columns"): _SystemTable(
        (*_NAME_COLUMNS, ("column_name", "text"), ("clustering_order", "text"), ("column_name_bytes", "blob"),
         ("kind", "text"), ("position", "int"), ("type", "text")), _columns, keys=3),
    ("system_schema", "views"): _SystemTable(
        (("keyspace_name", "text"), ("view_name", "text"), ("base_table_id", "uuid"), ("base_table_name", "text"),
         ("include_all_columns", "boolean"), ("where_clause", "text"), *_OPTION_COLUMNS), _views, keys=2),
    ("system_schema", "indexes"): _SystemTable(
        (*_NAME_COLUMNS, ("index_name", "text"), ("kind", "text"), ("options", "map<text, text>")), _indexes, keys=3),
    ("system_schema", "types"): _SystemTable(
        (("keyspace_name", "text"), ("type_name", "text"), ("field_names", "list<text>"),
         ("field_types", "list<text>")), _none, keys=2),
    ("system_schema", "functions"): _SystemTable(
        (("keyspace_name", "text"), ("function_name", "text"), ("argument_types", "list<text>")), _none, keys=3),
    ("system_schema", "aggregates"): _SystemTable(
        (("keyspace_name", "text"), ("aggregate_name", "text"), ("argument_types", "list<text>")), _none, keys=3),
    ("system_schema", "triggers"): _SystemTable(
        (*_NAME_COLUMNS, ("trigger_name", "text"), ("options", "map<text, text>")), _none, keys=3),
    ("system_virtual_schema", "keyspaces"): _SystemTable((("keyspace_name", "text"),), _none),
    ("system_virtual_schema", "tables"): _SystemTable(_NAME_COLUMNS, _none, keys=2),
    ("system_virtual_schema", "columns"): _SystemTable((*_NAME_COLUMNS, ("column_name", "text")), _none, keys=3),
}


# ------------------------------------------------------------------ pushed events


@dataclass(frozen=True)
class Shape:
    """What drivers are told about when it changes: keyspaces, tables (views and indexes as their base's), nodes."""

    keyspaces: tuple[tuple[str, int], ...]
    tables: tuple[tuple[tuple[str, str], tuple], ...]
    nodes: tuple[tuple[str, tuple[str, int]], ...]


def shape(state: Group0State) -> Shape:
    tables = {}
    for table in _user_tables(state):
        owner = state.tables.get(table.view.base_id) if table.view is not None and table.view.is_index else table
        if owner is not None:
            key = (owner.keyspace, owner.name)
            tables[key] = tables.get(key, ()) + ((table.name, table.columns, table.partition_key, table.clustering_key),)
    nodes = {node.id: _native_address(node) for node in state.nodes.values() if node.state == NODE_NORMAL}
    return Shape(tuple(sorted((k.name, k.rf) for k in state.keyspaces.values())), tuple(sorted(tables.items())),
                 tuple(sorted((node, address) for node, address in nodes.items() if address is not None)))


def events(before: Shape, after: Shape) -> list[tuple]:
    """The EVENTs between two shapes: ("SCHEMA_CHANGE", change, target, keyspace[, name]) and ("TOPOLOGY_CHANGE",
    change, host, port), dropped objects after created and updated ones."""
    found = [("SCHEMA_CHANGE", change, "KEYSPACE", name) for change, name, _ in _changed(before.keyspaces,
                                                                                          after.keyspaces)]
    found += [("SCHEMA_CHANGE", change, "TABLE", *name) for change, name, _ in _changed(before.tables, after.tables)]
    found += [("TOPOLOGY_CHANGE", "NEW_NODE" if change == "CREATED" else "REMOVED_NODE", *address)
              for change, _, address in _changed(before.nodes, after.nodes) if change != "UPDATED"]
    return sorted(found, key=lambda event: event[1] == "DROPPED")


def _changed(before: tuple, after: tuple) -> list[tuple[str, object, object]]:
    old, new = dict(before), dict(after)
    return ([("CREATED", key, value) for key, value in new.items() if key not in old]
            + [("UPDATED", key, value) for key, value in new.items() if key in old and old[key] != value]
            + [("DROPPED", key, value) for key, value in old.items() if key not in new])
