"""Bulk data-plane benchmark: storage.bulk's token-range read and view-row merge against plain SQLite, same layout.

Run: `.venv/bin/python bench/bulk.py [--rows N] [--runs R]` (default 1,000,000 rows, best of 2 runs).
The base table is `tab(key int, c int, v text, PRIMARY KEY (key, c))` with rows
`(i // 10, i % 10, str(i))` in the storage layout; the view is `PRIMARY KEY (c, key, v)`.

- read: `bulk.read_token_range` of the whole base replica (ADBC in a child process, Arrow back over a pipe)
  against Python's `sqlite3` fetching the same rows and building the same Arrow table;
- merge: `bulk.merge_view_rows` of the view rows (computed from that Arrow table in pyarrow, standing in for
  the Spark job) into an empty view table, and again (a retried task: nothing changes), against SQLite's own
  `INSERT INTO view SELECT ... FROM base ... ON CONFLICT DO UPDATE ... WHERE newer` into an empty view table
  of the same layout (view tokens precomputed in a temporary table).
Figures are seconds and ratios (ours / baseline), measured in the same run: absolute times are noisy.
"""
from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN, token_of  # noqa: E402
from storage import bulk  # noqa: E402
from storage.arrow_layouts import storage_schema, view_rows_schema  # noqa: E402
from storage.cells import ColumnSpec, TableSpec  # noqa: E402
from storage.store import NodeStore  # noqa: E402
from storage.upsert import physical_table_name  # noqa: E402

BASE = TableSpec(uuid.uuid4().hex, (ColumnSpec("key", "int"),), (ColumnSpec("c", "int"),), (ColumnSpec("v", "text"),))
TS = 1_700_000_000_000_000


def view_spec() -> TableSpec:
    return TableSpec(uuid.uuid4().hex, (ColumnSpec("c", "int"),), (ColumnSpec("key", "int"), ColumnSpec("v", "text")))


def fill_base(path: Path, rows: int) -> None:
    """The base rows in the storage layout, written with plain sqlite3 (setup, not measured)."""
    tokens = {key: token_of((key,), ("int",)) for key in range(rows // 10 + 1)}
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    db.executemany(f"INSERT INTO {physical_table_name(BASE.table_id)} VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, 0)",
                   ((tokens[i // 10], i // 10, i % 10, str(i), TS + i, TS + i, TS + i, TS + i) for i in range(rows)))
    db.execute("COMMIT")
    db.close()


def python_sqlite_read(path: Path) -> pa.Table:
    """The baseline read: the same rows through Python's sqlite3, into an Arrow table of the same schema."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA cache_size=-262144")
    rows = db.execute(f"SELECT * FROM {physical_table_name(BASE.table_id)} WHERE token >= ? AND token <= ? "
                      "AND tombstone = 0", (MIN_TOKEN, MAX_TOKEN)).fetchall()
    db.close()
    schema = storage_schema(BASE)
    columns = list(zip(*rows))
    arrays = [pa.array(column).cast(field.type) for column, field in zip(columns, schema)]
    return pa.Table.from_arrays(arrays, schema=schema)


def view_rows(base: pa.Table, view: TableSpec) -> pa.Table:
    """The view rows of the base rows, computed in pyarrow (the Spark job's part in production)."""
    tokens = pa.array([token_of((c,), ("int",)) for c in range(10)], pa.int64())
    return pa.table({"token": pc.take(tokens, base.column("c_c")), "c_c": base.column("c_c"),
                     "c_key": base.column("c_key"), "c_v": base.column("c_v"), "ts": base.column("view_ts")},
                    schema=view_rows_schema(view))


def sqlite_set_based_build(path: Path, view: TableSpec) -> float:
    """SQLite's own INSERT ... SELECT ... ON CONFLICT DO UPDATE ... WHERE newer; seconds."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA cache_size=-262144")
    db.execute("CREATE TEMP TABLE view_tokens (c INTEGER PRIMARY KEY, token INTEGER)")
    db.executemany("INSERT INTO view_tokens VALUES (?, ?)", [(c, token_of((c,), ("int",))) for c in range(10)])
    start = time.perf_counter()
    db.execute("BEGIN IMMEDIATE")
    db.execute(f"INSERT INTO {physical_table_name(view.table_id)} AS cur "
               "(token, c_c, c_key, c_v, marker_ts, tomb_ts, view_ts, write_ts, tombstone) "
               "SELECT t.token, b.c_c, b.c_key, b.c_v, b.view_ts, NULL, b.view_ts, b.view_ts, 0 "
               f"FROM {physical_table_name(BASE.table_id)} AS b JOIN view_tokens AS t ON t.c = b.c_c "
               "WHERE b.tombstone = 0 AND b.c_v IS NOT NULL "
               "ON CONFLICT (token, c_c, c_key, c_v) DO UPDATE SET marker_ts = excluded.marker_ts, "
               "view_ts = excluded.view_ts, write_ts = excluded.write_ts, tombstone = 0 "
               "WHERE excluded.marker_ts > cur.marker_ts")
    db.execute("COMMIT")
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed


def timed(function, *args) -> tuple[float, object]:
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def one_run(store: NodeStore, path: Path) -> dict[str, float]:
    figures = {}
    figures["read ours"], base = timed(bulk.read_token_range, store, BASE, MIN_TOKEN, MAX_TOKEN)
    figures["read python sqlite3"], _ = timed(python_sqlite_read, path)
    view = view_spec()
    store.ensure_table(view)
    figures["view rows (pyarrow)"], rows = timed(view_rows, base, view)
    figures["merge ours"], changed = timed(bulk.merge_view_rows, store, view, rows)
    figures["merge ours, retried"], unchanged = timed(bulk.merge_view_rows, store, view, rows)
    assert (changed, unchanged) == (rows.num_rows, 0), (changed, unchanged)
    baseline_view = view_spec()
    store.ensure_table(baseline_view)
    figures["sqlite INSERT..SELECT"] = sqlite_set_based_build(path, baseline_view)
    return figures


def report(runs: list[dict[str, float]], rows: int) -> None:
    best = {name: min(run[name] for run in runs) for name in runs[0]}
    print(f"{rows:,} rows, best of {len(runs)} runs (seconds)")
    for name, seconds in best.items():
        print(f"  {name:<24} {seconds:7.2f}   (runs: {', '.join(f'{run[name]:.2f}' for run in runs)})")
    pipeline = best["read ours"] + best["view rows (pyarrow)"] + best["merge ours"]
    print(f"read:     ours {best['read ours']:.2f}  baseline (python sqlite3) {best['read python sqlite3']:.2f}  "
          f"ratio {best['read ours'] / best['read python sqlite3']:.2f}")
    print(f"merge:    ours {best['merge ours']:.2f}  baseline (sqlite INSERT..SELECT) {best['sqlite INSERT..SELECT']:.2f}  "
          f"ratio {best['merge ours'] / best['sqlite INSERT..SELECT']:.2f}")
    print(f"pipeline: ours (read + view rows + merge) {pipeline:.2f}  baseline {best['sqlite INSERT..SELECT']:.2f}  "
          f"ratio {pipeline / best['sqlite INSERT..SELECT']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "storage.db"
        with NodeStore(f"sqlite:///{path}") as store:
            store.ensure_table(BASE)
            fill_base(path, args.rows)
            runs = [one_run(store, path) for _ in range(args.runs)]
        bulk.shutdown()
    report(runs, args.rows)


if __name__ == "__main__":
    main()
