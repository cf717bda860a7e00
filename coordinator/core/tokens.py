"""The partition-key hash (token) and the mapping between tokens and tablets.

Token of a partition key: encode each component as a 1-byte type tag, a 4-byte big-endian length and
its bytes (int/bigint/timestamp: 8-byte big-endian two's complement; double: 8-byte IEEE-754
big-endian; boolean: 1 byte; text: UTF-8), hash the concatenation with BLAKE2b (8-byte digest), read
the digest as an unsigned big-endian integer and subtract 2**63. Tokens are signed 64-bit integers.

Tablet i of 2**k owns the contiguous token range [MIN_TOKEN + i * 2**(64-k), MIN_TOKEN + (i+1) * 2**(64-k) - 1],
so splitting tablet n gives tablets 2n and 2n+1 of the doubled map, and merging gives n // 2.
"""
from __future__ import annotations

import hashlib
import struct

MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1

_TAGS = {"int": 1, "bigint": 2, "text": 3, "boolean": 4, "double": 5, "timestamp": 6}


def _encode_component(type_name: str, value: object) -> bytes:
    if type_name in ("int", "bigint", "timestamp"):
        payload = struct.pack(">q", value)
    elif type_name == "double":
        payload = struct.pack(">d", value)
    elif type_name == "boolean":
        payload = b"\x01" if value else b"\x00"
    else:
        payload = str(value).encode("utf-8")
    return bytes([_TAGS[type_name]]) + struct.pack(">I", len(payload)) + payload


def token_of(values: tuple, types: tuple[str, ...]) -> int:
    """The token of a partition key given its component values and column types."""
    encoded = b"".join(_encode_component(t, v) for t, v in zip(types, values, strict=True))
    digest = hashlib.blake2b(encoded, digest_size=8).digest()
    return int.from_bytes(digest, "big") + MIN_TOKEN


def is_power_of_two(count: int) -> bool:
    return count >= 1 and count & (count - 1) == 0


def _width(tablet_count: int) -> int:
    return 2**64 // tablet_count


def tablet_range(tablet_id: int, tablet_count: int) -> tuple[int, int]:
    """Inclusive (first_token, last_token) owned by a tablet of a map with `tablet_count` tablets."""
    width = _width(tablet_count)
    first = MIN_TOKEN + tablet_id * width
    return first, first + width - 1


def tablet_of(token: int, tablet_count: int) -> int:
    """The id of the tablet owning `token`."""
    return (token - MIN_TOKEN) // _width(tablet_count)
