"""CQL native protocol requests run through the node's executor: values typed by their prepared statement, results
and errors written as the protocol's frames."""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.core import errors
from coordinator.core.auth import Principal
from coordinator.core.state import Group0State
from cql import ast, native_protocol as native, system_tables
from cql.binding import UNSET
from cql.executor import Executor
from cql.native_connection import Run
from cql.parser import CqlSyntaxError
from cql.prepared import UNPREPARED, Prepared, Unprepared
from cql.result import Result

log = logging.getLogger(__name__)

ANY, ONE, ALL, SERIAL, LOCAL_SERIAL = 0x0000, 0x0001, 0x0005, 0x0008, 0x0009
DDL = (ast.CreateKeyspace, ast.AlterKeyspace, ast.DropKeyspace, ast.CreateTable, ast.AlterTable, ast.DropTable,
       ast.CreateView, ast.DropView, ast.CreateIndex, ast.DropIndex)
WRITES = (ast.Insert, ast.Update, ast.Delete, ast.Batch)


class Session:
    """One connection's state beyond the protocol's: the keyspace USE chose."""

    def __init__(self) -> None:
        self.keyspace: str | None = None


@dataclass(frozen=True)
class NativeDeps:
    executor: Executor
    read_state: Callable[[Callable[[Group0State], object]], object]
    asker: system_tables.Asker
    still_allowed: Callable[[Principal], None] = lambda principal: None
    failed: Callable[[str], None] = lambda code: None  # a statement failed: its gRPC status code's name, for metrics


class NativeStatements:
    """Answers a connection's QUERY, PREPARE, EXECUTE and BATCH requests (a `Run`) with one response frame."""

    def __init__(self, deps: NativeDeps):
        self._deps = deps
        self._executor = deps.executor

    def answer(self, run: Run, session: Session) -> bytes:
        statement = None
        try:
            self._deps.still_allowed(run.principal)
            request = run.request
            if isinstance(request, native.Prepare):
                return self._prepare(run.stream, request, session)
            if isinstance(request, native.Batch):
                statement = ast.Batch((), None)  # for its errors: a write
                _check_consistency(request.consistency)
                self._executor.batch(self._batch_items(request, session), principal=run.principal,
                                     keyspace=session.keyspace, timestamp=request.timestamp)
                return native.void(run.stream)
            statement, result = self._run(request, run.principal, session)
            return self._result_frame(run.stream, statement, result, session)
        except Exception as error:  # every failure is the client's answer; the connection goes on
            self._deps.failed(getattr(error, "code", "INTERNAL"))
            return error_frame(run.stream, error, statement)

    def _run(self, request, principal: Principal, session: Session) -> tuple[ast.Statement, Result]:
        params = request.parameters
        _check_consistency(params.consistency)
        if isinstance(request, native.Execute):
            prepared = self._executor.prepared_statement(request.statement_id.hex())
            statement, text, prepared_id = prepared.statement, prepared.text, prepared.id
        else:
            statement, text, prepared_id = self._executor.parsed(request.query, session.keyspace), request.query, ""
            if isinstance(statement, ast.Select) and system_tables.is_system(statement.table):
                return statement, self._system_select(statement, params)
            prepared = self._executor.prepare(text, session.keyspace) if params.values else None
        values = _typed_values(prepared, params) if params.values else None
        result = self._executor.answer(text, [values] if values is not None else None, prepared_id,
                                       params.page_size if params.page_size and params.page_size > 0 else None,
                                       params.paging_state or b"", principal=principal, keyspace=session.keyspace,
                                       timestamp=params.timestamp)
        return statement, result

    def _system_select(self, statement: ast.Select, params: native.QueryParameters) -> Result:
        if params.values:
            raise errors.InvalidArgument("system tables take no bind values")
        return self._deps.read_state(lambda state: system_tables.select(state, self._deps.asker, statement))

    def _prepare(self, stream: int, request: native.Prepare, session: Session) -> bytes:
        prepared = self._executor.prepare(request.query, session.keyspace)
        table = prepared.tables[0][1] if prepared.tables else None
        keyspace, name = (table.keyspace, table.name) if table is not None else (session.keyspace or "", "")
        bound = tuple(native.Column(keyspace, name, c.name, c.type if c.type in native.TYPE_IDS else "blob")
                      for c in prepared.bind_columns)
        return native.prepared(stream, bytes.fromhex(prepared.id), bound, _pk_indexes(prepared), ())

    def _batch_items(self, request: native.Batch, session: Session) -> list[tuple[str, str, list]]:
        items = []
        for inner in request.statements:
            if inner.statement_id is not None:
                prepared = self._executor.prepared_statement(inner.statement_id.hex())
                items.append(("", prepared.id, _decoded(prepared, inner.values)))
            else:
                prepared = self._executor.prepare(inner.query, session.keyspace) if inner.values else None
                items.append((inner.query, "", _decoded(prepared, inner.values) if inner.values else []))
        return items

    def _result_frame(self, stream: int, statement: ast.Statement, result: Result, session: Session) -> bytes:
        if result.keyspace:
            session.keyspace = result.keyspace
            return native.set_keyspace(stream, result.keyspace)
        if isinstance(statement, DDL):
            return native.schema_change(stream, *schema_change_of(statement))
        if not result.columns:
            return native.void(stream)
        keyspace, table = _result_table(statement)
        columns = tuple(native.Column(keyspace, table, name, kind) for name, kind in result.columns)
        if result.arrow is not None and not result.rows:
            return native.rows_from_arrow(stream, columns, result.arrow, result.paging_state or None)
        return native.rows(stream, native.Rows(columns, [tuple(row) for row in result.row_values()],
                                               result.paging_state or None))


def _check_consistency(consistency: int) -> None:
    """Every write reaches every replica before it is acknowledged and a read asks one replica: each consistency
    level is met or exceeded, but the serial ones (lightweight transactions) are not served."""
    if consistency in (SERIAL, LOCAL_SERIAL):
        raise errors.InvalidArgument("SERIAL and LOCAL_SERIAL consistency need lightweight transactions, which this "
                                     "cluster does not serve; use ONE, QUORUM or ALL (writes reach every replica)")


def _typed_values(prepared: Prepared, params: native.QueryParameters) -> list:
    if params.names is not None:
        by_name = dict(zip(params.names, params.values))
        missing = [c.name for c in prepared.bind_columns if c.name not in by_name]
        if missing:
            raise errors.InvalidArgument(f"no value given for {', '.join(missing)}")
        return _decoded(prepared, tuple(by_name[c.name] for c in prepared.bind_columns))
    return _decoded(prepared, params.values)


def _decoded(prepared: Prepared, values: tuple) -> list:
    columns = prepared.bind_columns
    if len(values) != len(columns):
        raise errors.InvalidArgument(f"the statement has {len(columns)} bind marker(s) (?) but {len(values)} value(s) "
                                     "were given")
    decoded = []
    for column, value in zip(columns, values):
        if value is native.UNSET:
            decoded.append(UNSET)
            continue
        try:
            decoded.append(native.decode_value(column.type, value))
        except (native.ProtocolError, KeyError) as error:
            raise errors.InvalidArgument(f"the value for {column.name} ({column.type}) cannot be read: {error}") \
                from None
    return decoded


def _pk_indexes(prepared: Prepared) -> tuple[int, ...]:
    """The bind positions of the partition key's columns, in key order, when every one is bound exactly once."""
    if len(prepared.tables) != 1 or isinstance(prepared.statement, ast.Batch):
        return ()
    table = prepared.tables[0][1]
    names = [c.name for c in prepared.bind_columns]
    if any(names.count(column) != 1 for column in table.partition_key):
        return ()
    return tuple(names.index(column) for column in table.partition_key)


def _result_table(statement: ast.Statement | None) -> tuple[str, str]:
    name = getattr(statement, "table", None)
    if isinstance(name, ast.QualifiedName):
        return name.keyspace or "", name.name
    return "system_auth", "roles"


def schema_change_of(statement: ast.Statement) -> tuple[str, str, str] | tuple[str, str, str, str]:
    """(change, target, keyspace[, name]) of a schema statement's Schema_change result."""
    if isinstance(statement, (ast.CreateKeyspace, ast.AlterKeyspace, ast.DropKeyspace)):
        change = {ast.CreateKeyspace: "CREATED", ast.AlterKeyspace: "UPDATED"}.get(type(statement), "DROPPED")
        return change, "KEYSPACE", statement.name
    if isinstance(statement, ast.CreateIndex):
        return "UPDATED", "TABLE", statement.table.keyspace, statement.table.name
    if isinstance(statement, ast.DropIndex):
        return "UPDATED", "KEYSPACE", statement.index.keyspace
    name = statement.view if isinstance(statement, (ast.CreateView, ast.DropView)) else statement.table
    change = "CREATED" if type(statement).__name__.startswith("Create") else (
        "DROPPED" if type(statement).__name__.startswith("Drop") else "UPDATED")
    return change, "TABLE", name.keyspace, name.name


def error_frame(stream: int, error: Exception, statement: ast.Statement | None = None) -> bytes:
    """The protocol's ERROR for a failure, with the fields its code carries."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    if isinstance(error, Unprepared):
        found = _UNPREPARED_ID.search(message)
        raw = bytes.fromhex(found.group(1)) if found else b""
        return native.error(stream, native.UNPREPARED, message, native.unprepared_details(raw))
    if isinstance(error, errors.DeadlineExceeded):
        if isinstance(statement, WRITES):
            kind = "BATCH" if isinstance(statement, ast.Batch) else "SIMPLE"
            return native.error(stream, native.WRITE_TIMEOUT, message, native.write_timeout_details(ALL, 0, 1, kind))
        return native.error(stream, native.READ_TIMEOUT, message, native.read_timeout_details(ONE, 0, 1, False))
    if isinstance(error, errors.AlreadyExists) and isinstance(statement, DDL):
        _, _, keyspace, *name = schema_change_of(statement)
        return native.error(stream, native.ALREADY_EXISTS, message,
                            native.already_exists_details(keyspace, name[0] if name else ""))
    if isinstance(error, errors.Unavailable):
        return native.error(stream, native.UNAVAILABLE, message, native.unavailable_details(ALL, 1, 0))
    code = _CODES.get(type(error)) or next((c for cls, c in _CODES.items() if isinstance(error, cls)), None)
    if code is None:
        log.exception("a CQL statement failed on the server side")
        return native.error(stream, native.SERVER_ERROR, f"{type(error).__name__}: {message}")
    return native.error(stream, code, message)


_UNPREPARED_ID = re.compile(UNPREPARED + r" ((?:[0-9a-f]{2})+)\b")
_CODES: dict[type, int] = {
    CqlSyntaxError: native.SYNTAX_ERROR,
    errors.ResourceExhausted: native.OVERLOADED,
    errors.PermissionDenied: native.UNAUTHORIZED,
    errors.Unauthenticated: native.UNAUTHORIZED,
    errors.AlreadyExists: native.INVALID,
    errors.NotFound: native.INVALID,
    errors.FailedPrecondition: native.INVALID,
    errors.InvalidArgument: native.INVALID,
}
