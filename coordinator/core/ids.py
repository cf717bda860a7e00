"""Names and ids inside commands: checking those a proposer chose, and deriving new ids deterministically."""
from __future__ import annotations

import uuid

from .errors import InvalidArgument

MAX_NAME_LENGTH = 48


def derived_id(seed: str, *parts: object) -> str:
    """A deterministic id (32 hex chars) derived from a proposer-chosen seed id and a name."""
    return uuid.uuid5(uuid.UUID(seed), "/".join(map(str, parts))).hex


def check_name(kind: str, name: str) -> str:
    if not name or len(name) > MAX_NAME_LENGTH or not (name[0].isalpha() or name[0] == "_"):
        raise InvalidArgument(f"invalid {kind} name {name!r}: use 1-{MAX_NAME_LENGTH} letters, digits or '_', "
                              f"starting with a letter")
    if not all(ch.isalnum() or ch == "_" for ch in name):
        raise InvalidArgument(f"invalid {kind} name {name!r}: only letters, digits and '_' are allowed")
    return name


def check_id(value: str | None) -> str:
    if not isinstance(value, str) or len(value) != 32 or any(c not in "0123456789abcdef" for c in value):
        raise InvalidArgument(f"invalid id {value!r}: expected 32 lowercase hex characters")
    return value
