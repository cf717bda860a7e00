"""Spark view rows (worker/spark_views.py) equal the write path's view rows: random rows and view definitions."""
from __future__ import annotations

import io
import logging
import math
import os
import random
import struct
import threading
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.core import types as coltypes
from coordinator.core.ddl import FILTER_OPS
from coordinator.core.schema import Column, Filter, Replica, Table, ViewDef
from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN, tablet_of, token_of
from coordinator.core.views import matches
from replica.rows import partition_token, storage_spec
from replica.view_updates import WriteContext, view_updates
from storage import bulk
from storage.arrow_layouts import storage_schema, view_rows_schema
from storage.cells import Cell, Row, visible_values
from storage.physical import PhysicalTable
from storage.store import NodeStore
from worker import spark_views as sv
from worker.spark_session import NodeSpark, SparkConfig, _forward_jvm_output, jvm_log, spark_conf

pytestmark = pytest.mark.integration

BASE_ID = "b" * 32
NODE = "n1"
REPLICA = Replica(NODE, 0)
MAX_ROWS = 30


@pytest.fixture(scope="module")
def node_spark(tmp_path_factory):
    node = NodeSpark(SparkConfig(master="local[1]", driver_memory="1g", shuffle_partitions=1,
                                 data_dir=str(tmp_path_factory.mktemp("spark-node"))))
    yield node
    node.stop()


@pytest.fixture(scope="module")
def spark(node_spark):
    return node_spark.session()


# --- the write path's side ------------------------------------------------------------------------------


def write_path_view_rows(base: Table, view: Table, rows: list[Row]) -> list[dict]:
    """The stored view rows the write path produces for `rows` inserted into an empty view, as SQL columns."""
    context = WriteContext(1, base, (view,), ((REPLICA,),), {view.id: ((REPLICA,),)})
    physical = PhysicalTable(storage_spec(view))
    stored = []
    for row in rows:
        for _target, batch in view_updates(context, NODE, None, row):
            stored += [physical.to_params(NodeStore._merged(None, mutation)) for mutation in batch.rows]
    return stored


def stored_base_rows(base: Table, rows: list[Row]) -> pa.Table:
    """The base rows as `storage.bulk.read_token_range(..., include_tombstones=True)` hands them over."""
    spec = storage_spec(base)
    physical = PhysicalTable(spec)
    return pa.Table.from_pylist([physical.to_params(r) for r in rows], schema=storage_schema(spec))


def canonical(value: object) -> object:
    """A hashable stand-in that tells NaN (any payload) and -0.0 apart from other values, and bools from ints."""
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else ("float", value, math.copysign(1.0, value))
    if isinstance(value, bool):
        return ("bool", value)
    return value


def as_rows(records: list[dict], names: list[str]) -> Counter:
    return Counter(tuple(canonical(r[n]) for n in names) for r in records)


def physical_names(view: Table) -> list[str]:
    return [c.name for c in PhysicalTable(storage_spec(view)).table.columns]


def assert_same_view_rows(base: Table, view: Table, rows: list[Row], spark_rows: pa.Table) -> None:
    names = physical_names(view)
    assert spark_rows.column_names == names
    expected_schema = storage_schema(storage_spec(view))
    assert [f.type for f in spark_rows.schema] == [f.type for f in expected_schema]
    got = spark_rows.to_pylist()
    assert as_rows(got, names) == as_rows(write_path_view_rows(base, view, rows), names)
    for record in got:
        key = tuple(record[f"c_{c}"] for c in view.partition_key)
        assert record["token"] == token_of(key, view.partition_key_types)


# --- strategies -----------------------------------------------------------------------------------------


def _fresh_float(value: float) -> float:
    """A new float object (so no NaN literal is ever the very object a row holds: Python's `in` checks identity)."""
    return struct.unpack("<d", struct.pack("<d", value))[0]


_DOUBLES = st.one_of(st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, math.nan, -math.nan, math.inf, -math.inf]),
                     st.floats(allow_nan=True, allow_infinity=True)).map(_fresh_float)
_SMALL_INTS = st.integers(-3, 3)
VALUES = {
    "int": st.one_of(_SMALL_INTS, st.integers(-(2**31), 2**31 - 1)),
    "bigint": st.one_of(_SMALL_INTS, st.integers(-(2**63), 2**63 - 1)),
    "timestamp": st.one_of(_SMALL_INTS, st.integers(-(2**63), 2**63 - 1)),
    "double": _DOUBLES,
    "boolean": st.booleans(),
    "text": st.one_of(st.sampled_from(["", "a", "b", "é", "日本", "😀", "a\x00b"]),
                      st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)),
}
TIMESTAMPS = st.one_of(st.integers(1, 4), st.integers(1, 2**62))  # small ones tie often


@st.composite
def base_tables(draw) -> Table:
    types = draw(st.lists(st.one_of(st.sampled_from(coltypes.TYPES), st.just("double")), min_size=2, max_size=6))
    names = [f"col{i}" for i in range(len(types))]
    pk = draw(st.integers(1, min(2, len(names) - 1)))
    ck = draw(st.integers(0, min(2, len(names) - pk)))
    columns = tuple(Column(n, t) for n, t in zip(names, types))
    return Table(BASE_ID, "ks", "base", columns, tuple(names[:pk]), tuple(names[pk:pk + ck]))


def _key_of(values: tuple) -> tuple:
    return tuple(("nan",) if isinstance(v, float) and math.isnan(v) else v for v in values)  # -0.0 == 0.0


@st.composite
def stored_rows(draw, base: Table) -> list[Row]:
    """Up to MAX_ROWS rows with distinct keys, live or tombstoned, with written, deleted and missing cells."""
    rows, seen = [], set()
    for _ in range(draw(st.one_of(st.integers(0, MAX_ROWS), st.just(MAX_ROWS)))):
        key = tuple(draw(VALUES[base.column_type(n)]) for n in base.primary_key)
        if _key_of(key) in seen:
            continue
        seen.add(_key_of(key))
        rows.append(draw(_row(base, key)))
    return rows


@st.composite
def _row(draw, base: Table, key: tuple) -> Row:
    cells = {}
    for column in base.regular_columns:
        kind = draw(st.sampled_from(["value", "value", "deleted", "missing"]))
        if kind != "missing":
            value = draw(VALUES[column.type]) if kind == "value" else None
            cells[column.name] = Cell(value, draw(TIMESTAMPS))
    marker_ts = draw(st.one_of(st.none(), TIMESTAMPS))
    tomb_ts = draw(st.one_of(st.none(), TIMESTAMPS))
    if marker_ts is None and tomb_ts is None and not cells:
        marker_ts = draw(TIMESTAMPS)
    token = partition_token(base, dict(zip(base.primary_key, key)))
    view_ts = max([c.ts for c in cells.values()] + [t for t in (marker_ts, tomb_ts) if t is not None])
    return Row(token, key, marker_ts, tomb_ts, cells, view_ts + draw(st.integers(0, 3)))


def _column_pool(base: Table, rows: list[Row], name: str) -> list:
    if name in base.primary_key:
        return [r.key[base.primary_key.index(name)] for r in rows]
    return [r.cells[name].value for r in rows if name in r.cells and r.cells[name].value is not None]


@st.composite
def _literal(draw, base: Table, rows: list[Row], name: str) -> object:
    column_type = base.column_type(name)
    pool = _column_pool(base, rows, name)
    values = st.one_of(st.sampled_from(pool), VALUES[column_type]) if pool else VALUES[column_type]
    return coltypes.coerce(column_type, draw(values), name)  # what the DDL stores: -0.0 -> 0.0, a fresh float


@st.composite
def filters(draw, base: Table, rows: list[Row]) -> Filter:
    name = draw(st.sampled_from([c.name for c in base.columns]))
    op = draw(st.sampled_from(FILTER_OPS))
    if op == "IS NOT NULL":
        return Filter(name, op, None)
    if op == "IN":
        return Filter(name, op, tuple(draw(st.lists(_literal(base, rows, name), max_size=12))))
    return Filter(name, op, draw(_literal(base, rows, name)))


@st.composite
def views(draw, base: Table, rows: list[Row], number: int) -> Table:
    """A view as the DDL builds it: the base key in some order plus at most one regular column, some columns."""
    regular = [c.name for c in base.regular_columns]
    key = list(draw(st.permutations(base.primary_key)))
    if regular and draw(st.booleans()):
        key.insert(draw(st.integers(0, len(key))), draw(st.sampled_from(regular)))
    pk = draw(st.integers(1, len(key)))
    selected = set(draw(st.lists(st.sampled_from(regular), unique=True))) if regular else set()
    if draw(st.booleans()):
        selected = set(regular)  # SELECT *
    where = tuple(Filter(n, "IS NOT NULL", None) for n in key) + tuple(draw(st.lists(filters(base, rows), max_size=3)))
    columns = tuple(base.column(n) for n in key) + tuple(
        c for c in base.columns if c.name in selected and c.name not in key)
    return Table(f"{number:032x}", "ks", f"v{number}", columns, tuple(key[:pk]), tuple(key[pk:]),
                 ViewDef(base.id, where))


@st.composite
def scenarios(draw, max_views: int = 6):
    base = draw(base_tables())
    rows = draw(stored_rows(base))
    count = draw(st.integers(1, max_views))
    return base, rows, [draw(views(base, rows, i + 1)) for i in range(count)]


PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.data_too_large])


# --- property tests -------------------------------------------------------------------------------------


@PROPERTY
@given(scenarios())
def test_batch_of_views_equals_the_write_path(spark, scenario):
    base, rows, view_list = scenario
    frame = sv.base_frame(spark, stored_base_rows(base, rows))
    computed = sv.compute_view_rows(frame, base, view_list, layout=sv.STORAGE)
    assert set(computed) == {v.id for v in view_list}
    for view in view_list:
        assert_same_view_rows(base, view, rows, computed[view.id])


@settings(PROPERTY, max_examples=10)
@given(scenarios(max_views=1))
def test_single_view_dataframe_and_merge_layout(spark, scenario):
    base, rows, (view,) = scenario
    frame = sv.base_frame(spark, stored_base_rows(base, rows))
    assert_same_view_rows(base, view, rows, sv.view_rows(frame, base, view).toArrow())
    merge_rows = sv.compute_view_rows(frame, base, [view])[view.id]
    expected_names = view_rows_schema(storage_spec(view)).names
    assert merge_rows.column_names == expected_names
    names = expected_names[:-1]
    stored = [dict(r, ts=r["view_ts"]) for r in write_path_view_rows(base, view, rows)]
    assert as_rows(merge_rows.to_pylist(), names + ["ts"]) == as_rows(stored, names + ["ts"])


# --- a multi-view batch -------------------------------------------------------------------------------


def _acceptance_tables() -> tuple[Table, Table, Table]:
    base = Table(BASE_ID, "ks", "tab", (Column("key", "int"), Column("c", "int"), Column("v", "text")),
                 ("key",), ("c",))
    not_null = tuple(Filter(n, "IS NOT NULL", None) for n in ("c", "key", "v"))
    full = Table("1" * 32, "ks", "mv", base.columns[1:2] + base.columns[:1] + base.columns[2:], ("c",),
                 ("key", "v"), ViewDef(base.id, not_null))
    filtered = Table("2" * 32, "ks", "mv_in", base.columns, ("key",), ("c",),
                     ViewDef(base.id, (Filter("key", "IN", (1, 4, 9)),) + not_null[:2]))
    return base, full, filtered


def _acceptance_rows(base: Table, count: int) -> list[Row]:
    rows = []
    for i in range(count):
        key = (i // 10, i % 10)
        token = partition_token(base, {"key": key[0]})
        tomb = 5 if i % 7 == 0 else None  # every 7th row deleted after it was written
        v = None if i % 11 == 0 else str(i)
        rows.append(Row(token, key, 2, tomb, {"v": Cell(v, 3)}, 3 + i % 3))
    return rows


def test_two_views_one_scan_one_job(spark):
    base, full, filtered = _acceptance_tables()
    rows = _acceptance_rows(base, 200)
    frame = sv.base_frame(spark, stored_base_rows(base, rows))
    tracker, group = spark.sparkContext.statusTracker(), "test-two-views"
    spark.sparkContext.setJobGroup(group, "two views, one scan")
    try:
        computed = sv.compute_view_rows(frame, base, [full, filtered], layout=sv.STORAGE)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert len(tracker.getJobIdsForGroup(group)) == 1
    for view in (full, filtered):
        assert_same_view_rows(base, view, rows, computed[view.id])
    live = [r for r in rows if r.tomb_ts is None and r.cells["v"].value is not None]
    assert computed[full.id].num_rows == len(live)
    assert sorted(set(computed[filtered.id].column("c_key").to_pylist())) == [1, 4, 9]


def test_empty_base_gives_empty_tables_of_the_layout(spark):
    base, full, filtered = _acceptance_tables()
    frame = sv.base_frame(spark, stored_base_rows(base, []))
    computed = sv.compute_view_rows(frame, base, [full, filtered])
    for view in (full, filtered):
        assert computed[view.id].num_rows == 0
        assert computed[view.id].column_names == view_rows_schema(storage_spec(view)).names


def test_nan_and_signed_zero_follow_python_matches(spark):
    """Every operator against NaN, -0.0, 0.0 and infinities, many views in one job, against `matches`."""
    base = Table(BASE_ID, "ks", "d", (Column("k", "int"), Column("d", "double")), ("k",), ())
    values = [math.nan, -math.nan, -0.0, 0.0, 1.0, -math.inf, math.inf, None]
    rows = [Row(partition_token(base, {"k": i}), (i,), 1, None, {"d": Cell(v, 1)}, 1) for i, v in enumerate(values)]
    terms = [Filter("d", op, _fresh_float(x)) for op in ("=", "!=", "<", "<=", ">", ">=")
             for x in (math.nan, 0.0, 1.0, math.inf)]
    terms += [Filter("d", "IN", tuple(_fresh_float(x) for x in xs))
              for xs in ((math.nan,), (0.0,), (math.nan, 1.0), tuple(float(i) for i in range(-1, 11)), ())]
    terms += [Filter("d", "IS NOT NULL", None)]
    view_list = [Table(f"{i + 1:032x}", "ks", f"v{i}", base.columns, ("k",), (),
                       ViewDef(base.id, (Filter("k", "IS NOT NULL", None), term))) for i, term in enumerate(terms)]
    computed = sv.compute_view_rows(sv.base_frame(spark, stored_base_rows(base, rows)), base, view_list)
    for term, view in zip(terms, view_list):
        want = {i for i, r in enumerate(rows) if matches((term,), {"k": i, **visible_values(r)})}
        assert set(computed[view.id].column("c_k").to_pylist()) == want, term


def test_merge_layout_feeds_the_bulk_merge(spark, tmp_path):
    """Spark's view rows merged set-based give the same view table as the write path's view updates applied."""
    base, full, filtered = _acceptance_tables()
    rows = _acceptance_rows(base, 120)
    computed = sv.compute_view_rows(sv.base_frame(spark, stored_base_rows(base, rows)), base, [full, filtered])
    with NodeStore.for_data_dir(tmp_path / "bulk") as merged, NodeStore.for_data_dir(tmp_path / "path") as applied:
        for view in (full, filtered):
            spec = storage_spec(view)
            merged.ensure_table(spec)
            applied.ensure_table(spec)
            bulk.merge_view_rows(merged, spec, computed[view.id])
            context = WriteContext(1, base, (view,), ((REPLICA,),), {view.id: ((REPLICA,),)})
            mutations = [m for r in rows for _t, b in view_updates(context, NODE, None, r) for m in b.rows]
            applied.apply(view.id, mutations)
            scan = [merged.scan(view.id, MIN_TOKEN, MAX_TOKEN, include_tombstones=True),
                    applied.scan(view.id, MIN_TOKEN, MAX_TOKEN, include_tombstones=True)]
            assert scan[0] == scan[1] and scan[0]


# --- tablets, the session ---------------------------------------------------------------------------------


def test_tablet_sql_matches_tablet_of(spark):
    rng = random.Random(7)
    tokens = [MIN_TOKEN, MAX_TOKEN, -1, 0, 1] + [rng.randint(MIN_TOKEN, MAX_TOKEN) for _ in range(300)]
    frame = spark.createDataFrame(pa.table({"token": pa.array(tokens, pa.int64())}))
    counts = (1, 2, 8, 256, 2**20)
    got = frame.selectExpr(*[f"{sv.tablet_sql('token', n)} AS t{n}" for n in counts]).toArrow()
    for n in counts:
        assert got.column(f"t{n}").to_pylist() == [tablet_of(t, n) for t in tokens]
    with pytest.raises(ValueError):
        sv.tablet_sql("token", 3)


def test_view_of_another_base_is_refused():
    base, full, _ = _acceptance_tables()
    other = Table("c" * 32, "ks", "other", base.columns, base.partition_key, base.clustering_key)
    with pytest.raises(ValueError):
        sv.compile_view(other, full)


def test_column_names_differing_in_case_and_quotes(spark):
    base = Table(BASE_ID, "ks", "t", (Column("x", "int"), Column("X", "text"), Column("é`q", "text")), ("x",), ())
    rows = [Row(partition_token(base, {"x": i}), (i,), 1, None, {"X": Cell(f"up{i}", 1), "é`q": Cell("é", 1)}, 1)
            for i in range(4)]
    view = Table("1" * 32, "ks", "v", (base.columns[1], base.columns[0], base.columns[2]), ("X",), ("x",),
                 ViewDef(base.id, (Filter("X", "IS NOT NULL", None), Filter("x", "IS NOT NULL", None),
                                   Filter("é`q", "IN", ("é",)))))
    frame = sv.base_frame(spark, stored_base_rows(base, rows))
    assert_same_view_rows(base, view, rows, sv.view_rows(frame, base, view).toArrow())


def test_node_spark_is_lazy_and_shares_the_process_driver(spark, node_spark):
    second = NodeSpark(SparkConfig(master="local[1]"))
    assert not second.started
    assert second.session() is spark
    second.stop()
    assert spark.range(3).count() == 3  # the first node's session still runs
    with pytest.raises(RuntimeError):
        second.session()
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.ui.enabled") == "false"
    assert conf.get("spark.local.dir") == str(node_spark.config.local_dir())
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch") == "100000"


def test_spark_conf_bounds_memory_and_turns_the_ui_off(tmp_path):
    config = SparkConfig(master="local[2]", driver_memory="768m", data_dir=str(tmp_path), max_records_per_batch=5000)
    conf = spark_conf(config, tmp_path / "log4j2.properties")
    assert conf["spark.master"] == "local[2]" and conf["spark.driver.memory"] == "768m"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.sql.execution.arrow.maxRecordsPerBatch"] == "5000"
    assert conf["spark.local.dir"] == str(tmp_path / "spark" / "local")
    assert "log4j2.configurationFile=file:" in conf["spark.driver.extraJavaOptions"]
    assert conf["spark.driver.extraJavaOptions"].endswith(" -XX:+UseParallelGC -XX:TieredStopAtLevel=1")


def test_spark_conf_takes_the_configured_java_options(tmp_path):
    tuned = spark_conf(SparkConfig(java_options="-XX:+UseG1GC"), tmp_path / "log4j2.properties")
    assert tuned["spark.driver.extraJavaOptions"].endswith(" -XX:+UseG1GC")
    plain = spark_conf(SparkConfig(java_options=""), tmp_path / "log4j2.properties")
    assert plain["spark.driver.extraJavaOptions"] == f"-Dlog4j2.configurationFile={(tmp_path / 'log4j2.properties').as_uri()}"


def test_the_driver_binds_loopback_with_a_local_master_and_its_given_host_for_a_cluster(tmp_path):
    log4j = tmp_path / "log4j2.properties"
    local = spark_conf(SparkConfig(master="local[2]", driver_host="10.0.0.5"), log4j)
    assert local["spark.driver.host"] == local["spark.driver.bindAddress"] == "127.0.0.1"
    remote = spark_conf(SparkConfig(master="spark://10.0.0.9:7077", driver_host="10.0.0.5"), log4j)
    assert remote["spark.driver.host"] == remote["spark.driver.bindAddress"] == "10.0.0.5"
    assert not SparkConfig(master="local[1]", remote="sc://h:15002").is_local
    assert NodeSpark(SparkConfig(master="spark://h:7077", data_dir=str(tmp_path))).scratch_dir() is None


def test_jvm_output_becomes_log_records(caplog):
    stream = io.BytesIO(b"note from the launcher\nWARN TaskSetManager: lost task\nERROR Executor: boom\n"
                        b"\tat org.apache.Foo(Foo.java:1)\n\nINFO SparkContext: hello\n")
    with caplog.at_level(logging.DEBUG, logger=jvm_log.name):
        _forward_jvm_output(stream)
    records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == jvm_log.name]
    assert records == [(logging.INFO, "note from the launcher"), (logging.WARNING, "TaskSetManager: lost task"),
                       (logging.ERROR, "Executor: boom"), (logging.ERROR, "\tat org.apache.Foo(Foo.java:1)"),
                       (logging.INFO, "SparkContext: hello")]


def test_base_frame_keeps_every_row_whatever_the_batch_layout(spark):
    """PySpark 4.x loses the batches after an empty one in createDataFrame(pa.Table); base_frame must not."""
    schema = pa.schema([pa.field("a", pa.int32(), nullable=False), pa.field("b", pa.string())])
    for layout in ([5, 3, 0, 7], [0, 0, 0, 2], [0, 0, 1, 0, 0, 1, 0, 0], [0], []):
        batches = [pa.record_batch([pa.array(range(n), pa.int32()), pa.array(["x"] * n)], schema=schema)
                   for n in layout]
        frame = sv.base_frame(spark, pa.Table.from_batches(batches, schema=schema))
        assert frame.count() == sum(layout), layout
        assert frame.schema.names == ["a", "b"]


def test_staged_frame_reads_back_every_value_and_removes_its_file(node_spark):
    """The Parquet-staged DataFrame holds exactly the Arrow rows (nulls, NaN, -0.0, unicode, 64-bit extremes)."""
    schema = pa.schema([pa.field("i", pa.int32(), nullable=False), pa.field("b", pa.int64()),
                        pa.field("d", pa.float64()), pa.field("s", pa.string()), pa.field("t", pa.bool_())])
    rows = pa.Table.from_batches([
        pa.record_batch([pa.array([1, 2, 3], pa.int32()), pa.array([2**63 - 1, -2**63, None]),
                         pa.array([float("nan"), -0.0, None]), pa.array(["é中😀", "", None]),
                         pa.array([True, None, False])], schema=schema),
        pa.record_batch([pa.array([], pa.int32()), pa.array([], pa.int64()), pa.array([], pa.float64()),
                         pa.array([], pa.string()), pa.array([], pa.bool_())], schema=schema),
        pa.record_batch([pa.array([4], pa.int32()), pa.array([0]), pa.array([1.5]), pa.array(["x"]),
                         pa.array([True])], schema=schema)], schema=schema)
    with sv.staged_frame(node_spark, rows) as frame:
        got = frame.toArrow()
        assert len(list(node_spark.scratch_dir().iterdir())) == 1
    assert list(node_spark.scratch_dir().iterdir()) == []
    got_rows, want_rows = got.to_pylist(), rows.to_pylist()
    assert [r["i"] for r in got_rows] == [1, 2, 3, 4]
    for got_row, want_row in zip(got_rows, want_rows):
        for name, want in want_row.items():
            value = got_row[name]
            if isinstance(want, float) and math.isnan(want):
                assert math.isnan(value)
            else:
                assert value == want and (not isinstance(want, float) or math.copysign(1, value) == math.copysign(1, want))


def test_the_warm_up_job_computes_its_views_like_a_batch(node_spark):
    from worker import spark_warmup

    rows = spark_warmup.warmup_rows()
    computed = spark_warmup.run_view_job(node_spark, rows)
    by_name, flag_idx = spark_warmup.VIEWS
    records = rows.to_pylist()
    assert computed[by_name.id].num_rows == sum(
        1 for r in records if r["c_name"] is not None and r["c_amount"] is not None and r["c_amount"] > 0)
    assert computed[flag_idx.id].num_rows == sum(1 for r in records if r["c_flag"] is not None)
    assert len(spark_warmup.warm_up(node_spark, runs=(10, 20), planning_runs=1)) == 3
    stopping = threading.Event()
    stopping.set()
    assert spark_warmup.warm_up(node_spark, stopping) == []


def _nice_of(thread_id: int) -> int | None:
    """A thread's nice value; None for a JVM thread that ended since its id was listed."""
    try:
        return os.getpriority(os.PRIO_PROCESS, thread_id)
    except ProcessLookupError:
        return None


def test_the_driver_jvm_runs_at_a_lower_cpu_priority_than_the_node(spark):
    from worker import spark_session

    jvm = spark_session._JVM.proc.pid
    own = os.getpriority(os.PRIO_PROCESS, 0)
    threads = [int(tid) for tid in os.listdir(f"/proc/{jvm}/task")]
    assert {nice for nice in map(_nice_of, threads) if nice is not None} == {own + spark_session.DRIVER_NICE}
    assert os.getpriority(os.PRIO_PROCESS, 0) == own, "the launching thread's nice value is its own"
