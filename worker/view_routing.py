"""Where a batch's view rows go: the view replicas paired with its base replica, view tablet by view tablet."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from coordinator.core.migrations import TabletTransition, paired_targets
from coordinator.core.schema import Replica


def paired_targets_by_tablet(replicas: tuple[tuple[Replica, ...], ...], pair: int,
                             moves: dict[int, TabletTransition] | None = None, base_count: int | None = None
                             ) -> list[tuple[Replica, ...]]:
    """Per view tablet, the view replicas paired with base position `pair` (`migrations.paired_positions`; while
    the view tablet moves, its pending replica too)."""
    return [paired_targets(replicas[tablet], (moves or {}).get(tablet), pair,
                           len(replicas[tablet]) if base_count is None else base_count)
            for tablet in range(len(replicas))]


def by_destination(view_rows: pa.Table, replicas: tuple[tuple[Replica, ...], ...], pair: int,
                   moves: dict[int, TabletTransition] | None = None, base_count: int | None = None
                   ) -> dict[Replica, pa.Table]:
    """View rows grouped by the view replicas paired with this base replica in the view tablet owning each row
    (`paired_targets_by_tablet`)."""
    if view_rows.num_rows == 0:
        return {}
    targets_of = paired_targets_by_tablet(replicas, pair, moves, base_count)
    targets = set(targets_of)
    if len(targets) == 1:  # every view tablet's rows go to the same replicas (RF = nodes, or one node): no split
        return {replica: view_rows for replica in targets.pop()}
    tablets = tablet_indices(view_rows.column("token"), len(replicas))
    groups: dict[Replica, list[pa.Table]] = {}
    for tablet in pc.unique(tablets).to_pylist():
        rows = view_rows.filter(pc.equal(tablets, tablet))
        for destination in targets_of[tablet]:
            groups.setdefault(destination, []).append(rows)
    return {replica: pa.concat_tables(parts) for replica, parts in groups.items()}


def tablet_indices(tokens: pa.ChunkedArray, tablet_count: int) -> pa.ChunkedArray:
    """`tokens.tablet_of` for a column of tokens: the high bits of the token, shifted into 0..count-1."""
    bits = tablet_count.bit_length() - 1
    if bits == 0:
        return pc.multiply(tokens, 0)
    high = pc.shift_right(pc.shift_right(tokens, 63 - bits), 1)  # pyarrow leaves a shift by 63 undone
    return pc.add(high, 1 << (bits - 1))
