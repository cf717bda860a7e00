"""Bind-value sets as Arrow IPC (common/arrow_values.py and the Client service's decoding of them)."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest

from common.arrow_values import decode_table, longest_string_bytes, plain_columns, rows_of
from coordinator.core.errors import InvalidArgument
from cql.limits import Limits
from node.client_service import _params
from vbc.client import arrow_ipc
from vbcpb import vbc_pb2 as pb

EXTREMES = [-(2**63), 2**63 - 1, 0, None]


def decoded(table: pa.Table) -> list[list]:
    return rows_of(plain_columns(decode_table(arrow_ipc(table))))


def test_every_accepted_type_comes_back_as_the_python_value():
    table = pa.table({
        "i64": pa.array(EXTREMES, pa.int64()),
        "i32": pa.array([-(2**31), 2**31 - 1, 7, None], pa.int32()),
        "u8": pa.array([0, 255, 1, None], pa.uint8()),
        "f64": pa.array([math.nan, -0.0, math.inf, None], pa.float64()),
        "f32": pa.array([1.5, -2.25, 0.0, None], pa.float32()),
        "b": pa.array([True, False, None, True]),
        "s": pa.array(["", "é✓ \U0001F600", "a\x00b", None]),
        "ls": pa.array(["x", "y", None, "z"], pa.large_string()),
        "ts": pa.array([0, 1_700_000_000_000_000, None, -1_000], pa.timestamp("us")),
        "null": pa.array([None] * 4, pa.null()),
    })
    rows = decoded(table)
    assert [r[0] for r in rows] == EXTREMES
    assert [r[1] for r in rows] == [-(2**31), 2**31 - 1, 7, None] and [r[2] for r in rows] == [0, 255, 1, None]
    nan, negative_zero, inf, none = (r[3] for r in rows)
    assert math.isnan(nan) and math.copysign(1, negative_zero) == -1 and inf == math.inf and none is None
    assert [r[4] for r in rows] == [1.5, -2.25, 0.0, None]
    assert [r[5] for r in rows] == [True, False, None, True]
    assert [r[6] for r in rows] == ["", "é✓ \U0001F600", "a\x00b", None]
    assert [r[7] for r in rows] == ["x", "y", None, "z"]
    assert [r[8] for r in rows] == [0, 1_700_000_000_000, None, -1], "milliseconds, as a CQL timestamp stores"
    assert [r[9] for r in rows] == [None] * 4


def test_dictionary_strings_and_timestamps_of_any_unit_are_decoded_to_milliseconds():
    table = pa.table({"d": pa.array(["a", "b", "a"]).dictionary_encode(),
                      "ms": pa.array([1, 2, None], pa.timestamp("ms")),
                      "s": pa.array([1, 2, None], pa.timestamp("s")),
                      "ns": pa.array([1_500_000, 2_999_999, None], pa.timestamp("ns"))})
    assert decoded(table) == [["a", 1, 1000, 1], ["b", 2, 2000, 2], ["a", None, None, None]]


def test_a_pandas_frame_and_a_record_batch_go_the_same_way():
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"k": [1, 2], "v": ["a", None]})
    assert decoded(pa.Table.from_pandas(frame, preserve_index=False)) == [[1, "a"], [2, None]]
    assert rows_of(plain_columns(decode_table(arrow_ipc(frame)))) == [[1, "a"], [2, None]]
    batch = pa.record_batch({"k": [1], "v": ["x"]})
    assert rows_of(plain_columns(decode_table(arrow_ipc(batch)))) == [[1, "x"]]
    assert arrow_ipc([[1, "x"]]) is None


def test_unsupported_types_and_bad_bytes_are_refused_naming_the_column():
    with pytest.raises(InvalidArgument, match=r"Arrow column 2 \('blob'\) has type binary"):
        plain_columns(decode_table(arrow_ipc(pa.table({"k": [1], "blob": [b"x"]}))))
    with pytest.raises(InvalidArgument, match="arrow_values is not an Arrow IPC stream"):
        decode_table(b"not arrow")


def test_the_longest_string_is_measured_in_utf8_bytes():
    columns = plain_columns(pa.table({"k": [1, 2], "a": ["é" * 3, "x"], "b": ["yy", None]}))
    assert longest_string_bytes(columns) == (6, 2)
    assert longest_string_bytes(plain_columns(pa.table({"k": [1]}))) == (0, 0)


def test_the_service_takes_arrow_values_within_the_limits():
    limits = Limits(max_value_bytes=5, max_batch_rows=2)
    request = pb.ExecuteRequest(arrow_values=arrow_ipc(pa.table({"k": [1, 2], "v": ["abc", None]})))
    assert _params(request, limits).rows() == [[1, "abc"], [2, None]]
    too_long = pb.ExecuteRequest(arrow_values=arrow_ipc(pa.table({"k": [1], "v": ["abcdef"]})))
    with pytest.raises(InvalidArgument, match=r"a value of Arrow column 2 is 6 bytes, over the limit of 5"):
        _params(too_long, limits)
    too_many = pb.ExecuteRequest(arrow_values=arrow_ipc(pa.table({"k": [1, 2, 3]})))
    with pytest.raises(InvalidArgument, match=r"3 bind-value sets in one execution, over the limit of 2"):
        _params(too_many, limits)
    with pytest.raises(InvalidArgument, match="holds no rows"):
        _params(pb.ExecuteRequest(arrow_values=arrow_ipc(pa.table({"k": pa.array([], pa.int64())}))), limits)
    both = pb.ExecuteRequest(arrow_values=request.arrow_values, params=[pb.Row()])
    with pytest.raises(InvalidArgument, match="either as params or as arrow_values"):
        _params(both, limits)
