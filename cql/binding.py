"""Substitution of `?` bind markers in a parsed statement by values, in the order the markers appear."""
from __future__ import annotations

import dataclasses

from .ast import Batch, BindMarker, Insert, Statement, Update


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()  # a bound value the client left unset: the column keeps what it holds (CQL protocol v4)


class BindError(ValueError):
    """The values given do not fit the statement's bind markers."""


def markers(node: object) -> list[BindMarker]:
    """Every bind marker in a statement (or part of one), in field order."""
    if isinstance(node, BindMarker):
        return [node]
    if dataclasses.is_dataclass(node):
        return [m for f in dataclasses.fields(node) for m in markers(getattr(node, f.name))]
    if isinstance(node, (tuple, list)):
        return [m for item in node for m in markers(item)]
    if isinstance(node, dict):
        return [m for value in node.values() for m in markers(value)]
    return []


def bind_marker_count(statement: Statement) -> int:
    return len(markers(statement))


def _replace(node: object, values: dict[int, object]) -> object:
    if isinstance(node, BindMarker):
        return values[node.position]
    if dataclasses.is_dataclass(node):
        changes = {f.name: _replace(getattr(node, f.name), values) for f in dataclasses.fields(node)}
        return dataclasses.replace(node, **changes)
    if isinstance(node, tuple):
        return tuple(_replace(item, values) for item in node)
    if isinstance(node, dict):
        return {key: _replace(value, values) for key, value in node.items()}
    return node


def bind(statement: Statement, values: list | tuple) -> Statement:
    """The statement with its i-th `?` (in text order) replaced by values[i]."""
    found = sorted(markers(statement), key=lambda m: m.position)
    if len(found) != len(values):
        raise BindError(f"the statement has {len(found)} bind marker(s) (?) but {len(values)} value(s) were given")
    if not found:
        return statement
    bound = _without_unset(_replace(statement, {m.position: v for m, v in zip(found, values)}))
    if any(value is UNSET for value in _values(bound)):
        raise BindError("an unset value (UNSET) can only stand for a column's new value in INSERT or UPDATE, not in "
                        "WHERE or USING")
    return bound


def _without_unset(statement: Statement) -> Statement:
    """INSERT columns and UPDATE assignments whose value was left unset are not written."""
    if isinstance(statement, Batch):
        return dataclasses.replace(statement, statements=tuple(_without_unset(s) for s in statement.statements))
    if isinstance(statement, Insert) and any(v is UNSET for v in statement.values):
        kept = [(c, v) for c, v in zip(statement.columns, statement.values) if v is not UNSET]
        return dataclasses.replace(statement, columns=tuple(c for c, _ in kept), values=tuple(v for _, v in kept))
    if isinstance(statement, Update) and any(v is UNSET for _, v in statement.assignments):
        return dataclasses.replace(statement, assignments=tuple((c, v) for c, v in statement.assignments
                                                                if v is not UNSET))
    return statement


def _values(node: object) -> list:
    if dataclasses.is_dataclass(node):
        return [v for f in dataclasses.fields(node) for v in _values(getattr(node, f.name))]
    if isinstance(node, (tuple, list)):
        return [v for item in node for v in _values(item)]
    return [node]
