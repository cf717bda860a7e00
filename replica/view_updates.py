"""The view updates of one base write: which view rows change, and which view replica each update goes to.

Pairing: the base replica at position i of its tablet's replica list sends to the view replica at position i
of the view tablet owning the view row, so every base replica feeds exactly one replica of each view row. While a
tablet moves (`coordinator.core.migrations`), its pending replica holds the leaving one's position: a moving base
replica's pending node feeds the same view replica once its rows are complete, and an update for a moving view
replica goes to the leaving and the pending one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from common.replica_messages import RowBatch
from coordinator.core.errors import Unavailable
from coordinator.core.migrations import (
    TabletTransition,
    feeding_count,
    feeds_no_view,
    paired_targets,
    position_in,
    transitions_of_table,
)
from coordinator.core.schema import Replica, Table
from coordinator.core.state import Group0State
from coordinator.core.tokens import tablet_of
from coordinator.core.views import ViewChange, view_changes
from storage.cells import Row

from replica.rows import delete_row, upsert_row, visible_row


@dataclass(frozen=True)
class WriteContext:
    """What one base write needs from the schema, read atomically with the schema version."""

    schema_version: int
    table: Table
    views: tuple[Table, ...]
    base_replicas: tuple[tuple[Replica, ...], ...]
    view_replicas: dict[str, tuple[tuple[Replica, ...], ...]]
    base_moves: dict[int, TabletTransition] = field(default_factory=dict)  # by base tablet
    view_moves: dict[str, dict[int, TabletTransition]] = field(default_factory=dict)  # by view id, view tablet


def write_context(state: Group0State, table_id: str) -> WriteContext | None:
    """The write context of table `table_id` in `state`, or None when the table does not exist (dropped)."""
    table = state.tables.get(table_id)
    if table is None:
        return None
    views = tuple(state.views_of(table_id))
    return WriteContext(state.schema_version, table, views, state.tablets[table_id].replicas,
                        {v.id: state.tablets[v.id].replicas for v in views}, transitions_of_table(state, table_id),
                        {v.id: transitions_of_table(state, v.id) for v in views})


def pair_index(context: WriteContext, node_id: str, token: int) -> int:
    """The position of `node_id` among the replicas of the base tablet owning `token` (a pending replica: the
    leaving one's position)."""
    tablet = tablet_of(token, len(context.base_replicas))
    position = position_in(context.base_replicas[tablet], context.base_moves.get(tablet), node_id)
    if position is not None:
        return position
    raise Unavailable(f"node {node_id} is not a replica of the tablet owning token {token} of "
                      f"{context.table.qualified_name}; the writer's tablet map is stale, retry")


def view_updates(context: WriteContext, node_id: str, old: Row | None, new: Row,
                 filled: bool = False) -> list[tuple[str, RowBatch]]:
    """(target node, one-row batch) for every view row that changes when base row `old` becomes `new`.

    The view rows are written at `new.view_ts`, the replica-local version of this change of the base row. A pending
    replica still being filled makes none, unless `filled` (a stream gave it the row's state at its source).
    """
    pair = pair_index(context, node_id, new.token)
    tablet = tablet_of(new.token, len(context.base_replicas))
    if feeds_no_view(context.base_moves.get(tablet), node_id, filled):
        return []  # a filling replica's leaving one makes them; a removed replica's view position is fed by position 0
    base_count = feeding_count(context.base_replicas[tablet], context.base_moves.get(tablet))
    old_values, new_values = visible_row(context.table, old), visible_row(context.table, new)
    return [update
            for view in context.views
            for change in view_changes(view, old_values, new_values)
            for update in _view_update(context, view, change, new.view_ts, pair, base_count)]


def _view_update(context: WriteContext, view: Table, change: ViewChange, ts: int, pair: int,
                 base_count: int) -> list[tuple[str, RowBatch]]:
    row = delete_row(view, change.key, ts) if change.is_delete else upsert_row(view, change.values, ts)
    return [(target.node, RowBatch(table_id=view.id, shard=target.shard, rows=(row,),
                                   schema_version=context.schema_version))
            for target in view_targets(context.view_replicas[view.id], context.view_moves.get(view.id, {}),
                                       row.token, pair, base_count)]


def view_targets(view_map: tuple[tuple[Replica, ...], ...], moves: dict[int, TabletTransition], token: int,
                 pair: int, base_count: int) -> tuple[Replica, ...]:
    """The view replicas a view row at `token` from base position `pair` (of `base_count`) goes to: the paired
    positions (`migrations.paired_positions`) of the view tablet owning the row, moving replicas included."""
    tablet = tablet_of(token, len(view_map))
    return paired_targets(view_map[tablet], moves.get(tablet), pair, base_count)
