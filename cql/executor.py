"""Runs one statement: check its size, parse (cached) or take it prepared, bind it, hand it to its handler."""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

from common.injection import Injections
from common.metrics import NodeMetrics
from coordinator.core.auth import Principal
from coordinator.core.errors import InvalidArgument
from coordinator.core.schema import Table
from replica.read_path import ReadCoordinator
from replica.write_path import TableDropped, WriteCoordinator

from . import BindError, ast, bind, parse
from .binding import UNSET
from .authorization import StatementAuthorization
from .catalog import Catalog, Group0Client, keyspace_of
from .columnar import ArrowValues, NotColumnar
from .ddl import SchemaAgreement, SchemaStatements
from .describe import describe
from .dml import WRITES, WriteStatements
from .keyspaces import SYSTEM_KEYSPACES, in_keyspace
from .limits import Limits
from .prepared import UNPREPARED, Prepared, PreparedCache, Unprepared, changed_table, prepare
from .result import Result
from .roles import ROLE_STATEMENTS, RoleStatements
from .select import SelectStatements


class Executor:
    """Turns statement text (or a prepared statement) into effects on the cluster."""

    def __init__(self, group0: Group0Client, writer: WriteCoordinator, reader: ReadCoordinator,
                 now: Callable[[], int], injections: Injections, metrics: NodeMetrics, limits: Limits | None = None,
                 schema_agreement: SchemaAgreement | None = None, cluster_name: str = "vbc"):
        self.cluster_name = cluster_name
        self._catalog = Catalog(group0)
        self._schema = SchemaStatements(group0, injections, schema_agreement)
        self._writes = WriteStatements(self._catalog, writer, now)
        self._selects = SelectStatements(self._catalog, reader)
        self._roles = RoleStatements(group0)
        self._authorization = StatementAuthorization(self._catalog)
        self._metrics = metrics
        self.limits = limits or Limits()
        self._prepared = PreparedCache()

    def prepare(self, text: str, keyspace: str | None = None) -> Prepared:
        """Parse and resolve `text` once (names without a keyspace in `keyspace`); its id and bind columns
        (INVALID_ARGUMENT/NOT_FOUND as executing it)."""
        statement = self.parsed(text, keyspace)
        if isinstance(statement, ROLE_STATEMENTS + (ast.Use, ast.Describe)):
            raise InvalidArgument(f"{type(statement).__name__} cannot be prepared: run it as a plain statement")
        prepared = prepare(text, statement, self._resolve, keyspace)
        self._prepared.add(prepared)
        return prepared

    def execute(self, text: str, params: list[list] | ArrowValues | None = None, prepared_id: str = "",
                page_size: int | None = None, paging_state: bytes = b"", deadline: float | None = None, *,
                principal: Principal, keyspace: str | None = None, timestamp: int | None = None) -> Result:
        """`answer`, with a SELECT's rows as lists in `rows` too."""
        return _with_rows(self.answer(text, params, prepared_id, page_size, paging_state, deadline,
                                      principal=principal, keyspace=keyspace, timestamp=timestamp))

    def answer(self, text: str, params: list[list] | ArrowValues | None = None, prepared_id: str = "",
               page_size: int | None = None, paging_state: bytes = b"", deadline: float | None = None, *,
               principal: Principal, keyspace: str | None = None, timestamp: int | None = None) -> Result:
        """One Result: a SELECT's every row (without `page_size`), or its page from `paging_state` on."""
        pages = self.execute_pages(text, page_size, params, prepared_id, paging_state, deadline, principal=principal,
                                   keyspace=keyspace, timestamp=timestamp)
        try:
            return next(pages)
        finally:
            pages.close()

    def execute_pages(self, text: str, page_size: int | None, params: list[list] | ArrowValues | None = None,
                      prepared_id: str = "", paging_state: bytes = b"",
                      deadline: float | None = None, *, principal: Principal, keyspace: str | None = None,
                      timestamp: int | None = None) -> Iterator[Result]:
        """Run `text`, or the prepared statement `prepared_id` (then `text` is not looked at), once per value set,
        if `principal` holds the permissions it needs (the caller's, resolved once per call: no default).

        Value sets given as Arrow columns (their sizes checked by the caller) feed a prepared INSERT as one
        columnar write; everything else gets them as rows. A SELECT answers pages of `page_size` rows from
        `paging_state` on; `deadline` (time.monotonic) bounds its reads. Names without a keyspace are in
        `keyspace` (a CQL connection's, set by USE); a write without USING TIMESTAMP is at `timestamp` (a CQL
        client's default timestamp, microseconds) when given, else at this node's clock."""
        arrow = params if isinstance(params, ArrowValues) else None
        statement = self._statement(text, None if arrow else params, prepared_id, keyspace)
        kind = type(statement).__name__
        self._metrics.statements.labels(kind).inc()
        self._authorization.check(principal, statement)
        with self._metrics.statement_seconds.labels(kind).time():
            if isinstance(statement, ROLE_STATEMENTS):
                if params:
                    raise InvalidArgument(f"{kind} takes no bind values")
                yield self._roles.run(principal, statement)
                return
            if isinstance(statement, WRITES):
                yield self._write(statement, params, prepared_id, timestamp)
                return
            if isinstance(statement, ast.Use):
                yield self._use(statement, params)
                return
            if isinstance(statement, ast.Describe):
                yield self._catalog.read(lambda state: describe(state, statement, keyspace, self.cluster_name))
                return
            statements = _bound(statement, arrow.rows() if arrow else params)
            if len(statements) > 1:
                raise InvalidArgument(f"{kind} takes at most one set of bind values, got {len(statements)}")
            if isinstance(statement, ast.Select):
                yield from self._selects.run(statements[0], page_size, paging_state, deadline)
                return
            yield self._schema.run(statements[0])

    def parsed(self, text: str, keyspace: str | None = None) -> ast.Statement:
        """`text` parsed (after the size limit, before anything else), its bare names put in `keyspace`."""
        self.limits.check_statement(text)
        return in_keyspace(_parsed(text), keyspace)

    def prepared_statement(self, prepared_id: str) -> Prepared:
        """The prepared statement `prepared_id` as this node holds it; Unprepared if it does not (any more)."""
        return self._valid_prepared(prepared_id)

    def batch(self, items: list[tuple[str, str, list]], *, principal: Principal, keyspace: str | None = None,
              timestamp: int | None = None) -> Result:
        """A batch of (text, prepared id, values) writes (CQL's BATCH message) as one write with one timestamp."""
        self.limits.check_rows(len(items), "statements")
        statements = []
        for text, prepared_id, values in items:
            statement = self._statement(text, [values] if values else None, prepared_id, keyspace)
            if not isinstance(statement, (ast.Insert, ast.Update, ast.Delete)):
                raise InvalidArgument(f"a BATCH holds INSERT, UPDATE and DELETE statements only, not "
                                      f"{type(statement).__name__}")
            self._authorization.check(principal, statement)
            statements += _bound(statement, [values] if values else None)
        self._metrics.statements.labels("Batch").inc()
        with self._metrics.statement_seconds.labels("Batch").time():
            return self._writes.run([ast.Batch(tuple(statements), None)], timestamp)

    def _use(self, statement: ast.Use, params) -> Result:
        if params:
            raise InvalidArgument("USE takes no bind values")
        if statement.keyspace not in SYSTEM_KEYSPACES and self._catalog.read(
                lambda state: statement.keyspace not in state.keyspaces):
            self._catalog.catch_up()
            self._catalog.read(lambda state: state.require_keyspace(statement.keyspace))
        return Result(message=f"using keyspace {statement.keyspace}", keyspace=statement.keyspace)

    def _write(self, statement: ast.Statement, params: list[list] | ArrowValues | None, prepared_id: str,
               timestamp: int | None = None) -> Result:
        """Run a write; if a replica had already applied a drop of its table that this node had not, catch up
        and run it once more against the table now under the name (a prepared one is then prepared again). A
        prepared write whose values do not fit its table catches up too before saying so: a table re-created
        with other column types, committed but not yet applied here, makes it unprepared instead."""
        try:
            return self._write_once(statement, params, timestamp)
        except TableDropped:
            self._catalog.catch_up()
            if prepared_id:
                self._valid_prepared(prepared_id)
            return self._write_once(statement, params, timestamp)
        except InvalidArgument:
            if prepared_id:  # values that do not fit may be meant for a re-created table this node has not seen yet
                self._catalog.catch_up()
                self._valid_prepared(prepared_id)
            raise

    def _write_once(self, statement: ast.Statement, params: list[list] | ArrowValues | None,
                    timestamp: int | None) -> Result:
        if isinstance(params, ArrowValues):
            if isinstance(statement, ast.Insert):
                try:
                    return self._writes.run_insert_columns(statement, params.columns, staged=params.staged,
                                                           timestamp=timestamp)
                except NotColumnar:
                    pass
            params = params.rows()
        if isinstance(statement, ast.Insert) and params and not any(v is UNSET for row in params for v in row):
            return self._writes.run_insert_values(statement, params, timestamp)
        return self._writes.run(_bound(statement, params), timestamp)

    def _statement(self, text: str, params: list[list] | None, prepared_id: str,
                   keyspace: str | None = None) -> ast.Statement:
        """The parsed statement, after the size limits (checked before any parsing)."""
        self.limits.check_rows(len(params or ()))
        self.limits.check_values(params or ())
        if prepared_id:
            statement = self._valid_prepared(prepared_id).statement
        else:
            statement = self.parsed(text, keyspace)
        if isinstance(statement, ast.Batch):
            self.limits.check_rows(len(statement.statements) * max(1, len(params or ())), "statements")
        return statement

    def _valid_prepared(self, prepared_id: str) -> Prepared:
        prepared = self._prepared.get(prepared_id)
        reason = changed_table(prepared, self._find)
        if reason is not None:
            self._prepared.evict(prepared_id)
            raise Unprepared(f"{UNPREPARED} {prepared_id}: {reason} since it was prepared; prepare it again")
        return prepared

    def _resolve(self, statement) -> Table:
        if isinstance(statement, ast.Select):
            return self._catalog.resolve(statement.table)
        return self._catalog.writable(statement.table)

    def _find(self, name: ast.QualifiedName) -> Table | None:
        keyspace = keyspace_of(name)
        return self._catalog.read(lambda s: s.find_table(keyspace, name.name))


def _with_rows(result: Result) -> Result:
    if result.arrow is not None and not result.rows:
        result.rows = result.row_values()
    return result


CACHED_TEXT = 16 * 1024  # statement texts up to this size keep their parse (a cache of large ones would pin memory)


def _parsed(text: str) -> ast.Statement:
    return _parse_cached(text) if len(text) <= CACHED_TEXT else parse(text)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> ast.Statement:
    return parse(text)


def _bound(statement: ast.Statement, params: list[list] | None) -> list:
    """The statement once per bind-value set (once, with no values, when none are given)."""
    try:
        return [bind(statement, values) for values in (params or [[]])]
    except BindError as error:
        raise InvalidArgument(str(error)) from None
