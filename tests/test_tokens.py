"""The token rule (Spark's xxhash64 over the partition key) against golden vectors; no Spark needed here.

tests/test_tokens_spark.py checks the same vectors, and random keys, against Spark itself.
"""
from __future__ import annotations

import math

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from coordinator.core.tokens import (
    MAX_TOKEN,
    MIN_TOKEN,
    SPARK_HASH_TYPES,
    encode_component,
    spark_hash_types,
    spark_token_sql,
    token_of,
)
from coordinator.core.types import TYPES
from tests.token_vectors import VECTORS, _nan


@pytest.mark.parametrize(("types", "values", "token"), VECTORS, ids=[f"{i}-{'+'.join(v[0])}" for i, v in enumerate(VECTORS)])
def test_golden_vector(types, values, token):
    assert token_of(values, types) == token


def test_measured_spark_examples():
    assert token_of((7,), ("bigint",)) == -2864211556195259663
    assert token_of(("hello",), ("text",)) == -4367754540140381902
    assert token_of((7, "hello"), ("bigint", "text")) == -728376459917541194


def test_every_type_has_a_vector_and_a_spark_type():
    assert set(SPARK_HASH_TYPES) == set(TYPES)
    assert {t for types, _, _ in VECTORS for t in types} == set(TYPES)


def test_spark_hash_types_and_sql():
    assert spark_hash_types(("int", "bigint", "timestamp", "boolean", "double", "text")) == [
        "INT", "BIGINT", "BIGINT", "BOOLEAN", "DOUBLE", "STRING"]
    assert spark_token_sql(["key"], ["int"]) == "xxhash64(CAST(`key` AS INT))"
    assert spark_token_sql(("a", "we`ird"), ("timestamp", "text")) == "xxhash64(CAST(`a` AS BIGINT), CAST(`we``ird` AS STRING))"
    with pytest.raises(ValueError):
        spark_token_sql([], [])
    with pytest.raises(ValueError):
        spark_token_sql(["a", "b"], ["int"])


def test_null_leaves_the_hash_unchanged():
    assert token_of((None,), ("int",)) == 42
    assert token_of((None, "hello", None), ("int", "text", "double")) == token_of(("hello",), ("text",))


def test_negative_zero_and_every_nan_hash_alike():
    assert token_of((-0.0,), ("double",)) == token_of((0.0,), ("double",))
    canonical = token_of((math.nan,), ("double",))
    for bits in (0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FFFFFFFFFFFFFFF, 0xFFF0000000000001):
        assert token_of((_nan(bits),), ("double",)) == canonical
    assert encode_component("double", _nan(0xFFF8000000000001)) == (0x7FF8000000000000).to_bytes(8, "little")


def test_timestamp_hashes_as_its_stored_milliseconds_bigint():
    for millis in (0, 1700000000000, -1, MAX_TOKEN, MIN_TOKEN):
        assert token_of((millis,), ("timestamp",)) == token_of((millis,), ("bigint",))


def test_per_type_encoding():
    assert encode_component("int", -2) == b"\xfe\xff\xff\xff"
    assert encode_component("bigint", 1) == b"\x01" + b"\x00" * 7
    assert encode_component("boolean", True) == b"\x01\x00\x00\x00"
    assert encode_component("boolean", False) == b"\x00" * 4
    assert encode_component("double", 1.0) == (0x3FF0000000000000).to_bytes(8, "little")
    assert encode_component("text", "é") == b"\xc3\xa9"


def _values(type_name):
    return {
        "int": st.integers(-(2**31), 2**31 - 1),
        "bigint": st.integers(MIN_TOKEN, MAX_TOKEN),
        "timestamp": st.integers(MIN_TOKEN, MAX_TOKEN),
        "boolean": st.booleans(),
        "double": st.floats(allow_nan=True, allow_infinity=True),
        "text": st.text(),
    }[type_name]


@st.composite
def keys(draw):
    types = tuple(draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=4)))
    values = tuple(draw(st.none() | _values(t)) for t in types)
    return types, values


@given(keys())
def test_token_is_a_signed_64_bit_chain_of_xxh64(key):
    types, values = key
    token = token_of(values, types)
    assert MIN_TOKEN <= token <= MAX_TOKEN
    assert token == token_of(values, types)
    seed = 42
    for type_name, value in zip(types, values):
        if value is not None:
            seed = xxhash.xxh64_intdigest(encode_component(type_name, value), seed=seed)
    assert token == (seed - 2**64 if seed >= 2**63 else seed)
