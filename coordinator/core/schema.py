"""Immutable records of the replicated state: nodes, keyspaces, tables, views, tablets and view-building tasks."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .errors import CoreError, error_from_code

NODE_NORMAL = "normal"
NODE_LEAVING = "leaving"  # decommissioned: its replicas move away (streamed from it), then it is removed
NODE_REMOVING = "removing"  # gone for good: its replicas are rebuilt elsewhere from the surviving ones
TASK_BUILD_RANGE = "build_range"
TASK_PROCESS_STAGING = "process_staging"
BUILD_STARTED = "STARTED"
BUILD_SUCCESS = "SUCCESS"


@dataclass(frozen=True)
class Node:
    id: str
    grpc: str
    raft: str
    shards: int
    state: str = NODE_NORMAL
    cql: str = ""  # HOST:PORT of its CQL native protocol server ("": it serves none)


@dataclass(frozen=True)
class Keyspace:
    name: str
    rf: int
    initial_tablets: int


@dataclass(frozen=True)
class Column:
    name: str
    type: str


@dataclass(frozen=True)
class Filter:
    """One term of a view's WHERE clause: `column op value` (value is a tuple for IN, None for IS NOT NULL)."""

    column: str
    op: str
    value: object


@dataclass(frozen=True)
class ViewDef:
    """What makes a table a view: its base and the function from a base row to a view row."""

    base_id: str
    where: tuple[Filter, ...]
    is_index: bool = False


@dataclass(frozen=True)
class Table:
    """A base table, or a view when `view` is set (a view is a table whose rows derive from one base row)."""

    id: str
    keyspace: str
    name: str
    columns: tuple[Column, ...]
    partition_key: tuple[str, ...]
    clustering_key: tuple[str, ...]
    view: ViewDef | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.keyspace}.{self.name}"

    # Cached (the write path asks for these per row); a cached value is derived from the fields and not a field.
    @cached_property
    def primary_key(self) -> tuple[str, ...]:
        return self.partition_key + self.clustering_key

    @cached_property
    def regular_columns(self) -> tuple[Column, ...]:
        keys = set(self.primary_key)
        return tuple(c for c in self.columns if c.name not in keys)

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)

    def column_type(self, name: str) -> str:
        column = self.column(name)
        assert column is not None, name
        return column.type

    @cached_property
    def partition_key_types(self) -> tuple[str, ...]:
        return tuple(self.column_type(n) for n in self.partition_key)


@dataclass(frozen=True, order=True)
class Replica:
    node: str
    shard: int

    def __str__(self) -> str:
        return f"{self.node}:{self.shard}"


@dataclass(frozen=True)
class TabletMap:
    """The tablets of one table: `replicas[i]` lists the replicas of tablet i (ordered: the pairing index)."""

    table_id: str
    replicas: tuple[tuple[Replica, ...], ...]

    @property
    def tablet_count(self) -> int:
        return len(self.replicas)


@dataclass(frozen=True)
class Task:
    """One view building task. `build_range`: `replica` of base tablet `tablet_id` delivers the view's rows to the
    view replicas its position feeds. `process_staging` (no view): `replica` moves its staged rows of the tablet into
    the base (`coordinator.core.staging`). A `repair` task also deletes the view rows those replicas hold that its base rows do not imply,
    and orders its rows after any they hold (a lost feeder's updates: `worker.view_repair`)."""

    id: str
    type: str
    base_id: str
    view_id: str | None
    replica: Replica
    tablet_id: int
    aborted: bool = False
    repair: bool = False
    staged_through: int = 0  # process_staging: the highest staging number of the replica's tablet it covers
    staged_rows: int = 0  # process_staging: the rows of the registration that made it (for the status)


@dataclass(frozen=True)
class Outcome:
    """The result of applying one command: a value, or an error code and message."""

    value: object = None
    error_code: str | None = None
    error_message: str | None = None
    error_kind: str | None = None  # the class name of the typed refusal (`StaleTerm`, say); see `error`

    @property
    def ok(self) -> bool:
        return self.error_code is None

    @property
    def error(self) -> CoreError | None:
        """The refusal as a typed error (`StaleTerm`, `NotFound`, ...), None when the command was applied."""
        return None if self.ok else error_from_code(self.error_code, self.error_message or "", self.error_kind)
