"""Tablet split and merge: doubling or halving one table's tablet count, and the build tasks that follow.

Owns the `merge_requests` field of Group0State. Rows never move on a split or a merge: a node's store keeps a table's
rows by token, whatever the tablet count, and tablet *n* of 2^k covers exactly tablets *2n* and *2n+1* of 2^(k+1).
A split keeps every replica (the halves inherit the tablet's replica list, so the pairing positions too). A merge
needs both halves on the same replicas: a merge request waits while the leader's driver moves replicas of *2n+1*
onto those of *2n* (ordinary migrations), then MergeTablets gives *n* the replica list of *2n*. Views keep their own
tablet maps: splitting a base table leaves its views' maps as they are, and a view can be split on its own.

Base replica *i* feeds view replica *i*. When *2n+1* held the replicas of *2n* in another order, its range gets new
feeders at the positions whose node changed: a write applied on some replicas only (refused, retried later) left the
base replicas different there, and the view replicas fed by the old position's history would keep rows the new one
never deletes. Those positions get repair tasks (`view_building.ensure_repair_task`), as after a lost feeder.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import migrations, staging, view_building
from .commands import MergeTablets, RequestTabletMerge, SplitTablets
from .errors import FailedPrecondition, InvalidArgument, NotFound
from .ids import check_id, derived_id
from .schema import NODE_NORMAL, Replica, Table, TabletMap
from .tablets import MAX_TABLETS

if TYPE_CHECKING:
    from .state import Group0State

Move = tuple[int, Replica, Replica]  # (tablet, leaving, pending)


def split_tablets(state: Group0State, cmd: SplitTablets) -> int:
    """Split every tablet of the table in two; the new tablet count."""
    check_id(cmd.id_seed)
    table, tablet_map = _table(state, cmd.table_id)
    count = tablet_map.tablet_count * 2
    if count > MAX_TABLETS:
        raise InvalidArgument(f"{table.qualified_name} has {tablet_map.tablet_count} tablets; a split would exceed "
                              f"the limit of {MAX_TABLETS}")
    _check_quiet(state, table, "split")
    if table.id in state.merge_requests:
        raise FailedPrecondition(f"{table.qualified_name} is waiting to merge its tablets; split it after the merge")
    state.tablets[table.id] = TabletMap(table.id, tuple(r for r in tablet_map.replicas for _ in (0, 1)))
    view_building.split_tasks(state, table.id, cmd.id_seed)
    state.schema_version += 1
    return count


def request_merge(state: Group0State, cmd: RequestTabletMerge) -> int:
    """Record the wish to halve the table's tablets; the tablet count it will have."""
    table, tablet_map = _table(state, cmd.table_id)
    if tablet_map.tablet_count < 2:
        raise InvalidArgument(f"{table.qualified_name} has one tablet: there is nothing to merge")
    state.merge_requests.add(table.id)
    return tablet_map.tablet_count // 2


def merge_tablets(state: Group0State, cmd: MergeTablets) -> int:
    """Merge the co-located pairs of a table whose merge was requested; the new tablet count."""
    check_id(cmd.id_seed)
    migrations.check_term(state, cmd.term)
    table, tablet_map = _table(state, cmd.table_id)
    if table.id not in state.merge_requests:
        raise FailedPrecondition(f"no merge of {table.qualified_name} was requested")
    _check_quiet(state, table, "merge")
    if not pairs_co_located(state, table.id):
        raise FailedPrecondition(f"the tablet pairs of {table.qualified_name} do not share their replicas yet")
    if not pairs_keep_positions(state, table.id) and table.view is not None and not view_building.is_built(state,
                                                                                                          table.id):
        raise FailedPrecondition(f"view {table.qualified_name} is being built and its tablet pairs hold their replicas "
                                 "in another order: its tablets merge once it is built")
    migrations.record_term(state, cmd.term)
    state.merge_requests.discard(table.id)
    state.tablets[table.id] = TabletMap(table.id, tablet_map.replicas[::2])
    view_building.merge_tasks(state, table.id, cmd.id_seed, tablet_map.replicas)
    _repair_new_feeders(state, table, tablet_map.replicas, derived_id(cmd.id_seed, "reordered"))
    state.schema_version += 1
    return tablet_map.tablet_count // 2


def _repair_new_feeders(state: Group0State, table: Table, halves: tuple[tuple[Replica, ...], ...], seed: str) -> None:
    """Repair tasks where the merged tablet feeds a view position from another node than *2n+1* did: on that base
    replica for every view of a base table; for every feeder of that position of a view."""
    for even in range(0, len(halves) - 1, 2):
        for position in reordered_positions(halves[even], halves[even + 1]):
            if table.view is None:
                view_building.rebuild_replica(state, table.id, even // 2, halves[even][position], seed)
            else:
                migrations.repair_view_position(state, table, position, seed)


def reordered_positions(wanted: tuple[Replica, ...], held: tuple[Replica, ...]) -> list[int]:
    """The positions at which `held` has another node than `wanted`."""
    return [position for position, (w, h) in enumerate(zip(wanted, held, strict=True)) if w.node != h.node]


def merge_moves(state: Group0State, table_id: str) -> list[Move]:
    """The migrations that put each tablet 2n+1 on the replicas of 2n: a replica on the same node first (a move
    between shards), the others in order; at most the first pending move of each pair matters at a time. A pair
    with a replica on a departing node, or whose halves have different replica counts, waits (none for it yet)."""
    replicas = state.tablets[table_id].replicas
    departing = {n.id for n in state.nodes.values() if n.state != NODE_NORMAL}
    moves = []
    for even in range(0, len(replicas) - 1, 2):
        wanted, held = replicas[even], replicas[even + 1]
        if len(wanted) != len(held) or any(r.node in departing for r in wanted + held):
            continue  # an RF change or a drain reshapes the pair first (`migrations.replication_moves`, `drain_moves`)
        targets = [r for r in wanted if r not in held]
        leaving = [r for r in held if r not in wanted]
        for replica in sorted(leaving, key=lambda r: all(t.node != r.node for t in targets)):
            target = next((t for t in targets if t.node == replica.node), targets[0])
            targets.remove(target)
            moves.append((even + 1, replica, target))
    return moves


def pairs_co_located(state: Group0State, table_id: str) -> bool:
    """Whether every tablet 2n+1 holds the same replicas as 2n (in any order: tasks are merged by position)."""
    replicas = state.tablets[table_id].replicas
    return all(set(replicas[even]) == set(replicas[even + 1]) for even in range(0, len(replicas) - 1, 2))


def pairs_keep_positions(state: Group0State, table_id: str) -> bool:
    """Whether every tablet 2n+1 holds the replicas of 2n in the same order (a merge changes no pairing position)."""
    replicas = state.tablets[table_id].replicas
    return all(replicas[even] == replicas[even + 1] for even in range(0, len(replicas) - 1, 2))


def can_merge(state: Group0State, table_id: str) -> bool:
    """Whether `MergeTablets` would be taken now (the driver's question): the pairs share their replicas, and a view
    being built keeps its positions (a view replica at another position of the merged tablet would be fed by another
    base position, whose build may already have passed it by)."""
    table = state.tables[table_id]
    return pairs_co_located(state, table_id) and not migrations.transitions_of_table(state, table_id) and (
        table.view is None or view_building.is_built(state, table_id) or pairs_keep_positions(state, table_id))


def forget_table(state: Group0State, table_id: str) -> None:
    state.merge_requests.discard(table_id)


def _table(state: Group0State, table_id: str) -> tuple[Table, TabletMap]:
    table, tablet_map = state.tables.get(table_id), state.tablets.get(table_id)
    if table is None or tablet_map is None:
        raise NotFound(f"table id {table_id} does not exist")
    return table, tablet_map


def _check_quiet(state: Group0State, table: Table, what: str) -> None:
    staging.check_no_staging(state, table.id, None, f"a {what} of the tablets")
    moving = migrations.transitions_of_table(state, table.id)
    if moving:
        raise FailedPrecondition(f"cannot {what} {table.qualified_name} while tablet(s) "
                                 f"{', '.join(map(str, sorted(moving)))} move; wait until they are done")
