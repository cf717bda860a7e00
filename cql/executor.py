"""Runs one statement: parse (cached) and bind it, then hand it to the schema, write or select handler."""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

from common.injection import Injections
from common.metrics import NodeMetrics
from coordinator.core.errors import InvalidArgument
from replica.read_path import ReadCoordinator
from replica.write_path import WriteCoordinator

from . import BindError, ast, bind, parse
from .catalog import Catalog, Group0Client
from .ddl import SchemaStatements
from .dml import WRITES, WriteStatements
from .result import Result
from .select import SelectStatements


class Executor:
    """Turns statement text into effects on the cluster."""

    def __init__(self, group0: Group0Client, writer: WriteCoordinator, reader: ReadCoordinator,
                 now: Callable[[], int], injections: Injections, metrics: NodeMetrics):
        catalog = Catalog(group0)
        self._schema = SchemaStatements(group0, injections)
        self._writes = WriteStatements(catalog, writer, now)
        self._selects = SelectStatements(catalog, reader)
        self._metrics = metrics

    def execute(self, text: str, params: list[list] | None = None) -> Result:
        pages = list(self.execute_pages(text, page_size=None, params=params))
        if len(pages) == 1:
            return pages[0]
        return Result(columns=pages[0].columns, rows=[r for p in pages for r in p.rows])

    def execute_pages(self, text: str, page_size: int | None, params: list[list] | None = None) -> Iterator[Result]:
        statements = _bound(text, params)
        first = statements[0]
        kind = type(first).__name__
        self._metrics.statements.labels(kind).inc()
        with self._metrics.statement_seconds.labels(kind).time():
            if isinstance(first, WRITES):
                yield self._writes.run(statements)
                return
            if len(statements) > 1:
                raise InvalidArgument(f"{kind} takes at most one set of bind values, got {len(statements)}")
            if isinstance(first, ast.Select):
                yield from self._selects.run(first, page_size)
                return
            yield self._schema.run(first)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> ast.Statement:
    return parse(text)


def _bound(text: str, params: list[list] | None) -> list:
    """The statement once per bind-value set (once, with no values, when none are given)."""
    statement = _parse_cached(text)
    try:
        return [bind(statement, values) for values in (params or [[]])]
    except BindError as error:
        raise InvalidArgument(str(error)) from None
