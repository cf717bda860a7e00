"""Deterministic placement of tablet replicas on (node, shard) pairs, balancing replica counts."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from .schema import NODE_NORMAL, Node, Replica, TabletMap


def replica_loads(tablet_maps: Iterable[TabletMap]) -> tuple[Counter, Counter]:
    """Replica counts per node and per (node, shard) over the given tablet maps."""
    per_node: Counter = Counter()
    per_shard: Counter = Counter()
    for tablet_map in tablet_maps:
        for replicas in tablet_map.replicas:
            for replica in replicas:
                per_node[replica.node] += 1
                per_shard[replica] += 1
    return per_node, per_shard


def choose_replicas(nodes: Mapping[str, Node], rf: int, exclude: frozenset[str],
                    per_node: Counter, per_shard: Counter) -> list[Replica]:
    """Pick `rf` replicas on distinct least-loaded nodes (ties by node id), each on its least-loaded shard.

    Updates the load counters so that consecutive calls spread replicas evenly.
    """
    candidates = sorted((n for n in nodes.values() if n.id not in exclude and n.state == NODE_NORMAL),
                        key=lambda n: (per_node[n.id], n.id))
    chosen = []
    for node in candidates[:rf]:
        shard = min(range(node.shards), key=lambda s: (per_shard[Replica(node.id, s)], s))
        replica = Replica(node.id, shard)
        per_node[node.id] += 1
        per_shard[replica] += 1
        chosen.append(replica)
    return chosen


def place_tablet_map(table_id: str, tablet_count: int, rf: int, nodes: Mapping[str, Node],
                     existing: Iterable[TabletMap]) -> TabletMap:
    """A new tablet map for `table_id`, balanced against the replicas of the `existing` maps."""
    per_node, per_shard = replica_loads(existing)
    replicas = tuple(
        tuple(choose_replicas(nodes, rf, frozenset(), per_node, per_shard)) for _ in range(tablet_count)
    )
    return TabletMap(table_id, replicas)
