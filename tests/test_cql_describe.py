"""DESCRIBE answered by the server (cql.describe): names, and statements that make the same schema again here."""
from __future__ import annotations

import pytest

from common.injection import Injections
from common.metrics import NodeMetrics
from coordinator.core.errors import NotFound

from .cluster_executor import ClusterExecutor
from .fakes import FakeGroup0
from .test_executor_routing import NOW, RecordingReader, RecordingWriter, register_node

SCHEMA = [
    "CREATE KEYSPACE ks WITH replication = {'rf': 1} AND tablets = {'initial': 4}",
    'CREATE TABLE ks.t (p int, c bigint, "Mixed" text, d double, PRIMARY KEY ((p, c), d))',
    "CREATE MATERIALIZED VIEW ks.v AS SELECT p, c, d FROM ks.t WHERE d IS NOT NULL AND p IS NOT NULL AND "
    "c IS NOT NULL AND d > 1.5 PRIMARY KEY (d, p, c)",
    'CREATE INDEX mixed_idx ON ks.t ("Mixed")',
]


@pytest.fixture
def executor():
    group0 = FakeGroup0()
    register_node(group0, "n1")
    executor = ClusterExecutor(group0, RecordingWriter(), RecordingReader(), now=lambda: NOW,
                               injections=Injections(), metrics=NodeMetrics(), cluster_name="test")
    for statement in SCHEMA:
        executor.execute(statement)
    return executor, group0


def schema_of(group0: FakeGroup0) -> list:
    def shape(state):
        tables = sorted(state.tables.values(), key=lambda t: t.name)
        return [(t.name, t.columns, t.partition_key, t.clustering_key,
                 None if t.view is None else (t.view.where, t.view.is_index)) for t in tables]
    return group0.read(shape)


def test_describe_keyspace_writes_statements_that_make_the_same_schema_again(executor):
    run, group0 = executor
    rows = run.execute("DESCRIBE KEYSPACE ks").rows
    assert [(r[1], r[2]) for r in rows] == [("keyspace", "ks"), ("table", "t"), ("index", "mixed_idx"),
                                            ("materialized_view", "v")]
    before = schema_of(group0)
    run.execute("DROP KEYSPACE ks")
    for row in rows:
        run.execute(row[3])
    assert schema_of(group0) == before
    assert '"Mixed" text' in rows[1][3] and "PRIMARY KEY ((p, c), d)" in rows[1][3]


def test_listings_one_object_and_the_cluster(executor):
    run, _ = executor
    assert run.execute("DESCRIBE KEYSPACES").rows == [["ks", "keyspace", "ks", ""]]
    assert [r[2] for r in run.execute("DESCRIBE TABLES").rows] == ["t"]
    assert run.execute("DESC TABLE ks.t").rows[0][3].startswith("CREATE TABLE ks.t (")
    assert [r[2] for r in run.execute("DESCRIBE ks.t").rows] == ["t", "mixed_idx", "v"]  # a table with its views
    assert run.execute("DESCRIBE INDEX ks.mixed_idx").rows[0][3] == 'CREATE INDEX mixed_idx ON ks.t ("Mixed");'
    assert run.execute("DESCRIBE CLUSTER").rows == [["test", "vbc.TabletPartitioner", "SimpleSnitch"]]
    assert [r[2] for r in run.execute("DESCRIBE t", keyspace="ks").rows] == ["t", "mixed_idx", "v"]
    assert run.execute("DESCRIBE ks").rows[0][1] == "keyspace"
    with pytest.raises(NotFound, match="no materialized view ks.t"):
        run.execute("DESCRIBE MATERIALIZED VIEW ks.t")
