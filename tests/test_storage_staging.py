"""The store's staging area: staged mutations kept durably in staging order, read by token range and number."""
from __future__ import annotations

import uuid

import pyarrow as pa

from storage.arrow_layouts import mutation_table
from storage.cells import Cell, ColumnSpec, Row, TableSpec
from storage.store import NodeStore

SPEC = TableSpec(uuid.uuid4().hex, (ColumnSpec("k", "int"),), (), (ColumnSpec("v", "text"),))


def mutations(*tokens: int) -> pa.Table:
    return mutation_table(SPEC, [Row(t, (t,), marker_ts=10, cells={"v": Cell(f"v{t}", 10)}) for t in tokens])


def test_staged_entries_survive_a_reopen_and_are_read_back_by_range_and_number(tmp_path):
    other = uuid.uuid4().hex
    with NodeStore.for_data_dir(tmp_path) as store:
        first = store.stage(SPEC.table_id, -100, -1, mutations(-50, -7))
        second = store.stage(SPEC.table_id, 0, 100, mutations(3))
        third = store.stage(SPEC.table_id, -100, -1, mutations(-9))
        store.stage(other, -100, -1, mutations(-8))
    assert first < second < third
    with NodeStore.for_data_dir(tmp_path) as store:
        low = store.staged_entries(SPEC.table_id, -100, -1, with_mutations=True)
        assert [e.seq for e in low] == [first, third] and [e.rows for e in low] == [2, 1]
        assert low[0].mutations.equals(mutations(-50, -7))
        assert [e.seq for e in store.staged_entries(SPEC.table_id, -100, -1, through=second)] == [first]
        assert store.staged_entries(SPEC.table_id, -100, -1)[0].mutations is None  # not read unless asked
        assert store.unstage([first, third]) == 2
        assert [e.seq for e in store.staged_entries(SPEC.table_id)] == [second]
        assert store.unstage_table(other) == 1
        assert [e.table_id for e in store.staged_entries()] == [SPEC.table_id]
