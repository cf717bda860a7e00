"""The store's result types, its SQL column types, and the checks and conversions of the values it stores."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import sqlalchemy as sa

from .cells import Cell, ColumnSpec, Row

Derive = Callable[[Sequence[tuple[Row | None, Row]]], Sequence[tuple[str, bytes]]]
DeriveStates = Callable[[pa.Table, pa.Table], Sequence[tuple[str, bytes]]]

MAX_IDENTIFIER_BYTES = 63  # PostgreSQL truncates longer identifiers
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_NAN_KEY = object()  # stands for any NaN key component in dictionary lookups (NaN != NaN)


class StoreClosed(RuntimeError):
    """A write reached a store after its `close`."""


@dataclass(frozen=True)
class Checkpoint:
    """What one background checkpoint found: the frames in the WAL, how many of them the database file now holds,
    and whether another checkpoint (the writer's own, or a bulk merge's) held the checkpoint lock meanwhile."""

    wal_frames: int
    checkpointed: int
    busy: bool


@dataclass(frozen=True)
class OutboxEntry:
    """One queued outbox entry: its id (ascending in queue order), the node it goes to and what it carries."""

    id: int
    target: str
    payload: bytes


@dataclass(frozen=True)
class ApplyResult:
    """What a write did: how many rows it changed, and the ids of the outbox entries it queued with them."""

    changed: int
    outbox_ids: tuple[int, ...]


class _SqliteReal(sa.types.UserDefinedType):
    """SQLite REAL without SQLAlchemy's float conversion of bound values (which would undo Float64's 'NaN')."""

    cache_ok = True

    def get_col_spec(self, **kw) -> str:
        return "REAL"


class Float64(sa.types.TypeDecorator):
    """A double that round-trips NaN on SQLite too (SQLite turns a NaN REAL into NULL; 'NaN' text sorts last)."""

    impl = sa.Double
    cache_ok = True

    def load_dialect_impl(self, dialect):
        return dialect.type_descriptor(_SqliteReal() if dialect.name == "sqlite" else sa.Double())

    def process_bind_param(self, value, dialect):
        if dialect.name == "sqlite" and isinstance(value, float) and math.isnan(value):
            return "NaN"
        return value

    def process_result_value(self, value, dialect):
        return None if value is None else float(value)


def sql_type(column_type: str, is_key: bool) -> sa.types.TypeEngine:
    if column_type == "double":
        return Float64()
    if column_type == "boolean":
        return sa.Boolean()
    if column_type == "text":
        # Key order must be code-point order on every backend; SQLite's default BINARY collation already is.
        return sa.Text().with_variant(sa.Text(collation="C"), "postgresql") if is_key else sa.Text()
    return sa.BigInteger()



def check_identifier(name: str) -> None:
    if len(name.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
        raise ValueError(f"column name too long for the database: {name!r}")


def check_token(token: int) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or not INT64_MIN <= token <= INT64_MAX:
        raise ValueError(f"token must be a signed 64-bit integer, got {token!r}")
    return token


def _is_int32(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and INT32_MIN <= value <= INT32_MAX


def _is_int64(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_ACCEPTS = {
    "int": _is_int32,  # CQL's int is 32 bits, as in every Arrow layout (storage.arrow_layouts)
    "bigint": _is_int64,
    "timestamp": _is_int64,
    "double": _is_number,
    "boolean": lambda value: isinstance(value, bool),
    "text": lambda value: isinstance(value, str),
}


def coerce_value(column: ColumnSpec, value: object) -> object:
    """Check a value against its column type; ints are accepted for doubles. None stays None."""
    if value is None:
        return None
    if not _ACCEPTS[column.type](value):
        raise TypeError(f"column {column.name!r} ({column.type}) cannot hold {value!r}")
    return float(value) if column.type == "double" else value


def bindable(value: object, nan: str | None) -> object:
    if nan is not None and isinstance(value, float) and value != value:
        return nan
    return value


def negative_zero(cell: Cell | None) -> bool:
    value = None if cell is None else cell.value
    return isinstance(value, float) and value == 0.0 and math.copysign(1.0, value) < 0


def lookup_key(token: int, key: tuple) -> tuple:
    return (token, tuple(_NAN_KEY if isinstance(v, float) and math.isnan(v) else v for v in key))
