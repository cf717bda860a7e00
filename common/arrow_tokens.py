"""Tokens and tablets of whole Arrow columns: the rule of coordinator.core.tokens, vectorized with numpy.

XXH64 of a 4- or 8-byte input is a fixed sequence of 64-bit multiplies, rotations and shifts, so int, bigint,
timestamp, boolean and double components hash as numpy uint64 arithmetic (wrapping like the C code) over the
whole column at once; text components go through the C `xxhash` one value at a time. The seed of each row's
next component is its previous hash, as in `token_of`. Key columns hold no NULLs (callers check that first).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash

from coordinator.core.tokens import SPARK_SEED

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_CANONICAL_NAN = np.uint64(0x7FF8000000000000)
_SIGN = np.uint64(1 << 63)


def _rotl(x: np.ndarray, bits: int) -> np.ndarray:
    return (x << np.uint64(bits)) | (x >> np.uint64(64 - bits))


def _avalanche(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def xxh64_u32(lanes: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """XXH64 of each 4-byte little-endian value (uint64 holding the uint32), seeded per row."""
    h = seeds + _P5 + np.uint64(4)
    h = h ^ (lanes * _P1)
    return _avalanche(_rotl(h, 23) * _P2 + _P3)


def xxh64_u64(lanes: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """XXH64 of each 8-byte little-endian value (as uint64), seeded per row."""
    h = seeds + _P5 + np.uint64(8)
    h = h ^ (_rotl(lanes * _P2, 31) * _P1)
    return _avalanche(_rotl(h, 27) * _P1 + _P4)


def _numbers(column: pa.ChunkedArray | pa.Array, dtype) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=dtype)


def _hash_component(type_name: str, column, seeds: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        if type_name == "int":
            return xxh64_u32(_numbers(column, np.int32).view(np.uint32).astype(np.uint64), seeds)
        if type_name == "boolean":
            return xxh64_u32(_numbers(column, np.bool_).astype(np.uint64), seeds)
        if type_name in ("bigint", "timestamp"):
            return xxh64_u64(_numbers(column, np.int64).view(np.uint64), seeds)
        if type_name == "double":
            values = _numbers(column, np.float64) + 0.0  # -0.0 hashes as 0.0
            bits = values.view(np.uint64).copy()
            bits[np.isnan(values)] = _CANONICAL_NAN
            return xxh64_u64(bits, seeds)
    if type_name == "text":
        digest = xxhash.xxh64_intdigest
        return np.fromiter((digest(text.encode("utf-8"), int(seed)) for text, seed in zip(column.to_pylist(), seeds)),
                           dtype=np.uint64, count=len(seeds))
    raise ValueError(f"no token rule for column type {type_name!r}")


def tokens_of(columns: list, types: tuple[str, ...]) -> np.ndarray:
    """The int64 token of every row whose partition key components are `columns` (of CQL `types`)."""
    rows = len(columns[0])
    h = np.full(rows, SPARK_SEED, dtype=np.uint64)
    for column, type_name in zip(columns, types, strict=True):
        h = _hash_component(type_name, column, h)
    return h.view(np.int64)


def tablets_of(tokens: np.ndarray, tablet_count: int) -> np.ndarray:
    """The tablet owning each token (tablet counts are powers of two, see coordinator.core.tokens)."""
    shift = 64 - (tablet_count.bit_length() - 1)
    if shift == 64:
        return np.zeros(len(tokens), dtype=np.int64)
    offsets = tokens.view(np.uint64) ^ _SIGN  # token - MIN_TOKEN (= -2**63), as unsigned
    return (offsets >> np.uint64(shift)).astype(np.int64)

