"""A view definition compiled to Spark SQL: base rows in the storage layout in, the view's rows and tokens out.

The compiled expressions compute, for each stored base row, exactly the view row the write path would
send for it (`replica.view_updates.view_updates` of the row as a fresh insert, merged into an empty view
table by `NodeStore.apply`):

- only a **live** base row (``marker_ts`` set and newer than ``tomb_ts``) has a view row; a backfill
  emits no deletes;
- a base column's value is its **visible** value: a key column always, a regular column only when its
  cell was written (``ts_<c>`` set) after the row tombstone and is not a deletion, else NULL (as
  `storage.cells.visible_values`);
- the row must pass every WHERE term with the semantics of `coordinator.core.views.matches` (Python
  comparisons: NULL fails every term but ``IS NOT NULL``; a NaN fails ``=``, ``<``, ``<=``, ``>``,
  ``>=`` and ``IN`` and passes ``!=``; -0.0 equals 0.0) and have a non-NULL value in every view key column;
- every cell of the view row, its marker, ``view_ts`` and ``write_ts`` carry one timestamp ``ts``: the
  base row's ``view_ts`` (the version the write path gives the row's view updates; ``write_ts`` if a row
  has none); ``tomb_ts`` is NULL and ``tombstone`` false;
- ``token`` is Spark's ``xxhash64`` of the view's partition key columns cast as
  `coordinator.core.tokens.spark_token_sql` says, equal to `token_of` of the same values.

Spark compares doubles differently from Python (NaN = NaN is true and NaN is above every value), so the
compiled terms guard every double comparison with ``isnan``.

The compiler is pure (SQL text, no JVM): `compile_view` gives a view's condition and output columns over
the *prepared* base row (`prepared_base_columns`: the visible value of base column ``x`` as ``b_x``,
``__live``, ``__ts``). A DataFrame is then three ``selectExpr``/``where`` calls, whatever the number of views
(building the same plan from Column objects costs ~1,000 py4j calls, ~0.5 s, per view). Two output
layouts, both with the Arrow types of `storage.arrow_layouts` (int -> INT, bigint/timestamp -> BIGINT, double,
boolean, text -> STRING):

- `STORAGE`: the view table's SQL columns in table order: ``token``, ``c_<k>`` per key column,
  ``c_<r>``/``ts_<r>`` per regular column, ``marker_ts``, ``tomb_ts``, ``view_ts``, ``write_ts``,
  ``tombstone`` (what `storage.bulk.read_token_range` returns for the merged rows);
- `MERGE`: ``token``, ``c_<k>`` per key column, ``c_<r>`` per regular column and ``ts`` (the input of
  `storage.bulk.merge_view_rows`).

Several views of one base are computed by one Spark job over one scan (`compute_view_rows`): one row per
base row with a row in any view, a flag column per view and the view's columns (NULL where it has no
row), split per view in pyarrow.
"""
from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from coordinator.core.schema import Filter, Table
from coordinator.core.tokens import MIN_TOKEN, is_power_of_two, spark_token_sql
from storage import bulk
from storage.arrow_layouts import storage_schema, ts_column_name, value_column_name
from storage.cells import TableSpec
from storage.store import NodeStore

if TYPE_CHECKING:
    from worker.spark_session import NodeSpark

STORAGE = "storage"
MERGE = "merge"
TS = "ts"  # the MERGE layout's upsert timestamp (storage.arrow_layouts.TS)
LIVE = "__live"  # prepared base row: whether the row is live
ROW_TS = "__ts"  # prepared base row: the timestamp of its view rows

# CQL type -> the Spark type of a stored value (the Arrow types of storage.arrow_layouts).
SPARK_TYPES = {"int": "INT", "bigint": "BIGINT", "timestamp": "BIGINT", "double": "DOUBLE",
               "boolean": "BOOLEAN", "text": "STRING"}
_COMPARISONS = ("=", "!=", "<", "<=", ">", ">=")


def spark_type(cql_type: str) -> str:
    """The Spark SQL type a value of a column of `cql_type` has in both layouts."""
    return SPARK_TYPES[cql_type]


def quote(identifier: str) -> str:
    """A Spark SQL identifier in backticks."""
    return "`" + identifier.replace("`", "``") + "`"


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def sql_literal(value: object, cql_type: str) -> str:
    """A non-NULL, non-NaN value of a column of `cql_type` as an exact Spark SQL literal of its Spark type."""
    if cql_type == "boolean":
        return "TRUE" if value else "FALSE"
    if cql_type == "text":  # the UTF-8 bytes as a binary literal: no escaping, any character
        return f"CAST(X'{value.encode('utf-8').hex()}' AS STRING)"
    if cql_type == "double":
        text = "Infinity" if value == math.inf else "-Infinity" if value == -math.inf else repr(float(value))
        return f"CAST('{text}' AS DOUBLE)"
    return f"CAST({int(value)} AS {spark_type(cql_type)})"


# --- the prepared base row ----------------------------------------------------------------------------------


def base_value_name(name: str) -> str:
    """The prepared base row's column holding the visible value of base column `name`."""
    return f"b_{name}"


def _bigint(name: str) -> str:
    return f"CAST({quote(name)} AS BIGINT)"


def _visible_value_sql(base: Table, name: str) -> str:
    value = f"CAST({quote(value_column_name(name))} AS {spark_type(base.column_type(name))})"
    if name in base.primary_key:
        return value
    ts, tomb = _bigint(ts_column_name(name)), _bigint("tomb_ts")
    return f"CASE WHEN {ts} IS NOT NULL AND ({tomb} IS NULL OR {ts} > {tomb}) THEN {value} END"


def prepared_base_columns(base: Table) -> list[str]:
    """Select expressions turning a stored base row into the prepared row the compiled views read.

    ``b_<x>``: the visible value of every base column (`storage.cells.visible_values`; key columns always);
    ``__live``: `storage.cells.is_live`; ``__ts``: the view rows' timestamp (the row's view_ts, else write_ts).
    """
    marker, tomb = _bigint("marker_ts"), _bigint("tomb_ts")
    columns = [f"{_visible_value_sql(base, c.name)} AS {quote(base_value_name(c.name))}" for c in base.columns]
    return columns + [f"({marker} IS NOT NULL AND ({tomb} IS NULL OR {marker} > {tomb})) AS {quote(LIVE)}",
                      f"COALESCE({_bigint('view_ts')}, {_bigint('write_ts')}) AS {quote(ROW_TS)}"]


# --- the WHERE clause ---------------------------------------------------------------------------------------


def _in_sql(value: str, literals: tuple, cql_type: str) -> str:
    """`value IN literals` as Python's `in`: NaN literals are dropped, so a NaN value is in no list (Spark's
    IN would match NaN with NaN); -0.0 and 0.0 are equal on both sides."""
    wanted = [sql_literal(v, cql_type) for v in literals if not _is_nan(v)]
    return f"{value} IN ({', '.join(wanted)})" if wanted else "FALSE"


def _comparison_sql(op: str, value: str, literal: object, cql_type: str) -> str:
    """`value op literal` with Python's float semantics (a NaN on either side: false, but `!=` true)."""
    if cql_type == "double" and _is_nan(literal):
        return "TRUE" if op == "!=" else "FALSE"
    compared = f"{value} {op} {sql_literal(literal, cql_type)}"
    if cql_type != "double":
        return compared
    return f"(isnan({value}) OR {compared})" if op == "!=" else f"NOT isnan({value}) AND {compared}"


def compile_filter(base: Table, term: Filter) -> str:
    """One WHERE term over the prepared base row, as `coordinator.core.views.matches` decides it (never NULL)."""
    value = quote(base_value_name(term.column))
    if term.op == "IS NOT NULL":
        return f"({value} IS NOT NULL)"
    cql_type = base.column_type(term.column)
    if term.op == "IN":
        test = _in_sql(value, tuple(term.value), cql_type)
    elif term.op in _COMPARISONS:
        test = _comparison_sql(term.op, value, term.value, cql_type)
    else:
        raise ValueError(f"unsupported view filter operator {term.op!r}")
    return f"COALESCE({value} IS NOT NULL AND {test}, FALSE)"


def view_condition(base: Table, view: Table) -> str:
    """Whether a prepared base row has a row in `view`: live, passes the WHERE clause, no NULL view key column."""
    terms = [quote(LIVE)] + [compile_filter(base, term) for term in view.view.where]
    terms += [f"({quote(base_value_name(n))} IS NOT NULL)" for n in view.primary_key]
    return " AND ".join(terms)


# --- view rows ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompiledView:
    """A view as Spark SQL over the prepared base row: its row condition and its output columns in order."""

    view: Table
    condition: str
    columns: tuple[tuple[str, str], ...]  # (output column name, SQL expression)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.columns]

    def select_exprs(self) -> list[str]:
        return [f"{sql} AS {quote(name)}" for name, sql in self.columns]


def view_token_sql(view: Table) -> str:
    """The view row's token over the prepared base row: xxhash64 of the view partition key (= `token_of`)."""
    return spark_token_sql([base_value_name(n) for n in view.partition_key], view.partition_key_types)


def _storage_columns(view: Table) -> list[tuple[str, str]]:
    ts = quote(ROW_TS)
    columns = [(value_column_name(n), quote(base_value_name(n))) for n in view.primary_key]
    for column in view.regular_columns:
        columns += [(value_column_name(column.name), quote(base_value_name(column.name))),
                    (ts_column_name(column.name), ts)]
    return columns + [("marker_ts", ts), ("tomb_ts", "CAST(NULL AS BIGINT)"), ("view_ts", ts), ("write_ts", ts),
                      ("tombstone", "FALSE")]


def _merge_columns(view: Table) -> list[tuple[str, str]]:
    names = list(view.primary_key) + [c.name for c in view.regular_columns]
    return [(value_column_name(n), quote(base_value_name(n))) for n in names] + [(TS, quote(ROW_TS))]


def compile_view(base: Table, view: Table, layout: str = STORAGE) -> CompiledView:
    """`view` (a view of `base`) compiled to SQL over the prepared base row, with output columns in `layout`."""
    if view.view is None or view.view.base_id != base.id:
        raise ValueError(f"{view.qualified_name} is not a view of {base.qualified_name}")
    build = {STORAGE: _storage_columns, MERGE: _merge_columns}.get(layout)
    if build is None:
        raise ValueError(f"unknown view row layout {layout!r}; expected {STORAGE!r} or {MERGE!r}")
    columns = (("token", view_token_sql(view)),) + tuple(build(view))
    return CompiledView(view, view_condition(base, view), columns)


def prepare(base_rows: DataFrame, base: Table) -> DataFrame:
    """The prepared base rows (`prepared_base_columns`) of a DataFrame of stored base rows."""
    return base_rows.selectExpr(*prepared_base_columns(base))


def view_rows(base_rows: DataFrame, base: Table, view: Table, layout: str = STORAGE) -> DataFrame:
    """The rows of one view, from a DataFrame of stored base rows (tombstoned rows may be included)."""
    compiled = compile_view(base, view, layout)
    return prepare(base_rows, base).where(compiled.condition).selectExpr(*compiled.select_exprs())


def views_frame(base_rows: DataFrame, base: Table, views: Sequence[Table], layout: str = MERGE) -> DataFrame:
    """One row per base row with a row in any of `views`: per view i a flag `v<i>` and its columns `v<i>__<name>`.

    A view's columns are NULL where its flag is false. (Flat columns rather than a struct per view: Spark marks
    the fields of a NULL struct non-nullable, which its own `toArrow` then refuses.)
    """
    if not views:
        raise ValueError("no views to compute")
    compiled = [compile_view(base, view, layout) for view in views]
    flags = [f"({c.condition}) AS {quote(f'v{i}')}" for i, c in enumerate(compiled)]
    flagged = prepare(base_rows, base).selectExpr("*", *flags)
    any_view = " OR ".join(quote(f"v{i}") for i in range(len(compiled)))
    columns = []
    for i, view in enumerate(compiled):
        flag = quote(f"v{i}")
        columns.append(flag)
        columns += [f"CASE WHEN {flag} THEN {sql} END AS {quote(f'v{i}__{name}')}" for name, sql in view.columns]
    return flagged.where(any_view).selectExpr(*columns)


def split_views(frame: pa.Table, views: Sequence[Table]) -> dict[str, pa.Table]:
    """The Arrow form of a `views_frame` split into one table per view id (the rows where that view has a row)."""
    return {view.id: _view_part(frame, f"v{i}") for i, view in enumerate(views)}


def _view_part(frame: pa.Table, flag: str) -> pa.Table:
    prefix = flag + "__"
    names = [n for n in frame.column_names if n.startswith(prefix)]
    part = frame.select(names).filter(frame.column(flag))
    return part.rename_columns([n[len(prefix):] for n in names])


def compute_view_rows(base_rows: DataFrame, base: Table, views: Sequence[Table],
                      layout: str = MERGE) -> dict[str, pa.Table]:
    """The rows of every view in `views` (view id -> Arrow table in `layout`), in one Spark job over one scan."""
    return split_views(views_frame(base_rows, base, views, layout).toArrow(), views)


# --- plumbing ----------------------------------------------------------------------------------------------


def base_frame(spark: SparkSession, rows: pa.Table) -> DataFrame:
    """A DataFrame of stored rows from their Arrow table (one partition per non-empty record batch).

    Empty record batches are dropped first: PySpark 4.x `createDataFrame(pyarrow.Table)` silently loses the
    batches that follow an empty one (measured: batches of 5, 3, 0 and 7 rows gave 8 rows).
    """
    batches = [batch for batch in rows.to_batches() if batch.num_rows]
    return spark.createDataFrame(pa.Table.from_batches(batches, schema=rows.schema))


def parquet_frame(session: SparkSession, path: Path, schema: pa.Schema) -> DataFrame:
    """A DataFrame of the Parquet file at `path`, whose Arrow schema is `schema`.

    The schema is given rather than inferred: inferring it runs a Spark job reading the file's footer (measured:
    60-80 ms of every batch)."""
    return session.read.schema(from_arrow_schema(schema)).parquet(str(path))


@contextmanager
def _scratch_file(spark: NodeSpark) -> Iterator[Path | None]:
    """A fresh path in the node's Spark scratch space (None without one), deleted when the block ends."""
    scratch = spark.scratch_dir()
    if scratch is None:
        yield None
        return
    path = scratch / f"{uuid.uuid4().hex}.parquet"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


@contextmanager
def staged_frame(spark: NodeSpark, rows: pa.Table) -> Iterator[DataFrame]:
    """A DataFrame of `rows` for the duration of the block.

    With a local master the table is staged as an uncompressed Parquet file in the node's Spark scratch space
    and read by Spark's vectorized reader (measured on 250,000 storage-layout rows: 0.15 s to write, and the
    view job then took 0.9 s against 2.3-2.5 s from `createDataFrame`, whose rows travel inside the tasks);
    the file is deleted when the block ends, so run the Spark actions inside it. Otherwise `base_frame`.
    """
    with _scratch_file(spark) as path:
        session = spark.session()
        if path is None:
            yield base_frame(session, rows)
            return
        pq.write_table(rows, path, compression="none", use_dictionary=False, write_statistics=False)
        yield parquet_frame(session, path, rows.schema)


@contextmanager
def staged_token_range(spark: NodeSpark, store: NodeStore, spec: TableSpec, first_token: int,
                       last_token: int) -> Iterator[tuple[int, Callable[[], DataFrame]]]:
    """One replica's live rows of a token range staged for Spark: (rows, a function giving their DataFrame).

    With a local master the rows go from the store straight into a Parquet file of the scratch space
    (`storage.bulk.stage_token_range`: on SQLite the reading child process writes it), never through this
    process; otherwise they are read into Arrow and handed over by `base_frame`. Use the DataFrame inside the
    block (the file is deleted when it ends)."""
    with _scratch_file(spark) as path:
        if path is None:
            rows = bulk.read_token_range(store, spec, first_token, last_token)
            yield rows.num_rows, lambda: base_frame(spark.session(), rows)
            return
        count = bulk.stage_token_range(store, spec, first_token, last_token, path)
        yield count, lambda: parquet_frame(spark.session(), path, storage_schema(spec))


def tablet_sql(token: str, tablet_count: int) -> str:
    """SQL for the id of the tablet owning the token expression `token` among `tablet_count` (`tokens.tablet_of`)."""
    if not is_power_of_two(tablet_count):
        raise ValueError(f"tablet count must be a power of two, got {tablet_count}")
    bits = tablet_count.bit_length() - 1
    if bits == 0:
        return "0"
    offset = f"(CAST({token} AS BIGINT) ^ CAST({MIN_TOKEN} AS BIGINT))"  # token - MIN_TOKEN, as unsigned 64 bits
    return f"CAST(shiftrightunsigned({offset}, {64 - bits}) AS INT)"
