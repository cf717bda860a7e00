"""SELECT: resolve, refuse an unbuilt view unless ALLOW STALE, read through the read path, filter, project, page."""
from __future__ import annotations

import itertools
from collections.abc import Iterator

from coordinator.core.errors import FailedPrecondition, InvalidArgument
from coordinator.core.schema import Filter, Table
from coordinator.core.views import matches
from replica.read_path import ReadCoordinator

from . import ast
from .catalog import Catalog, coerce, require_column
from .result import Result, paged


class SelectStatements:
    """Runs SELECT statements; rows stream page by page from the replicas."""

    def __init__(self, catalog: Catalog, reader: ReadCoordinator):
        self._catalog = catalog
        self._reader = reader

    def run(self, s: ast.Select, page_size: int | None) -> Iterator[Result]:
        table = self._catalog.resolve(s.table)
        if table.view is not None and not s.allow_stale:
            self._refuse_unbuilt_view(table)
        columns = _selected_columns(table, s.columns)
        filters = tuple(_filter(table, r) for r in s.where)
        pushed_limit = None if filters or s.count else s.limit
        rows = self._reader.rows(table, partitions=partition_restrictions(table, filters), limit=pushed_limit)
        rows = (r for r in rows if matches(filters, dict(zip((c.name for c in table.columns), r))))
        if s.count:  # LIMIT applies to the single result row, as in Cassandra since 2.2
            yield Result(columns=[("count", "bigint")], rows=[[sum(1 for _ in rows)]])
            return
        positions = [next(i for i, c in enumerate(table.columns) if c.name == name) for name, _ in columns]
        projected = ([row[i] for i in positions] for row in _limited(rows, s.limit))
        yield from paged(columns, projected, page_size)

    def _refuse_unbuilt_view(self, view: Table) -> None:
        progress = self._catalog.read(lambda s: s.view_progress(view.id))
        if not progress["built"]:
            raise FailedPrecondition(
                f"{view.qualified_name} is being built ({progress['tasks_done']} of {progress['tasks_total']} "
                "build tasks done) and cannot be read yet; wait for it (vbc status), or add ALLOW STALE to read "
                "what it holds now"
            )


def _selected_columns(table: Table, names: tuple[str, ...] | None) -> list[tuple[str, str]]:
    if names is None:
        return [(c.name, c.type) for c in table.columns]
    return [(n, require_column(table, n).type) for n in names]


def _filter(table: Table, relation: ast.Relation) -> Filter:
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
        term = next((f for f in filters if f.column == column and f.op in ("=", "IN")), None)
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


def _limited(rows: Iterator, limit: int | None) -> Iterator:
    return itertools.islice(rows, limit) if limit is not None else rows
