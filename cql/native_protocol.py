"""CQL's native protocol v4 as bytes and values: frames, the notations of the spec, requests read and responses written.

Pure: no sockets, no clock. `native_protocol_v4.spec` (Cassandra) names every piece used here; a frame is a 9-byte
header (version, flags, stream, opcode, body length) and a body. Requests are decoded into small dataclasses,
responses are encoded from values. Compression and the v5 segment layer are not spoken (a client is answered with
ERROR 0x000A for any version but 4).
"""
from __future__ import annotations

import functools
import ipaddress
import struct
import uuid

import numpy as np
import pyarrow as pa
from dataclasses import dataclass, field

VERSION = 4
RESPONSE = 0x80
HEADER = struct.Struct(">BBhBi")
MAX_BODY = 256 * 1024 * 1024  # the spec's bound on a frame's body

# opcodes
ERROR, STARTUP, READY, AUTHENTICATE, OPTIONS, SUPPORTED = 0x00, 0x01, 0x02, 0x03, 0x05, 0x06
QUERY, RESULT, PREPARE, EXECUTE, REGISTER, EVENT, BATCH = 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D
AUTH_CHALLENGE, AUTH_RESPONSE, AUTH_SUCCESS = 0x0E, 0x0F, 0x10

# error codes
SERVER_ERROR, PROTOCOL_ERROR, BAD_CREDENTIALS = 0x0000, 0x000A, 0x0100
UNAVAILABLE, OVERLOADED, WRITE_TIMEOUT, READ_TIMEOUT = 0x1000, 0x1001, 0x1100, 0x1200
SYNTAX_ERROR, UNAUTHORIZED, INVALID, CONFIG_ERROR, ALREADY_EXISTS, UNPREPARED = (
    0x2000, 0x2100, 0x2200, 0x2300, 0x2400, 0x2500)

# query parameter flags
_VALUES, _SKIP_METADATA, _PAGE_SIZE, _PAGING_STATE = 0x01, 0x02, 0x04, 0x08
_SERIAL_CONSISTENCY, _DEFAULT_TIMESTAMP, _NAMES = 0x10, 0x20, 0x40

# result kinds and rows flags
_VOID, _ROWS, _SET_KEYSPACE, _PREPARED, _SCHEMA_CHANGE = 0x0001, 0x0002, 0x0003, 0x0004, 0x0005
_GLOBAL_TABLES_SPEC, _HAS_MORE_PAGES, _NO_METADATA = 0x0001, 0x0002, 0x0004

UNSET = object()  # a bound value the client left unset (v4 [value] of length -2)

# column types ([option] ids) of the types our tables have
TYPE_IDS = {"ascii": 0x0001, "bigint": 0x0002, "blob": 0x0003, "boolean": 0x0004, "double": 0x0007,
            "float": 0x0008, "int": 0x0009, "timestamp": 0x000B, "uuid": 0x000C, "text": 0x000D,
            "varchar": 0x000D, "inet": 0x0010, "smallint": 0x0013, "tinyint": 0x0014}
COLLECTION_IDS = {"list": 0x0020, "map": 0x0021, "set": 0x0022}  # of the system tables' columns


class ProtocolError(Exception):
    """A frame or body that does not follow the protocol: answered with ERROR 0x000A, or the connection closed."""


@dataclass(frozen=True)
class Header:
    version: int
    flags: int
    stream: int
    opcode: int
    length: int


@dataclass(frozen=True)
class QueryParameters:
    consistency: int
    values: tuple = ()
    names: tuple[str, ...] | None = None
    skip_metadata: bool = False
    page_size: int | None = None
    paging_state: bytes | None = None
    serial_consistency: int | None = None
    timestamp: int | None = None


@dataclass(frozen=True)
class Query:
    query: str
    parameters: QueryParameters


@dataclass(frozen=True)
class Prepare:
    query: str


@dataclass(frozen=True)
class Execute:
    statement_id: bytes
    parameters: QueryParameters


@dataclass(frozen=True)
class BatchStatement:
    """One statement of a BATCH: its text, or the id of a prepared one, and its bound values."""

    query: str | None
    statement_id: bytes | None
    values: tuple


@dataclass(frozen=True)
class Batch:
    kind: int  # 0 logged, 1 unlogged, 2 counter
    statements: tuple[BatchStatement, ...]
    consistency: int
    serial_consistency: int | None = None
    timestamp: int | None = None


@dataclass(frozen=True)
class Startup:
    options: dict[str, str]


@dataclass(frozen=True)
class AuthResponse:
    token: bytes | None


@dataclass(frozen=True)
class Options:
    pass


@dataclass(frozen=True)
class Register:
    events: tuple[str, ...]


@dataclass(frozen=True)
class Column:
    keyspace: str
    table: str
    name: str
    type: str


@dataclass(frozen=True)
class Rows:
    columns: tuple[Column, ...]
    rows: list[tuple] = field(default_factory=list)
    paging_state: bytes | None = None


# ------------------------------------------------------------------ frames


def read_header(data: bytes) -> Header:
    """The header of a frame (its first 9 bytes); ProtocolError for a body longer than the spec allows."""
    if len(data) < HEADER.size:
        raise ProtocolError(f"a frame header has {HEADER.size} bytes, got {len(data)}")
    version, flags, stream, opcode, length = HEADER.unpack_from(data)
    if length < 0 or length > MAX_BODY:
        raise ProtocolError(f"frame body length {length} is outside 0..{MAX_BODY}")
    return Header(version, flags, stream, opcode, length)


def check_version(header: Header) -> None:
    """ProtocolError unless the request speaks v4 (the driver steps down from newer versions on this message)."""
    if header.version & 0x7F != VERSION or header.version & RESPONSE:
        raise ProtocolError(f"Invalid or unsupported protocol version: {header.version & 0x7F}")


def response_frame(stream: int, opcode: int, body: bytes) -> bytes:
    return HEADER.pack(RESPONSE | VERSION, 0, stream, opcode, len(body)) + body


# ------------------------------------------------------------------ notations: reading


class Reader:
    """Reads the spec's notations from a body, front to back; ProtocolError when the body ends early."""

    def __init__(self, body: bytes):
        self._body = memoryview(body)
        self._at = 0

    def _take(self, count: int) -> memoryview:
        if count < 0 or self._at + count > len(self._body):
            raise ProtocolError("the frame body ends in the middle of a value")
        part = self._body[self._at:self._at + count]
        self._at += count
        return part

    def byte(self) -> int:
        return self._take(1)[0]

    def short(self) -> int:
        return struct.unpack(">H", self._take(2))[0]

    def int(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def long(self) -> int:
        return struct.unpack(">q", self._take(8))[0]

    def string(self) -> str:
        return self._text(self.short())

    def long_string(self) -> str:
        return self._text(self.int())

    def _text(self, length: int) -> str:
        try:
            return str(self._take(length), "utf-8")
        except UnicodeDecodeError as error:
            raise ProtocolError(f"a string is not UTF-8: {error}") from None

    def bytes(self) -> bytes | None:
        length = self.int()
        return None if length < 0 else bytes(self._take(length))

    def short_bytes(self) -> bytes:
        return bytes(self._take(self.short()))

    def value(self):
        """A bound [value]: bytes, None (null) or UNSET."""
        length = self.int()
        if length == -2:
            return UNSET
        return None if length < 0 else bytes(self._take(length))

    def string_list(self) -> tuple[str, ...]:
        return tuple(self.string() for _ in range(self.short()))

    def string_map(self) -> dict[str, str]:
        return {self.string(): self.string() for _ in range(self.short())}

    def done(self) -> None:
        if self._at != len(self._body):
            raise ProtocolError(f"{len(self._body) - self._at} byte(s) left over after the message")


# ------------------------------------------------------------------ notations: writing


def short(value: int) -> bytes:
    return struct.pack(">H", value)


def int_(value: int) -> bytes:
    return struct.pack(">i", value)


def string(value: str) -> bytes:
    encoded = value.encode("utf-8")
    return short(len(encoded)) + encoded


def bytes_(value: bytes | None) -> bytes:
    return int_(-1) if value is None else int_(len(value)) + value


def string_multimap(values: dict[str, list[str]]) -> bytes:
    parts = [short(len(values))]
    for key, items in values.items():
        parts += [string(key), short(len(items)), *(string(item) for item in items)]
    return b"".join(parts)


# ------------------------------------------------------------------ requests


def decode_request(opcode: int, body: bytes):
    """The request a body holds; ProtocolError for an opcode a client does not send or a malformed body."""
    decoder = _REQUESTS.get(opcode)
    if decoder is None:
        raise ProtocolError(f"opcode 0x{opcode:02X} is not a request this server takes")
    reader = Reader(body)
    request = decoder(reader)
    reader.done()
    return request


def _query_parameters(reader: Reader) -> QueryParameters:
    consistency, flags = reader.short(), reader.byte()
    values, names = (), None
    if flags & _VALUES:
        count = reader.short()
        if flags & _NAMES:
            pairs = [(reader.string(), reader.value()) for _ in range(count)]
            names, values = tuple(n for n, _ in pairs), tuple(v for _, v in pairs)
        else:
            values = tuple(reader.value() for _ in range(count))
    page_size = reader.int() if flags & _PAGE_SIZE else None
    paging_state = reader.bytes() if flags & _PAGING_STATE else None
    serial = reader.short() if flags & _SERIAL_CONSISTENCY else None
    timestamp = reader.long() if flags & _DEFAULT_TIMESTAMP else None
    return QueryParameters(consistency, values, names, bool(flags & _SKIP_METADATA), page_size, paging_state,
                           serial, timestamp)


def _batch(reader: Reader) -> Batch:
    kind, statements = reader.byte(), []
    for _ in range(reader.short()):
        prepared = reader.byte()
        if prepared not in (0, 1):
            raise ProtocolError(f"a batch statement's kind is 0 (text) or 1 (prepared), not {prepared}")
        query = None if prepared else reader.long_string()
        statement_id = reader.short_bytes() if prepared else None
        statements.append(BatchStatement(query, statement_id, tuple(reader.value() for _ in range(reader.short()))))
    consistency, flags = reader.short(), reader.byte()
    serial = reader.short() if flags & _SERIAL_CONSISTENCY else None
    timestamp = reader.long() if flags & _DEFAULT_TIMESTAMP else None
    return Batch(kind, tuple(statements), consistency, serial, timestamp)


_REQUESTS = {
    OPTIONS: lambda reader: Options(),
    STARTUP: lambda reader: Startup(reader.string_map()),
    AUTH_RESPONSE: lambda reader: AuthResponse(reader.bytes()),
    QUERY: lambda reader: Query(reader.long_string(), _query_parameters(reader)),
    PREPARE: lambda reader: Prepare(reader.long_string()),
    EXECUTE: lambda reader: Execute(reader.short_bytes(), _query_parameters(reader)),
    REGISTER: lambda reader: Register(reader.string_list()),
    BATCH: _batch,
}


# ------------------------------------------------------------------ responses


def error(stream: int, code: int, message: str, details: bytes = b"") -> bytes:
    """An ERROR; `details` are the fields its code has after the message (see the error_* helpers)."""
    return response_frame(stream, ERROR, int_(code) + string(message) + details)


def unavailable_details(consistency: int, required: int, alive: int) -> bytes:
    return short(consistency) + int_(required) + int_(alive)


def write_timeout_details(consistency: int, received: int, block_for: int, write_type: str) -> bytes:
    return short(consistency) + int_(received) + int_(block_for) + string(write_type)


def read_timeout_details(consistency: int, received: int, block_for: int, data_present: bool) -> bytes:
    return short(consistency) + int_(received) + int_(block_for) + (b"\x01" if data_present else b"\x00")


def unprepared_details(statement_id: bytes) -> bytes:
    return short(len(statement_id)) + statement_id


def already_exists_details(keyspace: str, table: str) -> bytes:
    return string(keyspace) + string(table)


def ready(stream: int) -> bytes:
    return response_frame(stream, READY, b"")


def authenticate(stream: int, authenticator: str) -> bytes:
    return response_frame(stream, AUTHENTICATE, string(authenticator))


def auth_success(stream: int) -> bytes:
    return response_frame(stream, AUTH_SUCCESS, bytes_(None))


def supported(stream: int, options: dict[str, list[str]]) -> bytes:
    return response_frame(stream, SUPPORTED, string_multimap(options))


def void(stream: int) -> bytes:
    return response_frame(stream, RESULT, int_(_VOID))


def set_keyspace(stream: int, keyspace: str) -> bytes:
    return response_frame(stream, RESULT, int_(_SET_KEYSPACE) + string(keyspace))


def rows(stream: int, result: Rows) -> bytes:
    """A Rows result: its metadata (one table for every column: the global table spec) and each cell serialized."""
    flags = (_HAS_MORE_PAGES if result.paging_state is not None else 0) | (
        _GLOBAL_TABLES_SPEC if _one_table(result.columns) else 0)
    parts = [int_(_ROWS), int_(flags), int_(len(result.columns))]
    if result.paging_state is not None:
        parts.append(bytes_(result.paging_state))
    parts += [_column_specs(result.columns, flags), int_(len(result.rows))]
    encoders = [encoder(column.type) for column in result.columns]
    for row in result.rows:
        parts += [bytes_(None if value is None else encode(value)) for encode, value in zip(encoders, row, strict=True)]
    return response_frame(stream, RESULT, b"".join(parts))


def rows_from_arrow(stream: int, columns: tuple[Column, ...], batch, paging_state: bytes | None = None) -> bytes:
    """A Rows result from an Arrow record batch (the columns in `columns`' order), its cells laid out with numpy
    column by column: no Python object per value."""
    flags = (_HAS_MORE_PAGES if paging_state is not None else 0) | (
        _GLOBAL_TABLES_SPEC if _one_table(columns) else 0)
    head = [int_(_ROWS), int_(flags), int_(len(columns))]
    if paging_state is not None:
        head.append(bytes_(paging_state))
    head += [_column_specs(columns, flags), int_(batch.num_rows)]
    cells = [_arrow_cells(column.type, batch.column(i)) for i, column in enumerate(columns)]
    return response_frame(stream, RESULT, b"".join(head) + _row_major(cells, batch.num_rows))


def _arrow_cells(type_name: str, array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One column as [bytes] cells: (the length each cell declares, -1 for null; the bytes after it per row; the
    concatenated bytes of every non-null value)."""
    valid = np.ones(len(array), bool) if array.null_count == 0 else array.is_valid().to_numpy(zero_copy_only=False)
    if type_name in ("text", "varchar", "ascii"):
        array = array.cast(pa.large_string())
        offsets = np.frombuffer(array.buffers()[1], np.int64, len(array) + 1, array.offset * 8)
        sizes = np.diff(offsets)
        data = np.frombuffer(array.buffers()[2], np.uint8)[offsets[0]:offsets[-1]] if len(array) else np.zeros(0,
                                                                                                            np.uint8)
        return np.where(valid, sizes, -1).astype(np.int64), np.where(valid, sizes, 0), data
    dtype, width = _FIXED[type_name]
    filled = array.fill_null(False if pa.types.is_boolean(array.type) else 0)
    values = filled.to_numpy(zero_copy_only=False).astype(dtype)[valid]
    return np.where(valid, width, -1).astype(np.int64), np.where(valid, width, 0), values.view(np.uint8)


_FIXED = {"int": (">i4", 4), "bigint": (">i8", 8), "timestamp": (">i8", 8), "double": (">f8", 8),
          "float": (">f4", 4), "smallint": (">i2", 2), "tinyint": (">i1", 1), "boolean": ("u1", 1)}


def _row_major(cells: list[tuple[np.ndarray, np.ndarray, np.ndarray]], rows: int) -> bytes:
    """Every row's cells one after another: a 4-byte length, then the bytes, for each column in turn."""
    if not cells or rows == 0:
        return b""
    widths = np.stack([4 + body for _, body, _ in cells], axis=1)  # rows x columns, each cell's size
    starts = np.concatenate(([0], np.cumsum(widths.ravel())[:-1])).reshape(rows, len(cells))
    out = np.empty(int(widths.sum()), np.uint8)
    for column, (declared, body, data) in enumerate(cells):
        start = starts[:, column]
        out[(start[:, None] + np.arange(4)).ravel()] = declared.astype(">i4").view(np.uint8)
        if data.size:
            value_starts = start[body > 0] + 4
            value_sizes = body[body > 0]
            offsets = np.concatenate(([0], np.cumsum(value_sizes)[:-1]))
            out[np.repeat(value_starts - offsets, value_sizes) + np.arange(data.size)] = data
    return out.tobytes()


def prepared(stream: int, statement_id: bytes, bound: tuple[Column, ...], pk_indexes: tuple[int, ...],
             result: tuple[Column, ...]) -> bytes:
    """A Prepared result: the id, the bound variables with the positions of the partition key among them (v4), and
    the columns its rows will have (none: a statement without rows)."""
    bound_flags = _GLOBAL_TABLES_SPEC if _one_table(bound) else 0
    parts = [int_(_PREPARED), short(len(statement_id)), statement_id, int_(bound_flags), int_(len(bound)),
             int_(len(pk_indexes)), *(short(index) for index in pk_indexes), _column_specs(bound, bound_flags)]
    result_flags = (_GLOBAL_TABLES_SPEC if _one_table(result) else 0) | (0 if result else _NO_METADATA)
    parts += [int_(result_flags), int_(len(result)), _column_specs(result, result_flags)]
    return response_frame(stream, RESULT, b"".join(parts))


def schema_change(stream: int, change: str, target: str, keyspace: str, name: str | None = None) -> bytes:
    """A Schema_change result: CREATED, UPDATED or DROPPED; KEYSPACE, or TABLE with the table's name."""
    options = string(keyspace) + (b"" if name is None else string(name))
    return response_frame(stream, RESULT, int_(_SCHEMA_CHANGE) + string(change) + string(target) + options)


def schema_change_event(change: str, target: str, keyspace: str, name: str | None = None) -> bytes:
    """A pushed EVENT (stream -1) of a schema change made anywhere in the cluster."""
    body = string("SCHEMA_CHANGE") + string(change) + string(target) + string(keyspace)
    return response_frame(-1, EVENT, body + (b"" if name is None else string(name)))


def topology_change_event(change: str, host: str, port: int) -> bytes:
    """A pushed EVENT of a node that joined (NEW_NODE) or left (REMOVED_NODE), by its CQL address."""
    address = ipaddress.ip_address(host).packed
    return response_frame(-1, EVENT, string("TOPOLOGY_CHANGE") + string(change) + bytes([len(address)]) + address
                          + int_(port))


def _one_table(columns: tuple[Column, ...]) -> bool:
    return bool(columns) and len({(c.keyspace, c.table) for c in columns}) == 1


def _column_specs(columns: tuple[Column, ...], flags: int) -> bytes:
    parts = [string(columns[0].keyspace), string(columns[0].table)] if flags & _GLOBAL_TABLES_SPEC else []
    for column in columns:
        if not flags & _GLOBAL_TABLES_SPEC:
            parts += [string(column.keyspace), string(column.table)]
        parts += [string(column.name), type_option(column.type)]
    return b"".join(parts)


def type_option(type_name: str) -> bytes:
    """A column type as the protocol's [option]: its id, and a collection's element types after it."""
    kind, elements = _parse_type(type_name)
    if kind in COLLECTION_IDS:
        return short(COLLECTION_IDS[kind]) + b"".join(type_option(element) for element in elements)
    try:
        return short(TYPE_IDS[kind])
    except KeyError:
        raise ValueError(f"column type {type_name!r} has no native protocol type here") from None


def _parse_type(type_name: str) -> tuple[str, tuple[str, ...]]:
    """`map<text, text>` -> ("map", ("text", "text")); a simple type has no elements."""
    name = type_name.replace(" ", "")
    if "<" not in name:
        return name, ()
    kind, inner = name.split("<", 1)
    return kind, tuple(inner[:-1].split(",")) if kind in COLLECTION_IDS else ()


# ------------------------------------------------------------------ values


def _int(width: str):
    packer = struct.Struct(f">{width}")
    return packer.pack, lambda data: packer.unpack(data)[0]


def _inet(value: str) -> bytes:
    return ipaddress.ip_address(value).packed


_ENCODERS = {
    "int": _int("i")[0], "bigint": _int("q")[0], "timestamp": _int("q")[0], "smallint": _int("h")[0],
    "tinyint": _int("b")[0], "double": _int("d")[0], "float": _int("f")[0],
    "boolean": lambda value: b"\x01" if value else b"\x00",
    "text": lambda value: value.encode("utf-8"), "varchar": lambda value: value.encode("utf-8"),
    "ascii": lambda value: value.encode("ascii"), "blob": bytes,
    "uuid": lambda value: uuid.UUID(str(value)).bytes, "inet": _inet,
}
_DECODERS = {
    "int": _int("i")[1], "bigint": _int("q")[1], "timestamp": _int("q")[1], "smallint": _int("h")[1],
    "tinyint": _int("b")[1], "double": _int("d")[1], "float": _int("f")[1],
    "boolean": lambda data: data != b"\x00",
    "text": lambda data: data.decode("utf-8"), "varchar": lambda data: data.decode("utf-8"),
    "ascii": lambda data: data.decode("ascii"), "blob": bytes,
}


def _collection(elements: tuple[str, ...], value) -> bytes:
    """A list or set: [int] n, then n [bytes]; a map: [int] n, then n key and value [bytes] pairs."""
    if len(elements) == 2:
        key, item = encoder(elements[0]), encoder(elements[1])
        pairs = sorted(value.items())
        return int_(len(pairs)) + b"".join(bytes_(key(k)) + bytes_(item(v)) for k, v in pairs)
    element = encoder(elements[0])
    items = sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    return int_(len(items)) + b"".join(bytes_(element(item)) for item in items)


def encoder(type_name: str):
    """The function writing a non-null value of `type_name` as the bytes of a [bytes] cell."""
    kind, elements = _parse_type(type_name)
    if kind in COLLECTION_IDS:
        return functools.partial(_collection, elements)
    return _ENCODERS[kind]


def decode_value(type_name: str, data):
    """A bound value of a column type: None for null, UNSET left as it is; ProtocolError for bytes of another size."""
    if data is None or data is UNSET:
        return data
    try:
        return _DECODERS[type_name](data)
    except (struct.error, UnicodeDecodeError) as error:
        raise ProtocolError(f"a {type_name} value cannot be read from {len(data)} byte(s): {error}") from None
