"""Nodes and tablet maps: registering nodes, placing a new table's tablets, resizing replica sets on an RF change.

Owns the `nodes` and `tablets` fields of Group0State.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING

from . import migrations, staging, view_building
from .commands import DecommissionNode, RegisterNode, RemoveNode
from .errors import FailedPrecondition, InvalidArgument
from .ids import check_name
from .placement import choose_replicas, place_tablet_map, replica_loads
from .schema import NODE_LEAVING, NODE_NORMAL, NODE_REMOVING, Keyspace, Node, Replica, TabletMap
from .tokens import is_power_of_two

if TYPE_CHECKING:
    from .state import Group0State

MAX_TABLETS = 4096
MAX_SHARDS = 256

AddedReplicas = dict[int, list[Replica]]


def register_node(state: Group0State, cmd: RegisterNode) -> None:
    if not 1 <= cmd.shards <= MAX_SHARDS:
        raise InvalidArgument(f"shard count must be between 1 and {MAX_SHARDS}, got {cmd.shards!r}")
    if cmd.node_id in state.removed_nodes:
        raise FailedPrecondition(removed_message(cmd.node_id))
    known = state.nodes.get(cmd.node_id)
    node = Node(check_name("node", cmd.node_id), cmd.grpc, cmd.raft, cmd.shards,
                known.state if known is not None else NODE_NORMAL, cmd.cql)
    used = [r.shard for m in state.tablets.values() for rs in m.replicas for r in rs if r.node == node.id]
    if used and max(used) >= node.shards:
        raise FailedPrecondition(
            f"node {node.id} holds tablet replicas on shard {max(used)}; it cannot restart with {node.shards} shard(s)"
        )
    state.nodes[node.id] = node


def removed_message(node_id: str) -> str:
    return (f"node {node_id} was removed from the cluster; its id and data directory cannot be used again: start "
            "a new node with a new id and an empty data directory (vbc node start ... --join HOST:PORT)")


def normal_nodes(state: Group0State) -> list[Node]:
    return [n for n in state.nodes.values() if n.state == NODE_NORMAL]


def check_rf(state: Group0State, rf: int) -> int:
    if rf < 1:
        raise InvalidArgument(f"replication factor must be a positive integer, got {rf!r}")
    count = len(normal_nodes(state))
    if rf > count:
        raise InvalidArgument(
            f"replication factor {rf} exceeds the number of nodes in the cluster ({count}); "
            f"add nodes or use rf <= {count}"
        )
    return rf


def decommission_node(state: Group0State, cmd: DecommissionNode) -> str:
    """Mark a node leaving (or removing, when dead): the driver moves its replicas away, then removes it."""
    node = state.nodes.get(cmd.node_id)
    if node is None:
        raise (FailedPrecondition(removed_message(cmd.node_id)) if cmd.node_id in state.removed_nodes else
               InvalidArgument(f"unknown node {cmd.node_id!r} (nodes: {', '.join(sorted(state.nodes))})"))
    remaining = [n for n in normal_nodes(state) if n.id != node.id]
    if not remaining:
        raise FailedPrecondition(f"node {node.id} is the last node of the cluster: it cannot leave")
    needed = max((k.rf for k in state.keyspaces.values()), default=1)
    if len(remaining) < needed:
        keyspace = max(state.keyspaces.values(), key=lambda k: k.rf)
        raise FailedPrecondition(f"without node {node.id}, {len(remaining)} node(s) would be left for keyspace "
                                 f"{keyspace.name!r} with rf {keyspace.rf}: add a node or lower its RF first")
    stranded = migrations.stranded_tablets(state, node.id) if cmd.dead else []
    if stranded:
        shown = ", ".join(f"tablet {tablet} of {state.tables[table].qualified_name}" for table, tablet in stranded[:5])
        raise FailedPrecondition(f"node {node.id} holds the only replica of {len(stranded)} tablet(s) ({shown}): its "
                                 "rows would be lost; bring the node back and decommission it instead, or raise the RF "
                                 "first")
    state.nodes[node.id] = dataclasses.replace(node, state=NODE_REMOVING if cmd.dead else NODE_LEAVING)
    state.deaths_declared += cmd.dead
    if cmd.dead:
        staging.forget_node_staging(state, node.id)
    state.schema_version += 1
    return state.nodes[node.id].state


def dead_nodes(state: Group0State) -> frozenset[str]:
    """Nodes declared dead (being removed) or removed: nothing sent to them can arrive."""
    return frozenset(n.id for n in state.nodes.values() if n.state == NODE_REMOVING) | frozenset(state.removed_nodes)


def remove_node(state: Group0State, cmd: RemoveNode) -> None:
    """Forget a decommissioned node that holds no replica and takes part in no migration."""
    node = state.nodes.get(cmd.node_id)
    if node is None or node.state == NODE_NORMAL:
        raise FailedPrecondition(f"node {cmd.node_id} is not being decommissioned")
    held = sum(1 for m in state.tablets.values() for rs in m.replicas for r in rs if r.node == node.id)
    moving = [t for t in state.transitions.values() if node.id in (t.leaving.node, t.pending.node)]
    if held or moving:
        raise FailedPrecondition(f"node {node.id} still holds {held} tablet replica(s) ({len(moving)} moving)")
    del state.nodes[node.id]
    state.removed_nodes.add(node.id)
    view_building.forget_node_holds(state, node.id)
    for key in [k for k in state.build_status if k[1] == node.id]:
        del state.build_status[key]
    state.schema_version += 1


def check_tablet_count(count: int) -> int:
    if not is_power_of_two(count) or count > MAX_TABLETS:
        raise InvalidArgument(f"initial tablet count must be a power of two between 1 and {MAX_TABLETS}, got {count!r}")
    return count


def place_table(state: Group0State, table_id: str, keyspace: Keyspace) -> None:
    """Give a new table (or view) its tablet map, balanced against every existing replica."""
    state.tablets[table_id] = place_tablet_map(table_id, keyspace.initial_tablets, keyspace.rf, state.nodes,
                                               state.tablets.values())


def resize_keyspace(state: Group0State, keyspace: str, rf: int) -> dict[str, AddedReplicas]:
    """Grow or shrink the replica list of every tablet in `keyspace` to `rf`; the replicas added, by table id.

    Moves no data: for a keyspace with tables it runs only when an AlterKeyspace journaled before such RF
    changes were refused is replayed (ddl.alter_keyspace), and for data movement once tablets can move.
    """
    per_node, per_shard = replica_loads(state.tablets.values())
    added_by_table = {}
    for table in state.tables_in(keyspace):
        state.tablets[table.id], added_by_table[table.id] = _resized(state, state.tablets[table.id], rf,
                                                                     per_node, per_shard)
    return added_by_table


def _resized(state: Group0State, tablet_map: TabletMap, rf: int, per_node: Counter,
             per_shard: Counter) -> tuple[TabletMap, AddedReplicas]:
    new_replicas, added = [], {}
    for tablet_id, replicas in enumerate(tablet_map.replicas):
        if rf <= len(replicas):
            new_replicas.append(replicas[:rf])
            continue
        fresh = choose_replicas(state.nodes, rf - len(replicas), frozenset(r.node for r in replicas),
                                per_node, per_shard)
        new_replicas.append(replicas + tuple(fresh))
        added[tablet_id] = fresh
    return TabletMap(tablet_map.table_id, tuple(new_replicas)), added


def forget_table(state: Group0State, table_id: str) -> None:
    state.tablets.pop(table_id, None)
