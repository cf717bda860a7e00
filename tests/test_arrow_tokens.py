"""The vectorized tokens and tablets of common.arrow_tokens equal coordinator.core.tokens row by row."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from common.arrow_tokens import tablets_of, tokens_of
from coordinator.core.tokens import MAX_TOKEN, MIN_TOKEN, tablet_of, token_of

ARROW = {"int": pa.int32(), "bigint": pa.int64(), "timestamp": pa.int64(), "boolean": pa.bool_(),
         "double": pa.float64(), "text": pa.string()}
VALUES = {
    "int": st.integers(-(2**31), 2**31 - 1),
    "bigint": st.integers(-(2**63), 2**63 - 1),
    "timestamp": st.integers(-(2**63), 2**63 - 1),
    "boolean": st.booleans(),
    "double": st.floats(allow_nan=True) | st.sampled_from([-0.0, 0.0, math.nan, -math.nan, math.inf]),
    "text": st.text(max_size=40),
}


@st.composite
def keys(draw):
    types = tuple(draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=3)))
    rows = draw(st.lists(st.tuples(*(VALUES[t] for t in types)), min_size=1, max_size=20))
    return types, rows


@settings(max_examples=300, deadline=None)
@given(keys())
def test_vectorized_tokens_equal_the_row_rule(key):
    types, rows = key
    columns = [pa.array([row[i] for row in rows], ARROW[t]) for i, t in enumerate(types)]
    assert tokens_of(columns, types).tolist() == [token_of(row, types) for row in rows]


def test_golden_vectors_hold_for_whole_columns():
    assert tokens_of([pa.array([7], pa.int64())], ("bigint",)).tolist() == [-2864211556195259663]
    assert tokens_of([pa.array(["hello"])], ("text",)).tolist() == [-4367754540140381902]
    assert tokens_of([pa.array([7], pa.int64()), pa.array(["hello"])], ("bigint", "text")).tolist() == \
        [-728376459917541194]


@given(st.lists(st.integers(MIN_TOKEN, MAX_TOKEN), min_size=1, max_size=50), st.integers(0, 12))
def test_tablets_of_tokens_equal_the_row_rule(tokens, power):
    count = 2**power
    assert tablets_of(np.array(tokens, dtype=np.int64), count).tolist() == [tablet_of(t, count) for t in tokens]
