"""CQL's rules for view definitions (through the real DDL path) and for SELECT restrictions (`plan_select`)."""
from __future__ import annotations

import pytest

from common.injection import Injections
from common.metrics import NodeMetrics
from coordinator.core.commands import RegisterNode
from coordinator.core.errors import InvalidArgument
from coordinator.core.schema import Filter
from coordinator.core.views import view_row
from cql import parse
from cql.restrictions import FILTERING_REFUSAL, PARTITION_RANGE_REFUSAL, indexes_of, plan_select
from worker.spark_views import compile_filter, view_condition

from .cluster_executor import ClusterExecutor
from .fakes import FakeGroup0

SCHEMA = (
    "CREATE KEYSPACE ks WITH replication = {'rf': 1} AND tablets = {'initial': 2}",
    "CREATE TABLE ks.tab (key int, c int, v text, PRIMARY KEY (key, c))",
    "CREATE TABLE ks.comp (a int, b int, c int, v text, PRIMARY KEY ((a, b), c))",
    "CREATE TABLE ks.t (p int, c1 int, c2 int, v text, w int, PRIMARY KEY (p, c1, c2))",
    "CREATE TABLE ks.ti (p int, c1 int, c2 int, v text, w int, PRIMARY KEY (p, c1, c2))",
    "CREATE INDEX ON ks.ti (v)",
)


class NoDataPath:
    """The write and read paths, which schema statements never use."""

    def __getattr__(self, name):
        raise AssertionError(f"a schema statement used the data path ({name})")


@pytest.fixture
def cluster():
    group0 = FakeGroup0()
    group0.propose(RegisterNode(node_id="n1", grpc="127.0.0.1:1", raft="127.0.0.1:2", shards=1, cmd_id=None))
    executor = ClusterExecutor(group0, NoDataPath(), NoDataPath(), now=lambda: 1, injections=Injections(),
                        metrics=NodeMetrics())
    for statement in SCHEMA:
        executor.execute(statement)
    return executor, group0


def table_named(group0: FakeGroup0, name: str):
    return group0.read(lambda s: s.find_table("ks", name))


# -------------------------------------------------------------------- view definitions

MISSING = "Primary key column '{}' is required to be filtered by 'IS NOT NULL'"

VIEWS = [
    # any relation keeps a key column from being null; the base's only partition key column never is
    ("SELECT * FROM ks.tab WHERE key IN (1, 4, 9) AND c IS NOT NULL PRIMARY KEY (c, key)", None),
    ("SELECT * FROM ks.tab WHERE c IS NOT NULL PRIMARY KEY (c, key)", None),
    ("SELECT * FROM ks.tab WHERE c > 0 AND v = 'x' PRIMARY KEY (v, key, c)", None),
    ("SELECT * FROM ks.tab WHERE v IN ('a', 'b') AND c != 3 PRIMARY KEY (v, c, key)", None),
    ("SELECT * FROM ks.tab WHERE c IS NOT NULL AND key IS NOT NULL AND v IS NOT NULL PRIMARY KEY (c, key, v)", None),
    ("SELECT * FROM ks.comp WHERE a IS NOT NULL AND b = 2 AND c >= 0 PRIMARY KEY ((b, a), c)", None),
    # a key column nothing restricts
    ("SELECT * FROM ks.tab WHERE key IN (1, 4, 9) PRIMARY KEY (c, key)", MISSING.format("c")),
    ("SELECT * FROM ks.tab WHERE c IS NOT NULL PRIMARY KEY (v, key, c)", MISSING.format("v")),
    ("SELECT * FROM ks.tab WHERE v IS NOT NULL AND key > 0 PRIMARY KEY (v, key, c)", MISSING.format("c")),
    ("SELECT * FROM ks.tab PRIMARY KEY (c, key)", MISSING.format("c")),
    # a column of a composite partition key is not exempt
    ("SELECT * FROM ks.comp WHERE b IS NOT NULL AND c IS NOT NULL PRIMARY KEY ((b, a), c)", MISSING.format("a")),
]


@pytest.mark.parametrize("definition, refusal", VIEWS)
def test_a_view_key_column_needs_is_not_null_only_when_nothing_else_restricts_it(cluster, definition, refusal):
    executor, group0 = cluster
    statement = f"CREATE MATERIALIZED VIEW ks.mv AS {definition}"
    if refusal is None:
        assert executor.execute(statement).message == "created materialized view ks.mv"
        assert table_named(group0, "mv").view is not None
    else:
        with pytest.raises(InvalidArgument) as refused:
            executor.execute(statement)
        assert refused.value.message == refusal
        assert table_named(group0, "mv") is None


def test_a_view_without_is_not_null_holds_only_rows_passing_every_relation(cluster):
    executor, group0 = cluster
    executor.execute("CREATE MATERIALIZED VIEW ks.mv AS SELECT * FROM ks.tab WHERE key IN (1, 4, 9) AND c > 0 "
                     "PRIMARY KEY (c, key)")
    view = table_named(group0, "mv")
    assert view.view.where == (Filter("key", "IN", (1, 4, 9)), Filter("c", ">", 0))
    assert view_row(view, {"key": 4, "c": 2, "v": "x"}) == ((2, 4), {"c": 2, "key": 4, "v": "x"})
    assert view_row(view, {"key": 4, "c": 2}) == ((2, 4), {"c": 2, "key": 4, "v": None})
    assert view_row(view, {"key": 5, "c": 2, "v": "x"}) is None  # key not in the list
    assert view_row(view, {"key": 4, "c": 0, "v": "x"}) is None  # c not above 0
    assert view_row(view, {"key": 4, "c": None, "v": "x"}) is None  # a null key column
    assert view_row(view, None) is None


def test_a_view_keyed_by_the_base_partition_key_alone_keeps_null_keys_out(cluster):
    executor, group0 = cluster
    executor.execute("CREATE MATERIALIZED VIEW ks.mv AS SELECT * FROM ks.tab WHERE v = 'x' AND c IS NOT NULL "
                     "PRIMARY KEY (key, v, c)")
    view = table_named(group0, "mv")
    assert view_row(view, {"key": 1, "c": 2, "v": "x"}) == ((1, "x", 2), {"key": 1, "v": "x", "c": 2})
    assert view_row(view, {"key": None, "c": 2, "v": "x"}) is None
    assert view_row(view, {"key": 1, "c": 2, "v": "y"}) is None


def test_the_spark_build_keeps_null_keys_out_and_applies_every_relation(cluster):
    executor, group0 = cluster
    executor.execute("CREATE MATERIALIZED VIEW ks.mv AS SELECT * FROM ks.tab WHERE key IN (1, 4, 9) AND c > 0 "
                     "PRIMARY KEY (c, key)")
    base, view = table_named(group0, "tab"), table_named(group0, "mv")
    condition = view_condition(base, view)
    assert "(`b_c` IS NOT NULL)" in condition and "(`b_key` IS NOT NULL)" in condition
    assert all(compile_filter(base, term) in condition for term in view.view.where)


# -------------------------------------------------------------------- SELECT


def accepted(partitions=None, index=None, filtering=False) -> dict:
    return {"partitions": partitions, "index": index, "filtering": filtering}


NOT_RESTRICTED = 'PRIMARY KEY column "{}" cannot be restricted as preceding column "{}" is not restricted'
AFTER_RANGE = 'Clustering column "{}" cannot be restricted (preceding column "{}" is restricted by a non-EQ relation)'

SELECTS = [
    # key reads and clustering ranges
    ("SELECT * FROM ks.t", accepted()),
    ("SELECT * FROM ks.t WHERE p = 1", accepted([(1,)])),
    ("SELECT * FROM ks.t WHERE p IN (1, 2, 1)", accepted([(1,), (2,)])),
    ("SELECT * FROM ks.t WHERE p = 1 AND c1 = 2 AND c2 > 3", accepted([(1,)])),
    ("SELECT * FROM ks.t WHERE p = 1 AND c1 > 2 AND c1 <= 5", accepted([(1,)])),
    ("SELECT * FROM ks.t WHERE p = 1 AND c1 IN (1, 2) AND c2 = 3", accepted([(1,)])),
    ("SELECT * FROM ks.comp WHERE a = 1 AND b IN (2, 3)", accepted([(1, 2), (1, 3)])),
    # filtering: refused without ALLOW FILTERING, accepted with it
    ("SELECT * FROM ks.t WHERE v = 'x'", FILTERING_REFUSAL),
    ("SELECT * FROM ks.t WHERE v = 'x' ALLOW FILTERING", accepted(filtering=True)),
    ("SELECT * FROM ks.t WHERE p = 1 AND v = 'x'", FILTERING_REFUSAL),
    ("SELECT * FROM ks.t WHERE p = 1 AND v = 'x' ALLOW FILTERING", accepted([(1,)], filtering=True)),
    ("SELECT * FROM ks.t WHERE c1 = 2", FILTERING_REFUSAL),
    ("SELECT * FROM ks.t WHERE c1 = 2 ALLOW FILTERING", accepted(filtering=True)),
    ("SELECT * FROM ks.t WHERE p = 1 AND c2 = 3", NOT_RESTRICTED.format("c2", "c1")),
    ("SELECT * FROM ks.t WHERE c2 = 3", NOT_RESTRICTED.format("c2", "c1")),
    ("SELECT * FROM ks.t WHERE p = 1 AND c2 = 3 ALLOW FILTERING", accepted([(1,)], filtering=True)),
    ("SELECT * FROM ks.t WHERE p = 1 AND c1 > 2 AND c2 = 3", AFTER_RANGE.format("c2", "c1")),
    ("SELECT * FROM ks.t WHERE p = 1 AND c1 > 2 AND c2 = 3 ALLOW FILTERING", accepted([(1,)], filtering=True)),
    ("SELECT * FROM ks.t WHERE p > 1", PARTITION_RANGE_REFUSAL),
    ("SELECT * FROM ks.t WHERE p > 1 ALLOW FILTERING", accepted(filtering=True)),
    ("SELECT * FROM ks.comp WHERE a = 1", FILTERING_REFUSAL),
    ("SELECT * FROM ks.comp WHERE a = 1 ALLOW FILTERING", accepted(filtering=True)),
    # an index serves an '=' restriction; the partition read wins when the partition key is given
    ("SELECT * FROM ks.ti WHERE v = 'x'", accepted(index="v")),
    ("SELECT * FROM ks.ti WHERE v = 'x' AND w = 1", FILTERING_REFUSAL),
    ("SELECT * FROM ks.ti WHERE v = 'x' AND w = 1 ALLOW FILTERING", accepted(index="v", filtering=True)),
    ("SELECT * FROM ks.ti WHERE c1 = 2 AND v = 'x'", FILTERING_REFUSAL),
    ("SELECT * FROM ks.ti WHERE c2 = 2 AND v = 'x' ALLOW FILTERING", accepted(index="v", filtering=True)),
    ("SELECT * FROM ks.ti WHERE v > 'x'", FILTERING_REFUSAL),
    ("SELECT * FROM ks.ti WHERE v > 'x' ALLOW FILTERING", accepted(filtering=True)),
    ("SELECT * FROM ks.ti WHERE p = 1 AND v = 'x'", accepted([(1,)], filtering=True)),
    ("SELECT * FROM ks.ti WHERE p = 1 AND v = 'x' AND w = 1", FILTERING_REFUSAL),
    ("SELECT * FROM ks.ti WHERE p > 1 AND v = 'x'", PARTITION_RANGE_REFUSAL),
    # relations a SELECT cannot have, whatever ALLOW FILTERING says
    ("SELECT * FROM ks.t WHERE v IS NOT NULL ALLOW FILTERING", "Unsupported restriction: v IS NOT NULL"),
    ("SELECT * FROM ks.t WHERE v != 'it''s' ALLOW FILTERING", "Unsupported \"!=\" relation: v != 'it''s'"),
    ("SELECT * FROM ks.t WHERE w = null ALLOW FILTERING", "Invalid null value in condition for column w"),
    ("SELECT * FROM ks.t WHERE p IN (1, null)", "Invalid null value in condition for column p"),
    ("SELECT * FROM ks.t WHERE p = 1 AND p = 2",
     "p cannot be restricted by more than one relation if it includes an Equal"),
    ("SELECT * FROM ks.t WHERE w > 1 AND w IN (2, 3) ALLOW FILTERING",
     "w cannot be restricted by more than one relation if it includes a IN"),
    ("SELECT * FROM ks.t WHERE p = 1 AND c1 > 1 AND c1 >= 2",
     "More than one restriction was found for the start bound on c1"),
    ("SELECT * FROM ks.t WHERE w < 1 AND w <= 2 ALLOW FILTERING",
     "More than one restriction was found for the end bound on w"),
    ("SELECT * FROM ks.t WHERE nope = 1", "unknown column 'nope' in ks.t; its columns are p, c1, c2, v, w"),
    ("SELECT * FROM ks.t WHERE p = 'one'", None),  # refused by the type check, its message tested elsewhere
]


def plan_of(group0: FakeGroup0, text: str):
    statement = parse(text)
    table = table_named(group0, statement.table.name)
    indexes = group0.read(lambda s: indexes_of(s, table))
    return plan_select(table, statement.where, indexes, statement.allow_filtering)


@pytest.mark.parametrize("text, expected", SELECTS)
def test_select_restrictions_follow_cql(cluster, text, expected):
    _, group0 = cluster
    if isinstance(expected, dict):
        plan = plan_of(group0, text)
        assert {"partitions": plan.partitions, "index": plan.index and plan.index.column,
                "filtering": plan.filtering} == expected
        return
    with pytest.raises(InvalidArgument) as refused:
        plan_of(group0, text)
    assert expected is None or refused.value.message == expected


def test_an_index_lookup_names_the_index_view_and_the_coerced_value(cluster):
    _, group0 = cluster
    plan = plan_of(group0, "SELECT * FROM ks.ti WHERE v = 'x' AND c1 = 2 ALLOW FILTERING")
    assert plan.index.index == table_named(group0, "ti_v_idx") and plan.index.index.view.is_index
    assert (plan.index.column, plan.index.value) == ("v", "x")
    assert plan.filters == (Filter("v", "=", "x"), Filter("c1", "=", 2))
    assert plan.residual == (Filter("c1", "=", 2),)


def test_the_residual_leaves_out_what_the_partition_read_answers(cluster):
    _, group0 = cluster
    plan = plan_of(group0, "SELECT * FROM ks.t WHERE c1 = 2 AND p IN (1, 2) AND w > 4 ALLOW FILTERING")
    assert plan.partitions == [(1,), (2,)] and plan.index is None and plan.filtering
    assert plan.residual == (Filter("c1", "=", 2), Filter("w", ">", 4))
    scan = plan_of(group0, "SELECT * FROM ks.t WHERE w > 4 ALLOW FILTERING")
    assert scan.residual == scan.filters == (Filter("w", ">", 4),)


def test_indexes_of_maps_each_indexed_column_to_its_index_and_skips_views(cluster):
    executor, group0 = cluster
    executor.execute("CREATE INDEX by_w ON ks.ti (w)")
    executor.execute("CREATE MATERIALIZED VIEW ks.ti_by_c2 AS SELECT * FROM ks.ti WHERE c2 IS NOT NULL "
                     "AND c1 IS NOT NULL PRIMARY KEY (c2, p, c1)")
    indexed, plain = table_named(group0, "ti"), table_named(group0, "t")
    indexes = group0.read(lambda s: indexes_of(s, indexed))
    assert {column: index.name for column, index in indexes.items()} == {"v": "ti_v_idx", "w": "by_w"}
    assert group0.read(lambda s: indexes_of(s, plain)) == {}
