"""Schema commands: create, alter and drop keyspaces, tables, views and indexes, and their validation.

Owns the `keyspaces`, `tables`, `dropped_tables` and `schema_version` fields of Group0State; tablet maps
and build tasks of the tables it creates or drops are changed through `tablets` and `view_building`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import auth, migrations, resize, tablets, view_building
from . import types as coltypes
from .commands import (
    AlterKeyspace,
    AlterTable,
    ColumnSpec,
    CreateIndex,
    CreateKeyspace,
    CreateTable,
    CreateView,
    DropKeyspace,
    DropTable,
    DropView,
    WhereTerm,
)
from .errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from .ids import check_id, check_name
from .schema import Column, Filter, Keyspace, Table, ViewDef

if TYPE_CHECKING:
    from .state import Group0State

FILTER_OPS = ("=", "!=", "<", "<=", ">", ">=", "IN", "IS NOT NULL")
MAX_NAMES_SHOWN = 5  # tables named in a refusal message


# -------------------------------------------------------------------- keyspaces


def create_keyspace(state: Group0State, cmd: CreateKeyspace) -> str:
    name = check_name("keyspace", cmd.name)
    if name in state.keyspaces:
        if cmd.if_not_exists:
            return "exists"
        raise AlreadyExists(f"keyspace {name!r} already exists")
    rf = tablets.check_rf(state, cmd.rf)
    count = tablets.check_tablet_count(cmd.initial_tablets)
    state.keyspaces[name] = Keyspace(name, rf, count)
    state.schema_version += 1
    return "created"


def alter_keyspace(state: Group0State, cmd: AlterKeyspace) -> str:
    keyspace = state.require_keyspace(cmd.name)
    rf = tablets.check_rf(state, cmd.rf)
    seed = check_id(cmd.id_seed)
    if cmd.move_data:
        return _change_replication(state, keyspace, rf)
    if cmd.refuse_with_tables and rf != keyspace.rf:
        _check_holds_no_tables(state, keyspace, rf)
    # Past the check, replica sets of tables change only for an entry journaled before the refusal (replayed);
    # an empty keyspace has none, and an unchanged rf leaves them as they are.
    state.keyspaces[keyspace.name] = Keyspace(keyspace.name, rf, keyspace.initial_tablets)
    added = tablets.resize_keyspace(state, keyspace.name, rf)
    for table in state.tables_in(keyspace.name):
        if table.view is None:
            view_building.replicas_changed(state, table, seed, added[table.id])
    state.schema_version += 1
    return "altered"


def _change_replication(state: Group0State, keyspace: Keyspace, rf: int) -> str:
    """Set the keyspace's RF; the leader's driver brings every tablet to it (`migrations.replication_moves`)."""
    if any(key[0] in {t.id for t in state.tables_in(keyspace.name)} for key in state.transitions) and rf != keyspace.rf:
        raise FailedPrecondition(f"tablets of keyspace {keyspace.name!r} are moving; change its replication factor "
                                 "once they are done")
    state.keyspaces[keyspace.name] = Keyspace(keyspace.name, rf, keyspace.initial_tablets)
    state.schema_version += 1
    replicas = sum(abs(len(rs) - rf) for t in state.tables_in(keyspace.name) for rs in state.tablets[t.id].replicas)
    return f"altered; {replicas} tablet replicas to {'add' if rf > keyspace.rf else 'remove'}" if replicas else "altered"


def _check_holds_no_tables(state: Group0State, keyspace: Keyspace, rf: int) -> None:
    """Refuse an RF change of a keyspace with tables: their replicas would change without their data moving."""
    names = sorted(t.name for t in state.tables_in(keyspace.name))
    if not names:
        return
    shown = ", ".join(names[:MAX_NAMES_SHOWN]) + (f", ... ({len(names)} in all)" if len(names) > MAX_NAMES_SHOWN else "")
    raise FailedPrecondition(
        f"keyspace {keyspace.name!r} holds tables ({shown}): changing its replication factor from {keyspace.rf} "
        f"to {rf} needs data movement between nodes, which is not supported yet; create a new keyspace with "
        f"replication = {{'rf': {rf}}} and copy the data into it"
    )


def drop_keyspace(state: Group0State, cmd: DropKeyspace) -> str:
    if cmd.name not in state.keyspaces:
        if cmd.if_exists:
            return "absent"
        raise NotFound(f"keyspace {cmd.name!r} does not exist")
    for table in state.tables_in(cmd.name):
        _forget_table(state, table.id)
    auth.forget_resource(state, cmd.name)
    del state.keyspaces[cmd.name]
    state.schema_version += 1
    return "dropped"


# -------------------------------------------------------------------- tables


def create_table(state: Group0State, cmd: CreateTable) -> str:
    keyspace = state.require_keyspace(cmd.keyspace)
    name = check_name("table", cmd.name)
    if state.find_table(keyspace.name, name) is not None and cmd.if_not_exists:
        return "exists"
    _check_name_free(state, keyspace.name, name)
    table_id = _check_new_table_id(state, cmd.id)
    columns = _build_columns(cmd.columns)
    _check_primary_key(f"table {keyspace.name}.{name}", columns, cmd.partition_key, cmd.clustering_key)
    state.tables[table_id] = Table(table_id, keyspace.name, name, columns, cmd.partition_key, cmd.clustering_key)
    tablets.place_table(state, table_id, keyspace)
    state.schema_version += 1
    return "created"


def alter_table(state: Group0State, cmd: AlterTable) -> str:
    """Add regular columns to a base table; views keep the columns they were created with."""
    state.require_keyspace(cmd.keyspace)
    table = state.find_table(cmd.keyspace, cmd.name)
    if table is None:
        raise NotFound(f"table {cmd.keyspace}.{cmd.name} does not exist")
    if table.view is not None:
        kind = "an index" if table.view.is_index else "a materialized view"
        raise InvalidArgument(f"{table.qualified_name} is {kind}: only a base table can be altered")
    added = _build_columns(cmd.add)
    existing = [c.name for c in added if table.column(c.name) is not None]
    if existing:
        raise InvalidArgument(f"{table.qualified_name} already has column {existing[0]!r}")
    state.tables[table.id] = dataclasses.replace(table, columns=table.columns + added)
    state.schema_version += 1
    return "altered"


def drop_table(state: Group0State, cmd: DropTable) -> str:
    if cmd.keyspace not in state.keyspaces and cmd.if_exists:
        return "absent"
    state.require_keyspace(cmd.keyspace)
    table = state.find_table(cmd.keyspace, cmd.name)
    if table is None:
        if cmd.if_exists:
            return "absent"
        raise NotFound(f"table {cmd.keyspace}.{cmd.name} does not exist")
    if table.view is not None:
        statement = "DROP INDEX" if table.view.is_index else "DROP MATERIALIZED VIEW"
        raise InvalidArgument(f"{table.qualified_name} is a view; use {statement}")
    dependent = [v.qualified_name for v in state.views_of(table.id) if not v.view.is_index]
    if dependent:
        raise FailedPrecondition(
            f"cannot drop {table.qualified_name}: materialized views depend on it ({', '.join(dependent)}); drop them first"
        )
    for index in state.views_of(table.id):
        _forget_table(state, index.id)
    _forget_table(state, table.id)
    state.schema_version += 1
    return "dropped"


def _forget_table(state: Group0State, table_id: str) -> None:
    state.dropped_tables.add(table_id)
    table = state.tables.pop(table_id, None)
    if table is not None:
        auth.forget_resource(state, table.keyspace, table.name)
    migrations.forget_table(state, table_id)
    resize.forget_table(state, table_id)
    tablets.forget_table(state, table_id)
    view_building.forget_table(state, table_id)


# -------------------------------------------------------------------- views and indexes


def create_view(state: Group0State, cmd: CreateView) -> str:
    return _add_view(state, cmd, is_index=False)


def create_index(state: Group0State, cmd: CreateIndex) -> str:
    """An index is a view keyed by the indexed column, then the rest of the base's primary key."""
    base = state.require_table(cmd.keyspace, cmd.base)
    column = cmd.column
    if base.column(column) is None:
        raise InvalidArgument(f"cannot index unknown column {column!r} of {base.qualified_name}")
    if base.view is not None:
        raise InvalidArgument(f"{base.qualified_name} is a view; indexes can only be created on base tables")
    if (column,) == base.partition_key:
        raise InvalidArgument(f"cannot index {column!r}: it is already the whole partition key of {base.qualified_name}")
    clustering = tuple(c for c in base.primary_key if c != column)
    view = CreateView(id=cmd.id, keyspace=cmd.keyspace, name=cmd.name, base=cmd.base, partition_key=(column,),
                      clustering_key=clustering, columns=(), if_not_exists=cmd.if_not_exists, cmd_id=cmd.cmd_id,
                      where=tuple(WhereTerm(c, "IS NOT NULL", None) for c in (column,) + clustering))
    return _add_view(state, view, is_index=True)


def drop_view(state: Group0State, cmd: DropView) -> str:
    kind = "index" if cmd.is_index else "materialized view"
    if cmd.keyspace not in state.keyspaces and cmd.if_exists:
        return "absent"
    state.require_keyspace(cmd.keyspace)
    view = state.find_table(cmd.keyspace, cmd.name)
    if view is None or view.view is None or view.view.is_index != cmd.is_index:
        if view is None and cmd.if_exists:
            return "absent"
        if view is not None and view.view is not None:
            other = "DROP INDEX" if view.view.is_index else "DROP MATERIALIZED VIEW"
            raise InvalidArgument(f"{view.qualified_name} is not a {kind}; use {other}")
        if view is not None:
            raise InvalidArgument(f"{view.qualified_name} is a table, not a {kind}; use DROP TABLE")
        raise NotFound(f"{kind} {cmd.keyspace}.{cmd.name} does not exist")
    _forget_table(state, view.id)
    state.schema_version += 1
    return "dropped"


def _add_view(state: Group0State, cmd: CreateView, is_index: bool) -> str:
    keyspace = state.require_keyspace(cmd.keyspace)
    name = check_name("view", cmd.name)
    if state.find_table(keyspace.name, name) is not None and cmd.if_not_exists:
        return "exists"
    base = state.require_table(keyspace.name, cmd.base)
    if base.view is not None:
        raise InvalidArgument(f"{base.qualified_name} is a view; views can only be created over base tables")
    _check_name_free(state, keyspace.name, name)
    view_id = _check_new_table_id(state, cmd.id)
    view_key = cmd.partition_key + cmd.clustering_key
    _check_view_key(base, cmd.partition_key, cmd.clustering_key)
    filters = tuple(_build_filter(base, term) for term in cmd.where)
    if not is_index:
        _check_key_filters(base, view_key, filters, cmd.implied_not_null)
    columns = _view_columns(base, cmd.columns, view_key)
    view = Table(view_id, keyspace.name, name, columns, cmd.partition_key, cmd.clustering_key,
                 ViewDef(base.id, filters, is_index))
    state.tables[view_id] = view
    tablets.place_table(state, view_id, keyspace)
    view_building.start_build(state, view)
    state.schema_version += 1
    return "created"


# -------------------------------------------------------------------- validation


def _check_name_free(state: Group0State, keyspace: str, name: str) -> None:
    existing = state.find_table(keyspace, name)
    if existing is not None:
        kind = "index" if existing.view and existing.view.is_index else "view" if existing.view else "table"
        raise AlreadyExists(f"{keyspace}.{name} already exists (as a {kind})")


def _check_new_table_id(state: Group0State, table_id: str) -> str:
    check_id(table_id)
    if table_id in state.tables or table_id in state.dropped_tables:
        raise AlreadyExists(f"table id {table_id} is already in use")
    return table_id


def _check_no_duplicates(kind: str, names: Sequence[str]) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise InvalidArgument(f"{kind} {name!r} is listed twice")
        seen.add(name)


def _build_columns(specs: Sequence[ColumnSpec]) -> tuple[Column, ...]:
    if not specs:
        raise InvalidArgument("a table needs at least one column")
    columns = tuple(Column(check_name("column", s.name), coltypes.check_type_name(s.type)) for s in specs)
    _check_no_duplicates("column", [c.name for c in columns])
    return columns


def _check_primary_key(owner: str, columns: Sequence[Column], partition_key: tuple[str, ...],
                       clustering_key: tuple[str, ...]) -> None:
    if not partition_key:
        raise InvalidArgument(f"{owner} needs a PRIMARY KEY with at least one partition key column")
    names = {c.name for c in columns}
    for name in partition_key + clustering_key:
        if name not in names:
            raise InvalidArgument(f"primary key column {name!r} of {owner} is not a defined column")
    _check_no_duplicates("primary key column", partition_key + clustering_key)


def _build_filter(base: Table, term: WhereTerm) -> Filter:
    column = base.column(term.column)
    if column is None:
        raise InvalidArgument(f"WHERE refers to unknown column {term.column!r} of {base.qualified_name}")
    if term.op not in FILTER_OPS:
        raise InvalidArgument(f"unsupported operator {term.op!r} in view WHERE; use one of {', '.join(FILTER_OPS)}")
    if term.op == "IS NOT NULL":
        return Filter(term.column, term.op, None)
    if term.op == "IN":
        if not isinstance(term.value, tuple):
            raise InvalidArgument(f"IN on {term.column!r} in view WHERE needs a list of values, got {term.value!r}")
        return Filter(term.column, term.op, tuple(coltypes.coerce(column.type, v, term.column) for v in term.value))
    if term.value is None:
        raise InvalidArgument(f"comparison of {term.column!r} with null is never true; use IS NOT NULL")
    return Filter(term.column, term.op, coltypes.coerce(column.type, term.value, term.column))


def _check_view_key(base: Table, partition_key: tuple[str, ...], clustering_key: tuple[str, ...]) -> None:
    view_key = partition_key + clustering_key
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


def _view_columns(base: Table, selected: tuple[str, ...] | None, view_key: tuple[str, ...]) -> tuple[Column, ...]:
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


def _check_key_filters(base: Table, view_key: tuple[str, ...], filters: tuple[Filter, ...],
                       implied_not_null: bool) -> None:
    """Refuse a view key column the WHERE clause does not keep from being null, as CQL does.

    Every term is false for a null (`views.matches`), so any term on a column keeps it non-null, and the only
    partition key column of the base is never null; entries journaled before that rule (`implied_not_null`
    false) need IS NOT NULL on every view key column."""
    missing = next((c for c in view_key if c not in _non_null_columns(base, filters, implied_not_null)), None)
    if missing is not None:
        raise InvalidArgument(f"Primary key column '{missing}' is required to be filtered by 'IS NOT NULL'")


def _non_null_columns(base: Table, filters: tuple[Filter, ...], implied_not_null: bool) -> set[str]:
    if not implied_not_null:
        return {f.column for f in filters if f.op == "IS NOT NULL"}
    never_null = set(base.partition_key) if len(base.partition_key) == 1 else set()
    return never_null | {f.column for f in filters}
