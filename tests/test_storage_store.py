"""Tests of storage.store.NodeStore on SQLite and, when its binaries are installed, a throwaway PostgreSQL 15."""
from __future__ import annotations

import itertools
import math
import random
import threading
import uuid
from collections import defaultdict
from functools import reduce

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.core.tokens import token_of as system_token_of
from storage.cells import Cell, ColumnSpec, Row, TableSpec, is_live, merge, state_equal, visible_values, write_ts
from storage.store import NodeStore
from storage.store_types import StoreClosed


MIN_TOKEN, MAX_TOKEN = -(2**63), 2**63 - 1

REGULAR = (
    ColumnSpec("i", "int"),
    ColumnSpec("big", "bigint"),
    ColumnSpec("t", "text"),
    ColumnSpec("flag", "boolean"),
    ColumnSpec("d", "double"),
    ColumnSpec("at", "timestamp"),
)


@pytest.fixture
def spec(store):
    table_spec = make_spec()
    store.ensure_table(table_spec)
    return table_spec


# --- helpers ------------------------------------------------------------------------------------------


def make_spec(regular=REGULAR) -> TableSpec:
    return TableSpec(uuid.uuid4().hex, (ColumnSpec("p", "text"),), (ColumnSpec("c", "text"),), regular)


def token_of(partition: str) -> int:
    return system_token_of((partition,), ("text",))


def mutation(partition: str, clustering: str, marker_ts=None, tomb_ts=None, token=None, **cells) -> Row:
    token = token_of(partition) if token is None else token
    return Row(token, (partition, clustering), marker_ts=marker_ts, tomb_ts=tomb_ts, cells=cells)


def expected_states(mutations: list[Row]) -> dict[tuple, Row]:
    by_key = defaultdict(list)
    for m in mutations:
        by_key[(m.token, m.key)].append(m)
    return {key: reduce(merge, rows) for key, rows in by_key.items()}


def assert_store_holds(store: NodeStore, spec: TableSpec, mutations: list[Row]) -> None:
    stored = store.scan(spec.table_id, MIN_TOKEN, MAX_TOKEN, include_tombstones=True)
    expected = expected_states(mutations)
    assert sorted((r.token, r.key) for r in stored) == sorted(expected)
    for r in stored:
        assert state_equal(r, expected[(r.token, r.key)]), (r, expected[(r.token, r.key)])


def scan_all(store: NodeStore, spec: TableSpec, **options) -> list[Row]:
    return store.scan(spec.table_id, MIN_TOKEN, MAX_TOKEN, **options)


def recording_derive(calls: list):
    def derive(changes):
        calls.extend(changes)
        return [(f"view-{merged.key[1]}", repr(merged.key).encode()) for _, merged in changes]

    return derive


# --- round trips --------------------------------------------------------------------------------------


def test_values_of_every_type_round_trip(store, spec):
    values = {"i": -7, "big": 2**62, "t": "héllo \U0001f600", "flag": True, "d": -1.25, "at": 1_700_000_000_123}
    store.apply(spec.table_id, [mutation("p", "c", 10, **{n: Cell(v, 10) for n, v in values.items()})])
    row = store.get(spec.table_id, token_of("p"), ("p", "c"))
    assert visible_values(row) == values
    assert {n: type(v) for n, v in visible_values(row).items()} == {n: type(v) for n, v in values.items()}


@pytest.mark.parametrize(
    "name, value",
    [
        ("big", MIN_TOKEN),
        ("big", MAX_TOKEN),
        ("at", 0),
        ("flag", False),
        ("d", math.inf),
        ("d", -math.inf),
        ("d", 5e-324),
        ("t", ""),
    ],
)
def test_extreme_values_round_trip(store, spec, name, value):
    store.apply(spec.table_id, [mutation("p", "c", 1, **{name: Cell(value, 1)})])
    stored = store.get(spec.table_id, token_of("p"), ("p", "c")).cells[name].value
    assert stored == value and type(stored) is type(value)


def test_nan_round_trips(store, spec):
    store.apply(spec.table_id, [mutation("p", "c", 1, d=Cell(math.nan, 1))])
    assert math.isnan(store.get(spec.table_id, token_of("p"), ("p", "c")).cells["d"].value)
    assert store.apply(spec.table_id, [mutation("p", "c", 1, d=Cell(math.nan, 1))]).changed == 0


def test_ints_are_accepted_for_doubles(store, spec):
    store.apply(spec.table_id, [mutation("p", "c", 1, d=Cell(3, 1))])
    value = store.get(spec.table_id, token_of("p"), ("p", "c")).cells["d"].value
    assert value == 3.0 and type(value) is float


def test_deleted_and_unwritten_cells_are_distinguished(store, spec):
    store.apply(spec.table_id, [mutation("p", "c", 4, t=Cell(None, 4))])
    row = store.get(spec.table_id, token_of("p"), ("p", "c"))
    assert dict(row.cells) == {"t": Cell(None, 4)}


def test_invalid_mutations_are_rejected(store, spec):
    with pytest.raises(TypeError):
        store.apply(spec.table_id, [mutation("p", "c", 1, big=Cell("not a number", 1))])
    with pytest.raises(TypeError):
        store.apply(spec.table_id, [mutation("p", "c", 1, flag=Cell(1, 1))])
    with pytest.raises(TypeError):
        store.apply(spec.table_id, [mutation("p", "c", 1, big=Cell(2**63, 1))])
    with pytest.raises(KeyError):
        store.apply(spec.table_id, [mutation("p", "c", 1, missing=Cell(1, 1))])
    with pytest.raises(ValueError):
        store.apply(spec.table_id, [Row(token_of("p"), ("p",), marker_ts=1)])
    with pytest.raises(ValueError):
        store.apply(spec.table_id, [Row(2**63, ("p", "c"), marker_ts=1)])
    with pytest.raises(KeyError):
        store.apply(uuid.uuid4().hex, [mutation("p", "c", 1)])
    assert scan_all(store, spec, include_tombstones=True) == []


# --- last write wins ----------------------------------------------------------------------------------


def conflicting_writes(partition: str) -> list[Row]:
    return [
        mutation(partition, "x", 5, t=Cell("first", 5), i=Cell(1, 5)),
        mutation(partition, "x", 5, t=Cell("second", 5), i=Cell(None, 5)),
        mutation(partition, "x", tomb_ts=6),
        mutation(partition, "x", 7, big=Cell(70, 7), t=Cell("late", 4)),
        mutation(partition, "y", 3, d=Cell(1.5, 3)),
        mutation(partition, "y", 3, d=Cell(-2.5, 3), flag=Cell(False, 3)),
    ]


@pytest.mark.parametrize("one_batch", [False, True], ids=["batch-per-write", "single-batch"])
def test_last_write_wins_in_every_order(store, spec, one_batch):
    applied = []
    for number, order in enumerate(itertools.permutations(range(4))):
        writes = conflicting_writes(f"perm{number}")
        ordered = [writes[i] for i in order] + writes[4:]
        batches = [ordered] if one_batch else [[w] for w in ordered]
        for batch in batches:
            store.apply(spec.table_id, batch)
        applied += ordered
    assert_store_holds(store, spec, applied)
    final = store.get(spec.table_id, token_of("perm0"), ("perm0", "x"))
    assert visible_values(final) == {"big": 70}
    assert visible_values(store.get(spec.table_id, token_of("perm0"), ("perm0", "y"))) == {"d": 1.5, "flag": False}


WRITES = st.builds(
    mutation,
    partition=st.sampled_from(["a", "b"]),
    clustering=st.sampled_from(["x", "y"]),
    marker_ts=st.none() | st.integers(1, 6),
    tomb_ts=st.none() | st.integers(1, 6),
    t=st.builds(Cell, st.none() | st.sampled_from(["B", "a", "é"]), st.integers(1, 6)),
    big=st.builds(Cell, st.none() | st.integers(-(2**62), 2**62), st.integers(1, 6)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    writes=st.lists(WRITES, min_size=1, max_size=8),
    shuffle=st.randoms(use_true_random=False),
    split=st.integers(1, 4),
)
def test_any_order_and_batching_gives_the_merged_state(store, writes, shuffle, split):
    spec = make_spec()
    store.ensure_table(spec)
    try:
        ordered = writes + writes[: len(writes) // 2]
        shuffle.shuffle(ordered)
        for start in range(0, len(ordered), split):
            store.apply(spec.table_id, ordered[start:start + split])
        assert_store_holds(store, spec, writes)
    finally:
        store.drop_table(spec.table_id)


def test_duplicates_and_older_writes_are_no_ops(store, spec):
    calls = []
    batch = [mutation("p", "a", 5, t=Cell("v", 5)), mutation("p", "b", 5)]
    first = store.apply(spec.table_id, batch, derive=recording_derive(calls))
    assert first.changed == 2 and len(first.outbox_ids) == 2
    again = store.apply(spec.table_id, batch, derive=recording_derive(calls))
    older = store.apply(spec.table_id, [mutation("p", "a", 4, t=Cell("old", 4))], derive=recording_derive(calls))
    assert (again.changed, again.outbox_ids) == (0, ())
    assert (older.changed, older.outbox_ids) == (0, ())
    assert len(calls) == 2
    assert store.outbox_size() == 2


def test_mutations_of_one_key_compose_within_a_batch(store, spec):
    calls = []
    writes = [mutation("p", "a", 5, t=Cell("v", 5)), mutation("p", "a", 6, i=Cell(1, 6)), mutation("p", "a", 4)]
    result = store.apply(spec.table_id, writes, derive=recording_derive(calls))
    assert result.changed == 2
    assert calls[0][0] is None
    assert state_equal(calls[1][0], calls[0][1])
    assert calls[1][0].view_ts == calls[0][1].view_ts
    assert_store_holds(store, spec, writes)


# --- tombstones ---------------------------------------------------------------------------------------


def test_tombstones_are_kept_but_hidden_unless_requested(store, spec):
    token = token_of("p")
    store.apply(spec.table_id, [mutation("p", "a", 5, t=Cell("x", 5)), mutation("p", "b", 5)])
    store.apply(spec.table_id, [mutation("p", "a", tomb_ts=9)])
    assert [r.key for r in scan_all(store, spec)] == [("p", "b")]
    assert [r.key for r in scan_all(store, spec, include_tombstones=True)] == [("p", "a"), ("p", "b")]
    assert store.get(spec.table_id, token, ("p", "a")) is None
    tombstone = store.get(spec.table_id, token, ("p", "a"), include_tombstones=True)
    assert tombstone.tomb_ts == 9 and not is_live(tombstone)
    assert store.count(spec.table_id) == 1


def test_reinsert_after_delete_shows_only_newer_cells(store, spec):
    store.apply(spec.table_id, [mutation("p", "a", 5, t=Cell("x", 5), i=Cell(1, 10))])
    store.apply(spec.table_id, [mutation("p", "a", tomb_ts=10)])
    store.apply(spec.table_id, [mutation("p", "a", 11, big=Cell(2, 11))])
    row = store.get(spec.table_id, token_of("p"), ("p", "a"))
    assert is_live(row) and visible_values(row) == {"big": 2}


def test_missing_rows_are_none(store, spec):
    assert store.get(spec.table_id, 1, ("p", "nothing")) is None
    assert store.get(spec.table_id, 1, ("p", "nothing"), include_tombstones=True) is None


# --- scans --------------------------------------------------------------------------------------------


def rows_at_tokens(tokens: list[int]) -> list[Row]:
    return [mutation(f"p{token}", c, 1, token=token) for token in tokens for c in ("b", "a")]


def test_token_range_scans_are_inclusive_and_ordered(store, spec):
    tokens = [MAX_TOKEN, 7, 0, -5, MIN_TOKEN, 8, -6]
    store.apply(spec.table_id, rows_at_tokens(tokens))
    scanned = store.scan(spec.table_id, -5, 7)
    assert [(r.token, r.key[1]) for r in scanned] == [(-5, "a"), (-5, "b"), (0, "a"), (0, "b"), (7, "a"), (7, "b")]
    full = scan_all(store, spec)
    assert [r.token for r in full] == sorted(t for t in tokens for _ in "ab")
    assert store.count(spec.table_id) == 14
    assert store.count(spec.table_id, -5, 7) == 6
    assert store.count(spec.table_id, first_token=8) == 4
    assert store.count(spec.table_id, last_token=MIN_TOKEN) == 2


def test_after_pages_through_a_range(store, spec):
    store.apply(spec.table_id, rows_at_tokens([3, 1, 2, 2**40, -(2**40)]))
    full = scan_all(store, spec)
    pages, after = [], None
    while True:
        page = store.scan(spec.table_id, MIN_TOKEN, MAX_TOKEN, after=after, limit=3)
        if not page:
            break
        pages += page
        after = (page[-1].token, page[-1].key)
    assert pages == full
    assert store.scan(spec.table_id, MIN_TOKEN, MAX_TOKEN, limit=0) == []


def test_after_a_partition_key_prefix_skips_the_partition(store, spec):
    store.apply(spec.table_id, rows_at_tokens([1, 2]))
    scanned = store.scan(spec.table_id, MIN_TOKEN, MAX_TOKEN, after=(1, ("p1",)))
    assert [r.key for r in scanned] == [("p2", "a"), ("p2", "b")]


def test_partition_key_restricts_to_one_partition(store, spec):
    store.apply(spec.table_id, [mutation("left", "a", 1, token=9), mutation("right", "a", 1, token=9)])
    scanned = store.scan(spec.table_id, 9, 9, partition_key=("right",))
    assert [r.key for r in scanned] == [("right", "a")]


def test_text_keys_sort_by_code_point(store, spec):
    clustering = ["é", "a", "B", "Z", "b", "\U0001f600", "\uffff", "aa", "", "A", "\u00e9t\u00e9"]
    store.apply(spec.table_id, [mutation("p", c, 1) for c in clustering])
    assert [r.key[1] for r in scan_all(store, spec)] == sorted(clustering)
    assert sorted(clustering)[:5] == ["", "A", "B", "Z", "a"]


def test_double_and_boolean_clustering_keys(store):
    clustering = (ColumnSpec("d", "double"), ColumnSpec("b", "boolean"))
    spec = TableSpec(uuid.uuid4().hex, (ColumnSpec("p", "bigint"),), clustering, ())
    store.ensure_table(spec)
    keys = [(1, math.nan, True), (1, -math.inf, False), (1, 2.5, True), (1, 2.5, False), (1, -1.0, True)]
    store.apply(spec.table_id, [Row(5, key, marker_ts=1) for key in keys])
    assert store.apply(spec.table_id, [Row(5, (1, math.nan, True), marker_ts=1)]).changed == 0
    scanned = [r.key for r in scan_all(store, spec)]
    assert scanned[:4] == [(1, -math.inf, False), (1, -1.0, True), (1, 2.5, False), (1, 2.5, True)]
    assert math.isnan(scanned[4][1])
    assert store.get(spec.table_id, 5, (1, math.nan, True)) is not None


# --- view versions ------------------------------------------------------------------------------------


def test_view_ts_follows_writes_and_advances_on_late_writes(store, spec):
    def view_ts() -> int:
        return store.get(spec.table_id, token_of("p"), ("p", "a"), include_tombstones=True).view_ts

    store.apply(spec.table_id, [mutation("p", "a", 10)])
    assert view_ts() == 10
    store.apply(spec.table_id, [mutation("p", "a", 20, t=Cell("x", 20))])
    assert view_ts() == 20
    store.apply(spec.table_id, [mutation("p", "a", i=Cell(1, 5))])
    assert view_ts() == 21
    store.apply(spec.table_id, [mutation("p", "a", i=Cell(1, 5))])
    assert view_ts() == 21
    store.apply(spec.table_id, [mutation("p", "a", tomb_ts=30)])
    assert view_ts() == 30


def test_derive_sees_the_new_view_ts(store, spec):
    calls = []
    store.apply(spec.table_id, [mutation("p", "a", 10)], derive=recording_derive(calls))
    store.apply(spec.table_id, [mutation("p", "a", i=Cell(1, 3))], derive=recording_derive(calls))
    (_, first), (previous, second) = calls
    assert (first.view_ts, previous.view_ts, second.view_ts) == (10, 10, 11)
    assert write_ts(second) == 10


# --- outbox -------------------------------------------------------------------------------------------


def test_failing_derive_rolls_back_the_rows(store, spec):
    store.apply(spec.table_id, [mutation("p", "a", 1, t=Cell("kept", 1))], derive=recording_derive([]))

    def failing(changes):
        if any(merged.key[1] == "b" for _, merged in changes):
            raise RuntimeError("derive failed")
        return [("view", b"payload")]

    with pytest.raises(RuntimeError):
        store.apply(spec.table_id, [mutation("p", "a", 2, t=Cell("lost", 2)), mutation("p", "b", 2)], derive=failing)
    assert visible_values(store.get(spec.table_id, token_of("p"), ("p", "a"))) == {"t": "kept"}
    assert store.get(spec.table_id, token_of("p"), ("p", "b"), include_tombstones=True) is None
    assert store.outbox_size() == 1
    store.apply(spec.table_id, [mutation("p", "c", 3)], derive=recording_derive([]))  # the writer goes on
    store.apply(spec.table_id, [mutation("p", "d", 3)])
    assert {r.key for r in scan_all(store, spec)} == {("p", "a"), ("p", "c"), ("p", "d")}


def test_a_writer_connection_left_inside_a_transaction_is_replaced(store, spec):
    """A ROLLBACK that failed would leave SQLite's one writer connection mid-transaction: the next write must not
    inherit it (it would fail on BEGIN, and every write after it)."""
    if store.url.get_backend_name() == "postgresql":
        return  # a connection per write there
    store.apply(spec.table_id, [mutation("p", "a", 1)])
    store._writer_connection().connection.driver_connection.execute("BEGIN")  # what a failed ROLLBACK leaves
    store.apply(spec.table_id, [mutation("p", "b", 1)])
    store.apply(spec.table_id, [mutation("p", "c", 1)], derive=recording_derive([]))
    assert {r.key for r in scan_all(store, spec)} == {("p", "a"), ("p", "b"), ("p", "c")}


def test_a_closed_store_refuses_writes_and_skips_checkpoints(store_url):
    store = NodeStore(store_url)
    table = make_spec()
    store.ensure_table(table)
    store.close()
    assert store.checkpoint() is None
    if store.url.get_backend_name() == "sqlite":
        with pytest.raises(StoreClosed):
            store.apply(table.table_id, [mutation("p", "a", 1)])


def test_outbox_is_oldest_first_and_acks_remove_entries(store, spec):
    results = [
        store.apply(spec.table_id, [mutation("p", c, 1) for c in batch], derive=recording_derive([]))
        for batch in (["a", "b"], ["c"], ["d", "e", "f"])
    ]
    ids = [i for result in results for i in result.outbox_ids]
    pending = store.outbox_pending()
    assert [entry.id for entry in pending] == ids == sorted(ids)
    assert [entry.target for entry in pending] == [f"view-{c}" for c in "abcdef"]
    assert pending[0].payload == repr(("p", "a")).encode() and isinstance(pending[0].payload, bytes)
    assert store.outbox_pending(limit=2) == pending[:2]
    store.outbox_ack([ids[0], ids[2], ids[5]])
    store.outbox_ack([])
    assert [entry.id for entry in store.outbox_pending()] == [ids[1], ids[3], ids[4]]
    assert store.outbox_size() == 3
    store.outbox_ack(ids)
    assert store.outbox_size() == 0 and store.outbox_pending() == []
    later = store.apply(spec.table_id, [mutation("p", "g", 1)], derive=recording_derive([]))
    assert later.outbox_ids[0] > max(ids)


def test_outbox_ids_follow_the_order_of_the_derived_entries(store, spec):
    produced = []

    def derive(changes):
        entries = [(f"node-{n}", f"{merged.key[1]}/{n}".encode()) for _, merged in changes for n in range(3)]
        produced.extend(entries)
        return entries

    result = store.apply(spec.table_id, [mutation("p", f"{i:04}", 1) for i in range(400)], derive=derive)
    by_id = {entry.id: (entry.target, entry.payload) for entry in store.outbox_pending(limit=5000)}
    assert [by_id[i] for i in result.outbox_ids] == produced
    assert list(result.outbox_ids) == sorted(result.outbox_ids)


def test_reads_inside_derive_see_the_last_committed_state(store, spec):
    store.apply(spec.table_id, [mutation("p", "a", 1, t=Cell("old", 1))])
    seen = []

    def derive(changes):
        seen.extend(visible_values(store.get(spec.table_id, merged.token, merged.key)) for _, merged in changes)
        return []

    store.apply(spec.table_id, [mutation("p", "a", 2, t=Cell("new", 2))], derive=derive)
    assert seen == [{"t": "old"}]


# --- tables -------------------------------------------------------------------------------------------


def test_ensure_and_drop_are_idempotent(store):
    spec = make_spec()
    assert not store.has_table(spec.table_id)
    store.ensure_table(spec)
    store.apply(spec.table_id, [mutation("p", "a", 1)])
    store.ensure_table(spec)
    assert store.has_table(spec.table_id) and store.count(spec.table_id) == 1
    store.drop_table(spec.table_id)
    store.drop_table(spec.table_id)
    assert not store.has_table(spec.table_id)
    with pytest.raises(KeyError):
        store.get(spec.table_id, 1, ("p", "a"))
    store.ensure_table(spec)
    assert store.count(spec.table_id) == 0


def test_ensure_table_can_append_regular_columns(store, spec):
    store.apply(spec.table_id, [mutation("p", "a", 1, t=Cell("x", 1))])
    extra = ColumnSpec("extra", "double")
    wider = TableSpec(spec.table_id, spec.partition_key, spec.clustering_key, spec.regular + (extra,))
    store.ensure_table(wider)
    store.apply(spec.table_id, [mutation("p", "a", 2, extra=Cell(0.5, 2))])
    assert visible_values(store.get(spec.table_id, token_of("p"), ("p", "a"))) == {"t": "x", "extra": 0.5}
    narrower = TableSpec(spec.table_id, spec.partition_key, spec.clustering_key, spec.regular[1:])
    with pytest.raises(ValueError):
        store.ensure_table(narrower)
    store.ensure_table(spec)  # an older definition (a write that read the schema before the ALTER) changes nothing
    assert store.table_spec(spec.table_id) == wider
    store.apply(spec.table_id, [mutation("p", "a", 3, t=Cell("y", 3))])
    assert visible_values(store.get(spec.table_id, token_of("p"), ("p", "a"))) == {"t": "y", "extra": 0.5}


def test_tables_and_rows_survive_reopening(store_url, spec):
    with NodeStore(store_url) as first:
        first.ensure_table(spec)
        first.apply(spec.table_id, [mutation("p", "a", 1, t=Cell("x", 1))], derive=recording_derive([]))
    with NodeStore(store_url) as second:
        assert second.has_table(spec.table_id)
        assert visible_values(second.get(spec.table_id, token_of("p"), ("p", "a"))) == {"t": "x"}
        assert second.outbox_size() == 1


def test_for_data_dir_uses_a_wal_sqlite_file(tmp_path):
    with NodeStore.for_data_dir(tmp_path / "node") as node_store:
        node_store.ensure_table(make_spec())
    assert (tmp_path / "node" / "storage.db").exists()
    engine = sa.create_engine(sa.URL.create("sqlite", database=str(tmp_path / "node" / "storage.db")))
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()


# --- concurrency --------------------------------------------------------------------------------------


def test_concurrent_apply_from_eight_threads_loses_nothing(store, spec):
    threads_count, batches_per_thread = 8, 25
    keys = [("p", c) for c in "abcdef"]
    plans = []
    for thread_number in range(threads_count):
        rng = random.Random(thread_number)
        plans.append([
            [
                mutation(
                    p, c,
                    marker_ts=rng.choice([None, rng.randint(1, 1000)]),
                    tomb_ts=rng.choice([None, None, None, rng.randint(1, 1000)]),
                    big=Cell(rng.randint(-(2**62), 2**62), rng.randint(1, 1000)),
                    t=Cell(rng.choice([None, "x", "y"]), rng.randint(1, 1000)),
                )
                for p, c in rng.sample(keys, 3)
            ]
            for _ in range(batches_per_thread)
        ])
    start = threading.Barrier(threads_count + 1)
    changed, errors = [], []
    writers_done = threading.Event()

    def write(plan):
        start.wait()
        try:
            for batch in plan:
                changed.append(store.apply(spec.table_id, batch, derive=recording_derive([])).changed)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    def read():
        start.wait()
        try:
            while not writers_done.is_set():
                scan_all(store, spec, include_tombstones=True)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    writers = [threading.Thread(target=write, args=(plan,)) for plan in plans]
    reader = threading.Thread(target=read)
    for thread in writers + [reader]:
        thread.start()
    for thread in writers:
        thread.join()
    writers_done.set()
    reader.join()
    assert errors == []
    assert_store_holds(store, spec, [m for plan in plans for batch in plan for m in batch])
    assert store.outbox_size() == sum(changed)


# --- background checkpoints --------------------------------------------------------------------------------


def test_a_checkpoint_copies_the_whole_wal_so_the_next_write_starts_it_over(store, spec):
    if store.url.get_backend_name() == "postgresql":
        assert store.checkpoint() is None  # PostgreSQL checkpoints by itself
        return
    for batch in range(20):
        store.apply(spec.table_id, [mutation(f"p{batch}-{i}", "c", marker_ts=1, t=Cell("x" * 200, 1))
                                    for i in range(50)])
    full = store.checkpoint()
    assert full.wal_frames > 20 and full.checkpointed == full.wal_frames and not full.busy
    store.apply(spec.table_id, [mutation("one-more", "c", marker_ts=2)])
    after_one_write = store.checkpoint()
    assert 0 < after_one_write.wal_frames < full.wal_frames  # the WAL holds that write alone
    assert after_one_write.checkpointed == after_one_write.wal_frames
    assert_store_holds(store, spec, [mutation(f"p{b}-{i}", "c", marker_ts=1, t=Cell("x" * 200, 1))
                                     for b in range(20) for i in range(50)] + [mutation("one-more", "c", marker_ts=2)])


def test_checkpoints_run_beside_writers_and_readers_without_losing_a_row(store, spec):
    if store.url.get_backend_name() == "postgresql":
        return  # PostgreSQL checkpoints by itself
    stop, errors, written, done = threading.Event(), [], [], []

    def checkpoints():
        try:
            while not stop.is_set():
                done.append(store.checkpoint())
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    checkpointer = threading.Thread(target=checkpoints)
    checkpointer.start()
    try:
        for batch in range(30):
            rows = [mutation(f"k{batch}-{i}", "c", marker_ts=batch + 1, i=Cell(i, batch + 1)) for i in range(20)]
            store.apply(spec.table_id, rows)
            written.extend(rows)
            scan_all(store, spec)
    finally:
        stop.set()
        checkpointer.join()
    assert errors == []
    assert any(checkpoint is not None and checkpoint.checkpointed for checkpoint in done)
    assert_store_holds(store, spec, written)


def test_a_checkpoint_waits_for_min_writes_write_transactions_since_the_last(store, spec):
    if store.url.get_backend_name() == "postgresql":
        assert store.checkpoint(min_writes=0) is None
        return
    store.checkpoint()
    store.apply(spec.table_id, [mutation("a", "c", marker_ts=1)])
    store.apply(spec.table_id, [mutation("b", "c", marker_ts=1)])
    assert store.checkpoint(min_writes=3) is None
    store.apply(spec.table_id, [mutation("c", "c", marker_ts=1)])
    done = store.checkpoint(min_writes=3)
    assert done is not None and done.checkpointed == done.wal_frames > 0
    assert store.checkpoint(min_writes=1) is None  # nothing written since


def test_a_relative_sqlite_path_is_made_absolute_so_it_does_not_follow_the_working_directory(tmp_path, monkeypatch):
    from storage.engine import absolute_url

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel").mkdir()
    store = NodeStore("sqlite:///rel/storage.db")
    try:
        assert store.url.database == str(tmp_path.resolve() / "rel" / "storage.db")
    finally:
        store.close()
    assert absolute_url("sqlite://").database is None
    assert absolute_url("sqlite:///:memory:").database == ":memory:"
    assert absolute_url("postgresql+psycopg://u@h/db").database == "db"
