"""The tablet load balancer's decisions: which replica moves where so that every node (and every shard of a node)
holds as many tablet replicas as the others, within one.

Owns the `balancer_enabled` field of Group0State. The leader's driver asks `balance_moves` only when nothing else
is moving (no migration, RF change, drain or merge in progress), starts the moves it answers (ordinary
migrations), and asks again once they ended. Each move goes from the most loaded normal node to the least
loaded one (replica counts over every table), taking the first tablet (tables by id, tablets in order) that
the destination does not hold; once nodes are even, the same between the shards of each node. Every move
lowers the spread, so the balancer stops.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from .commands import SetBalancer
from .migrations import MOVE, PlannedMove
from .placement import replica_loads
from .schema import NODE_NORMAL, Replica

if TYPE_CHECKING:
    from .state import Group0State


def set_balancer(state: Group0State, cmd: SetBalancer) -> bool:
    state.balancer_enabled = cmd.enabled
    return cmd.enabled


def balance_moves(state: Group0State, limit: int) -> list[PlannedMove]:
    """Up to `limit` moves that even out replica counts over nodes, else over the shards of each node."""
    if not state.balancer_enabled or state.transitions:
        return []
    per_node, per_shard = replica_loads(state.tablets.values())
    nodes = sorted(n.id for n in state.nodes.values() if n.state == NODE_NORMAL)
    moves = _node_moves(state, nodes, per_node, per_shard, limit)
    return moves or _shard_moves(state, nodes, per_shard, limit)


def _node_moves(state: Group0State, nodes: list[str], per_node: Counter, per_shard: Counter,
                limit: int) -> list[PlannedMove]:
    moves: list[PlannedMove] = []
    taken: set[tuple[str, int]] = set()
    while len(moves) < limit and len(nodes) > 1:
        ranked = sorted(nodes, key=lambda n: (per_node[n], n))
        move = _first_move(state, ranked, per_node, per_shard, taken)
        if move is None:
            break
        moves.append(move)
    return moves


def _first_move(state: Group0State, ranked: list[str], per_node: Counter, per_shard: Counter,
                taken: set[tuple[str, int]]) -> PlannedMove | None:
    """A move from the most loaded node that can give to the least loaded one that can take (spread > 1)."""
    for source in reversed(ranked):
        for target in ranked:
            if per_node[source] - per_node[target] <= 1:
                break
            found = _tablet_to_move(state, source, target, taken)
            if found is not None:
                table_id, tablet, leaving = found
                pending = Replica(target, _least_loaded_shard(state, target, per_shard))
                _account(per_node, per_shard, leaving, pending)
                taken.add((table_id, tablet))
                return PlannedMove(table_id, tablet, MOVE, leaving, pending)
    return None


def _tablet_to_move(state: Group0State, source: str, target: str,
                    taken: set[tuple[str, int]]) -> tuple[str, int, Replica] | None:
    for table_id in sorted(state.tablets):
        for tablet, replicas in enumerate(state.tablets[table_id].replicas):
            if (table_id, tablet) in taken or any(r.node == target for r in replicas):
                continue
            leaving = next((r for r in replicas if r.node == source), None)
            if leaving is not None:
                return table_id, tablet, leaving
    return None


def _shard_moves(state: Group0State, nodes: list[str], per_shard: Counter, limit: int) -> list[PlannedMove]:
    moves: list[PlannedMove] = []
    taken: set[tuple[str, int]] = set()
    for node in nodes:
        shards = range(state.nodes[node].shards)
        while len(moves) < limit:
            ranked = sorted(shards, key=lambda s: (per_shard[Replica(node, s)], s))
            low, high = Replica(node, ranked[0]), Replica(node, ranked[-1])
            if per_shard[high] - per_shard[low] <= 1:
                break
            found = next(((t, i, r) for t in sorted(state.tablets) for i, rs in enumerate(state.tablets[t].replicas)
                          for r in rs if r == high and (t, i) not in taken), None)
            if found is None:
                break
            table_id, tablet, leaving = found
            per_shard[high] -= 1
            per_shard[low] += 1
            taken.add((table_id, tablet))
            moves.append(PlannedMove(table_id, tablet, MOVE, leaving, low))
    return moves


def _least_loaded_shard(state: Group0State, node: str, per_shard: Counter) -> int:
    return min(range(state.nodes[node].shards), key=lambda s: (per_shard[Replica(node, s)], s))


def _account(per_node: Counter, per_shard: Counter, leaving: Replica, pending: Replica) -> None:
    per_node[leaving.node] -= 1
    per_shard[leaving] -= 1
    per_node[pending.node] += 1
    per_shard[pending] += 1


def imbalance(state: Group0State) -> dict[str, int]:
    """Tablet replicas per normal node (what `vbc balancer status` shows)."""
    per_node, _ = replica_loads(state.tablets.values())
    return {n.id: per_node[n.id] for n in sorted(state.nodes.values(), key=lambda n: n.id) if n.state == NODE_NORMAL}
