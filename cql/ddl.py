"""Schema statements (CREATE/ALTER/DROP of keyspaces, tables, views and indexes) as group0 commands."""
from __future__ import annotations

import uuid
from collections.abc import Callable

from common.injection import Injections
from coordinator.core.commands import (
    AlterKeyspace,
    AlterTable,
    ColumnSpec,
    Command,
    CreateIndex,
    CreateKeyspace,
    CreateTable,
    CreateView,
    DropKeyspace,
    DropTable,
    DropView,
    WhereTerm,
)
from coordinator.core.errors import InvalidArgument

from . import ast
from .catalog import Group0Client, keyspace_of
from .keyspaces import DATA_CENTER
from .result import Result

DEFAULT_INITIAL_TABLETS = 8
DDL_TIMEOUT = 20.0

# Waits until every other node has applied a schema version; the nodes that did not (with why) when it gave up.
SchemaAgreement = Callable[[int], list[str]]


class SchemaStatements:
    """Turns each schema statement into one group0 command and its outcome into a message.

    With a `schema_agreement`, a statement returns once every node applied the new schema (as CQL drivers wait
    for schema agreement after DDL), so a statement run next on any node finds it; a node that did not confirm
    in time is named in the message (the change is committed: that node applies it when it catches up)."""

    def __init__(self, group0: Group0Client, injections: Injections,
                 schema_agreement: SchemaAgreement | None = None):
        self._group0 = group0
        self._injections = injections
        self._schema_agreement = schema_agreement

    def run(self, statement: ast.Statement) -> Result:
        before = self._schema_version()
        result = _HANDLERS[type(statement)](self, statement)
        version = self._schema_version()
        if self._schema_agreement is None or version == before:  # IF [NOT] EXISTS with nothing to do
            return result
        disagreeing = self._schema_agreement(version)
        if disagreeing:
            result.message += (f"; not yet confirmed by {'; '.join(disagreeing)} (the change is committed: "
                               "a node applies it when it catches up)")
        return result

    def _schema_version(self) -> int:
        return self._group0.read(lambda state: state.schema_version)

    def _propose(self, command: Command) -> object:
        self._injections.hit("ddl.before_propose")
        outcome = self._group0.propose(command, timeout=DDL_TIMEOUT)
        if not outcome.ok:
            raise outcome.error
        return outcome.value

    def _create_keyspace(self, s: ast.CreateKeyspace) -> Result:
        rf = _replication_factor(s.replication)
        tablets = _initial_tablets(s.tablets)
        value = self._propose(CreateKeyspace(name=s.name, rf=rf, initial_tablets=tablets,
                                             if_not_exists=s.if_not_exists, cmd_id=new_id()))
        return _message("created", "keyspace", s.name, value)

    def _alter_keyspace(self, s: ast.AlterKeyspace) -> Result:
        rf = _replication_factor(s.replication)
        value = self._propose(AlterKeyspace(name=s.name, rf=rf, id_seed=new_id(), cmd_id=new_id()))
        result = _message("altered", "keyspace", s.name, value)
        if isinstance(value, str) and value.startswith("altered; "):
            result.message += (f": {value.removeprefix('altered; ')}, one tablet at a time in the background "
                               f"(`vbc status` lists the operations; `vbc tablets {s.name}.TABLE` shows each tablet)")
        return result

    def _create_table(self, s: ast.CreateTable) -> Result:
        keyspace = keyspace_of(s.table)
        value = self._propose(CreateTable(
            id=new_id(), keyspace=keyspace, name=s.table.name,
            columns=tuple(ColumnSpec(c.name, c.type) for c in s.columns), partition_key=tuple(s.partition_key),
            clustering_key=tuple(s.clustering_key), if_not_exists=s.if_not_exists, cmd_id=new_id(),
        ))
        return _message("created", "table", f"{keyspace}.{s.table.name}", value)

    def _alter_table(self, s: ast.AlterTable) -> Result:
        keyspace = keyspace_of(s.table)
        value = self._propose(AlterTable(keyspace=keyspace, name=s.table.name,
                                         add=tuple(ColumnSpec(c.name, c.type) for c in s.add), cmd_id=new_id()))
        return _message("altered", "table", f"{keyspace}.{s.table.name}", value)

    def _create_view(self, s: ast.CreateView) -> Result:
        keyspace = keyspace_of(s.view)
        if s.base.keyspace not in (None, keyspace):
            raise InvalidArgument(f"a view must be in the keyspace of its base table ({s.base.keyspace}), not {keyspace}")
        value = self._propose(CreateView(
            id=new_id(), keyspace=keyspace, name=s.view.name, base=s.base.name,
            columns=tuple(s.columns) if s.columns is not None else None,
            where=tuple(WhereTerm(r.column, r.op, r.value) for r in s.where), partition_key=tuple(s.partition_key),
            clustering_key=tuple(s.clustering_key), if_not_exists=s.if_not_exists, cmd_id=new_id(),
        ))
        return _message("created", "materialized view", f"{keyspace}.{s.view.name}", value)

    def _create_index(self, s: ast.CreateIndex) -> Result:
        keyspace = keyspace_of(s.table)
        name = s.name or f"{s.table.name}_{s.column}_idx"
        value = self._propose(CreateIndex(id=new_id(), keyspace=keyspace, name=name, base=s.table.name,
                                          column=s.column, if_not_exists=s.if_not_exists, cmd_id=new_id()))
        return _message("created", "index", f"{keyspace}.{name}", value)

    def _drop_keyspace(self, s: ast.DropKeyspace) -> Result:
        value = self._propose(DropKeyspace(name=s.name, if_exists=s.if_exists, cmd_id=new_id()))
        return _message("dropped", "keyspace", s.name, value)

    def _drop_table(self, s: ast.DropTable) -> Result:
        keyspace = keyspace_of(s.table)
        value = self._propose(DropTable(keyspace=keyspace, name=s.table.name, if_exists=s.if_exists, cmd_id=new_id()))
        return _message("dropped", "table", f"{keyspace}.{s.table.name}", value)

    def _drop_view(self, s: ast.DropView) -> Result:
        keyspace = keyspace_of(s.view)
        value = self._propose(DropView(keyspace=keyspace, name=s.view.name, if_exists=s.if_exists, cmd_id=new_id()))
        return _message("dropped", "materialized view", f"{keyspace}.{s.view.name}", value)

    def _drop_index(self, s: ast.DropIndex) -> Result:
        keyspace = keyspace_of(s.index)
        value = self._propose(DropView(keyspace=keyspace, name=s.index.name, if_exists=s.if_exists, is_index=True,
                                       cmd_id=new_id()))
        return _message("dropped", "index", f"{keyspace}.{s.index.name}", value)


def new_id() -> str:
    """A command's or object's id: 32 random hex characters."""
    return uuid.uuid4().hex


def _message(verb: str, kind: str, name: str, value: object) -> Result:
    if value == "exists":
        return Result(message=f"{kind} {name} already exists (IF NOT EXISTS): nothing done")
    if value == "absent":
        return Result(message=f"{kind} {name} does not exist (IF EXISTS): nothing done")
    return Result(message=f"{verb} {kind} {name}")


def _replication_factor(options: dict) -> int:
    unknown = set(options) - {"rf", "replication_factor", "class", DATA_CENTER}
    if unknown:
        raise InvalidArgument(f"unknown replication option(s) {', '.join(sorted(unknown))}; use {{'rf': N}} (or "
                              f"{{'class': 'NetworkTopologyStrategy', '{DATA_CENTER}': N}}: the cluster is one data "
                              "center)")
    value = options.get("rf", options.get("replication_factor", options.get(DATA_CENTER)))
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"replication needs an integer 'rf' (e.g. {{'rf': 3}}), got {value!r}")
    return value


def _initial_tablets(options: dict) -> int:
    unknown = set(options) - {"initial"}
    if unknown:
        raise InvalidArgument(f"unknown tablets option(s) {', '.join(sorted(unknown))}; use {{'initial': N}}")
    value = options.get("initial", DEFAULT_INITIAL_TABLETS)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"tablets needs an integer 'initial' (e.g. {{'initial': 8}}), got {value!r}")
    return value


_HANDLERS = {
    ast.CreateKeyspace: SchemaStatements._create_keyspace,
    ast.AlterKeyspace: SchemaStatements._alter_keyspace,
    ast.CreateTable: SchemaStatements._create_table,
    ast.AlterTable: SchemaStatements._alter_table,
    ast.CreateView: SchemaStatements._create_view,
    ast.CreateIndex: SchemaStatements._create_index,
    ast.DropKeyspace: SchemaStatements._drop_keyspace,
    ast.DropTable: SchemaStatements._drop_table,
    ast.DropView: SchemaStatements._drop_view,
    ast.DropIndex: SchemaStatements._drop_index,
}
