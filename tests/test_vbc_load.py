"""`vbc load`'s file reading and checking (vbc/load.py) without a cluster: CSV rules, conversions, row locations."""
from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.arrow_tokens import tablets_of, tokens_of
from vbc.load import SPILL_RANGES, LoadError, Plan, TokenSpill, chunks, converted, file_columns, file_format

CSV = (
    'k,c,v,b,d,ts\n'
    '1,1,plain,true,1.5,2024-01-02T03:04:05\n'
    '2,2,"",0,NaN,1700000000000\n'
    '3,3,,FALSE,-0.0,\n'
    '4,4,NULL,1,inf,2024-01-02 03:04:05.25\n'
    '5,5,"a,b ""q"" é",,,\n'
)
TYPES = ["int", "bigint", "text", "boolean", "double", "timestamp"]
NAMES = ["k", "c", "v", "b", "d", "ts"]


def read_all(path, fmt, names, types, key=frozenset({"k", "c"}), batch_rows=2) -> list[dict]:
    out = []
    for chunk in chunks(path, fmt, names, batch_rows):
        out += converted(chunk, names, types, set(key), path).to_pylist()
    return out


def test_csv_values_follow_the_documented_rules(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text(CSV, encoding="utf-8")
    assert file_format(path) == "csv" and file_columns(path, "csv") == NAMES
    got = read_all(path, "csv", NAMES, TYPES)
    assert [r["v"] for r in got] == ["plain", "", None, None, 'a,b "q" é']
    assert [r["b"] for r in got] == [True, False, False, True, None]
    assert [r["ts"] for r in got] == [1_704_164_645_000, 1_700_000_000_000, None, 1_704_164_645_250, None]
    d = [r["d"] for r in got]
    assert d[0] == 1.5 and math.isnan(d[1]) and math.copysign(1, d[2]) == -1 and d[3] == math.inf and d[4] is None
    assert [r["k"] for r in got] == [1, 2, 3, 4, 5]


def test_a_bad_value_is_located_by_data_row_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("k,c\n" + "".join(f"{i},{i}\n" for i in range(1, 8)) + "8,eight\n9,9\n")
    with pytest.raises(LoadError, match=r"data row 8 \(line 9\), column 'c': 'eight' does not convert to bigint"):
        read_all(path, "csv", ["k", "c"], ["int", "bigint"], batch_rows=3)


def test_parquet_rows_are_located_by_row_group_and_row(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"k": pa.array([1, 2, 3, None, 5], pa.int64()), "c": [1] * 5}), path, row_group_size=2)
    assert file_format(path) == "parquet" and file_columns(path, "parquet") == ["k", "c"]
    with pytest.raises(LoadError, match=r"row group 1, row 2, column 'k': primary key columns cannot be NULL"):
        read_all(path, "parquet", ["k", "c"], ["int", "int"])
    assert read_all(path, "parquet", ["c"], ["int"], key=set()) == [{"c": 1}] * 5


def test_unknown_file_types_and_unreadable_files_are_refused(tmp_path):
    with pytest.raises(LoadError, match="unknown file type .json"):
        file_format(tmp_path / "x.json")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(LoadError, match="not a readable Parquet file"):
        file_columns(broken, "parquet")


def test_the_spill_gives_every_row_back_once_grouped_by_token_range_in_batches_of_the_size_asked(tmp_path):
    plan = Plan("INSERT ...", ["k", "v"], ["int", "text"], {"k"}, ["k"])
    spill = TokenSpill(tmp_path, plan)
    for start in range(0, 1000, 300):
        keys = list(range(start, min(start + 300, 1000)))
        spill.add(pa.table({"k": pa.array(keys, pa.int32()), "v": [f"v{k}" for k in keys]}))
    spill.close()
    batches = list(spill.batches(128))
    assert [b.num_rows for b in batches] == [128] * 7 + [104]
    rows = [row for b in batches for row in b.to_pylist()]
    assert sorted(r["k"] for r in rows) == list(range(1000)) and all(r["v"] == f"v{r['k']}" for r in rows)
    ranges = tablets_of(tokens_of([pa.array([r["k"] for r in rows], pa.int32())], ("int",)), SPILL_RANGES)
    assert list(ranges) == sorted(ranges), "rows come range after range"


def test_without_a_partition_key_the_spill_keeps_file_order(tmp_path):
    spill = TokenSpill(tmp_path, Plan("INSERT ...", ["k"], ["int"], {"k"}, []))
    spill.add(pa.table({"k": pa.array([3, 1, 2], pa.int32())}))
    spill.close()
    assert [r["k"] for b in spill.batches(2) for r in b.to_pylist()] == [3, 1, 2]
