"""The outbox payload format (docs/outbox.md): exact round trips, version 1 entries, and delivery from the store."""
from __future__ import annotations

import math
import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.codec import batch_from_proto_bytes, batch_to_proto
from common.metrics import NodeMetrics
from common.replica_messages import RowBatch
from coordinator.core.errors import Unavailable
from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN
from replica.outbox import ViewUpdateOutbox, grouped_updates
from replica.outbox_payload import UnreadablePayload, decode_payload, decode_value, encode_payload, encode_value
from replica.rows import storage_spec, upsert_row
from storage.cells import Cell, Row
from storage.store import NodeStore
from tests.replica_fakes import InProcessCluster, cluster_state

TABLE_ID = "ab" * 16


def double_from_bits(bits: int) -> float:
    return struct.unpack(">d", struct.pack(">Q", bits))[0]


def same_value(a: object, b: object) -> bool:
    """Equal and of the same type; doubles bit for bit (NaN sign and payload, the sign of zero)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack(">d", a) == struct.pack(">d", b)
    return a == b


def same_row(a: Row, b: Row) -> bool:
    return (a.token, a.marker_ts, a.tomb_ts) == (b.token, b.marker_ts, b.tomb_ts) \
        and len(a.key) == len(b.key) and all(same_value(x, y) for x, y in zip(a.key, b.key)) \
        and a.cells.keys() == b.cells.keys() \
        and all(same_value(a.cells[n].value, b.cells[n].value) and a.cells[n].ts == b.cells[n].ts for n in a.cells)


def same_batch(a: RowBatch, b: RowBatch) -> bool:
    def header(batch: RowBatch) -> tuple:
        return (batch.table_id, batch.shard, batch.schema_version, batch.timestamp)

    return header(a) == header(b) and len(a.rows) == len(b.rows) and all(map(same_row, a.rows, b.rows))


EDGE_VALUES = [
    None, True, False, 0, 1, -1, 2**63 - 1, -(2**63), 2**100, -(2**100),
    0.0, -0.0, 1.5, -2.25e-310, math.inf, -math.inf, math.nan, double_from_bits(0xFFF8000000000000),
    double_from_bits(0x7FF0000000000001), "", "text", "café ☕ 🎉", "\ud800 lone surrogate", '{"version":2}',
    b"", b"\x00\xff blob",
]


@pytest.mark.parametrize("value", EDGE_VALUES, ids=repr)
def test_every_value_round_trips_exactly(value):
    assert same_value(decode_value(encode_value(value)), value)


def test_a_batch_with_upserts_tombstones_null_cells_and_extreme_timestamps_round_trips_exactly():
    rows = (
        Row(token=-(2**63), key=(1, "a"), marker_ts=2**62, cells={"v": Cell(math.nan, 5), "w": Cell(None, 6)}),
        Row(token=2**63 - 1, key=(-0.0, b"k"), tomb_ts=1),
        Row(token=0, key=(True,), marker_ts=3, tomb_ts=4, cells={"x": Cell(-(2**70), 4)}),
    )
    batch = RowBatch(TABLE_ID, 3, rows, schema_version=12, timestamp=99)
    payload = encode_payload(batch)
    assert payload.startswith(b'{"version":2,') and payload.isascii()
    assert same_batch(decode_payload(payload), batch)


scalar_values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(), st.binary())
timestamps = st.integers(min_value=-(2**63), max_value=2**63 - 1)
rows = st.builds(
    Row,
    token=timestamps,
    key=st.lists(scalar_values.filter(lambda v: v is not None), min_size=1, max_size=3).map(tuple),
    marker_ts=st.none() | timestamps,
    tomb_ts=st.none() | timestamps,
    cells=st.dictionaries(st.text(min_size=1), st.builds(Cell, scalar_values, timestamps), max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(rows, max_size=4), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1))
def test_any_batch_round_trips_exactly(batch_rows, shard, schema_version):
    batch = RowBatch(TABLE_ID, shard, tuple(batch_rows), schema_version)
    assert same_batch(decode_payload(encode_payload(batch)), batch)


# ----------------------------------------------------------------- versions


def version_1_payload(batch: RowBatch) -> bytes:
    """How the code before format version 2 stored an entry: a serialized protobuf MutationBatch."""
    return batch_to_proto(batch).SerializeToString()


def test_a_version_1_entry_is_read_with_the_reader_the_node_passes_in():
    batch = RowBatch(TABLE_ID, 1, (Row(token=7, key=(1, 2), marker_ts=10, cells={"v": Cell(1.5, 10)}),), 4)
    payload = version_1_payload(batch)
    assert payload[:1] == b"\x0a"
    assert same_batch(decode_payload(payload, batch_from_proto_bytes), batch)
    with pytest.raises(UnreadablePayload, match="version 1"):
        decode_payload(payload)


def test_an_entry_of_an_unknown_version_is_refused():
    with pytest.raises(UnreadablePayload, match="version 5"):
        decode_payload(b'{"version":5,"rows":[]}')
    with pytest.raises(UnreadablePayload, match="unreadable columns"):
        decode_payload(b'{"version":3,"table_id":"t","shard":0,"schema_version":1,"columns":"bm90IGFycm93"}')
    with pytest.raises(UnreadablePayload, match="unknown tagged value"):
        decode_value({"decimal": "1.0"})


# ----------------------------------------------------------------- delivery from the store


class RecordingSend:
    def __init__(self, refused: set[str] = frozenset()):
        self.sent: list[tuple[str, RowBatch]] = []
        self.refused = refused

    def __call__(self, target: str, batch: RowBatch) -> None:
        if target in self.refused:
            raise Unavailable(f"{target} is down")
        self.sent.append((target, batch))


@pytest.fixture
def store(tmp_path):
    store = NodeStore.for_data_dir(tmp_path)
    yield store
    store.close()


def queue(store: NodeStore, entries: list[tuple[str, bytes]]) -> None:
    """Put outbox entries in the store the way a base write does (in the transaction of a base row)."""
    schema = cluster_state(nodes=("n1",), rf=1, tablets=1)
    store.ensure_table(storage_spec(schema.table))
    store.apply(schema.table_id, [upsert_row(schema.table, {"key": 1, "c": 1, "v": "x"}, 5)], lambda changes: entries)


def view_batch(shard: int, key: int, schema_version: int) -> RowBatch:
    return RowBatch(TABLE_ID, shard, (Row(token=key, key=(key,), marker_ts=5),), schema_version)


def test_a_flush_delivers_old_and_new_entries_merged_per_target_view_and_shard_and_acknowledges_them(store):
    entries = [("n2", version_1_payload(view_batch(0, 1, 3))), ("n2", encode_payload(view_batch(0, 2, 4))),
               ("n3", encode_payload(view_batch(1, 3, 4))), ("n2", encode_payload(view_batch(1, 4, 2)))]
    queue(store, entries)
    send = RecordingSend()
    ViewUpdateOutbox(store, send, NodeMetrics(), batch_from_proto_bytes).flush()
    delivered = {(target, batch.shard): ([r.key for r in batch.rows], batch.schema_version)
                 for target, batch in send.sent}
    assert delivered == {("n2", 0): ([(1,), (2,)], 4), ("n2", 1): ([(4,)], 2), ("n3", 1): ([(3,)], 4)}
    assert store.outbox_size() == 0


def test_entries_for_an_unreachable_target_or_in_an_unreadable_format_stay_queued_and_others_are_delivered(store):
    garbage = b"\x0a\xff\xff not protobuf"
    queue(store, [("n2", encode_payload(view_batch(0, 1, 1))), ("n3", b'{"version":9}'), ("n3", garbage),
                  ("n3", encode_payload(view_batch(0, 2, 1))), ("n4", encode_payload(view_batch(0, 3, 1)))])
    send = RecordingSend(refused={"n4"})
    ViewUpdateOutbox(store, send, NodeMetrics(), batch_from_proto_bytes).flush()
    assert sorted(target for target, _ in send.sent) == ["n2", "n3"]
    assert sorted(e.target for e in store.outbox_pending()) == ["n3", "n3", "n4"]
    assert [e.payload for e in store.outbox_pending(target="n3")] == [b'{"version":9}', garbage]


def test_entries_for_a_node_removed_from_the_cluster_are_dropped_and_counted_and_the_others_delivered(store):
    queue(store, [("n2", encode_payload(view_batch(0, 1, 1))), ("n8", encode_payload(view_batch(0, 2, 1))),
                  ("n8", encode_payload(view_batch(1, 3, 1))), ("n9", encode_payload(view_batch(0, 4, 1)))])
    send, metrics = RecordingSend(refused={"n8", "n9"}), NodeMetrics()
    ViewUpdateOutbox(store, send, metrics, removed_nodes=lambda: {"n8", "n5"}).flush()
    assert [target for target, _ in send.sent] == ["n2"]
    assert [e.target for e in store.outbox_pending()] == ["n9"]  # down, not removed: kept for a retry
    assert metrics.view_updates_dropped._value.get() == 2


# ----------------------------------------------------------------- a build's view rows kept for an unreachable replica


def build_view_rows(schema, keys: range, ts: int) -> pa.Table:
    view = schema.view
    rows = [upsert_row(view, {"v": f"v{k}", "key": k, "c": k % 3}, ts) for k in keys]
    return pa.table({"token": [r.token for r in rows], "c_v": [r.key[0] for r in rows],
                     "c_key": pa.array([r.key[1] for r in rows], pa.int32()),
                     "c_c": pa.array([r.key[2] for r in rows], pa.int32()), "ts": [ts] * len(rows)})


def test_view_rows_round_trip_as_format_version_4_and_join_only_with_view_rows():
    schema = cluster_state(nodes=("n1",), rf=1, tablets=1, with_view=True)
    rows = build_view_rows(schema, range(5), 9)
    batch = RowBatch(schema.view_id, 0, (), 3, columns=rows, view_rows=True)
    payload = encode_payload(batch)
    assert payload.startswith(b'{"version":4,')
    decoded = decode_payload(payload)
    assert decoded.view_rows and decoded.columns.equals(rows) and decoded.schema_version == 3
    mutations = RowBatch(schema.view_id, 0, (), 3, columns=rows)
    assert not decode_payload(encode_payload(mutations)).view_rows
    assert len(grouped_updates([("n2", batch), ("n2", mutations), ("n2", batch)])) == 2


def test_kept_view_rows_wait_for_their_replica_then_merge_there_and_leave_no_trace(tmp_path):
    schema = cluster_state(nodes=("n1", "n2"), rf=1, tablets=1, with_view=True)
    cluster = InProcessCluster(tmp_path, schema)
    try:
        holder, target = cluster.nodes["n1"], cluster.nodes["n2"]
        cluster.network.down.add("n2")
        holder.local.queue_view_rows("n2", schema.view_id, 0, schema.state.schema_version,
                                     build_view_rows(schema, range(10), 7))
        holder.local.flush_outbox()
        assert holder.store.outbox_holds_view(schema.view_id, "n2")
        assert not holder.store.outbox_holds_view(schema.view_id, "n1")
        cluster.network.down.clear()
        holder.local.flush_outbox()
        assert not holder.store.outbox_holds_view(schema.view_id, "n2") and holder.store.outbox_size() == 0
        merged = target.store.scan(schema.view_id, MIN_TOKEN, MAX_TOKEN)
        assert sorted(row.key[1] for row in merged) == list(range(10))
        assert len(cluster.network.calls_of("merge_view_rows")) == 2  # refused while down, then merged
    finally:
        cluster.close()


def test_an_outbox_made_before_entries_named_their_view_gains_the_column(tmp_path):
    import sqlite3
    database = tmp_path / "storage.db"
    with sqlite3.connect(database) as conn:
        conn.execute("CREATE TABLE storage_outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, target TEXT NOT NULL, "
                     "payload BLOB NOT NULL)")
        conn.execute("INSERT INTO storage_outbox (target, payload) VALUES ('n2', x'7b7d')")
    store = NodeStore.for_data_dir(tmp_path)
    try:
        assert [e.target for e in store.outbox_pending()] == ["n2"]
        store.outbox_queue([("n3", b"{}")], "view")
        assert store.outbox_holds_view("view", "n3") and not store.outbox_holds_view("view", "n2")
    finally:
        store.close()
