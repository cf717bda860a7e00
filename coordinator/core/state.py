"""The replicated group0 state, its deterministic `apply(command)` and the read-only queries other layers use.

`apply` takes a journal entry (the dict `commands.encode` writes, or a version 1 dict of the first
releases) or a typed command, and dispatches by command class to a handler of the concern that owns
the fields it changes: `tablets` (nodes, tablet maps), `ddl` (keyspaces, tables, views, indexes),
`view_building` (build tasks and statuses) and `auth` (roles and grants). A handler changes only its own
concern's fields and calls other concerns through their public functions. Every id and timestamp a command
needs is chosen by the proposing node and travels inside the command; `apply` never reads a clock or draws a
random number, so every replica fed the same log reaches the same state. A command applied twice (a retry
after a leader change) returns the first outcome and changes nothing.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator

from . import auth, balancer, build_settings, ddl, invariants, migrations, resize, staging, tablets, view_building
from .commands import (
    AlterKeyspace,
    AlterRole,
    AdvanceTabletMigration,
    AlterTable,
    Command,
    CreateIndex,
    CreateKeyspace,
    CreateRole,
    CreateTable,
    CreateView,
    DropKeyspace,
    DropRole,
    DropTable,
    DropView,
    FinishViewBuildingTasks,
    DecommissionNode,
    GrantPermissions,
    HoldViewRows,
    RegisterStagedRows,
    MergeTablets,
    Noop,
    RegisterNode,
    RemoveNode,
    RequestTabletMerge,
    RevokePermissions,
    SetBalancer,
    SetBuildSettings,
    RecordTaskProgress,
    ReleaseViewRows,
    SetViewPaused,
    SetProcessingBase,
    SetProcessingBases,
    SplitTablets,
    StartTabletMigration,
    cmd_id_of,
    decode,
)
from .errors import CoreError, NotFound
from .schema import Keyspace, Node, Outcome, Table, TabletMap, Task

REMEMBERED_COMMANDS = 4096


class Group0State:
    """Schema, nodes, tablet maps, view-building tasks and build statuses, changed only by `apply`.

    Snapshots pickle this object: keep its class path and attribute names, and give new fields an
    empty value in __init__ (a snapshot written before they existed restores them empty).
    """

    def __init__(self) -> None:
        # owned by tablets.py
        self.nodes: dict[str, Node] = {}
        self.removed_nodes: set[str] = set()  # ids of nodes removed from the cluster: they cannot come back
        self.balancer_enabled = True  # the leader spreads tablet replicas evenly (balancer.py)
        self.deaths_declared = 0  # nodes declared dead so far (their undelivered view updates were lost)
        self.tablets: dict[str, TabletMap] = {}
        # owned by ddl.py
        self.keyspaces: dict[str, Keyspace] = {}
        self.tables: dict[str, Table] = {}
        self.dropped_tables: set[str] = set()  # ids of dropped tables and views, so nodes drop their storage
        self.schema_version = 0
        # owned by view_building.py
        self.tasks: dict[str, Task] = {}
        self.build_status: dict[tuple[str, str], str] = {}
        self.tasks_created: dict[str, int] = {}
        self.processing_bases: tuple[str, ...] = ()  # the base tables whose views are built now, in order chosen
        self.rows_done: dict[str, int] = {}  # view id -> base rows scanned by its tasks' batches (never lowered)
        self.task_rows: dict[str, int] = {}  # running task id -> the base rows its batch reported scanned so far
        self.paused_views: set[str] = set()  # views whose build is paused (`vbc view pause`)
        # (view, holder node, target node) -> hold number: view rows waiting in the holder's outbox for the target
        self.held_view_rows: dict[tuple[str, str, str], int] = {}
        self.holds_made = 0
        # owned by build_settings.py
        self.build_settings = build_settings.BuildSettings()
        # the newest Raft term of a view building loop command applied: a fence, not schema data (so private,
        # and out of the journal-replay comparisons); 0 until a loop proposed anything
        self._view_building_term = 0
        # owned by migrations.py: tablets on the move, how recent migrations ended, the driver's newest term
        self.transitions: dict[tuple[str, int], migrations.TabletTransition] = {}
        self.migration_results = migrations.new_results()
        self._migration_term = 0
        # owned by resize.py: tables waiting for their tablet pairs to share replicas, then to merge
        self.merge_requests: set[str] = set()
        # owned by auth.py: roles by name, and role -> resource -> granted permissions
        self.roles: dict[str, auth.Role] = auth.initial_roles()
        self.grants: dict[str, dict[auth.Resource, frozenset[str]]] = {}
        # owned by this module: outcomes of recent commands, by cmd_id
        self._recent: OrderedDict[str, Outcome] = OrderedDict()

    def __setstate__(self, saved: dict) -> None:
        """Restore a snapshot, giving fields added since it was written their empty value (and the one processing
        base of older releases as a set of one)."""
        self.__init__()
        if "processing_base" in saved:
            saved = dict(saved)
            base = saved.pop("processing_base")
            saved.setdefault("processing_bases", (base,) if base else ())
        self.__dict__.update(saved)

    # ----------------------------------------------------------------- apply

    def member_id(self, raft_addr: str) -> str | None:
        """The id of the node whose Raft address is `raft_addr`, if it is a node of the cluster."""
        return next((node.id for node in self.nodes.values() if node.raft == raft_addr), None)

    def apply(self, command: Command | dict) -> Outcome:
        """Apply a journal entry or a typed command. Refusals are outcomes; a handler bug raises."""
        cmd_id = cmd_id_of(command)
        if cmd_id is not None and cmd_id in self._recent:
            return self._recent[cmd_id]
        outcome = self._run(command)
        if cmd_id is not None:
            self._remember(cmd_id, outcome)
        return outcome

    def _run(self, command: Command | dict) -> Outcome:
        try:
            typed = command if isinstance(command, Command) else decode(command)
            return Outcome(value=_HANDLERS[type(typed)](self, typed))
        except CoreError as error:
            return Outcome(error_code=error.code, error_message=error.message, error_kind=type(error).__name__)

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
        return view_building.tasks_of_view(self, view_id)

    def view_is_built(self, view_id: str) -> bool:
        return view_building.is_built(self, view_id)

    def view_progress(self, view_id: str) -> dict:
        return view_building.progress(self, view_id)

    def digest(self) -> str:
        """A hash of everything replicated (every field): equal on two members that applied the same commands,
        whatever order their sets and restored dumps keep."""
        return hashlib.sha256(json.dumps(_canonical(vars(self)), separators=(",", ":")).encode()).hexdigest()[:32]

    def validate(self) -> None:
        """Raise AssertionError when the state contradicts an invariant (`invariants.py`); tests call it after every
        command."""
        invariants.validate(self)

    @property
    def view_building_term(self) -> int:
        """The newest term of a view building loop command applied; older loops' commands are refused."""
        return self._view_building_term


def _noop(state: Group0State, cmd: Noop) -> None:
    return None


def _remove_node(state: Group0State, cmd: RemoveNode) -> None:
    migrations.check_term(state, cmd.term)
    tablets.remove_node(state, cmd)
    migrations.record_term(state, cmd.term)


_HANDLERS: dict[type[Command], Callable[[Group0State, Command], object]] = {
    RegisterNode: tablets.register_node,
    CreateKeyspace: ddl.create_keyspace,
    AlterKeyspace: ddl.alter_keyspace,
    CreateTable: ddl.create_table,
    AlterTable: ddl.alter_table,
    CreateView: ddl.create_view,
    CreateIndex: ddl.create_index,
    DropView: ddl.drop_view,
    DropTable: ddl.drop_table,
    DropKeyspace: ddl.drop_keyspace,
    Noop: _noop,
    FinishViewBuildingTasks: view_building.finish_tasks,
    SetProcessingBase: view_building.set_processing_base,
    SetProcessingBases: view_building.set_processing_bases,
    StartTabletMigration: migrations.start_migration,
    AdvanceTabletMigration: migrations.advance_migration,
    SplitTablets: resize.split_tablets,
    RequestTabletMerge: resize.request_merge,
    MergeTablets: resize.merge_tablets,
    DecommissionNode: tablets.decommission_node,
    RemoveNode: _remove_node,
    SetBalancer: balancer.set_balancer,
    SetBuildSettings: build_settings.set_build_settings,
    RecordTaskProgress: view_building.record_task_progress,
    SetViewPaused: view_building.set_view_paused,
    HoldViewRows: view_building.hold_view_rows,
    ReleaseViewRows: view_building.release_view_rows,
    RegisterStagedRows: staging.register_staged_rows,
    CreateRole: auth.create_role,
    AlterRole: auth.alter_role,
    DropRole: auth.drop_role,
    GrantPermissions: auth.grant,
    RevokePermissions: auth.revoke,
}


def _canonical(value):
    """`value` as JSON-able data that does not depend on set or dict order (an OrderedDict keeps its order)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [type(value).__name__, {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}]
    if isinstance(value, OrderedDict):
        return [[_canonical(k), _canonical(v)] for k, v in value.items()]
    if isinstance(value, dict):
        return sorted(([_canonical(k), _canonical(v)] for k, v in value.items()), key=_order)
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=_order)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, enum.Enum):
        return _canonical(value.value)
    return [type(value).__name__, _canonical(vars(value))]


def _order(value) -> str:
    return json.dumps(value, sort_keys=True)
