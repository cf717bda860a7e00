"""The Python token rule against Spark's own xxhash64 (starts a local Spark session: one JVM for the module).

Checks the golden vectors of tests/token_vectors.py and a few hundred random keys per type, both with the
columns typed as Spark types (`SPARK_HASH_TYPES`) and as the storage layer hands them over (int, timestamp
and boolean as 64-bit integers) then cast by the expression of `spark_token_sql`.
"""
from __future__ import annotations

import math
import random
import struct

import pytest

from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN, SPARK_HASH_TYPES, spark_token_sql, token_of
from coordinator.core.types import TYPES
from tests.token_vectors import VECTORS

pytestmark = pytest.mark.integration

ROWS_PER_TYPE = 400
MULTI_COLUMN_KEYS = (
    ("bigint", "text"),
    ("int", "int"),
    ("text", "int", "boolean"),
    ("double", "timestamp"),
    ("boolean", "double", "text", "bigint", "int", "timestamp"),
    ("text", "text", "double"),
)


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """The node's own launcher: it retries a driver JVM that exits while starting and logs what it printed."""
    from worker.spark_session import NodeSpark, SparkConfig

    node_spark = NodeSpark(SparkConfig(master="local[1]", driver_memory="1g", shuffle_partitions=1,
                                       data_dir=str(tmp_path_factory.mktemp("spark"))))
    yield node_spark.session()
    node_spark.stop()


def _spark_type(type_name: str, stored: bool):
    from pyspark.sql import types as T

    if stored and type_name in ("int", "timestamp", "boolean", "bigint"):
        return T.LongType()  # what the storage layer hands over (SQLite: BOOLEAN and integers are int64)
    return {"INT": T.IntegerType(), "BIGINT": T.LongType(), "BOOLEAN": T.BooleanType(),
            "DOUBLE": T.DoubleType(), "STRING": T.StringType()}[SPARK_HASH_TYPES[type_name]]


def _stored(type_name: str, value):
    if type_name == "boolean" and value is not None:
        return int(value)
    return value


def spark_tokens(spark, column_types: list[str], rows: list[tuple], keys: list[tuple[int, ...]], stored: bool) -> list[list[int]]:
    """For each row, the Spark tokens of each key (a tuple of column indexes), via `spark_token_sql`."""
    from pyspark.sql import types as T

    names = [f"c{i}" for i in range(len(column_types))]
    schema = T.StructType([T.StructField("row_id", T.IntegerType(), False)]
                          + [T.StructField(n, _spark_type(t, stored)) for n, t in zip(names, column_types)])
    data = [(i,) + tuple(_stored(t, v) if stored else v for t, v in zip(column_types, row)) for i, row in enumerate(rows)]
    exprs = [spark_token_sql([names[c] for c in key], [column_types[c] for c in key]) + f" AS k{j}" for j, key in enumerate(keys)]
    frame = spark.createDataFrame(data, schema).selectExpr("row_id", *exprs)
    result = sorted(frame.collect(), key=lambda r: r["row_id"])
    assert [r["row_id"] for r in result] == list(range(len(rows)))
    return [[r[f"k{j}"] for j in range(len(keys))] for r in result]


def check(spark, column_types, rows, keys, stored):
    got = spark_tokens(spark, column_types, rows, keys, stored)
    mismatches = []
    for row, tokens in zip(rows, got):
        for key, token in zip(keys, tokens):
            want = token_of(tuple(row[c] for c in key), tuple(column_types[c] for c in key))
            if want != token:
                mismatches.append((tuple(column_types[c] for c in key), tuple(row[c] for c in key), token, want))
    assert not mismatches, f"{len(mismatches)} mismatches, e.g. (types, values, spark, python): {mismatches[:5]}"
    return len(rows) * len(keys)


@pytest.mark.parametrize("stored", [False, True], ids=["spark-types", "stored-columns"])
def test_golden_vectors_in_spark(spark, stored):
    by_types: dict[tuple, list] = {}
    for types, values, token in VECTORS:
        by_types.setdefault(types, []).append((values, token))
    for types, cases in by_types.items():
        rows = [values for values, _ in cases]
        got = spark_tokens(spark, list(types), rows, [tuple(range(len(types)))], stored)
        assert [tokens[0] for tokens in got] == [token for _, token in cases], types


def _random_value(rng: random.Random, type_name: str):
    roll = rng.random()
    if roll < 0.05:
        return None
    if type_name == "int":
        return rng.choice([rng.randint(-(2**31), 2**31 - 1), rng.randint(-1000, 1000), -(2**31), 2**31 - 1, 0])
    if type_name in ("bigint", "timestamp"):
        return rng.choice([rng.randint(MIN_TOKEN, MAX_TOKEN), rng.randint(-(10**13), 10**13), MIN_TOKEN, MAX_TOKEN, 0])
    if type_name == "boolean":
        return rng.random() < 0.5
    if type_name == "double":
        choice = rng.random()
        if choice < 0.4:  # any bit pattern: subnormals, infinities, NaNs with random payloads and signs
            return struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if choice < 0.7:
            return rng.uniform(-1e6, 1e6)
        return rng.choice([0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, -5e-324, 1.7976931348623157e308, 0.1, -1.0])
    return _random_text(rng)


def _random_text(rng: random.Random) -> str:
    ranges = [(0x20, 0x7E), (0x00, 0x1F), (0xA0, 0x24F), (0x370, 0x3FF), (0x4E00, 0x9FFF), (0xE000, 0xFFFD), (0x1F300, 0x1FAFF), (0x10000, 0x10FFFF)]
    chars = []
    for _ in range(rng.choice([0, 1, 2, 5, 17, 40, 120])):
        low, high = rng.choice(ranges)
        code = rng.randint(low, high)
        chars.append(chr(code) if not 0xD800 <= code <= 0xDFFF else "x")
    return "".join(chars)


@pytest.mark.parametrize("stored", [False, True], ids=["spark-types", "stored-columns"])
def test_random_keys_of_every_type_and_multi_column_keys(spark, stored):
    rng = random.Random(20261122 + stored)
    column_types = list(TYPES) + [t for key in MULTI_COLUMN_KEYS for t in key]
    rows = [tuple(_random_value(rng, t) for t in column_types) for _ in range(ROWS_PER_TYPE)]
    keys = [(i,) for i in range(len(TYPES))]
    offset = len(TYPES)
    for key in MULTI_COLUMN_KEYS:
        keys.append(tuple(range(offset, offset + len(key))))
        offset += len(key)
    assert check(spark, column_types, rows, keys, stored) == ROWS_PER_TYPE * (len(TYPES) + len(MULTI_COLUMN_KEYS))


def test_spark_hashes_a_timestamp_as_microseconds_so_tokens_cast_timestamps_to_bigint(spark):
    """Why SPARK_HASH_TYPES maps timestamp to BIGINT: a Spark TIMESTAMP hashes as its microseconds."""
    millis = 1700000000123
    row = spark.sql(f"SELECT xxhash64(TIMESTAMP_MILLIS({millis})) AS as_timestamp, "
                    f"xxhash64(CAST({millis} AS BIGINT) * 1000) AS micros, xxhash64(CAST({millis} AS BIGINT)) AS millis").collect()[0]
    assert row["as_timestamp"] == row["micros"] != row["millis"]
    assert row["millis"] == token_of((millis,), ("timestamp",))
