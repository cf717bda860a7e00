"""Tests of `?` bind markers: parsing, substitution in text order, and errors."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cql import BindError, BindMarker, CqlSyntaxError, bind, bind_marker_count, parse
from cql import ast


def test_markers_are_bound_in_text_order_across_clauses():
    statement = parse("UPDATE ks.t SET v = ?, w = ? WHERE k = ? AND c IN (?, 3)")
    assert bind_marker_count(statement) == 4
    bound = bind(statement, ["x", 2, 1, 7])
    assert bound.assignments == (("v", "x"), ("w", 2))
    assert bound.where == (ast.Relation("k", "=", 1), ast.Relation("c", "IN", (7, 3)))


def test_batches_bind_inner_statements_in_order():
    statement = parse("BEGIN BATCH INSERT INTO ks.t (a, b) VALUES (?, ?); DELETE FROM ks.t WHERE a = ? APPLY BATCH")
    bound = bind(statement, [1, "q", 2])
    assert bound.statements[0].values == (1, "q") and bound.statements[1].where[0].value == 2


def test_wrong_number_of_values_is_refused():
    statement = parse("INSERT INTO ks.t (a, b) VALUES (?, ?)")
    with pytest.raises(BindError, match="2 bind marker"):
        bind(statement, [1])
    with pytest.raises(BindError, match="0 bind marker"):
        bind(parse("SELECT * FROM ks.t"), [1])


@pytest.mark.parametrize("text, clause", [("SELECT * FROM t LIMIT ?", "LIMIT"),
                                          ("INSERT INTO t (a) VALUES (1) USING TIMESTAMP ?", "USING TIMESTAMP")])
def test_markers_are_refused_where_only_literals_fit(text, clause):
    with pytest.raises(CqlSyntaxError, match=f"{clause} takes a literal value"):
        parse(text)


@given(st.lists(st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.none()), min_size=1, max_size=8))
def test_binding_an_insert_equals_writing_the_values_inline(values):
    columns = ", ".join(f"c{i}" for i in range(len(values)))
    markers = ", ".join("?" for _ in values)
    statement = parse(f"INSERT INTO ks.t ({columns}) VALUES ({markers})")
    assert all(isinstance(v, BindMarker) for v in statement.values)
    assert bind(statement, values).values == tuple(values)
