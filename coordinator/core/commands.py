"""Typed group0 commands and their journal form: plain JSON-able dicts naming the command and its format version.

The Raft log and snapshots hold only `encode(command)` dicts, never pickled command classes, so moving or
renaming a class cannot break the replay of an old log. Journal form, version 2 (written by `encode`):
`{"op": <name>, "v": 2, <every field>, "cmd_id": <str or null>}`, with column specs as `[name, type]`
pairs, WHERE terms as `[column, op, value]` triples (value null for IS NOT NULL, a list for IN) and
tuples as lists. Version 1 is the untyped dict of the first releases: the same shape without "v",
where fields that have a default (and "cmd_id") may be absent. A field added to a command after entries
without it were journaled may be absent from either version: absent means its JOURNAL_ABSENT metadata (what
those entries meant), else its default. Constructors do not check field types; `decode` does, so every
command that reaches a handler through the log is well formed.
"""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from .errors import InvalidArgument

JOURNAL_VERSION = 2
LEGACY_VERSION = 1
JOURNAL_ABSENT = "journal_absent"  # field metadata: the value of an entry journaled before the field existed

Scalar = typing.Union[None, bool, int, float, str]
Value = typing.Union[Scalar, tuple[Scalar, ...]]


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type: str


@dataclass(frozen=True)
class WhereTerm:
    """One term of a view's WHERE clause as written: `value` is None for IS NOT NULL and a tuple for IN."""

    column: str
    op: str
    value: Value


@dataclass(frozen=True, kw_only=True)
class Command:
    """A group0 command; `cmd_id` (chosen by the proposer) makes a retried command apply once (None: no dedup)."""

    op: ClassVar[str]
    cmd_id: str | None


@dataclass(frozen=True, kw_only=True)
class RegisterNode(Command):
    op: ClassVar[str] = "register_node"
    node_id: str
    grpc: str
    raft: str
    shards: int
    cql: str = ""


@dataclass(frozen=True, kw_only=True)
class CreateKeyspace(Command):
    op: ClassVar[str] = "create_keyspace"
    name: str
    rf: int
    initial_tablets: int
    if_not_exists: bool = False


@dataclass(frozen=True, kw_only=True)
class AlterKeyspace(Command):
    """Change a keyspace's replication factor; `id_seed` seeds the ids of build tasks for new replicas.

    With `refuse_with_tables` (every command built now) an RF change of a keyspace that holds tables is
    refused: it would need data movement between nodes. Entries journaled before that refusal lack the field
    and replay as they applied then (resizing the tablet maps without moving data), so a node that replays the
    log from its start reaches the state of one that restored a snapshot taken after them.

    With `move_data` (every command built now) the change is accepted and only sets the keyspace's RF: the
    leader's driver then adds or removes one replica per tablet at a time, streaming rows to each new one
    (`coordinator.core.migrations`). Entries journaled before lack it and replay as they applied then.
    """

    op: ClassVar[str] = "alter_keyspace"
    name: str
    rf: int
    id_seed: str
    refuse_with_tables: bool = dataclasses.field(default=True, metadata={JOURNAL_ABSENT: False})
    move_data: bool = dataclasses.field(default=True, metadata={JOURNAL_ABSENT: False})


@dataclass(frozen=True, kw_only=True)
class CreateTable(Command):
    op: ClassVar[str] = "create_table"
    id: str
    keyspace: str
    name: str
    columns: tuple[ColumnSpec, ...]
    partition_key: tuple[str, ...]
    clustering_key: tuple[str, ...]
    if_not_exists: bool = False


@dataclass(frozen=True, kw_only=True)
class AlterTable(Command):
    """Add regular columns at the end of a base table (its stored rows hold no value for them)."""

    op: ClassVar[str] = "alter_table"
    keyspace: str
    name: str
    add: tuple[ColumnSpec, ...]


@dataclass(frozen=True, kw_only=True)
class CreateView(Command):
    """A materialized view over `base`; `columns` None selects every base column.

    With `implied_not_null` (every command built now) a view key column needs no IS NOT NULL when another WHERE
    term restricts it or it is the base's only partition key column, as in CQL. Entries journaled before lack it
    and replay under the rule they were applied with: every view key column restricted by IS NOT NULL.
    """

    op: ClassVar[str] = "create_view"
    id: str
    keyspace: str
    name: str
    base: str
    partition_key: tuple[str, ...]
    clustering_key: tuple[str, ...]
    columns: tuple[str, ...] | None = None
    where: tuple[WhereTerm, ...] = ()
    if_not_exists: bool = False
    implied_not_null: bool = dataclasses.field(default=True, metadata={JOURNAL_ABSENT: False})


@dataclass(frozen=True, kw_only=True)
class CreateIndex(Command):
    op: ClassVar[str] = "create_index"
    id: str
    keyspace: str
    name: str
    base: str
    column: str
    if_not_exists: bool = False


@dataclass(frozen=True, kw_only=True)
class DropView(Command):
    """Drop a materialized view, or an index when `is_index` (each refuses the other kind)."""

    op: ClassVar[str] = "drop_view"
    keyspace: str
    name: str
    if_exists: bool = False
    is_index: bool = False


@dataclass(frozen=True, kw_only=True)
class DropTable(Command):
    op: ClassVar[str] = "drop_table"
    keyspace: str
    name: str
    if_exists: bool = False


@dataclass(frozen=True, kw_only=True)
class DropKeyspace(Command):
    op: ClassVar[str] = "drop_keyspace"
    name: str
    if_exists: bool = False


@dataclass(frozen=True, kw_only=True)
class Noop(Command):
    op: ClassVar[str] = "noop"


@dataclass(frozen=True, kw_only=True)
class LoopCommand(Command):
    """A command of the view building loop, carrying the Raft `term` of the leader whose loop proposed it.

    `apply` refuses one whose term is older than the newest loop term it has seen, so the loop of a
    deposed leader cannot change the task table once its successor's loop has proposed anything.
    """

    term: int


@dataclass(frozen=True, kw_only=True)
class FinishViewBuildingTasks(LoopCommand):
    """Remove finished tasks (ids absent or aborted are ignored), then mark SUCCESS every STARTED node left
    without tasks of its view; with no ids it only settles those statuses."""

    op: ClassVar[str] = "finish_view_building_tasks"
    task_ids: tuple[str, ...]
    rows_scanned: tuple[int, ...] = ()  # base rows each task's batch scanned, parallel to task_ids (or empty)


@dataclass(frozen=True, kw_only=True)
class SetProcessingBase(LoopCommand):
    """Set (or clear, with None) the one base table whose views the loop builds now: the journal form of the
    releases that built one base at a time (applied as `SetProcessingBases` of that base)."""

    op: ClassVar[str] = "set_processing_base"
    base_id: str | None


@dataclass(frozen=True, kw_only=True)
class SetProcessingBases(LoopCommand):
    """Set the base tables whose views the loop builds now, in the order they were chosen (none: nothing to
    build); the loop's first command in a term, which also records that term."""

    op: ClassVar[str] = "set_processing_bases"
    base_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class StartTabletMigration(Command):
    """Begin moving replica (leaving_node, leaving_shard) of one tablet to (pending_node, pending_shard): the
    tablet enters the first migration stage and the build tasks of the leaving replica are aborted.
    `migration_id` (32 hex characters, chosen by the proposer) names the migration and seeds new task ids."""

    op: ClassVar[str] = "start_tablet_migration"
    migration_id: str
    table_id: str
    tablet_id: int
    leaving_node: str
    leaving_shard: int
    pending_node: str
    pending_shard: int
    # "move"; "add": a new replica (pending) filled from leaving, which stays (an RF increase); "remove": the last
    # replica (leaving) goes and nothing replaces it (an RF decrease; pending names leaving again)
    kind: str = "move"
    # the replica rows are streamed from when it is not the leaving one (a dead node's replica is rebuilt from a
    # surviving replica); empty: the leaving replica
    source_node: str = ""
    source_shard: int = 0


@dataclass(frozen=True, kw_only=True)
class AdvanceTabletMigration(Command):
    """Move a migration from `from_stage` to `to_stage` (the next stage, or `cleanup_target` to roll back, with
    `reason`); proposed by the leader's migration driver with its Raft `term`, refused from an older term."""

    op: ClassVar[str] = "advance_tablet_migration"
    term: int
    migration_id: str
    table_id: str
    tablet_id: int
    from_stage: str
    to_stage: str
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class SplitTablets(Command):
    """Double a table's tablet count: tablet n becomes 2n and 2n+1 on the same replicas, and each of its build
    tasks becomes one task of each half (new ids from `id_seed`)."""

    op: ClassVar[str] = "split_tablets"
    table_id: str
    id_seed: str


@dataclass(frozen=True, kw_only=True)
class RequestTabletMerge(Command):
    """Ask for a table's tablet count to be halved: the leader's driver first moves the replicas of each pair
    (2n, 2n+1) onto the same replicas, then proposes MergeTablets."""

    op: ClassVar[str] = "request_tablet_merge"
    table_id: str


@dataclass(frozen=True, kw_only=True)
class MergeTablets(Command):
    """Halve the tablet count of a table whose pairs share their replicas: tablets 2n and 2n+1 become n, their
    build tasks one task per (view, replica) of n (new ids from `id_seed`); proposed by the driver with its term."""

    op: ClassVar[str] = "merge_tablets"
    term: int
    table_id: str
    id_seed: str


@dataclass(frozen=True, kw_only=True)
class DecommissionNode(Command):
    """Start taking a node out of the cluster: every tablet replica it holds moves to other nodes, streamed from it
    (or, with `dead`, rebuilt from the surviving replicas of each tablet); then the driver removes it."""

    op: ClassVar[str] = "decommission_node"
    node_id: str
    dead: bool = False


@dataclass(frozen=True, kw_only=True)
class RemoveNode(Command):
    """Remove a decommissioned node that holds no tablet replica any more; proposed by the driver with its term
    once the node left the Raft configuration. Its id cannot join again."""

    op: ClassVar[str] = "remove_node"
    term: int
    node_id: str


@dataclass(frozen=True, kw_only=True)
class SetBalancer(Command):
    """Switch the leader's tablet load balancer on or off (`vbc balancer on|off`)."""

    op: ClassVar[str] = "set_balancer"
    enabled: bool


@dataclass(frozen=True, kw_only=True)
class SetBuildSettings(Command):
    """Change the cluster's view building settings (`vbc build config`); a field left None stays as it is."""

    op: ClassVar[str] = "set_build_settings"
    chunk_rows: int | None = None  # the base rows a batch reads (and hands to Spark) at a time
    rate_rows_per_s: int | None = None  # the base rows each node's batches read per second, at most; 0: no limit
    parallel_bases: int | None = None  # how many base tables' views are built at once


@dataclass(frozen=True, kw_only=True)
class SetViewPaused(Command):
    """Pause a view's build (no new batches; running ones stop at their next chunk) or resume it (`vbc view
    pause|resume`). Live writes maintain a paused view as any other."""

    op: ClassVar[str] = "set_view_paused"
    keyspace: str
    name: str
    paused: bool


@dataclass(frozen=True, kw_only=True)
class RecordTaskProgress(Command):
    """The base rows the running batch of each task has scanned so far (parallel tuples), reported by its worker
    chunk by chunk; a count never lowers what a task reported before."""

    op: ClassVar[str] = "record_task_progress"
    task_ids: tuple[str, ...]
    rows_scanned: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class HoldViewRows(Command):
    """Node `holder` stored view rows of `view_id` in its durable outbox for the view replicas on `targets` (it could
    not reach them when its build batch merged). The view is not built until each (holder, target) is released."""

    op: ClassVar[str] = "hold_view_rows"
    view_id: str
    holder: str
    targets: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ReleaseViewRows(Command):
    """Node `holder`'s outbox no longer holds view rows of `view_id` for `target`: it found so after group0 numbered
    that hold `hold` (`HoldViewRows`), so a hold made since (rows queued after its look) stays."""

    op: ClassVar[str] = "release_view_rows"
    view_id: str
    holder: str
    target: str
    hold: int


@dataclass(frozen=True, kw_only=True)
class RegisterStagedRows(Command):
    """Replica (`node`, `shard`) of tablet `tablet_id` (of `tablet_count`) of base table `base_id` holds staged rows
    numbered up to `through` for the tablet (the entry numbered `through` has `rows` rows): a `process_staging` task
    must move them into the base."""

    op: ClassVar[str] = "register_staged_rows"
    base_id: str
    node: str
    shard: int
    tablet_id: int
    tablet_count: int
    through: int
    rows: int = 0  # the rows of the staged entry numbered `through` (for the status)


@dataclass(frozen=True, kw_only=True)
class CreateRole(Command):
    """A role; `password_hash` is the salted slow hash the proposer made ("": no password login)."""

    op: ClassVar[str] = "create_role"
    name: str
    password_hash: str = dataclasses.field(default="", repr=False)
    login: bool = False
    superuser: bool = False
    if_not_exists: bool = False
    caller: str | None = None  # the role proposing it, checked when applied; None: the cluster (and older entries)


@dataclass(frozen=True, kw_only=True)
class AlterRole(Command):
    """Change what is given of a role (None: keep)."""

    op: ClassVar[str] = "alter_role"
    name: str
    password_hash: str | None = dataclasses.field(default=None, repr=False)
    login: bool | None = None
    superuser: bool | None = None
    caller: str | None = None  # the role proposing it, checked when applied; None: the cluster (and older entries)


@dataclass(frozen=True, kw_only=True)
class DropRole(Command):
    op: ClassVar[str] = "drop_role"
    name: str
    if_exists: bool = False
    caller: str | None = None  # the role proposing it, checked when applied; None: the cluster (and older entries)


@dataclass(frozen=True, kw_only=True)
class GrantPermissions(Command):
    """Grant `permissions` on every keyspace (keyspace None), one keyspace (table None) or one table to `role`."""

    op: ClassVar[str] = "grant_permissions"
    role: str
    permissions: tuple[str, ...]
    keyspace: str | None = None
    table: str | None = None
    caller: str | None = None  # the role proposing it, checked when applied; None: the cluster (and older entries)


@dataclass(frozen=True, kw_only=True)
class RevokePermissions(Command):
    op: ClassVar[str] = "revoke_permissions"
    role: str
    permissions: tuple[str, ...]
    keyspace: str | None = None
    table: str | None = None
    caller: str | None = None  # the role proposing it, checked when applied; None: the cluster (and older entries)


COMMANDS: tuple[type[Command], ...] = (RegisterNode, CreateKeyspace, AlterKeyspace, CreateTable, AlterTable, CreateView,
                                       CreateIndex, DropView, DropTable, DropKeyspace, Noop,
                                       FinishViewBuildingTasks, SetProcessingBase, SetProcessingBases,
                                       StartTabletMigration,
                                       AdvanceTabletMigration, SplitTablets, RequestTabletMerge, MergeTablets,
                                       DecommissionNode, RemoveNode, SetBalancer, SetBuildSettings, RecordTaskProgress,
                                       SetViewPaused, HoldViewRows, ReleaseViewRows, RegisterStagedRows,
                                       CreateRole, AlterRole,
                                       DropRole, GrantPermissions, RevokePermissions)
COMMANDS_BY_OP: dict[str, type[Command]] = {cls.op: cls for cls in COMMANDS}


# ------------------------------------------------------------------ field codecs


class _Mismatch(Exception):
    """A journal value does not have the shape of its field."""


class _Codec(NamedTuple):
    expected: str
    decode: Callable[[object], object]
    encode: Callable[[object], object]


def _is_int(raw: object) -> bool:
    return isinstance(raw, int) and not isinstance(raw, bool)


def _is_scalar(raw: object) -> bool:
    return raw is None or isinstance(raw, (bool, int, float, str))


def _require(condition: bool) -> None:
    if not condition:
        raise _Mismatch


def _items(raw: object, size: int | None = None) -> tuple:
    _require(isinstance(raw, (list, tuple)) and (size is None or len(raw) == size))
    return tuple(raw)


def _checked(predicate: Callable[[object], bool]) -> Callable[[object], object]:
    def decode(raw: object) -> object:
        _require(predicate(raw))
        return raw

    return decode


def _names(raw: object) -> tuple[str, ...]:
    names = _items(raw)
    _require(all(isinstance(n, str) for n in names))
    return names


def _integers(raw: object) -> tuple[int, ...]:
    numbers = _items(raw)
    _require(all(_is_int(n) for n in numbers))
    return numbers


def _optional_names(raw: object) -> tuple[str, ...] | None:
    return None if raw is None else _names(raw)


def _column_specs(raw: object) -> tuple[ColumnSpec, ...]:
    return tuple(ColumnSpec(*_names(_items(pair, 2))) for pair in _items(raw))


def _where_value(raw: object) -> Value:
    if isinstance(raw, (list, tuple)):
        _require(all(_is_scalar(v) for v in raw))
        return tuple(raw)
    _require(_is_scalar(raw))
    return raw


def _where_terms(raw: object) -> tuple[WhereTerm, ...]:
    terms = []
    for item in _items(raw):
        column, op, value = _items(item, 3)
        _require(isinstance(column, str) and isinstance(op, str))
        terms.append(WhereTerm(column, op, _where_value(value)))
    return tuple(terms)


def _optional_list(value: tuple | None) -> list | None:
    return None if value is None else list(value)


def _where_plain(term: WhereTerm) -> list:
    value = list(term.value) if isinstance(term.value, tuple) else term.value
    return [term.column, term.op, value]


def _identity(value: object) -> object:
    return value


_CODECS: dict[object, _Codec] = {
    str: _Codec("a string", _checked(lambda r: isinstance(r, str)), _identity),
    int: _Codec("an integer", _checked(_is_int), _identity),
    bool: _Codec("a boolean", _checked(lambda r: isinstance(r, bool)), _identity),
    str | None: _Codec("a string or null", _checked(lambda r: r is None or isinstance(r, str)), _identity),
    bool | None: _Codec("a boolean or null", _checked(lambda r: r is None or isinstance(r, bool)), _identity),
    int | None: _Codec("an integer or null", _checked(lambda r: r is None or _is_int(r)), _identity),
    tuple[str, ...]: _Codec("a list of strings", _names, list),
    tuple[int, ...]: _Codec("a list of integers", _integers, list),
    tuple[str, ...] | None: _Codec("a list of strings or null", _optional_names, _optional_list),
    tuple[ColumnSpec, ...]: _Codec("a list of [name, type] string pairs", _column_specs,
                                   lambda specs: [[c.name, c.type] for c in specs]),
    tuple[WhereTerm, ...]: _Codec("a list of [column, op, value] triples (value null, a scalar or a list of scalars)",
                                  _where_terms, lambda terms: [_where_plain(t) for t in terms]),
}


class _Field(NamedTuple):
    name: str
    codec: _Codec
    legacy_default: object  # what an entry without this field means (version 1, or added since); _REQUIRED if it must be there


_REQUIRED = object()
# Fields added to a version 2 command after entries without them were journaled: absent means the value of
# the field's JOURNAL_ABSENT metadata, else its default.
ADDED_WITH_DEFAULT = frozenset({"rows_scanned", "refuse_with_tables", "kind", "move_data", "source_node",
                                "source_shard", "implied_not_null", "caller"})
_ENVELOPE = ("op", "v")


def _legacy_default(field: dataclasses.Field) -> object:
    if field.name == "cmd_id":
        return None
    if JOURNAL_ABSENT in field.metadata:
        return field.metadata[JOURNAL_ABSENT]
    return _REQUIRED if field.default is dataclasses.MISSING else field.default


def _fields_of(cls: type[Command]) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    fields = []
    for field in dataclasses.fields(cls):
        codec = _CODECS.get(hints[field.name])
        if codec is None:
            raise TypeError(f"{cls.__name__}.{field.name}: no journal codec for {hints[field.name]!r}")
        fields.append(_Field(field.name, codec, _legacy_default(field)))
    return tuple(fields)


_FIELDS: dict[type[Command], tuple[_Field, ...]] = {cls: _fields_of(cls) for cls in COMMANDS}


# ------------------------------------------------------------------ encode / decode


def encode(command: Command) -> dict:
    """The journal form of `command`: a dict of plain JSON-able values."""
    body = {field.name: field.codec.encode(getattr(command, field.name)) for field in _FIELDS[type(command)]}
    return {"op": command.op, "v": JOURNAL_VERSION, **body}


def decode(entry: object) -> Command:
    """The typed command of a journal entry (version 1 or 2); InvalidArgument naming op and field if malformed."""
    if not isinstance(entry, dict):
        raise InvalidArgument(f"malformed command: expected a dict, got {type(entry).__name__}")
    if "op" not in entry:
        raise InvalidArgument("malformed command: missing field 'op'")
    op = entry["op"]
    cls = COMMANDS_BY_OP.get(op) if isinstance(op, str) else None
    if cls is None:
        raise InvalidArgument(f"unknown command {op!r}")
    version = _version_of(op, entry)
    fields = _FIELDS[cls]
    unexpected = sorted(set(entry) - set(_ENVELOPE) - {f.name for f in fields})
    if unexpected:
        raise InvalidArgument(f"malformed {op} command: unexpected field {unexpected[0]!r}")
    return cls(**{field.name: _decode_field(op, field, entry, version) for field in fields})


def cmd_id_of(entry: Command | dict) -> str | None:
    """The dedup id of a typed command or journal entry, read without decoding it (None if absent or unusable)."""
    cmd_id = entry.cmd_id if isinstance(entry, Command) else entry.get("cmd_id") if isinstance(entry, dict) else None
    return cmd_id if isinstance(cmd_id, str) else None


def _version_of(op: str, entry: dict) -> int:
    version = entry.get("v", LEGACY_VERSION)
    if not _is_int(version) or version not in (LEGACY_VERSION, JOURNAL_VERSION):
        raise InvalidArgument(f"malformed {op} command: unsupported version {version!r} "
                              f"(this node reads versions {LEGACY_VERSION} to {JOURNAL_VERSION})")
    return version


def _decode_field(op: str, field: _Field, entry: dict, version: int) -> object:
    if field.name not in entry:
        if version == LEGACY_VERSION and field.legacy_default is not _REQUIRED:
            return field.legacy_default
        if field.name in ADDED_WITH_DEFAULT:
            return field.legacy_default
        raise InvalidArgument(f"malformed {op} command: missing field {field.name!r}")
    raw = entry[field.name]
    try:
        return field.codec.decode(raw)
    except _Mismatch:
        raise InvalidArgument(f"malformed {op} command: field {field.name!r} must be {field.codec.expected}, "
                              f"got {_brief(raw)}") from None


def _brief(raw: object) -> str:
    text = repr(raw)
    return text if len(text) <= 80 else text[:77] + "..."
