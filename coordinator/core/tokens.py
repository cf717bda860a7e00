"""The partition-key hash (token) and the mapping between tokens and tablets.

The token of a partition key is Spark SQL's ``xxhash64`` of its components, so a Spark job computes it
natively (``xxhash64(CAST(k1 AS <type>), CAST(k2 AS <type>), ...)``, see `spark_token_sql`) and gets
the same number as this module. The rule, with XXH64 the 64-bit xxHash function:

- start with ``h = 42`` (Spark's seed);
- for each component, left to right: a NULL leaves ``h`` unchanged; any other value sets
  ``h = XXH64(encode(value), seed=h)``, ``h`` carried as an unsigned 64-bit number; so several columns
  are chained, each component's hash seeding the next one's;
- the token is the final ``h`` read as a signed 64-bit (two's complement) integer.

``encode(value)`` depends on the column's CQL type, which is hashed as the Spark type of
`SPARK_HASH_TYPES`:

=========== ============ ============================================================================
CQL type    Spark type   bytes hashed
=========== ============ ============================================================================
int         INT          4 bytes, little-endian two's complement
bigint      BIGINT       8 bytes, little-endian two's complement
timestamp   BIGINT       the stored value (milliseconds since the epoch) as 8 bytes, little-endian
boolean     BOOLEAN      4 bytes, little-endian int 1 (true) or 0 (false)
double      DOUBLE       the IEEE-754 bits as 8 bytes, little-endian; -0.0 is hashed as 0.0 and every
                         NaN as the canonical NaN 0x7ff8000000000000 (Java's doubleToLongBits)
text        STRING       the UTF-8 bytes
=========== ============ ============================================================================

A timestamp is hashed as the BIGINT of its stored milliseconds, not as a Spark TIMESTAMP: Spark
hashes a TIMESTAMP as its microseconds, and ``CAST(<bigint> AS TIMESTAMP)`` reads seconds, so both
differ from the stored value; casting the stored column to BIGINT keeps the two sides identical.

Examples: ``xxhash64(CAST(7 AS BIGINT))`` = -2864211556195259663, ``xxhash64('hello')`` =
-4367754540140381902, ``xxhash64(CAST(7 AS BIGINT), 'hello')`` = -728376459917541194 (golden vectors
for every type in tests/test_tokens.py; tests/test_tokens_spark.py checks them against Spark itself).

Tablet i of 2**k owns the contiguous token range [MIN_TOKEN + i * 2**(64-k), MIN_TOKEN + (i+1) * 2**(64-k) - 1],
so splitting tablet n gives tablets 2n and 2n+1 of the doubled map, and merging gives n // 2.
"""
from __future__ import annotations

import math
import struct

import xxhash

MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1

SPARK_SEED = 42

# CQL column type -> the Spark SQL type a column is cast to before `xxhash64`, so Spark hashes it exactly
# as `token_of` does.
SPARK_HASH_TYPES = {
    "int": "INT",
    "bigint": "BIGINT",
    "timestamp": "BIGINT",
    "boolean": "BOOLEAN",
    "double": "DOUBLE",
    "text": "STRING",
}

_INT = struct.Struct("<i")
_LONG = struct.Struct("<q")
_CANONICAL_NAN = struct.pack("<Q", 0x7FF8000000000000)
_ZERO_DOUBLE = struct.pack("<d", 0.0)


def _encode_double(value: float) -> bytes:
    value = float(value)
    if math.isnan(value):
        return _CANONICAL_NAN
    if value == 0.0:  # -0.0 hashes as 0.0
        return _ZERO_DOUBLE
    return struct.pack("<d", value)


_ENCODERS = {
    "int": _INT.pack,
    "bigint": _LONG.pack,
    "timestamp": _LONG.pack,
    "boolean": lambda value: _INT.pack(1 if value else 0),
    "double": _encode_double,
    "text": lambda value: value.encode("utf-8"),
}


def encode_component(type_name: str, value: object) -> bytes:
    """The bytes Spark's xxhash64 hashes for a non-NULL value of a column of CQL type `type_name`."""
    return _ENCODERS[type_name](value)


def token_of(values: tuple, types: tuple[str, ...]) -> int:
    """The token of a partition key given its component values and column types (Spark's xxhash64)."""
    h = SPARK_SEED
    for type_name, value in zip(types, values, strict=True):
        if value is not None:
            h = xxhash.xxh64_intdigest(_ENCODERS[type_name](value), seed=h)
    return h - 2**64 if h > MAX_TOKEN else h


def spark_hash_types(types) -> list[str]:
    """The Spark SQL type names the partition key columns (of these CQL types) are cast to before xxhash64."""
    return [SPARK_HASH_TYPES[t] for t in types]


def spark_token_sql(columns, types) -> str:
    """The Spark SQL expression computing the token of rows whose partition key columns are `columns`.

    Column names are quoted with backticks; e.g. ``xxhash64(CAST(`k` AS INT), CAST(`c` AS STRING))``.
    """
    columns, types = list(columns), list(types)
    if not columns or len(columns) != len(types):
        raise ValueError(f"need one type per partition key column, got {columns!r} and {types!r}")
    args = ", ".join(f"CAST({_quote(c)} AS {t})" for c, t in zip(columns, spark_hash_types(types)))
    return f"xxhash64({args})"


def _quote(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def is_power_of_two(count: int) -> bool:
    return count >= 1 and count & (count - 1) == 0


def _width(tablet_count: int) -> int:
    return 2**64 // tablet_count


def tablet_range(tablet_id: int, tablet_count: int) -> tuple[int, int]:
    """Inclusive (first_token, last_token) owned by a tablet of a map with `tablet_count` tablets."""
    width = _width(tablet_count)
    first = MIN_TOKEN + tablet_id * width
    return first, first + width - 1


def tablet_of(token: int, tablet_count: int) -> int:
    """The id of the tablet owning `token`."""
    return (token - MIN_TOKEN) // _width(tablet_count)
