"""Unit tests of tablet streaming on in-process replicas: copy, resume, retries, fencing, cleanup, progress."""
from __future__ import annotations

import threading

import pytest

from coordinator.core.errors import InvalidArgument, NotFound, StaleTerm, Unavailable
from coordinator.core.tokens import tablet_range
from replica import streaming
from replica.rows import delete_row, storage_spec, upsert_row
from replica.streaming import TabletStream
from storage import bulk
from storage.arrow_layouts import storage_schema
from tests.replica_fakes import InProcessCluster, cluster_state

from .test_storage_bulk import canonical_row

ROWS = 300


@pytest.fixture
def cluster(tmp_path):
    cluster = InProcessCluster(tmp_path, cluster_state(nodes=("n1", "n2"), rf=1, tablets=2))
    table = cluster.schema.table
    writer = cluster.nodes["n1"].writer
    writer.write([(table, upsert_row(table, _values(i), 1_000)) for i in range(ROWS)], 1_000)
    writer.write([(table, upsert_row(table, {**_values(i), "v": None}, 2_000)) for i in range(0, ROWS, 7)], 2_000)
    writer.write([(table, delete_row(table, (i // 3, i % 3), 3_000)) for i in range(0, ROWS, 5)], 3_000)
    yield cluster
    cluster.close()


def _values(i: int) -> dict:
    return {"key": i // 3, "c": i % 3, "v": f"row{i}"}


def _holder_tablet(cluster) -> tuple[str, str, int, int]:
    """(holder, other node, first token, last token) of a tablet with rows."""
    tablet_map = cluster.schema.state.tablets[cluster.schema.table_id]
    for index, replicas in enumerate(tablet_map.replicas):
        first, last = tablet_range(index, tablet_map.tablet_count)
        holder = replicas[0].node
        if _stored(cluster, holder, first, last).num_rows:
            return holder, next(n for n in cluster.nodes if n != holder), first, last
    raise AssertionError("no tablet holds rows")


def _stored(cluster, node: str, first: int, last: int):
    """`node`'s stored rows of the range, tombstones included."""
    store, spec = cluster.nodes[node].store, storage_spec(cluster.schema.table)
    if not store.has_table(spec.table_id):
        return storage_schema(spec).empty_table()
    return bulk.read_token_range(store, spec, first, last, include_tombstones=True)


def _comparable(table) -> list[dict]:
    return [canonical_row(row) for row in table.to_pylist()]


def _request(cluster, migration: str = "m1", term: int = 1) -> TabletStream:
    holder, other, first, last = _holder_tablet(cluster)
    return TabletStream(term, migration, cluster.schema.table_id, first, last, holder, 0)


def _stream(cluster, request: TabletStream, current_term: int = 1):
    destination = next(n for n in cluster.nodes if n != request.source_node)
    return cluster.nodes[destination].local.stream_tablet(request, current_term=current_term)


def test_a_stream_copies_the_source_rows_with_tombstones_and_a_retry_changes_nothing(cluster):
    request = _request(cluster)
    other = next(n for n in cluster.nodes if n != request.source_node)
    source = _stored(cluster, request.source_node, request.first_token, request.last_token)
    assert source.column("tombstone").to_pylist().count(True) > 0
    result = _stream(cluster, request)
    assert result.rows == source.num_rows and result.seconds > 0
    copied = _stored(cluster, other, request.first_token, request.last_token)
    assert _comparable(copied) == _comparable(source)
    reads = len(cluster.network.calls_of("read_tablet_rows"))
    assert _stream(cluster, request).rows == source.num_rows  # finished: answered without reading again
    assert len(cluster.network.calls_of("read_tablet_rows")) == reads
    assert _comparable(_stored(cluster, other, request.first_token, request.last_token)) == _comparable(source)
    fresh = _stream(cluster, TabletStream(1, "m2", *request.tablet_range, request.source_node, 0))
    assert fresh.rows == source.num_rows  # a new migration starts over; the merge changes nothing
    assert _comparable(_stored(cluster, other, request.first_token, request.last_token)) == _comparable(source)


def test_windows_start_small_and_double_up_to_the_window_size(cluster, monkeypatch):
    monkeypatch.setattr(streaming, "FIRST_WINDOW_ROWS", 4)
    request = _request(cluster)
    node = cluster.nodes[request.source_node]
    spec = storage_spec(cluster.schema.table)
    windows = list(streaming.tablet_windows(node.store, spec, request.first_token, request.last_token, None, 32))
    sizes = [window.num_rows for window in windows]
    assert len(sizes) >= 5
    # a window ends at a token boundary: at most one partition (3 rows here) short of its size
    for size, rows in zip([4, 8, 16, 32, 32], sizes):
        assert size - 3 <= rows <= size
    assert all(rows <= 32 for rows in sizes)
    whole = _stored(cluster, request.source_node, request.first_token, request.last_token)
    assert sum(sizes) == whole.num_rows


def test_a_failed_stream_resumes_after_the_last_token_it_merged(cluster, monkeypatch):
    monkeypatch.setattr(streaming, "WINDOW_ROWS", 20)
    request = _request(cluster)
    merges, real_merge = [], bulk.merge_prepared_window

    def merge_failing_second(store, spec, window, **options):
        merges.append([window.last_token])
        if len(merges) == 2:
            raise Unavailable("the disk hiccuped")
        return real_merge(store, spec, window, **options)

    monkeypatch.setattr(bulk, "merge_prepared_window", merge_failing_second)
    with pytest.raises(Unavailable, match=r"failed after \d+ rows \(merged up to token .*the disk hiccuped"):
        _stream(cluster, request)
    first_window = merges[0]
    _stream(cluster, request)
    [_, retry] = [c.message for c in cluster.network.calls_of("read_tablet_rows")]
    assert retry == (request.table_id, first_window[-1])
    source = _stored(cluster, request.source_node, request.first_token, request.last_token)
    other = next(n for n in cluster.nodes if n != request.source_node)
    assert _comparable(_stored(cluster, other, request.first_token, request.last_token)) == _comparable(source)


def test_stale_terms_are_refused_and_a_newer_call_raises_the_fence(cluster):
    request = _request(cluster, term=3)
    with pytest.raises(StaleTerm, match="stale term 3"):
        _stream(cluster, request, current_term=4)
    other = next(n for n in cluster.nodes if n != request.source_node)
    local = cluster.nodes[other].local
    local.cleanup_tablet(7, 4, "m1", *request.tablet_range, 0)
    with pytest.raises(StaleTerm):
        _stream(cluster, request, current_term=4)


def test_cleanup_deletes_the_range_and_a_later_stream_starts_over(cluster):
    request = _request(cluster)
    other = next(n for n in cluster.nodes if n != request.source_node)
    source_rows = _stream(cluster, request).rows
    local = cluster.nodes[other].local
    assert local.cleanup_tablet(1, 1, "m1", *request.tablet_range, 0) == source_rows
    assert _stored(cluster, other, request.first_token, request.last_token).num_rows == 0
    assert local.cleanup_tablet(1, 1, "m1", *request.tablet_range, 0) == 0
    assert _stream(cluster, request).rows == source_rows
    assert _stored(cluster, other, request.first_token, request.last_token).num_rows == source_rows


def test_bad_requests_are_refused(cluster):
    request = _request(cluster)
    for bad, error in ((TabletStream(1, "", *request.tablet_range, request.source_node, 0), InvalidArgument),
                       (TabletStream(1, "m", request.table_id, 5, 4, request.source_node, 0), InvalidArgument),
                       (TabletStream(1, "m", *request.tablet_range, "", 0), InvalidArgument),
                       (TabletStream(1, "m", "f" * 32, 0, 1, request.source_node, 0), NotFound)):
        with pytest.raises(error):
            _stream(cluster, bad)
    with pytest.raises(InvalidArgument, match="is this node"):
        cluster.nodes[request.source_node].local.stream_tablet(request, current_term=1)


def test_a_running_stream_shows_its_progress_and_an_injected_failure_fails_it(cluster):
    request = _request(cluster)
    other = cluster.nodes[next(n for n in cluster.nodes if n != request.source_node)]
    other.injections.enable("stream_tablet_fail", mode="pause", one_shot=True)
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(_stream(cluster, request)))
    runner.start()
    try:
        assert other.injections.wait_hit("stream_tablet_fail", timeout=30)
        [progress] = other.local.tablet_stream_progress()
        assert (progress.migration_id, progress.source_node, progress.rows) == ("m1", request.source_node, 0)
    finally:
        other.injections.disable("stream_tablet_fail")
        runner.join(timeout=60)
    assert outcome and other.local.tablet_stream_progress() == []
    other.injections.enable("stream_tablet_fail", mode="fail")
    fresh = TabletStream(1, "m2", *request.tablet_range, request.source_node, 0)
    with pytest.raises(Unavailable, match="injected failure at 'stream_tablet_fail'"):
        _stream(cluster, fresh)
