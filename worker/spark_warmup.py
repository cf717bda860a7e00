"""A warm-up of the view job's shape on synthetic rows, so a node's first real batch finds Spark compiled and planned."""
from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from coordinator.core.schema import Column, Filter, Table, ViewDef
from replica.rows import partition_token, storage_spec
from storage.arrow_layouts import storage_schema

from worker.spark_class_cache import ClassCache, cache_directory
from worker.spark_session import NodeSpark, SparkConfig
from worker.spark_views import compute_view_rows, staged_frame

log = logging.getLogger(__name__)

WARMUP_ROWS = 300
# The rows of each warm-up run. A first run pays the session's fixed first-job costs (classes loaded, Catalyst and
# the code generator compiled: 3.6-6.9 s on 2 cores); later ones run the per-row paths (Parquet reader, generated
# code, Arrow writer) often enough for the JIT to compile them. Measured on 2 cores, a first real job of 100,000 rows
# (two views) in a fresh JVM took 4.1-4.4 s without warm-up and 0.8-1.0 s after two 300-row runs; on 3 nodes RF 3,
# the first build of 1,000,000 rows used 10.4 CPU-seconds of the JVMs after runs of 300 and 20,000 rows against 13.9
# after two of 300. A third run of 100,000 rows took the first jobs of two shards at once (125,000 rows each) from
# 0.47-0.62 s to 0.39-0.52 s, as fast as the later ones.
WARMUP_RUNS = (WARMUP_ROWS, 20_000, 100_000)
# Then more jobs of WARMUP_ROWS rows. Each job plans its query afresh, and Catalyst's code is so large that the JIT
# still compiled its methods job after job: on 1 node, 0.65-0.84 CPU-seconds of the JVM's compiler threads during a
# build of 1,000,000 rows after the runs above. After 30 more small jobs (0.15-0.25 s each) it was 0.24-0.28, the
# JVM used 2.6 CPU-seconds for that build instead of 3.5-4.2, and the build took 4.5 s instead of 5.1-5.6.
PLANNING_RUNS = 30

BASE = Table("00000000000000000000000000000b00", "vbc_warmup", "base",
             (Column("id", "int"), Column("seq", "bigint"), Column("amount", "double"), Column("flag", "boolean"),
              Column("name", "text")), ("id",), ("seq",))
_KEY_NOT_NULL = (Filter("id", "IS NOT NULL", None), Filter("seq", "IS NOT NULL", None))
VIEWS = (
    # a materialized view keyed by a regular column, with every column
    Table("00000000000000000000000000000b01", "vbc_warmup", "by_name",
          (Column("name", "text"), Column("id", "int"), Column("seq", "bigint"), Column("amount", "double"),
           Column("flag", "boolean")), ("name",), ("id", "seq"),
          ViewDef(BASE.id, (Filter("name", "IS NOT NULL", None),) + _KEY_NOT_NULL + (Filter("amount", ">", 0.0),))),
    # an index: the indexed column and the base key
    Table("00000000000000000000000000000b02", "vbc_warmup", "flag_idx",
          (Column("flag", "boolean"), Column("id", "int"), Column("seq", "bigint")), ("flag",), ("id", "seq"),
          ViewDef(BASE.id, (Filter("flag", "IS NOT NULL", None),) + _KEY_NOT_NULL, is_index=True)),
)


def warmup_rows(count: int = WARMUP_ROWS) -> pa.Table:
    """`count` live rows of BASE in the storage layout, as a batch's tablet read hands them over (some NULL cells)."""
    ids = [i // 3 for i in range(count)]
    stamps = [1_000 + i for i in range(count)]
    values = {
        "amount": [None if i % 11 == 0 else i * 1.5 - 40.0 for i in range(count)],
        "flag": [None if i % 13 == 0 else i % 2 == 0 for i in range(count)],
        "name": [None if i % 7 == 0 else f"name-{i % 17}" for i in range(count)],
    }
    columns = {"token": [partition_token(BASE, {"id": key}) for key in ids], "c_id": ids, "c_seq": list(range(count))}
    for name, column in values.items():
        columns[f"c_{name}"], columns[f"ts_{name}"] = column, stamps
    columns.update(marker_ts=stamps, tomb_ts=[None] * count, view_ts=stamps, write_ts=stamps,
                   tombstone=[False] * count)
    return pa.Table.from_pydict(columns, schema=storage_schema(storage_spec(BASE)))


def run_view_job(spark: NodeSpark, rows: pa.Table) -> dict[str, pa.Table]:
    """One job exactly as a batch runs it: the rows staged for Spark, every view computed in one scan."""
    with staged_frame(spark, rows) as frame:
        return compute_view_rows(frame, BASE, VIEWS)


def warm_up(spark: NodeSpark, stopping: threading.Event | None = None, runs: tuple[int, ...] = WARMUP_RUNS,
            busy: Callable[[], bool] | None = None, planning_runs: int = PLANNING_RUNS) -> list[float]:
    """Run the warm-up job once per entry of `runs` (its rows), then `planning_runs` times on WARMUP_ROWS rows; none
    once `stopping` is set or `busy()` says real batches run: they warm the JIT themselves and need the cores (a
    node restarted in the middle of a build found its first batch waiting for the session, and the two first jobs
    side by side took 3.7-3.9 s each). The seconds of each job."""
    seconds = []
    for count in runs + (WARMUP_ROWS,) * planning_runs:
        if stopping is not None and stopping.is_set():
            break
        if busy is not None and busy():
            break
        rows = warmup_rows(count)
        started = time.perf_counter()
        run_view_job(spark, rows)
        seconds.append(time.perf_counter() - started)
    _log_warm_up(runs, seconds)
    return seconds


def _log_warm_up(runs: tuple[int, ...], seconds: list[float]) -> None:
    if not seconds:
        log.info("spark warm-up skipped: view building batches already run (their first job warms the session)")
        return
    sized, planning = seconds[:len(runs)], seconds[len(runs):]
    log.info("spark warm-up: %d job(s) of %s rows in %s s; %d planning job(s) of %s rows in %.2f s", len(sized),
             ", ".join(f"{n:,}" for n in runs[:len(sized)]), ", ".join(f"{s:.2f}" for s in sized), len(planning),
             f"{WARMUP_ROWS:,}", sum(planning))


def make_class_archive(config: SparkConfig | None = None) -> tuple[Path | None, str]:
    """Make the class-data archive of driver JVMs started with `config`'s options now, as a node would after its
    first start: a JVM that lists its classes runs the node's whole warm-up, then the archive is dumped from that
    list (worker.spark_class_cache). The archive (None if there is none) and what happened, in words."""
    config = config or SparkConfig()
    cache = ClassCache.for_jvm(cache_directory(config.class_cache), config.java_options)
    if cache is None:
        return None, "no archive: the class-data archive is off, or no java was found"
    if cache.archive.exists():
        return cache.archive, f"already made: {cache.archive}"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vbc-spark-archive-") as scratch:
        with NodeSpark(replace(config, data_dir=scratch)) as spark:
            warm_up(spark)
            made = spark.make_class_archive()
    if made:
        return cache.archive, f"made in {time.monotonic() - started:.0f} s: {cache.archive}"
    if cache.archive.exists():
        return cache.archive, f"made meanwhile by another process: {cache.archive}"
    return None, f"not made (another process is making it, or the dump failed: see the log above): {cache.archive}"
