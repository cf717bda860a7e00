"""The child processes of storage.adbc_pool running storage.adbc_child's ADBC SQLite work: reuse, errors, imports."""
from __future__ import annotations

import fcntl
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from storage import adbc_child, bulk
from storage.adbc_pool import PIPE_BYTES, ChildPool
from storage.cells import ColumnSpec, Row, TableSpec
from storage.store import NodeStore

pytestmark = pytest.mark.waits  # child processes that import pyarrow

MIN_TOKEN, MAX_TOKEN = -(2**63), 2**63 - 1


def one_row_table(store: NodeStore) -> TableSpec:
    spec = TableSpec(uuid.uuid4().hex, (ColumnSpec("p", "text"),), (ColumnSpec("n", "int"),))
    store.ensure_table(spec)
    store.apply(spec.table_id, [Row(1, ("a", 1), marker_ts=1)])
    return spec


def test_a_dead_child_process_is_replaced(tmp_path):
    with NodeStore(sa.URL.create("sqlite", database=str(tmp_path / "n.db"))) as store:
        spec = one_row_table(store)
        assert bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN).num_rows == 1
        for child in list(bulk._SQLITE_CHILDREN._idle):
            child._process.kill()
            child._process.wait()
        assert bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN).num_rows == 1
        bulk.shutdown()
        assert bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN).num_rows == 1


@contextmanager
def prestarted_store(tmp_path, children: int):
    """A store with one row, its data plane's children prestarted (`children` readers); the pools as they were after."""
    with NodeStore(sa.URL.create("sqlite", database=str(tmp_path / "n.db"))) as store:
        spec = one_row_table(store)
        bulk.shutdown()
        try:
            bulk.prestart_children(store, children)
            yield store, spec
        finally:
            bulk.shutdown()
            bulk._SQLITE_CHILDREN._keep_idle = bulk.SQLITE_IDLE_CHILDREN


def test_prestarted_children_serve_the_first_calls_and_a_dead_one_is_replaced(tmp_path):
    """A node starts its data plane's children at start: the first reads find them idle, none is started then."""
    with prestarted_store(tmp_path, 3) as (store, spec):
        prestarted = list(bulk._SQLITE_CHILDREN._idle)
        assert len(prestarted) == 3 and all(child.alive() for child in prestarted)
        prestarted[0]._process.kill()
        prestarted[0]._process.wait()
        bulk.prestart_children(store, 3)
        ready = list(bulk._SQLITE_CHILDREN._idle)
        assert len(ready) == 3 and prestarted[0] not in ready
        assert bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN).num_rows == 1
        assert set(bulk._SQLITE_CHILDREN._idle) == set(ready)  # the read used an idle child, started none


def test_merges_keep_one_child_process_while_reads_take_others(tmp_path):
    """A store's merges go to the writers' child, so its kept connection keeps its page cache between merges."""
    with prestarted_store(tmp_path, 2) as (store, spec):
        writer, = bulk._SQLITE_WRITERS._idle
        readers = set(bulk._SQLITE_CHILDREN._idle)
        stored = bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN, include_tombstones=True)
        for _ in range(3):
            bulk.merge_stored_rows(store, spec, stored)
            assert bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN).num_rows == 1
        assert bulk._SQLITE_WRITERS._idle == [writer] and writer not in readers
        assert set(bulk._SQLITE_CHILDREN._idle) == readers


def test_an_error_in_a_child_process_reaches_the_caller_and_the_child_stays_usable(tmp_path):
    with NodeStore(sa.URL.create("sqlite", database=str(tmp_path / "n.db"))) as store:
        spec = one_row_table(store)
        backend = bulk._backend(store)
        with pytest.raises(Exception, match="no_such_table"):
            bulk._SQLITE_CHILDREN.run("read", backend, "SELECT * FROM no_such_table", (), 10)
        assert bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN).num_rows == 1


def test_a_pool_answers_only_the_calls_its_served_module_names():
    pool = ChildPool(1, "storage.adbc_child")
    try:
        with pytest.raises(KeyError, match="no_such_call"):
            pool.run("no_such_call")
        assert sorted(adbc_child.CHILD_FUNCTIONS) == ["merge", "merge_window", "modules", "read", "stage"]
    finally:
        pool.shutdown()


def test_a_data_plane_child_imports_neither_sqlalchemy_nor_the_store(tmp_path):
    """A child loads only ADBC, pyarrow and light project modules: SQLAlchemy was ~40% of its start."""
    with prestarted_store(tmp_path, 1) as (store, spec):
        assert bulk.read_token_range(store, spec, MIN_TOKEN, MAX_TOKEN).num_rows == 1
        for pool in (bulk._SQLITE_CHILDREN, bulk._SQLITE_WRITERS):
            modules = set(pool.run("modules"))
            assert "adbc_driver_sqlite" in modules and "storage.adbc_child" in modules
            assert not {"sqlalchemy", "storage.bulk", "storage.store", "storage.engine"} & modules


@pytest.mark.skipif(int(Path("/proc/sys/fs/pipe-max-size").read_text()) < PIPE_BYTES,
                    reason="this system caps pipes below PIPE_BYTES")
def test_a_child_pipes_hold_a_window_of_rows_in_few_hand_overs():
    pool = ChildPool(1, "storage.adbc_child")
    pool.prestart(1)
    try:
        [child] = pool._idle
        for pipe in (child._process.stdin, child._process.stdout):
            assert fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ) == PIPE_BYTES
        payload = bytes(3 * PIPE_BYTES)  # more than a pipe holds: sent and answered in pieces
        with pytest.raises(KeyError):
            pool.run("no such function", payload)
        assert pool._idle and pool._idle[0].alive()
    finally:
        pool.shutdown()
