"""Unit tests of the statement executor's routing: DDL to group0, writes to the write path, SELECT to the read path."""
from __future__ import annotations

import pyarrow as pa
import pytest

from common.injection import Injections
from common.metrics import NodeMetrics
from coordinator.core.commands import RegisterNode
from coordinator.core.errors import FailedPrecondition, InvalidArgument, NotFound
from replica.rows import partition_token
from storage.arrow_layouts import arrow_type
from storage.cells import Cell, Row

from .cluster_executor import ClusterExecutor
from .fakes import FakeGroup0

NOW = 1_700_000_000_000_000


class RecordingWriter:
    """The write path as the executor sees it: records every write instead of sending it."""

    def __init__(self):
        self.writes = []
        self.column_writes = []

    def write(self, mutations, default_ts):
        self.writes.append((list(mutations), default_ts))

    def write_columns(self, table, mutations, default_ts, staged=False):
        self.column_writes.append((table, mutations, default_ts))


class RecordingReader:
    """The read path as the executor sees it: serves fixed rows per table (as the replicas would after their
    filters) and records each read."""

    def __init__(self):
        self.rows_by_table = {}
        self.reads = []
        self.queries = []

    def pages(self, table, query):
        self.reads.append((table.qualified_name, query.partitions, query.limit))
        self.queries.append(query)
        rows = self.rows_by_table.get(table.qualified_name, [])[:query.limit]
        names = [c.name for c in table.columns]
        columns = {"token": pa.array([0] * len(rows), pa.int64())}
        for name in query.columns:
            position = names.index(name)
            columns[name] = pa.array([row[position] for row in rows], arrow_type(table.columns[position].type))
        yield pa.RecordBatch.from_pydict(columns)


def register_node(group0: FakeGroup0, node_id: str) -> None:
    group0.propose(RegisterNode(node_id=node_id, grpc="127.0.0.1:1", raft="127.0.0.1:2", shards=2, cmd_id=None))


@pytest.fixture
def cluster():
    group0 = FakeGroup0()
    register_node(group0, "n1")
    writer, reader = RecordingWriter(), RecordingReader()
    executor = ClusterExecutor(group0, writer, reader, now=lambda: NOW, injections=Injections(), metrics=NodeMetrics())
    executor.execute("CREATE KEYSPACE ks WITH replication = {'replication_factor': 1} AND tablets = {'initial': 4}")
    executor.execute("CREATE TABLE ks.t (p int, c int, v text, PRIMARY KEY (p, c))")
    return executor, group0, writer, reader


def test_ddl_becomes_group0_commands_and_never_touches_the_data_paths(cluster):
    executor, group0, writer, reader = cluster
    assert group0.read(lambda s: s.find_table("ks", "t")) is not None
    assert group0.read(lambda s: s.tablets[s.find_table("ks", "t").id].tablet_count) == 4
    assert writer.writes == [] and reader.reads == []
    before = group0.applied_index
    assert executor.execute("DROP TABLE ks.t").message.startswith("dropped")
    assert group0.applied_index == before + 1 and group0.read(lambda s: s.find_table("ks", "t")) is None


def test_an_insert_is_one_write_with_the_coordinator_timestamp(cluster):
    executor, group0, writer, _ = cluster
    assert executor.execute("INSERT INTO ks.t (p, c, v) VALUES (1, 2, 'x')").message == "ok"
    [(mutations, default_ts)] = writer.writes
    table = group0.read(lambda s: s.find_table("ks", "t"))
    assert default_ts == NOW
    assert mutations == [(table, Row(token=partition_token(table, {"p": 1}), key=(1, 2), marker_ts=NOW,
                                     cells={"v": Cell("x", NOW)}))]


def test_bind_value_sets_and_batches_are_each_one_write(cluster):
    executor, _, writer, _ = cluster
    result = executor.execute("INSERT INTO ks.t (p, c, v) VALUES (?, ?, ?)", params=[[1, 1, "a"], [2, 2, "b"]])
    assert result.message == "ok: 2 statements applied"
    executor.execute("BEGIN BATCH USING TIMESTAMP 5 DELETE FROM ks.t WHERE p = 1 AND c = 1; "
                     "UPDATE ks.t USING TIMESTAMP 9 SET v = 'z' WHERE p = 2 AND c = 2; APPLY BATCH")
    assert [len(mutations) for mutations, _ in writer.writes] == [2, 2]
    deleted, updated = (row for _, row in writer.writes[1][0])
    assert deleted.tomb_ts == 5 and deleted.cells == {}
    assert updated.cells == {"v": Cell("z", 9)}


def test_a_select_reads_through_the_read_path_with_its_partitions_and_limit(cluster):
    executor, _, _, reader = cluster
    reader.rows_by_table["ks.t"] = [(1, 1, "a"), (1, 2, "b"), (1, 3, "c")]
    result = executor.execute("SELECT c, v FROM ks.t WHERE p IN (1, 1, 4) LIMIT 2")
    assert result.columns == [("c", "int"), ("v", "text")] and result.rows == [[1, "a"], [2, "b"]]
    assert reader.reads == [("ks.t", [(1,), (4,)], 2)]


def test_a_filter_on_a_regular_column_goes_to_the_replicas_with_the_limit(cluster):
    executor, _, _, reader = cluster
    reader.rows_by_table["ks.t"] = [(1, 2, "b")]
    result = executor.execute("SELECT p, c FROM ks.t WHERE v = 'b' LIMIT 1 ALLOW FILTERING")
    assert result.rows == [[1, 2]]
    assert reader.reads == [("ks.t", None, 1)]
    assert [(f.column, f.op, f.value) for f in reader.queries[0].filters] == [("v", "=", "b")]


def test_select_pages_come_from_one_read(cluster):
    executor, _, _, reader = cluster
    reader.rows_by_table["ks.t"] = [(p, 0, None) for p in range(5)]
    pages = list(executor.execute_pages("SELECT p FROM ks.t", page_size=2))
    assert [page.row_values() for page in pages] == [[[0], [1]], [[2], [3]], [[4]]]
    assert len(reader.reads) == 1
    assert [bool(page.paging_state) for page in pages] == [True, True, False]


def test_a_paging_state_resumes_after_the_last_row_of_its_page_with_the_limit_left(cluster):
    executor, _, _, reader = cluster
    reader.rows_by_table["ks.t"] = [(p, 0, None) for p in range(5)]
    first = executor.execute("SELECT p FROM ks.t LIMIT 4", page_size=3)
    assert first.rows == [[0], [1], [2]] and first.paging_state
    reader.rows_by_table["ks.t"] = [(3, 0, None), (4, 0, None)]
    second = executor.execute("SELECT p FROM ks.t LIMIT 4", page_size=3, paging_state=first.paging_state)
    assert second.rows == [[3]] and not second.paging_state
    resumed = reader.queries[-1]
    assert resumed.after == (0, (2, 0)) and resumed.limit == 1
    with pytest.raises(InvalidArgument, match="paging_state is not one this cluster issued"):
        executor.execute("SELECT p FROM ks.t", page_size=3, paging_state=b"garbage")


def test_a_view_being_built_is_refused_unless_allow_stale(cluster):
    executor, _, _, reader = cluster
    executor.execute("CREATE MATERIALIZED VIEW ks.by_v AS SELECT * FROM ks.t WHERE v IS NOT NULL "
                     "AND p IS NOT NULL AND c IS NOT NULL PRIMARY KEY (v, p, c)")
    with pytest.raises(FailedPrecondition, match="ks.by_v is being built .*ALLOW STALE"):
        executor.execute("SELECT * FROM ks.by_v")
    assert reader.reads == []
    executor.execute("SELECT * FROM ks.by_v ALLOW STALE")
    assert reader.reads == [("ks.by_v", None, None)]


def test_a_building_index_serves_no_query_unless_allow_stale_or_a_filtered_scan_is_allowed(cluster):
    executor, _, _, reader = cluster
    executor.execute("CREATE INDEX t_v ON ks.t (v)")
    with pytest.raises(FailedPrecondition, match="index ks.t_v on v is being built .*ALLOW FILTERING.*ALLOW STALE"):
        executor.execute("SELECT * FROM ks.t WHERE v = 'x'")
    assert reader.reads == []
    scanned = executor.execute("SELECT * FROM ks.t WHERE v = 'x' ALLOW FILTERING")
    assert reader.reads == [("ks.t", None, None)] and "scan of every tablet" in scanned.plan
    stale = executor.execute("SELECT * FROM ks.t WHERE v = 'x' ALLOW STALE")
    assert reader.reads[1] == ("ks.t_v", [("x",)], None) and "index ks.t_v" in stale.plan


def test_refusals_name_the_problem_and_send_nothing(cluster):
    executor, _, writer, reader = cluster
    with pytest.raises(NotFound, match="ks.missing"):
        executor.execute("INSERT INTO ks.missing (p) VALUES (1)")
    with pytest.raises(InvalidArgument, match="full primary key"):
        executor.execute("INSERT INTO ks.t (p, v) VALUES (1, 'x')")
    with pytest.raises(InvalidArgument, match="at most one set of bind values"):
        executor.execute("SELECT * FROM ks.t WHERE p = ?", params=[[1], [2]])
    assert writer.writes == [] and reader.reads == []


def test_statements_are_counted_in_the_nodes_registry(cluster):
    executor, _, _, _ = cluster
    metrics = executor._metrics
    executor.execute("INSERT INTO ks.t (p, c, v) VALUES (1, 1, 'a')")
    assert metrics.registry.get_sample_value("vbc_statements_total", {"kind": "Insert"}) == 1
    assert metrics.registry.get_sample_value("vbc_statements_total", {"kind": "CreateTable"}) == 1


def test_ddl_waits_for_schema_agreement_and_names_the_nodes_that_did_not_confirm():
    group0 = FakeGroup0()
    register_node(group0, "n1")
    asked, answers = [], [[], ["n3: no answer within 10s"]]

    def agreement(version):
        asked.append(version)
        return answers[len(asked) - 1]

    executor = ClusterExecutor(group0, RecordingWriter(), RecordingReader(), now=lambda: NOW, injections=Injections(),
                        metrics=NodeMetrics(), schema_agreement=agreement)
    created = executor.execute("CREATE KEYSPACE ks WITH replication = {'rf': 1}")
    assert created.message == "created keyspace ks"
    assert asked == [group0.read(lambda s: s.schema_version)]
    table = executor.execute("CREATE TABLE ks.t (p int PRIMARY KEY, v text)")
    version = group0.read(lambda s: s.schema_version)
    assert asked == [version - 1, version]
    assert table.message == ("created table ks.t; not yet confirmed by n3: no answer within 10s "
                             "(the change is committed: a node applies it when it catches up)")
    executor.execute("INSERT INTO ks.t (p, v) VALUES (1, 'x')")
    executor.execute("SELECT * FROM ks.t")
    noop = executor.execute("CREATE TABLE IF NOT EXISTS ks.t (p int PRIMARY KEY, v text)")
    assert noop.message.endswith("already exists (IF NOT EXISTS): nothing done")
    assert len(asked) == 2  # only schema statements that changed the schema wait


def test_alter_keyspace_rf_of_a_keyspace_with_tables_says_the_change_goes_on_in_the_background(cluster):
    executor, group0, writer, reader = cluster
    register_node(group0, "n2")
    maps = group0.read(lambda s: dict(s.tablets))
    message = executor.execute("ALTER KEYSPACE ks WITH replication = {'rf': 2}").message
    assert message.startswith("altered keyspace ks: ") and "tablet replicas to add" in message
    assert "in the background" in message and "vbc status" in message
    assert group0.read(lambda s: (s.keyspaces["ks"].rf, dict(s.tablets))) == (2, maps)  # the driver adds them
    executor.execute("DROP TABLE ks.t")
    assert executor.execute("ALTER KEYSPACE ks WITH replication = {'rf': 1}").message == "altered keyspace ks"
    assert group0.read(lambda s: s.keyspaces["ks"].rf) == 1
    assert writer.writes == [] and reader.reads == []
