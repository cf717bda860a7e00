"""The stored form of one outbox entry: a view-update RowBatch as versioned JSON (see docs/outbox.md).

Version 2 (written for a batch of rows), version 3 (written for a batch of Arrow columns, as an IPC stream in
base64) and version 4 (a view building batch's view rows, as columns in the same way) are ASCII JSON objects; version 1 (written before) is a serialized protobuf `vbc.v1.MutationBatch`. A
payload that does not start with `{` is version 1 and is read by the decoder the node passes in
(`read_version_1`), so this package stays free of protobuf.
"""
from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Callable

from common.arrow_stream import ipc_pieces, table_from_pieces
from common.replica_messages import RowBatch
from storage.cells import Cell, Row

FORMAT_VERSION = 2
COLUMNS_FORMAT_VERSION = 3
VIEW_ROWS_FORMAT_VERSION = 4
_COLUMN_VERSIONS = (COLUMNS_FORMAT_VERSION, VIEW_ROWS_FORMAT_VERSION)
_DOUBLE = "double"
_BLOB = "blob"


class UnreadablePayload(ValueError):
    """An outbox payload in a format or version this node cannot read."""


def encode_payload(batch: RowBatch) -> bytes:
    document = {
        "version": _version_of(batch),
        "table_id": batch.table_id,
        "shard": batch.shard,
        "schema_version": batch.schema_version,
        "timestamp": batch.timestamp,
    }
    if batch.columns is None:
        document["rows"] = [_encode_row(row) for row in batch.rows]
    else:
        document["columns"] = base64.b64encode(b"".join(ipc_pieces(batch.columns))).decode("ascii")
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode("ascii")


def _version_of(batch: RowBatch) -> int:
    if batch.columns is None:
        return FORMAT_VERSION
    return VIEW_ROWS_FORMAT_VERSION if batch.view_rows else COLUMNS_FORMAT_VERSION


def decode_payload(payload: bytes, read_version_1: Callable[[bytes], RowBatch] | None = None) -> RowBatch:
    """The RowBatch stored in `payload`, whatever version wrote it (raises UnreadablePayload otherwise)."""
    if payload.lstrip()[:1] != b"{":
        if read_version_1 is None:
            raise UnreadablePayload("outbox payload of format version 1 (protobuf) and no version 1 reader given")
        return read_version_1(payload)
    document = json.loads(payload)
    version = document.get("version")
    if version not in (FORMAT_VERSION, *_COLUMN_VERSIONS):
        raise UnreadablePayload(f"outbox payload of format version {version!r}; this node reads 1 to 4")
    rows, columns = (), None
    if version == FORMAT_VERSION:
        rows = tuple(_decode_row(row) for row in document["rows"])
    else:
        columns = _decode_columns(document["columns"], version)
    return RowBatch(table_id=document["table_id"], shard=document["shard"], rows=rows,
                    schema_version=document["schema_version"], timestamp=document.get("timestamp", 0),
                    columns=columns, view_rows=version == VIEW_ROWS_FORMAT_VERSION)


def _decode_columns(encoded: str, version: int):
    try:
        return table_from_pieces([base64.b64decode(encoded, validate=True)])
    except (ValueError, binascii.Error) as error:
        raise UnreadablePayload(f"outbox payload of format version {version} with unreadable columns: {error}"
                                ) from None


def _encode_row(row: Row) -> dict:
    return {
        "token": row.token,
        "key": [encode_value(v) for v in row.key],
        "marker_ts": row.marker_ts,
        "tomb_ts": row.tomb_ts,
        "cells": {name: [encode_value(cell.value), cell.ts] for name, cell in row.cells.items()},
    }


def _decode_row(document: dict) -> Row:
    cells = {name: Cell(decode_value(value), ts) for name, (value, ts) in document["cells"].items()}
    return Row(token=document["token"], key=tuple(decode_value(v) for v in document["key"]),
               marker_ts=document["marker_ts"], tomb_ts=document["tomb_ts"], cells=cells)


def encode_value(value: object) -> object:
    """A cell or key value as JSON: null, booleans, integers and text as themselves, doubles and blobs tagged."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {_DOUBLE: struct.pack(">d", value).hex()}
    if isinstance(value, bytes):
        return {_BLOB: base64.b64encode(value).decode("ascii")}
    raise TypeError(f"cannot store {value!r} ({type(value).__name__}) in an outbox payload")


def decode_value(encoded: object) -> object:
    if not isinstance(encoded, dict):
        return encoded
    if _DOUBLE in encoded:
        return struct.unpack(">d", bytes.fromhex(encoded[_DOUBLE]))[0]
    if _BLOB in encoded:
        return base64.b64decode(encoded[_BLOB])
    raise UnreadablePayload(f"unknown tagged value {encoded!r} in an outbox payload")
