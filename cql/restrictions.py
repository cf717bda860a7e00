"""SELECT's WHERE clause as CQL reads it: partition reads, index lookups, filtering, and what needs ALLOW FILTERING.

`plan_select` checks a SELECT's relations against the rules of Cassandra and ScyllaDB (with their messages) and
says how to run it: read the partitions '='/IN name, look rows up in an index serving an '=' restriction, or
scan; which relations the rows still have to be checked against; and whether that is filtering, which a
statement must ask for with ALLOW FILTERING. Pure: the caller reads the schema and runs the plan.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.core.errors import InvalidArgument
from coordinator.core.schema import Filter, Table

from . import ast
from .catalog import coerce, require_column

if TYPE_CHECKING:
    from coordinator.core.state import Group0State

FILTERING_REFUSAL = ("Cannot execute this query as it might involve data filtering and thus may have unpredictable "
                     "performance. If you want to execute this query despite the performance unpredictability, "
                     "use ALLOW FILTERING")
PARTITION_RANGE_REFUSAL = ("Only EQ and IN relation are supported on the partition key (unless you use the token() "
                           "function or allow filtering)")
EQUALITY_OPS = ("=", "IN")  # the relations that name key values (the others are ranges)
LOWER_BOUNDS = (">", ">=")
UPPER_BOUNDS = ("<", "<=")


@dataclass(frozen=True)
class IndexLookup:
    """Rows found through an index: the base rows whose `column` equals `value`."""

    index: Table  # the index's backing view (`view.is_index`)
    column: str  # the indexed base column
    value: object  # the value of the '=' restriction, of the column's type


@dataclass(frozen=True)
class SelectPlan:
    """How a SELECT runs.

    Rows come from `partitions` when set, else from `index` when set, else from a scan of the whole table; every
    one of them must then satisfy `residual` (the relations that lookup does not answer by itself). `filtering`
    says whether rows may be read and dropped beyond a key range: a scan with relations, relations on
    non-primary-key columns, clustering relations that do not make a prefix, or relations an index lookup leaves.
    """

    filters: tuple[Filter, ...]  # every relation (rows satisfy all)
    partitions: list[tuple] | None  # partition key values, when '='/IN restrict every partition key column
    index: IndexLookup | None  # an index serving an '=' restriction (only when partitions is None)
    filtering: bool
    residual: tuple[Filter, ...]


def indexes_of(state: Group0State, table: Table) -> dict[str, Table]:
    """The indexes of `table` by indexed column (an index is keyed by its column); the first by name of several on
    one column. Indexes being built are included: reading one is for the caller to allow or refuse."""
    indexes: dict[str, Table] = {}
    for index in sorted(state.views_of(table.id), key=lambda view: view.name):
        if index.view.is_index:
            indexes.setdefault(index.partition_key[0], index)
    return indexes


def plan_select(table: Table, relations: tuple[ast.Relation, ...], indexes: Mapping[str, Table],
                allow_filtering: bool) -> SelectPlan:
    """The plan of a SELECT on `table` with WHERE `relations` (bound values); INVALID_ARGUMENT with CQL's message
    for relations CQL refuses, and for filtering without `allow_filtering`."""
    _check_relations(table, relations)
    filters = tuple(to_filter(table, relation) for relation in relations)
    partitions = partition_restrictions(table, filters)
    served = _served_by_index(filters, indexes)
    if not allow_filtering:
        _check_without_filtering(table, filters, partitions, served)
    if partitions is not None:
        residual = tuple(f for f in filters if f.column not in table.partition_key)
        return SelectPlan(filters, partitions, None, _filters_partition(table, filters), residual)
    if served is not None:
        residual = tuple(f for f in filters if f is not served)
        lookup = IndexLookup(indexes[served.column], served.column, served.value)
        return SelectPlan(filters, None, lookup, bool(residual), residual)
    return SelectPlan(filters, None, None, bool(filters), filters)


def to_filter(table: Table, relation: ast.Relation) -> Filter:
    """A relation as a Filter, its values converted to the column's type (INVALID_ARGUMENT if they cannot be)."""
    if relation.op == "IS NOT NULL":
        require_column(table, relation.column)
        return Filter(relation.column, relation.op, None)
    if relation.op == "IN":
        return Filter(relation.column, "IN", tuple(coerce(table, relation.column, v) for v in relation.value))
    return Filter(relation.column, relation.op, coerce(table, relation.column, relation.value))


def partition_restrictions(table: Table, filters: tuple[Filter, ...]) -> list[tuple] | None:
    """The partition keys a query is limited to by '='/IN on every partition key column, or None."""
    choices = []
    for column in table.partition_key:
        term = next((f for f in filters if f.column == column and f.op in EQUALITY_OPS), None)
        if term is None:
            return None
        options = term.value if term.op == "IN" else (term.value,)
        if any(v is None for v in options):
            raise InvalidArgument(f"partition key column {column!r} cannot be compared with null")
        choices.append(options)
    keys = [()]
    for options in choices:
        keys = [k + (v,) for k in keys for v in dict.fromkeys(options)]
    return keys


# -------------------------------------------------------------------- relations


def _check_relations(table: Table, relations: tuple[ast.Relation, ...]) -> None:
    """Refuse unknown columns, relations a SELECT cannot have, nulls, and a column restricted in ways that clash."""
    for relation in relations:
        require_column(table, relation.column)
        _check_operator(relation)
    for column in dict.fromkeys(r.column for r in relations):
        _check_combination(column, [r.op for r in relations if r.column == column])


def _check_operator(relation: ast.Relation) -> None:
    if relation.op == "IS NOT NULL":
        raise InvalidArgument(f"Unsupported restriction: {relation.column} IS NOT NULL")
    if relation.op == "!=":
        raise InvalidArgument(f'Unsupported "!=" relation: {relation.column} != {_literal(relation.value)}')
    values = relation.value if relation.op == "IN" else (relation.value,)
    if any(v is None for v in values):
        raise InvalidArgument(f"Invalid null value in condition for column {relation.column}")


def _check_combination(column: str, ops: list[str]) -> None:
    if len(ops) < 2:
        return
    if "=" in ops:
        raise InvalidArgument(f"{column} cannot be restricted by more than one relation if it includes an Equal")
    if "IN" in ops:
        raise InvalidArgument(f"{column} cannot be restricted by more than one relation if it includes a IN")
    if sum(op in LOWER_BOUNDS for op in ops) > 1:
        raise InvalidArgument(f"More than one restriction was found for the start bound on {column}")
    if sum(op in UPPER_BOUNDS for op in ops) > 1:
        raise InvalidArgument(f"More than one restriction was found for the end bound on {column}")


def _literal(value: object) -> str:
    """A value as CQL text, for messages."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, ast.BindMarker):
        return "?"
    return "null" if value is None else str(value)


# -------------------------------------------------------------------- ALLOW FILTERING


def _served_by_index(filters: tuple[Filter, ...], indexes: Mapping[str, Table]) -> Filter | None:
    """The first '=' restriction (in WHERE order) on an indexed column."""
    return next((f for f in filters if f.op == "=" and f.column in indexes), None)


def _check_without_filtering(table: Table, filters: tuple[Filter, ...], partitions: list[tuple] | None,
                             served: Filter | None) -> None:
    """Refuse, as CQL does without ALLOW FILTERING: a range on the partition key, clustering relations that are
    not a prefix (unless an index serves an '=' restriction), and any filtering an index does not spare."""
    if any(f.column in table.partition_key and f.op not in EQUALITY_OPS for f in filters):
        raise InvalidArgument(PARTITION_RANGE_REFUSAL)
    if served is None:
        _check_clustering_prefix(table, filters)
    if _needs_allow_filtering(table, filters, partitions, served):
        raise InvalidArgument(FILTERING_REFUSAL)


def _needs_allow_filtering(table: Table, filters: tuple[Filter, ...], partitions: list[tuple] | None,
                           served: Filter | None) -> bool:
    """Whether rows would be filtered in a way CQL runs only with ALLOW FILTERING. Within the partitions read,
    one '=' on an indexed column needs no ALLOW FILTERING (CQL would look it up in the index)."""
    if partitions is None:
        return any(f is not served for f in filters)
    if _clustering_prefix_break(table, filters) is not None:
        return True
    regular = [f for f in filters if f.column not in table.primary_key]
    return bool(regular) and regular != [served]


def _filters_partition(table: Table, filters: tuple[Filter, ...]) -> bool:
    """Whether reading whole partitions drops rows beyond a clustering range."""
    regular = any(f.column not in table.primary_key for f in filters)
    return regular or _clustering_prefix_break(table, filters) is not None


def _check_clustering_prefix(table: Table, filters: tuple[Filter, ...]) -> None:
    broken = _clustering_prefix_break(table, filters)
    if broken is None:
        return
    column, preceding, preceding_restricted = broken
    if preceding_restricted:
        raise InvalidArgument(f'Clustering column "{column}" cannot be restricted (preceding column "{preceding}" '
                              "is restricted by a non-EQ relation)")
    raise InvalidArgument(f'PRIMARY KEY column "{column}" cannot be restricted as preceding column "{preceding}" '
                          "is not restricted")


def _clustering_prefix_break(table: Table, filters: tuple[Filter, ...]) -> tuple[str, str, bool] | None:
    """The first restricted clustering column not in a key range: (column, the preceding column that ends the
    range, whether that one is restricted by a range rather than not at all), or None."""
    end: tuple[str, bool] | None = None
    for column in table.clustering_key:
        ops = [f.op for f in filters if f.column == column]
        if ops and end is not None:
            return column, *end
        if end is None and not ops:
            end = (column, False)
        elif end is None and any(op not in EQUALITY_OPS for op in ops):
            end = (column, True)
    return None
