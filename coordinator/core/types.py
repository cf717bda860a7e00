"""Column types of the statement language and the checking and conversion of literal values."""
from __future__ import annotations

import datetime
import math

from .errors import InvalidArgument

TYPES = ("int", "bigint", "text", "boolean", "double", "timestamp")

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def check_type_name(type_name: str) -> str:
    if type_name not in TYPES:
        raise InvalidArgument(f"unknown type {type_name!r}; supported types: {', '.join(TYPES)}")
    return type_name


def coerce(type_name: str, value: object, column: str) -> object:
    """Convert a literal to the Python value stored for a column of `type_name`; None stays None."""
    if value is None:
        return None
    converter = _CONVERTERS[type_name]
    return converter(value, column)


def _type_error(column: str, type_name: str, value: object) -> InvalidArgument:
    return InvalidArgument(f"column {column!r} is {type_name}; cannot store {value!r} ({type(value).__name__})")


def _integer(bounds: tuple[int, int], type_name: str):
    def convert(value: object, column: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(column, type_name, value)
        if not bounds[0] <= value <= bounds[1]:
            raise InvalidArgument(f"value {value} is out of range for {type_name} column {column!r} ({bounds[0]}..{bounds[1]})")
        return value

    return convert


def _text(value: object, column: str) -> str:
    if not isinstance(value, str):
        raise _type_error(column, "text", value)
    return value


def _boolean(value: object, column: str) -> bool:
    if not isinstance(value, bool):
        raise _type_error(column, "boolean", value)
    return value


def _double(value: object, column: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(column, "double", value)
    return float(value) + 0.0  # -0.0 is stored as 0.0, so equal keys have one token


def _timestamp(value: object, column: str) -> int:
    """Milliseconds since the Unix epoch, from an integer or an ISO-8601 string (UTC unless an offset is given)."""
    if isinstance(value, str):
        return _parse_iso_timestamp(value, column)
    return _integer(_INT64, "timestamp")(value, column)


def _parse_iso_timestamp(text: str, column: str) -> int:
    try:
        parsed = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(
            f"column {column!r} is timestamp; {text!r} is not an ISO-8601 date/time (e.g. '2024-05-01 12:00:00+0000')"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    return math.floor(parsed.timestamp() * 1000)


_CONVERTERS = {
    "int": _integer(_INT32, "int"),
    "bigint": _integer(_INT64, "bigint"),
    "text": _text,
    "boolean": _boolean,
    "double": _double,
    "timestamp": _timestamp,
}


def sort_key(value: object) -> tuple:
    """A total order over stored values of one type: None first, text by code point, NaN after all floats."""
    if value is None:
        return (0,)
    if isinstance(value, float) and math.isnan(value):
        return (2,)
    return (1, value)
