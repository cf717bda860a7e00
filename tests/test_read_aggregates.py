"""Aggregates computed at the replicas equal SQLite's over the same live rows (property test: random rows, nulls,
deleted rows and cells, filters), and CQL's rules for empty inputs, NaN and int overflow."""
from __future__ import annotations

import math
import sqlite3
import uuid

import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from coordinator.core.commands import ColumnSpec, CreateTable
from coordinator.core.schema import Filter
from replica.read_path import ReadQuery
from replica.rows import delete_row, partition_token
from storage.cells import Cell, Row
from storage.reads import Aggregate, combine
from tests.replica_fakes import InProcessCluster, cluster_state
from tests.strength import fast_and_deep

COLUMNS = (("k", "int"), ("c", "int"), ("i", "int"), ("b", "bigint"), ("d", "double"), ("t", "text"))
AGGREGATES = tuple(Aggregate(f, c) for c in ("i", "b", "d") for f in ("count", "min", "max", "sum", "avg")) + (
    Aggregate("count"), Aggregate("min", "t"), Aggregate("max", "t"), Aggregate("count", "t"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    schema = cluster_state(nodes=("n1", "n2", "n3"), rf=2, tablets=4)
    cluster = InProcessCluster(tmp_path_factory.mktemp("aggregates"), schema)
    yield cluster
    cluster.close()


def _new_table(cluster) -> object:
    table_id = uuid.uuid4().hex
    outcome = cluster.schema.state.apply(CreateTable(
        cmd_id=None, id=table_id, keyspace="ks", name=f"t{table_id[:8]}",
        columns=tuple(ColumnSpec(n, t) for n, t in COLUMNS), partition_key=("k",), clustering_key=("c",)))
    assert outcome.ok, outcome
    return cluster.schema.state.tables[table_id]


values = st.fixed_dictionaries({
    "k": st.integers(-20, 20), "c": st.integers(0, 3),
    "i": st.none() | st.integers(-10**6, 10**6), "b": st.none() | st.integers(-10**12, 10**12),
    "d": st.none() | st.floats(-1e6, 1e6, allow_nan=False), "t": st.none() | st.text("abcxyzé", max_size=4),
})
operations = st.lists(st.tuples(st.sampled_from(["upsert", "upsert", "upsert", "delete row", "delete cell"]), values),
                      min_size=0, max_size=40)
filters = st.sampled_from([(), (Filter("i", ">", 0),), (Filter("t", "IN", ("a", "b", "xyz")),),
                           (Filter("d", "<=", 10.0), Filter("b", "IS NOT NULL", None))])


def _apply(cluster, table, ops) -> None:
    writer = cluster.nodes["n1"].writer
    for ts, (kind, row) in enumerate(ops, start=1):
        key = (row["k"], row["c"])
        token = partition_token(table, row)
        if kind == "delete row":
            mutation = delete_row(table, key, ts)
        elif kind == "delete cell":
            mutation = Row(token=token, key=key, cells={"i": Cell(None, ts)})
        else:
            mutation = Row(token=token, key=key, marker_ts=ts,
                           cells={n: Cell(row[n], ts) for n, _ in COLUMNS[2:]})
        writer.write([(table, mutation)], ts)


def _sqlite_aggregates(rows: list[tuple], terms: tuple[Filter, ...]) -> list:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE r (k, c, i, b, d, t)")
    db.executemany("INSERT INTO r VALUES (?, ?, ?, ?, ?, ?)", rows)
    where = " AND ".join(_sql(term) for term in terms) or "1"
    parts = []
    for item in AGGREGATES:
        column = item.column
        if item.function == "count":
            parts.append("count(*)" if column is None else f"count({column})")
        elif item.function in ("min", "max"):
            parts.append(f"{item.function}({column})")
        elif item.function == "sum":
            parts.append(f"coalesce(sum({column}), 0)" if column != "d" else "coalesce(sum(d), 0.0)")
        else:  # CQL: an integer average is truncated toward zero (SQLite's integer division), 0 over no rows
            parts.append(f"coalesce(sum({column}) / count({column}), 0)" if column != "d"
                         else "coalesce(avg(d), 0.0)")
    return list(db.execute(f"SELECT {', '.join(parts)} FROM r WHERE {where}").fetchone())


def _sql(term: Filter) -> str:
    if term.op == "IS NOT NULL":
        return f"{term.column} IS NOT NULL"
    if term.op == "IN":
        return f"{term.column} IN ({', '.join(repr(v) for v in term.value)})"
    return f"{term.column} {term.op} {term.value!r}"


def aggregates_equal_sqlite_over_the_live_rows(cluster, ops, terms):
    table = _new_table(cluster)
    _apply(cluster, table, ops)
    names = tuple(n for n, _ in COLUMNS)
    reader = cluster.nodes["n2"].reader
    live = [tuple(r[n] for n in names) for page in reader.pages(table, ReadQuery(columns=names))
            for r in page.to_pylist()]
    ours = reader.aggregate(table, ReadQuery(columns=(), filters=terms), AGGREGATES)
    expected = _sqlite_aggregates(live, terms)
    assert len(ours) == len(expected)
    for item, got, want in zip(AGGREGATES, ours, expected):
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-6), item
        else:
            assert got == want, item


test_aggregates_equal_sqlite_over_the_live_rows, test_aggregates_equal_sqlite_over_the_live_rows_in_40_examples = \
    fast_and_deep(aggregates_equal_sqlite_over_the_live_rows, 15, 40, given(ops=operations, terms=filters),
                  deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_cql_rules_for_empty_inputs_nan_and_overflow():
    types = {"i": "int", "d": "double"}
    empty = [[[0], [None, 0, 0], [None, 0, 0], [None, 0, 0], [None, 0, 0]]]
    aggregates = (Aggregate("count", "i"), Aggregate("min", "i"), Aggregate("sum", "i"), Aggregate("avg", "i"),
                  Aggregate("avg", "d"))
    assert combine(aggregates, types, empty) == [0, None, 0, 0, 0.0]
    overflow = [[[2**31 - 1, 1, 0]], [[5, 1, 0]]]
    assert combine((Aggregate("sum", "i"),), types, overflow) == [-(2**31) + 4]
    assert combine((Aggregate("avg", "i"),), types, [[[-7, 2, 0]]]) == [-3]
    with_nan = [[[1.5, 0, 1]], [[None, 1, 0]]]  # [value, NaNs, numbers] per range
    maximum, minimum = combine((Aggregate("max", "d"), Aggregate("min", "d")), types, [with_nan[0] * 2, with_nan[1] * 2])
    assert math.isnan(maximum) and minimum == 1.5
    assert math.isnan(combine((Aggregate("sum", "d"),), types, [[[1.0, 1, 1]]])[0])
