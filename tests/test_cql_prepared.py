"""Prepared statements (bind columns, ids, invalidation by DROP, re-creation and ALTER) and request size limits."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest

from common.injection import Injections
from common.metrics import NodeMetrics
from coordinator.core.errors import InvalidArgument, NotFound
from common.arrow_values import plain_columns
from cql.columnar import ArrowValues
from cql.executor import Executor
from replica.rows import storage_spec
from storage.arrow_layouts import rows_of_mutations
from storage.cells import Cell
from replica.write_path import TableDropped
from cql.limits import Limits
from cql.prepared import UNPREPARED, BindColumn, PreparedCache, Unprepared, statement_id
from vbc import client

from .cluster_executor import ClusterExecutor
from .fakes import FakeGroup0
from .test_executor_routing import NOW, RecordingReader, RecordingWriter, register_node


def executor_on(group0: FakeGroup0, limits: Limits | None = None) -> tuple[Executor, RecordingWriter]:
    writer = RecordingWriter()
    return ClusterExecutor(group0, writer, RecordingReader(), now=lambda: NOW, injections=Injections(),
                    metrics=NodeMetrics(), limits=limits), writer


def schema_on(group0: FakeGroup0) -> tuple[Executor, RecordingWriter]:
    """Node n1, keyspace ks and table ks.t (p int, c bigint, v text, d double), made through an executor on group0."""
    register_node(group0, "n1")
    executor, writer = executor_on(group0)
    executor.execute("CREATE KEYSPACE ks WITH replication = {'replication_factor': 1} AND tablets = {'initial': 4}")
    executor.execute("CREATE TABLE ks.t (p int, c bigint, v text, d double, PRIMARY KEY (p, c))")
    return executor, writer


@pytest.fixture
def cluster():
    group0 = FakeGroup0()
    executor, writer = schema_on(group0)
    return executor, group0, writer


INSERT = "INSERT INTO ks.t (p, c, v, d) VALUES (?, ?, ?, ?)"


def test_prepare_names_the_column_and_type_of_every_marker_in_order(cluster):
    executor, _, _ = cluster
    assert executor.prepare(INSERT).bind_columns == (BindColumn("p", "int"), BindColumn("c", "bigint"),
                                                     BindColumn("v", "text"), BindColumn("d", "double"))
    update = executor.prepare("UPDATE ks.t SET v = ? WHERE p = ? AND c = ?")
    assert [c.name for c in update.bind_columns] == ["v", "p", "c"]
    select = executor.prepare("SELECT * FROM ks.t WHERE p IN (?, ?) AND c = ?")
    assert select.bind_columns == (BindColumn("p", "int"), BindColumn("p", "int"), BindColumn("c", "bigint"))
    batch = executor.prepare("BEGIN BATCH DELETE FROM ks.t WHERE p = ? AND c = ?; "
                             "INSERT INTO ks.t (p, c) VALUES (?, 5) APPLY BATCH")
    assert [c.name for c in batch.bind_columns] == ["p", "c", "p"]


def test_the_id_is_the_same_on_every_node_and_for_every_preparation(cluster):
    executor, group0, _ = cluster
    other, _ = executor_on(group0)
    assert executor.prepare(INSERT).id == other.prepare(INSERT).id == statement_id(INSERT)
    assert statement_id(INSERT) != statement_id(INSERT + " ")


def test_a_prepared_statement_runs_with_value_sets_like_the_text(cluster):
    executor, _, writer = cluster
    prepared = executor.prepare(INSERT)
    result = executor.execute("", params=[[1, 2, "a", 0.5], [3, 4, None, -0.0]], prepared_id=prepared.id)
    assert result.message == "ok: 2 statements applied"
    [(mutations, _)] = writer.writes
    assert [row.key for _, row in mutations] == [(1, 2), (3, 4)]


def test_preparing_refuses_what_executing_would(cluster):
    executor, _, _ = cluster
    with pytest.raises(InvalidArgument, match="unknown column 'nope'"):
        executor.prepare("INSERT INTO ks.t (p, c, nope) VALUES (?, ?, ?)")
    with pytest.raises(NotFound):
        executor.prepare("INSERT INTO ks.missing (p) VALUES (?)")


def test_an_unknown_id_is_unprepared(cluster):
    executor, _, _ = cluster
    with pytest.raises(Unprepared, match="^unprepared statement abc: this node does not hold it"):
        executor.execute("", params=[[1, 2, "a", 1.0]], prepared_id="abc")
    assert client.UNPREPARED == UNPREPARED, "the client library recognises the node's answer"


def test_dropping_the_table_invalidates_and_preparing_again_reports_it_missing(cluster):
    executor, _, writer = cluster
    prepared = executor.prepare(INSERT)
    executor.execute("DROP TABLE ks.t")
    with pytest.raises(Unprepared, match="table ks.t was dropped since it was prepared; prepare it again"):
        executor.execute("", params=[[1, 2, "a", 1.0]], prepared_id=prepared.id)
    with pytest.raises(NotFound):
        executor.prepare(INSERT)
    assert writer.writes == []


def test_a_table_recreated_under_the_name_invalidates_the_statement(cluster):
    executor, _, writer = cluster
    prepared = executor.prepare("INSERT INTO ks.t (p, c, v) VALUES (?, ?, ?)")
    executor.execute("DROP TABLE ks.t")
    executor.execute("CREATE TABLE ks.t (p int, c bigint, v int, PRIMARY KEY (p, c))")  # v is an int now
    with pytest.raises(Unprepared, match="table ks.t changed"):
        executor.execute("", params=[[1, 2, "a"]], prepared_id=prepared.id)
    again = executor.prepare("INSERT INTO ks.t (p, c, v) VALUES (?, ?, ?)")
    assert again.id == prepared.id and again.bind_columns[2] == BindColumn("v", "int")
    executor.execute("", params=[[1, 2, 7]], prepared_id=again.id)
    assert len(writer.writes) == 1


def test_altering_the_table_invalidates_the_statement_and_preparing_again_sees_the_new_column(cluster):
    executor, _, writer = cluster
    prepared = executor.prepare(INSERT)
    assert executor.execute("ALTER TABLE ks.t ADD (w int, x text)").message == "altered table ks.t"
    with pytest.raises(Unprepared, match="table ks.t changed"):
        executor.execute("", params=[[1, 2, "a", 1.0]], prepared_id=prepared.id)
    assert writer.writes == []
    again = executor.prepare("INSERT INTO ks.t (p, c, w) VALUES (?, ?, ?)")
    assert again.bind_columns[2] == BindColumn("w", "int")
    executor.execute("", params=[[1, 2, 7]], prepared_id=again.id)
    assert len(writer.writes) == 1


def test_the_cache_evicts_the_least_recently_used(cluster):
    executor, _, _ = cluster
    cache = PreparedCache(capacity=2)
    first, second, third = (executor.prepare(f"SELECT * FROM ks.t WHERE p = ? LIMIT {n}") for n in (1, 2, 3))
    cache.add(first), cache.add(second)
    cache.get(first.id)
    cache.add(third)
    assert len(cache) == 2 and cache.get(first.id) is first and cache.get(third.id) is third
    with pytest.raises(Unprepared):
        cache.get(second.id)


# ----------------------------------------------------------------- limits


def small_limits(group0: FakeGroup0) -> Executor:
    executor, _ = executor_on(group0, Limits(max_statement_bytes=100, max_value_bytes=10, max_batch_rows=3))
    return executor


def test_a_long_statement_is_refused_before_parsing(cluster):
    _, group0, _ = cluster
    executor = small_limits(group0)
    with pytest.raises(InvalidArgument, match=r"the statement is 101 bytes, over the limit of 100 "
                                              r"\(max_statement_bytes\)"):
        executor.execute("x" * 101)  # not even a statement: the limit comes first
    with pytest.raises(InvalidArgument, match="over the limit of 100"):
        executor.execute("é" * 51)  # 102 UTF-8 bytes
    with pytest.raises(InvalidArgument, match="over the limit of 100"):
        executor.prepare("x" * 101)


def test_a_large_value_is_refused_naming_its_position(cluster):
    _, group0, _ = cluster
    executor = small_limits(group0)
    prepared = executor.prepare(INSERT)
    with pytest.raises(InvalidArgument, match=r"value 3 of value set 2 is 11 bytes, over the limit of 10 "
                                              r"\(max_value_bytes\)"):
        executor.execute("", params=[[1, 1, "ok", 1.0], [2, 2, "x" * 11, 1.0]], prepared_id=prepared.id)
    executor.execute("", params=[[1, 1, "x" * 10, 1.0]], prepared_id=prepared.id)


def test_too_many_value_sets_or_batch_statements_are_refused(cluster):
    _, group0, _ = cluster
    executor = small_limits(group0)
    with pytest.raises(InvalidArgument, match=r"4 bind-value sets in one execution, over the limit of 3 "
                                              r"\(max_batch_rows\)"):
        executor.execute("INSERT INTO ks.t (p, c) VALUES (?, ?)", params=[[i, i] for i in range(4)])
    statements = " ".join(f"INSERT INTO ks.t (p, c) VALUES ({i}, 1);" for i in range(4))
    with pytest.raises(InvalidArgument, match="4 statements in one execution"):
        ClusterExecutor(group0, RecordingWriter(), RecordingReader(), now=lambda: NOW, injections=Injections(),
                 metrics=NodeMetrics(), limits=Limits(max_batch_rows=3)).execute(
            f"BEGIN BATCH {statements} APPLY BATCH")


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_value_bytes must be at least 1"):
        Limits(max_value_bytes=0)


class WriterBehindADrop(RecordingWriter):
    """A write path whose first write meets a replica that already applied a re-creation of the table."""

    def __init__(self, recreate):
        super().__init__()
        self._recreate = recreate

    def write(self, mutations, default_ts):
        if self._recreate is not None:
            recreate, self._recreate = self._recreate, None
            recreate()
            raise TableDropped("ks.t was dropped while this write was running (n2: NOT_FOUND: ...)")
        super().write(mutations, default_ts)


def lagging_executor(group0: FakeGroup0) -> tuple[Executor, WriterBehindADrop]:
    elsewhere, _ = executor_on(group0)

    def recreate():
        elsewhere.execute("DROP TABLE ks.t")
        elsewhere.execute("CREATE TABLE ks.t (p int, c bigint, v text, d double, PRIMARY KEY (p, c))")

    writer = WriterBehindADrop(recreate)
    return ClusterExecutor(group0, writer, RecordingReader(), now=lambda: NOW, injections=Injections(),
                    metrics=NodeMetrics()), writer


def test_a_text_write_that_meets_a_drop_it_had_not_seen_runs_again_on_the_table_now_under_the_name(cluster):
    _, group0, _ = cluster
    executor, writer = lagging_executor(group0)
    old_id = group0.read(lambda s: s.find_table("ks", "t")).id
    executor.execute("INSERT INTO ks.t (p, c, v) VALUES (1, 2, 'x')")
    [(mutations, _)] = writer.writes
    assert {table.id for table, _ in mutations} == {group0.read(lambda s: s.find_table("ks", "t")).id} != {old_id}


def test_a_prepared_write_that_meets_a_drop_it_had_not_seen_is_unprepared_so_the_client_prepares_again(cluster):
    _, group0, _ = cluster
    executor, writer = lagging_executor(group0)
    prepared = executor.prepare(INSERT)
    with pytest.raises(Unprepared, match="^unprepared statement"):
        executor.execute("", params=[[1, 2, "a", 0.5]], prepared_id=prepared.id)
    assert writer.writes == []


# --- Arrow value sets: the columnar write and its fallback to the row path ----------------------------------


def arrow_values(**columns) -> ArrowValues:
    return ArrowValues(plain_columns(pa.table(columns)))


def test_arrow_values_make_one_columnar_write_holding_what_the_row_path_would(cluster):
    executor, group0, writer = cluster
    prepared = executor.prepare(INSERT)
    values = dict(p=pa.array([1, -5, 7], pa.int64()), c=pa.array([2, 2**62, -1], pa.int64()),
                  v=["a", None, "é"], d=pa.array([0.5, -0.0, math.nan]))
    result = executor.execute("", params=arrow_values(**values), prepared_id=prepared.id)
    assert result.message == "ok: 3 statements applied"
    [(table, mutations, _)] = writer.column_writes
    executor.execute("", params=ArrowValues(plain_columns(pa.table(values))).rows(), prepared_id=prepared.id)
    [(row_mutations, _)] = writer.writes
    columnar = rows_of_mutations(storage_spec(table), mutations)
    expected = [row for _, row in row_mutations]
    assert [(r.token, r.key, r.marker_ts) for r in columnar] == [(r.token, r.key, r.marker_ts) for r in expected]
    assert [{n: (repr(c.value), c.ts) for n, c in r.cells.items()} for r in columnar] == \
        [{n: (repr(c.value), c.ts) for n, c in r.cells.items()} for r in expected]


def test_arrow_values_the_columns_cannot_hold_go_the_row_path_and_its_errors(cluster):
    executor, _, writer = cluster
    prepared = executor.prepare(INSERT)
    with pytest.raises(InvalidArgument, match="out of range for int column 'p'"):
        executor.execute("", params=arrow_values(p=pa.array([2**40]), c=[1], v=["x"], d=[1.0]),
                         prepared_id=prepared.id)
    with pytest.raises(InvalidArgument, match="missing: c"):
        executor.execute("", params=arrow_values(p=[1], c=pa.array([None], pa.int64()), v=["x"], d=[1.0]),
                         prepared_id=prepared.id)
    with pytest.raises(InvalidArgument, match="column 'v' is text; cannot store 5"):
        executor.execute("", params=arrow_values(p=[1], c=[1], v=[5], d=[1.0]), prepared_id=prepared.id)
    assert writer.column_writes == [] and writer.writes == []
    timestamps = executor.prepare("INSERT INTO ks.t (p, c, v) VALUES (?, 1, ?) USING TIMESTAMP 77")
    executor.execute("", params=arrow_values(p=[3], v=["x"]), prepared_id=timestamps.id)
    [(table, mutations, _)] = writer.column_writes
    [row] = rows_of_mutations(storage_spec(table), mutations)
    assert (row.key, row.marker_ts, dict(row.cells)) == ((3, 1), 77, {"v": Cell("x", 77)})


class RecordingGroup0(FakeGroup0):
    """group0 as the node that ran the schema changes sees it; `entries` holds what it committed, in order."""

    def __init__(self):
        super().__init__()
        self.entries = []

    def propose(self, command, timeout: float = 10.0):
        self.entries.append(command)
        return super().propose(command, timeout)


class LaggingGroup0(FakeGroup0):
    """group0 on a node that applies what `leader` committed only at a Raft barrier (a follower behind)."""

    def __init__(self, leader: RecordingGroup0):
        super().__init__()
        self._leader = leader
        self._applied = 0

    def barrier(self, timeout: float = 10.0) -> int:
        for command in self._leader.entries[self._applied:]:
            super().propose(command)
        self._applied = len(self._leader.entries)
        return super().barrier(timeout)


def test_values_for_a_recreated_table_this_node_has_not_applied_make_the_statement_unprepared():
    leader = RecordingGroup0()
    ahead, _ = schema_on(leader)
    follower = LaggingGroup0(leader)
    follower.barrier()
    behind, writer = executor_on(follower)
    prepared = behind.prepare(INSERT)
    ahead.execute("DROP TABLE ks.t")
    ahead.execute("CREATE TABLE ks.t (p int, c bigint, v int, d double, PRIMARY KEY (p, c))")
    with pytest.raises(Unprepared):
        behind.execute("", params=[[1, 2, 2, 0.5]], prepared_id=prepared.id)
    again = behind.prepare(INSERT)
    assert behind.execute("", params=[[1, 2, 2, 0.5]], prepared_id=again.id).message == "ok"
    [(mutations, _)] = writer.writes
    assert [row.cells["v"].value for _, row in mutations] == [2]


def test_values_that_do_not_fit_an_unchanged_table_stay_invalid_after_catching_up(cluster):
    executor, group0, _ = cluster
    prepared = executor.prepare(INSERT)
    barriers = group0.barriers
    with pytest.raises(InvalidArgument, match="column 'v' is text"):
        executor.execute("", params=[[1, 2, 5, 0.5]], prepared_id=prepared.id)
    assert group0.barriers == barriers + 1
