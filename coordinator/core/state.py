"""The replicated group0 state and its deterministic `apply(command)`.

Commands are plain dicts with an "op" and a "cmd_id". Every id and timestamp a command needs is
chosen by the proposing node and travels inside the command; `apply` never reads a clock or draws a
random number, so every replica fed the same log reaches the same state. A command applied twice
(a retry after a leader change) returns the first outcome and changes nothing.
"""
from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator

from . import types as coltypes
from .errors import AlreadyExists, CoreError, FailedPrecondition, InvalidArgument, NotFound
from .placement import choose_replicas, place_tablet_map, replica_loads
from .schema import (
    BUILD_STARTED,
    BUILD_SUCCESS,
    TASK_BUILD_RANGE,
    Column,
    Filter,
    Keyspace,
    Node,
    Outcome,
    Replica,
    Table,
    TabletMap,
    Task,
    ViewDef,
)
from .tokens import is_power_of_two

REMEMBERED_COMMANDS = 4096
MAX_TABLETS = 4096
FILTER_OPS = ("=", "!=", "<", "<=", ">", ">=", "IN", "IS NOT NULL")


def derived_id(seed: str, *parts: object) -> str:
    """A deterministic id (32 hex chars) derived from a proposer-chosen seed id and a name."""
    return uuid.uuid5(uuid.UUID(seed), "/".join(map(str, parts))).hex


class Group0State:
    """Schema, nodes, tablet maps, view-building tasks and build statuses, changed only by `apply`."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.keyspaces: dict[str, Keyspace] = {}
        self.tables: dict[str, Table] = {}
        self.tablets: dict[str, TabletMap] = {}
        self.tasks: dict[str, Task] = {}
        self.build_status: dict[tuple[str, str], str] = {}
        self.tasks_created: dict[str, int] = {}
        self.processing_base: str | None = None
        self.dropped_tables: set[str] = set()  # ids of dropped tables and views, so nodes drop their storage
        self.schema_version = 0
        self._recent: OrderedDict[str, Outcome] = OrderedDict()

    def __setstate__(self, saved: dict) -> None:
        """Restore a snapshot, giving fields added since it was written their empty value."""
        self.__init__()
        self.__dict__.update(saved)

    # ----------------------------------------------------------------- apply

    def apply(self, command: dict) -> Outcome:
        cmd_id = command.get("cmd_id")
        if cmd_id is not None and cmd_id in self._recent:
            return self._recent[cmd_id]
        outcome = self._run(command)
        if cmd_id is not None:
            self._remember(cmd_id, outcome)
        return outcome

    def _run(self, command: dict) -> Outcome:
        handler = _HANDLERS.get(command.get("op"))
        try:
            if handler is None:
                raise InvalidArgument(f"unknown command {command.get('op')!r}")
            return Outcome(value=handler(self, command))
        except CoreError as error:
            return Outcome(error_code=error.code, error_message=error.message)
        except (KeyError, TypeError, ValueError) as error:
            return Outcome(error_code="INVALID_ARGUMENT", error_message=f"malformed {command.get('op')} command: {error!r}")

    def _remember(self, cmd_id: str, outcome: Outcome) -> None:
        self._recent[cmd_id] = outcome
        while len(self._recent) > REMEMBERED_COMMANDS:
            self._recent.popitem(last=False)

    # --------------------------------------------------------------- queries

    def find_table(self, keyspace: str, name: str) -> Table | None:
        return next((t for t in self.tables.values() if t.keyspace == keyspace and t.name == name), None)

    def require_keyspace(self, name: str) -> Keyspace:
        keyspace = self.keyspaces.get(name)
        if keyspace is None:
            raise NotFound(f"keyspace {name!r} does not exist")
        return keyspace

    def require_table(self, keyspace: str, name: str) -> Table:
        self.require_keyspace(keyspace)
        table = self.find_table(keyspace, name)
        if table is None:
            raise NotFound(f"table or view {keyspace}.{name} does not exist")
        return table

    def views_of(self, base_id: str) -> list[Table]:
        return [t for t in self.tables.values() if t.view is not None and t.view.base_id == base_id]

    def tables_in(self, keyspace: str) -> list[Table]:
        return [t for t in self.tables.values() if t.keyspace == keyspace]

    def tasks_of_view(self, view_id: str) -> Iterator[Task]:
        return (t for t in self.tasks.values() if t.view_id == view_id)

    def view_is_built(self, view_id: str) -> bool:
        statuses = [s for (v, _), s in self.build_status.items() if v == view_id]
        no_tasks_left = not any(True for _ in self.tasks_of_view(view_id))
        return no_tasks_left and all(s == BUILD_SUCCESS for s in statuses)

    def view_progress(self, view_id: str) -> dict:
        remaining = sum(1 for t in self.tasks_of_view(view_id) if not t.aborted)
        total = self.tasks_created.get(view_id, 0)
        hosts = {node: status for (v, node), status in self.build_status.items() if v == view_id}
        return {"tasks_total": total, "tasks_done": max(total - remaining, 0), "hosts": hosts,
                "built": self.view_is_built(view_id)}

    # --------------------------------------------------------------- helpers

    def _place(self, table_id: str, keyspace: Keyspace) -> TabletMap:
        return place_tablet_map(table_id, keyspace.initial_tablets, keyspace.rf, self.nodes, self.tablets.values())

    def _drop_table_state(self, table_id: str) -> None:
        self.dropped_tables.add(table_id)
        self.tables.pop(table_id, None)
        self.tablets.pop(table_id, None)
        self.tasks_created.pop(table_id, None)
        for task in list(self.tasks.values()):
            if table_id in (task.view_id, task.base_id):
                del self.tasks[task.id]
        for key in [k for k in self.build_status if k[0] == table_id]:
            del self.build_status[key]
        if self.processing_base == table_id:
            self.processing_base = None

    def _create_build_tasks(self, view: Table, seed: str, replicas_by_tablet: dict[int, list[Replica]]) -> int:
        """One build_range task per (base tablet replica) listed, for `view`; marks their nodes STARTED."""
        created = 0
        for tablet_id, replicas in replicas_by_tablet.items():
            for replica in replicas:
                task_id = derived_id(seed, view.id, tablet_id, replica.node, replica.shard)
                self.tasks[task_id] = Task(task_id, TASK_BUILD_RANGE, view.view.base_id, view.id, replica, tablet_id)
                self.build_status[(view.id, replica.node)] = BUILD_STARTED
                created += 1
        self.tasks_created[view.id] = self.tasks_created.get(view.id, 0) + created
        return created


# ------------------------------------------------------------------ validation


def _check_identifier(kind: str, name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > 48 or not (name[0].isalpha() or name[0] == "_"):
        raise InvalidArgument(f"invalid {kind} name {name!r}: use 1-48 letters, digits or '_', starting with a letter")
    if not all(ch.isalnum() or ch == "_" for ch in name):
        raise InvalidArgument(f"invalid {kind} name {name!r}: only letters, digits and '_' are allowed")
    return name


def _check_id(value: object) -> str:
    if not isinstance(value, str) or len(value) != 32 or any(c not in "0123456789abcdef" for c in value):
        raise InvalidArgument(f"invalid id {value!r}: expected 32 lowercase hex characters")
    return value


def _check_rf(state: Group0State, rf: object) -> int:
    if isinstance(rf, bool) or not isinstance(rf, int) or rf < 1:
        raise InvalidArgument(f"replication factor must be a positive integer, got {rf!r}")
    if rf > len(state.nodes):
        raise InvalidArgument(
            f"replication factor {rf} exceeds the number of nodes in the cluster ({len(state.nodes)}); "
            f"add nodes or use rf <= {len(state.nodes)}"
        )
    return rf


def _check_tablet_count(count: object) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or not is_power_of_two(count) or count > MAX_TABLETS:
        raise InvalidArgument(f"initial tablet count must be a power of two between 1 and {MAX_TABLETS}, got {count!r}")
    return count


def _check_name_free(state: Group0State, keyspace: str, name: str) -> None:
    existing = state.find_table(keyspace, name)
    if existing is not None:
        kind = "index" if existing.view and existing.view.is_index else "view" if existing.view else "table"
        raise AlreadyExists(f"{keyspace}.{name} already exists (as a {kind})")


def _check_no_duplicates(kind: str, names: list[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise InvalidArgument(f"{kind} {name!r} is listed twice")
        seen.add(name)


def _build_columns(raw_columns: list) -> tuple[Column, ...]:
    if not raw_columns:
        raise InvalidArgument("a table needs at least one column")
    columns = tuple(Column(_check_identifier("column", n), coltypes.check_type_name(t)) for n, t in raw_columns)
    _check_no_duplicates("column", [c.name for c in columns])
    return columns


def _check_primary_key(owner: str, columns: tuple[Column, ...], partition_key: list, clustering_key: list) -> None:
    if not partition_key:
        raise InvalidArgument(f"{owner} needs a PRIMARY KEY with at least one partition key column")
    names = {c.name for c in columns}
    for name in list(partition_key) + list(clustering_key):
        if name not in names:
            raise InvalidArgument(f"primary key column {name!r} of {owner} is not a defined column")
    _check_no_duplicates("primary key column", list(partition_key) + list(clustering_key))


def _build_filter(base: Table, raw: list) -> Filter:
    column_name, op, value = raw
    column = base.column(column_name)
    if column is None:
        raise InvalidArgument(f"WHERE refers to unknown column {column_name!r} of {base.qualified_name}")
    if op not in FILTER_OPS:
        raise InvalidArgument(f"unsupported operator {op!r} in view WHERE; use one of {', '.join(FILTER_OPS)}")
    if op == "IS NOT NULL":
        return Filter(column_name, op, None)
    if op == "IN":
        values = tuple(coltypes.coerce(column.type, v, column_name) for v in value)
        return Filter(column_name, op, values)
    if value is None:
        raise InvalidArgument(f"comparison of {column_name!r} with null is never true; use IS NOT NULL")
    return Filter(column_name, op, coltypes.coerce(column.type, value, column_name))


def _check_view_key(base: Table, partition_key: list, clustering_key: list) -> None:
    view_key = list(partition_key) + list(clustering_key)
    _check_primary_key("the view", base.columns, partition_key, clustering_key)
    missing = [c for c in base.primary_key if c not in view_key]
    if missing:
        raise InvalidArgument(
            f"the view's PRIMARY KEY must include every primary key column of {base.qualified_name}; "
            f"missing: {', '.join(missing)}"
        )
    extra = [c for c in view_key if c not in base.primary_key]
    if len(extra) > 1:
        raise InvalidArgument(
            f"the view's PRIMARY KEY may add at most one non-primary-key column of {base.qualified_name}; "
            f"it adds {', '.join(extra)}"
        )


def _view_columns(base: Table, selected: list | None, view_key: list) -> tuple[Column, ...]:
    if selected is None:
        wanted = {c.name for c in base.columns}
    else:
        unknown = [c for c in selected if base.column(c) is None]
        if unknown:
            raise InvalidArgument(f"the view selects unknown column(s) of {base.qualified_name}: {', '.join(unknown)}")
        wanted = set(selected) | set(view_key)
    keyed = [base.column(n) for n in view_key]
    rest = [c for c in base.columns if c.name in wanted and c.name not in view_key]
    return tuple(keyed + rest)


def _check_key_filters(view_key: list, filters: tuple[Filter, ...]) -> None:
    restricted = {f.column for f in filters if f.op == "IS NOT NULL"}
    missing = [c for c in view_key if c not in restricted]
    if missing:
        raise InvalidArgument(
            f"primary key column(s) {', '.join(missing)} of the view must be restricted with IS NOT NULL "
            f"(add 'AND {missing[0]} IS NOT NULL' to the WHERE clause)"
        )


# -------------------------------------------------------------------- handlers


def _register_node(state: Group0State, cmd: dict) -> None:
    shards = cmd["shards"]
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 256:
        raise InvalidArgument(f"shard count must be between 1 and 256, got {shards!r}")
    node = Node(_check_identifier("node", cmd["node_id"]), cmd["grpc"], cmd["raft"], shards)
    used = [r.shard for m in state.tablets.values() for rs in m.replicas for r in rs if r.node == node.id]
    if used and max(used) >= shards:
        raise FailedPrecondition(
            f"node {node.id} holds tablet replicas on shard {max(used)}; it cannot restart with {shards} shard(s)"
        )
    state.nodes[node.id] = node


def _create_keyspace(state: Group0State, cmd: dict) -> str:
    name = _check_identifier("keyspace", cmd["name"])
    if name in state.keyspaces:
        if cmd.get("if_not_exists"):
            return "exists"
        raise AlreadyExists(f"keyspace {name!r} already exists")
    rf = _check_rf(state, cmd["rf"])
    tablets = _check_tablet_count(cmd["initial_tablets"])
    state.keyspaces[name] = Keyspace(name, rf, tablets)
    state.schema_version += 1
    return "created"


def _alter_keyspace(state: Group0State, cmd: dict) -> str:
    keyspace = state.require_keyspace(cmd["name"])
    rf = _check_rf(state, cmd["rf"])
    _check_id(cmd["id_seed"])
    state.keyspaces[keyspace.name] = Keyspace(keyspace.name, rf, keyspace.initial_tablets)
    per_node, per_shard = replica_loads(state.tablets.values())
    for table in state.tables_in(keyspace.name):
        _resize_replica_sets(state, table, rf, cmd["id_seed"], per_node, per_shard)
    state.schema_version += 1
    return "altered"


def _resize_replica_sets(state: Group0State, table: Table, rf: int, seed: str, per_node, per_shard) -> None:
    """Grow or shrink every tablet's replica list to `rf`; abort or create build tasks to match."""
    old_map = state.tablets[table.id]
    new_replicas = []
    added: dict[int, list[Replica]] = {}
    for tablet_id, replicas in enumerate(old_map.replicas):
        if rf <= len(replicas):
            kept = replicas[:rf]
        else:
            exclude = frozenset(r.node for r in replicas)
            fresh = choose_replicas(state.nodes, rf - len(replicas), exclude, per_node, per_shard)
            kept = replicas + tuple(fresh)
            added[tablet_id] = fresh
        new_replicas.append(kept)
    state.tablets[table.id] = TabletMap(table.id, tuple(new_replicas))
    if table.view is not None:
        return
    for task in list(state.tasks.values()):
        if task.base_id == table.id and task.replica not in new_replicas[task.tablet_id]:
            del state.tasks[task.id]
            if task.view_id in state.tasks_created:
                state.tasks_created[task.view_id] -= 1
    holders = {r.node for replicas in new_replicas for r in replicas}
    for view in state.views_of(table.id):
        for key in [k for k in state.build_status if k[0] == view.id and k[1] not in holders]:
            del state.build_status[key]
        if not state.view_is_built(view.id):
            state._create_build_tasks(view, seed, added)


def _create_table(state: Group0State, cmd: dict) -> str:
    keyspace = state.require_keyspace(cmd["keyspace"])
    name = _check_identifier("table", cmd["name"])
    if state.find_table(keyspace.name, name) is not None and cmd.get("if_not_exists"):
        return "exists"
    _check_name_free(state, keyspace.name, name)
    table_id = _check_id(cmd["id"])
    if table_id in state.tables or table_id in state.dropped_tables:
        raise AlreadyExists(f"table id {table_id} is already in use")
    columns = _build_columns(cmd["columns"])
    _check_primary_key(f"table {keyspace.name}.{name}", columns, cmd["partition_key"], cmd["clustering_key"])
    table = Table(table_id, keyspace.name, name, columns, tuple(cmd["partition_key"]), tuple(cmd["clustering_key"]))
    state.tables[table_id] = table
    state.tablets[table_id] = state._place(table_id, keyspace)
    state.schema_version += 1
    return "created"


def _create_view(state: Group0State, cmd: dict) -> str:
    keyspace = state.require_keyspace(cmd["keyspace"])
    name = _check_identifier("view", cmd["name"])
    if state.find_table(keyspace.name, name) is not None and cmd.get("if_not_exists"):
        return "exists"
    base = state.require_table(keyspace.name, cmd["base"])
    if base.view is not None:
        raise InvalidArgument(f"{base.qualified_name} is a view; views can only be created over base tables")
    _check_name_free(state, keyspace.name, name)
    view_id = _check_id(cmd["id"])
    if view_id in state.tables or view_id in state.dropped_tables:
        raise AlreadyExists(f"table id {view_id} is already in use")
    partition_key, clustering_key = list(cmd["partition_key"]), list(cmd["clustering_key"])
    _check_view_key(base, partition_key, clustering_key)
    filters = tuple(_build_filter(base, raw) for raw in cmd.get("where", ()))
    view_key = partition_key + clustering_key
    if not cmd.get("is_index"):
        _check_key_filters(view_key, filters)
    columns = _view_columns(base, cmd.get("columns"), view_key)
    view_def = ViewDef(base.id, filters, bool(cmd.get("is_index")))
    view = Table(view_id, keyspace.name, name, columns, tuple(partition_key), tuple(clustering_key), view_def)
    state.tables[view_id] = view
    state.tablets[view_id] = state._place(view_id, keyspace)
    base_replicas = {i: list(r) for i, r in enumerate(state.tablets[base.id].replicas)}
    state._create_build_tasks(view, view_id, base_replicas)
    state.schema_version += 1
    return "created"


def _create_index(state: Group0State, cmd: dict) -> str:
    base = state.require_table(cmd["keyspace"], cmd["base"])
    column = cmd["column"]
    if base.column(column) is None:
        raise InvalidArgument(f"cannot index unknown column {column!r} of {base.qualified_name}")
    if base.view is not None:
        raise InvalidArgument(f"{base.qualified_name} is a view; indexes can only be created on base tables")
    if (column,) == base.partition_key:
        raise InvalidArgument(f"cannot index {column!r}: it is already the whole partition key of {base.qualified_name}")
    clustering = [c for c in base.primary_key if c != column]
    view_cmd = dict(cmd, partition_key=[column], clustering_key=clustering, columns=[],
                    where=[[c, "IS NOT NULL", None] for c in [column] + clustering], is_index=True)
    return _create_view(state, view_cmd)


def _drop_view(state: Group0State, cmd: dict) -> str:
    is_index = bool(cmd.get("is_index"))
    kind = "index" if is_index else "materialized view"
    if cmd["keyspace"] not in state.keyspaces and cmd.get("if_exists"):
        return "absent"
    state.require_keyspace(cmd["keyspace"])
    view = state.find_table(cmd["keyspace"], cmd["name"])
    if view is None or view.view is None or view.view.is_index != is_index:
        if view is None and cmd.get("if_exists"):
            return "absent"
        if view is not None and view.view is not None:
            other = "DROP INDEX" if view.view.is_index else "DROP MATERIALIZED VIEW"
            raise InvalidArgument(f"{view.qualified_name} is not a {kind}; use {other}")
        if view is not None:
            raise InvalidArgument(f"{view.qualified_name} is a table, not a {kind}; use DROP TABLE")
        raise NotFound(f"{kind} {cmd['keyspace']}.{cmd['name']} does not exist")
    state._drop_table_state(view.id)
    state.schema_version += 1
    return "dropped"


def _drop_table(state: Group0State, cmd: dict) -> str:
    if cmd["keyspace"] not in state.keyspaces and cmd.get("if_exists"):
        return "absent"
    state.require_keyspace(cmd["keyspace"])
    table = state.find_table(cmd["keyspace"], cmd["name"])
    if table is None:
        if cmd.get("if_exists"):
            return "absent"
        raise NotFound(f"table {cmd['keyspace']}.{cmd['name']} does not exist")
    if table.view is not None:
        statement = "DROP INDEX" if table.view.is_index else "DROP MATERIALIZED VIEW"
        raise InvalidArgument(f"{table.qualified_name} is a view; use {statement}")
    dependent = [v.qualified_name for v in state.views_of(table.id) if not v.view.is_index]
    if dependent:
        raise FailedPrecondition(
            f"cannot drop {table.qualified_name}: materialized views depend on it ({', '.join(dependent)}); drop them first"
        )
    for index in state.views_of(table.id):
        state._drop_table_state(index.id)
    state._drop_table_state(table.id)
    state.schema_version += 1
    return "dropped"


def _drop_keyspace(state: Group0State, cmd: dict) -> str:
    name = cmd["name"]
    if name not in state.keyspaces:
        if cmd.get("if_exists"):
            return "absent"
        raise NotFound(f"keyspace {name!r} does not exist")
    for table in state.tables_in(name):
        state._drop_table_state(table.id)
    del state.keyspaces[name]
    state.schema_version += 1
    return "dropped"


def _noop(state: Group0State, cmd: dict) -> None:
    return None


_HANDLERS: dict[str, Callable[[Group0State, dict], object]] = {
    "register_node": _register_node,
    "create_keyspace": _create_keyspace,
    "alter_keyspace": _alter_keyspace,
    "create_table": _create_table,
    "create_view": _create_view,
    "create_index": _create_index,
    "drop_view": _drop_view,
    "drop_table": _drop_table,
    "drop_keyspace": _drop_keyspace,
    "noop": _noop,
}
