"""The function from a base row to its view row, and the view changes a base row change implies."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from .schema import Filter, Table


@dataclass(frozen=True)
class ViewChange:
    """Delete the view row at `key`, or (when `values` is set) upsert it with `values` (all view columns)."""

    key: tuple
    values: dict | None = None

    @property
    def is_delete(self) -> bool:
        return self.values is None


def _passes(term: Filter, value: object) -> bool:
    if term.op == "IS NOT NULL":
        return value is not None
    if value is None:
        return False
    if term.op == "IN":  # by equality alone: Python's `in` also matches by identity, so one NaN object found itself
        return any(value == candidate for candidate in term.value)
    return COMPARISONS[term.op](value, term.value)


# A WHERE comparison as the operator it is; a SQL column expression takes them as well as a Python value does.
COMPARISONS = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
               ">=": operator.ge}


def matches(terms: tuple[Filter, ...], row: dict) -> bool:
    """Whether a row (column name -> value, absent = null) satisfies every term."""
    return all(_passes(term, row.get(term.column)) for term in terms)


def view_row(view: Table, base_row: dict | None) -> tuple[tuple, dict] | None:
    """The (view key, view column values) a live base row maps to, or None if it has no view row."""
    if base_row is None or not matches(view.view.where, base_row):
        return None
    key = tuple(base_row.get(c) for c in view.primary_key)
    if any(v is None for v in key):
        return None
    return key, {c.name: base_row.get(c.name) for c in view.columns}


def _canonical(value: object) -> object:
    """A stand-in equal for equal stored values: every NaN is the same value here."""
    if isinstance(value, float) and math.isnan(value):
        return _NAN
    return value


_NAN = ("NaN",)


def _same(a: tuple | dict, b: tuple | dict) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_canonical(a[k]) == _canonical(b[k]) for k in a)
    return len(a) == len(b) and all(_canonical(x) == _canonical(y) for x, y in zip(a, b))


def view_changes(view: Table, old_row: dict | None, new_row: dict | None) -> list[ViewChange]:
    """The view writes turning the view row of `old_row` into that of `new_row` (None = no live base row)."""
    old = view_row(view, old_row)
    new = view_row(view, new_row)
    changes = []
    same_key = old is not None and new is not None and _same(old[0], new[0])
    if old is not None and not same_key:
        changes.append(ViewChange(old[0]))
    if new is not None and not (same_key and _same(old[1], new[1])):
        changes.append(ViewChange(new[0], new[1]))
    return changes
