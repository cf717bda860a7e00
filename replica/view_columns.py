"""The view updates of a columnar base write, in bulk: `coordinator.core.views` applied to whole Arrow columns.

The store hands over the state of every base row the write changed, before and after (`storage.arrow_layouts.
state_schema`, aligned row by row). Per view, the rows whose view row goes away or moves get a view tombstone
at the old view key, the rows whose view row appears or changes get a full view row; both at the base row's
new `view_ts`, as `replica.view_updates` does row by row. A row changed several times by one write yields the
net change: the intermediate view rows were never sent, so nothing needs to undo them. The view mutations are
grouped per paired view replica (the pairing rule of `replica.view_updates`).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.arrow_tokens import tablets_of, tokens_of
from common.replica_messages import RowBatch
from coordinator.core.migrations import feeding_count, feeds_no_view, paired_targets
from coordinator.core.schema import Filter, Replica, Table
from coordinator.core.tokens import tablet_range
from storage.arrow_layouts import arrow_type, mutation_schema, ts_column_name, value_column_name

from replica.rows import storage_spec
from replica.view_updates import WriteContext, pair_index

_PYTHON_TYPES = {"int": int, "bigint": int, "timestamp": int, "double": float, "text": str, "boolean": bool}
_INT64 = range(-2 ** 63, 2 ** 63)
_COMPARE = {"=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
            ">=": pc.greater_equal}


def columnar_views_supported(context: WriteContext) -> bool:
    """Whether every view's WHERE terms have an exact Arrow counterpart (otherwise updates go row by row)."""
    return all(_exact(context.table, term) for view in context.views for term in view.view.where)


def _exact(table: Table, term: Filter) -> bool:
    if term.op == "IS NOT NULL":
        return True
    if term.op != "IN" and term.op not in _COMPARE:
        return False
    kind = _PYTHON_TYPES[table.column_type(term.column)]
    values = term.value if term.op == "IN" else (term.value,)
    return all(type(v) is kind and (kind is not int or v in _INT64) for v in values)


def view_updates_of_states(context: WriteContext, node_id: str, before: pa.Table,
                           after: pa.Table) -> list[tuple[str, RowBatch]]:
    """(target node, batch of view mutations as columns) for every view replica the change before -> after
    touches; one batch per (node, view, shard)."""
    if after.num_rows == 0:
        return []
    old, new = _visible(context.table, before), _visible(context.table, after)
    tokens = after.column("token").to_numpy()
    pairs, counts = _pairs(context, node_id, tokens), _base_counts(context, tokens)
    stamps = after.column("view_ts")
    updates = []
    for view in context.views:
        mutations, rows = view_mutations(view, old, new, stamps)
        updates += _per_replica(context, view, mutations, pairs[rows], counts[rows])
    return updates


def view_mutations(view: Table, old: dict, new: dict, stamps: pa.ChunkedArray) -> tuple[pa.Table, np.ndarray]:
    """The view's mutations (mutation layout of the view) turning the view rows of `old` into those of `new`
    (visible values per column, see `_visible`), and the index of the base row each comes from."""
    old_in, new_in = _in_view(view, old), _in_view(view, new)
    same_key = _all(pc.and_(old_in, new_in), (_same(old[c], new[c]) for c in view.primary_key))
    same_values = _all(same_key, (_same(old[c.name], new[c.name]) for c in view.columns))
    deleted = pc.and_(old_in, pc.invert(same_key))
    written = pc.and_(new_in, pc.invert(same_values))
    deletes = _tombstones(view, {c: pc.filter(old[c], deleted) for c in view.primary_key}, pc.filter(stamps, deleted))
    upserts = _full_rows(view, {c.name: pc.filter(new[c.name], written) for c in view.columns},
                         pc.filter(stamps, written))
    rows = np.concatenate([np.flatnonzero(deleted.to_numpy(zero_copy_only=False)),
                           np.flatnonzero(written.to_numpy(zero_copy_only=False))])
    return pa.concat_tables([deletes, upserts]), rows


def _visible(table: Table, states: pa.Table) -> dict[str, pa.ChunkedArray]:
    """Each column's value as a reader sees it (NULL for a deleted or hidden cell, every column NULL for a row
    that is missing or not live): `replica.rows.visible_row` over whole columns."""
    marker, tomb = states.column("marker_ts"), states.column("tomb_ts")
    live = _newer_than_tomb(marker, tomb)
    values = {name: _where(live, states.column(value_column_name(name))) for name in table.primary_key}
    for column in table.regular_columns:
        shown = pc.and_(live, _newer_than_tomb(states.column(ts_column_name(column.name)), tomb))
        values[column.name] = _where(shown, states.column(value_column_name(column.name)))
    return values


def _newer_than_tomb(stamp: pa.ChunkedArray, tomb: pa.ChunkedArray) -> pa.ChunkedArray:
    newer = pc.or_kleene(pc.is_null(tomb), pc.greater(stamp, tomb))
    return pc.fill_null(pc.and_kleene(pc.is_valid(stamp), newer), False)


def _where(mask: pa.ChunkedArray, values: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.if_else(mask, values, pa.scalar(None, values.type))


def _in_view(view: Table, values: dict) -> pa.ChunkedArray:
    """Whether each row has a view row: it passes the WHERE terms and no view key column is NULL (a row that is
    not live has only NULLs)."""
    terms = [_passes(term, values[term.column]) for term in view.view.where]
    keys = [pc.is_valid(values[name]) for name in view.primary_key]
    return _all(pc.is_valid(values[view.primary_key[0]]), terms + keys)


def _passes(term: Filter, column: pa.ChunkedArray) -> pa.ChunkedArray:
    if term.op == "IS NOT NULL":
        return pc.is_valid(column)
    if term.op == "IN":
        return pc.fill_null(pc.and_(_is_in(column, term.value), pc.is_valid(column)), False)
    return pc.fill_null(_COMPARE[term.op](column, pa.scalar(term.value, column.type)), False)


def _is_in(column: pa.ChunkedArray, values: tuple) -> pa.ChunkedArray:
    """`pc.is_in` with Python's `in` on stored values: for doubles -0.0 finds 0.0 (Arrow's hash lookup tells them
    apart; adding 0.0 folds -0.0 into 0.0) and no NaN is ever found."""
    if not pa.types.is_floating(column.type):
        return pc.is_in(column, value_set=pa.array(values, column.type))
    found = pc.is_in(pc.add(column, 0.0), value_set=pa.array([v + 0.0 for v in values], column.type))
    return pc.and_(found, pc.invert(pc.fill_null(pc.is_nan(column), False)))


def _same(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """Equal values, NULL equal to NULL and NaN equal to NaN (coordinator.core.views' `_same`)."""
    equal = pc.equal(a, b)
    if pa.types.is_floating(a.type):
        equal = pc.or_kleene(equal, pc.and_kleene(pc.is_nan(a), pc.is_nan(b)))
    return pc.or_(pc.fill_null(equal, False), pc.and_(pc.is_null(a), pc.is_null(b)))


def _all(first: pa.ChunkedArray, masks) -> pa.ChunkedArray:
    result = first
    for mask in masks:
        result = pc.and_(result, mask)
    return pc.fill_null(result, False)


def _tombstones(view: Table, keys: dict, stamps: pa.ChunkedArray) -> pa.Table:
    return _mutations(view, keys, stamps, cells=False)


def _full_rows(view: Table, values: dict, stamps: pa.ChunkedArray) -> pa.Table:
    return _mutations(view, values, stamps, cells=True)


def _mutations(view: Table, values: dict, stamps: pa.ChunkedArray, cells: bool) -> pa.Table:
    """View mutations: a row marker and every regular cell at `stamps` (cells), or a row tombstone there."""
    schema = mutation_schema(storage_spec(view))
    count = len(stamps)
    columns = {"token": pa.array(tokens_of([values[c] for c in view.partition_key], view.partition_key_types))}
    for name in view.primary_key:
        columns[value_column_name(name)] = values[name]
    for column in view.regular_columns:
        no_values = pa.nulls(count, arrow_type(column.type))
        columns[value_column_name(column.name)] = values[column.name] if cells else no_values
        columns[ts_column_name(column.name)] = stamps if cells else pa.nulls(count, pa.int64())
    columns["marker_ts"] = stamps if cells else pa.nulls(count, pa.int64())
    columns["tomb_ts"] = pa.nulls(count, pa.int64()) if cells else stamps
    return pa.table([_array(columns[name]) for name in schema.names], schema=schema)


def _array(column) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _pairs(context: WriteContext, node_id: str, tokens: np.ndarray) -> np.ndarray:
    """This node's position among the replicas of each row's base tablet; -1 where this node is a pending replica
    still being filled or a replica being removed (it makes no view updates there: `replica.view_updates`)."""
    count = len(context.base_replicas)
    tablets = tablets_of(tokens, count)
    positions = np.zeros(count, dtype=np.int64)
    for tablet in np.unique(tablets).tolist():
        positions[tablet] = pair_index(context, node_id, tablet_range(tablet, count)[0])
        if feeds_no_view(context.base_moves.get(tablet), node_id):
            positions[tablet] = -1
    return positions[tablets]


def _base_counts(context: WriteContext, tokens: np.ndarray) -> np.ndarray:
    """The feeding replica count of each row's base tablet (`migrations.feeding_count`)."""
    counts = np.array([feeding_count(replicas, context.base_moves.get(tablet))
                       for tablet, replicas in enumerate(context.base_replicas)], dtype=np.int64)
    return counts[tablets_of(tokens, len(context.base_replicas))]


def _per_replica(context: WriteContext, view: Table, mutations: pa.Table, pairs: np.ndarray,
                 base_counts: np.ndarray) -> list[tuple[str, RowBatch]]:
    """The view mutations split by the view replica each goes to: the replicas at the positions paired with
    `pair` in the view tablet owning the view row (`replica.view_updates.view_targets`)."""
    view_map = context.view_replicas[view.id]
    tablets = tablets_of(mutations.column("token").to_numpy(), len(view_map))
    count_width = int(base_counts.max(initial=0)) + 1
    width = (int(pairs.max(initial=0)) + 1) * count_width
    codes = np.where(pairs < 0, -1, tablets * width + pairs * count_width + base_counts)
    targets: dict[Replica, list[np.ndarray]] = {}
    moves = context.view_moves.get(view.id, {})
    for code in np.unique(codes).tolist():
        if code < 0:
            continue
        tablet, rest = divmod(code, width)
        pair, base_count = divmod(rest, count_width)
        for replica in paired_targets(view_map[tablet], moves.get(tablet), pair, base_count):
            targets.setdefault(replica, []).append(np.flatnonzero(codes == code))
    return [(replica.node, RowBatch(table_id=view.id, shard=replica.shard, rows=(),
                                    schema_version=context.schema_version,
                                    columns=mutations.take(np.sort(np.concatenate(rows)))))
            for replica, rows in targets.items()]
