"""Substitution of `?` bind markers in a parsed statement by values, in the order the markers appear."""
from __future__ import annotations

import dataclasses

from .ast import BindMarker, Statement


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
    return _replace(statement, {m.position: v for m, v in zip(found, values)})
