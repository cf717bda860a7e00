"""View repair: the pure functions of `worker.view_repair`, the store's view_ts floor, and group0's repair tasks
(made new, carried through renewals, hand-overs and merges)."""
from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from coordinator.core import view_building
from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN, token_of
from replica.rows import storage_spec, upsert_row
from storage.cells import Row
from storage.store import NodeStore
from worker.view_repair import base_rows_of, repair_floors, stale_deletes, stale_view_rows

from .replica_fakes import cluster_state

SEED_1, SEED_2 = f"{1:032x}", f"{2:032x}"


@pytest.fixture
def schema():
    return cluster_state(with_view=True)


def tables(schema):
    return schema.state.tables[schema.table_id], schema.state.tables[schema.view_id]


def held(rows: list[tuple[str, int, int, int, bool]]) -> pa.Table:
    """View rows of ks.by_v (v, key, c) as a repair reads them: key columns, write_ts, tombstone."""
    v, key, c, ts, dead = zip(*rows)
    return pa.table({"c_v": list(v), "c_key": list(key), "c_c": list(c), "write_ts": pa.array(ts, pa.int64()),
                     "tombstone": list(dead)})


def base_row(key: int, c: int) -> tuple[int, tuple]:
    return token_of((key,), ("int",)), (key, c)


def test_a_view_row_belongs_to_the_base_row_its_key_names(schema):
    base, _ = tables(schema)
    assert base_rows_of(base, held([("a", 1, 2, 5, False), ("b", 7, 0, 5, True)])) == [base_row(1, 2), base_row(7, 0)]


def test_floors_are_one_above_the_newest_view_row_of_each_base_row_in_range(schema):
    base, _ = tables(schema)
    rows = held([("a", 1, 0, 100, False), ("b", 1, 0, 150, True), ("c", 2, 0, 90, False)])
    assert repair_floors(base, rows, MIN_TOKEN, MAX_TOKEN) == {base_row(1, 0): 151, base_row(2, 0): 91}
    token = base_row(2, 0)[0]
    assert repair_floors(base, rows, token, token) == {base_row(2, 0): 91}


def test_stale_rows_are_the_live_ones_no_base_row_of_the_snapshot_implies(schema):
    base, view = tables(schema)
    rows = held([("a", 1, 0, 100, False), ("b", 1, 0, 150, True), ("c", 2, 0, 90, False), ("d", 3, 0, 90, False)])
    stale = stale_view_rows(base, view, rows, MIN_TOKEN, MAX_TOKEN, implied={("a", 1, 0)})
    assert stale == [(("c", 2, 0), base_row(2, 0)), (("d", 3, 0), base_row(3, 0))]
    deletes = stale_deletes(view, stale, {base_row(2, 0): 500})  # base row (3, 0) is not held: nothing orders it
    assert [(row.key, row.tomb_ts, row.marker_ts) for row in deletes] == [(("c", 2, 0), 500, None)]


def test_nothing_is_stale_in_an_empty_read(schema):
    base, view = tables(schema)
    empty = pa.table({"c_v": pa.array([], pa.string()), "c_key": pa.array([], pa.int32()),
                      "c_c": pa.array([], pa.int32()), "write_ts": pa.array([], pa.int64()),
                      "tombstone": pa.array([], pa.bool_())})
    assert repair_floors(base, empty, MIN_TOKEN, MAX_TOKEN) == {}
    assert stale_view_rows(base, view, empty, MIN_TOKEN, MAX_TOKEN, implied=set()) == []


def test_the_store_raises_view_ts_to_a_floor_and_later_writes_order_after_it(tmp_path, schema):
    base, _ = tables(schema)
    with NodeStore.for_data_dir(tmp_path) as store:
        store.ensure_table(storage_spec(base))
        store.apply(base.id, [upsert_row(base, {"key": 1, "c": 0, "v": "x"}, 100),
                              upsert_row(base, {"key": 2, "c": 0, "v": "y"}, 300)])
        token = base_row(2, 0)[0]
        store.apply(base.id, [Row(token, (2, 0), tomb_ts=400)])
        raised = store.raise_view_ts(base.id, {base_row(1, 0): 151, base_row(2, 0): 200, base_row(5, 0): 999})
        assert raised == {base_row(1, 0): 151, base_row(2, 0): 400}  # (2, 0) is newer already; (5, 0) not held
        assert store.get(base.id, base_row(2, 0)[0], (2, 0), include_tombstones=True).view_ts == 400
        store.apply(base.id, [upsert_row(base, {"key": 1, "c": 0, "v": "z"}, 120)])  # a late write, older than 151
        assert store.get(base.id, base_row(1, 0)[0], (1, 0)).view_ts == 152
        assert store.raise_view_ts(base.id, {}) == {}


def tasks_of(schema, tablet: int, replica) -> list:
    return [t for t in schema.state.tasks.values()
            if (t.view_id, t.tablet_id, t.replica) == (schema.view_id, tablet, replica)]


def test_a_repair_task_replaces_the_live_task_under_a_new_id(schema):
    state, (_, view) = schema.state, tables(schema)
    replica = state.tablets[schema.table_id].replicas[0][0]
    [before] = tasks_of(schema, 0, replica)
    created = state.tasks_created[view.id]
    view_building.ensure_repair_task(state, view, 0, replica, seed=SEED_1)
    [after] = tasks_of(schema, 0, replica)
    assert after.repair and after.id != before.id and not after.aborted
    assert state.tasks_created[view.id] == created
    view_building.renew_task(state, view, 0, replica, seed=SEED_2)
    [renewed] = tasks_of(schema, 0, replica)
    assert renewed.repair and renewed.id != after.id


def test_an_aborted_task_becomes_a_repair_task_in_place(schema):
    state, (_, view) = schema.state, tables(schema)
    replica = state.tablets[schema.table_id].replicas[1][0]
    view_building.abort_replica_tasks(state, schema.table_id, 1, replica)
    [before] = tasks_of(schema, 1, replica)
    view_building.ensure_repair_task(state, view, 1, replica, seed=SEED_1)
    assert tasks_of(schema, 1, replica) == [replace(before, repair=True)]


def test_a_hand_over_keeps_the_heirs_repair(schema):
    state, (_, view) = schema.state, tables(schema)
    heir, removed = state.tablets[schema.table_id].replicas[0]
    view_building.ensure_repair_task(state, view, 0, heir, seed=SEED_1)
    view_building.hand_over_tasks(state, schema.table_id, 0, removed, heir, seed=SEED_2)
    assert [t.repair for t in tasks_of(schema, 0, heir)] == [True] and not tasks_of(schema, 0, removed)


def test_a_merge_keeps_a_repair_of_either_half(schema):
    state, (_, view) = schema.state, tables(schema)
    before = state.tablets[schema.table_id].replicas
    view_building.ensure_repair_task(state, view, 1, before[1][0], seed=SEED_1)
    state.tablets[schema.table_id] = replace(state.tablets[schema.table_id], replicas=before[0::2])
    view_building.merge_tasks(state, schema.table_id, SEED_2, before)
    repaired = [(t.tablet_id, t.replica) for t in state.tasks.values() if t.repair]
    assert repaired == [(0, before[0][0])]  # position 0 of tablet 1 runs on position 0 of the merged tablet
