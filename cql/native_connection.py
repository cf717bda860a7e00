"""One native protocol connection without I/O (as h11 is for HTTP): bytes in, frames out, requests to run handed over.

`NativeConnection.receive(data)` buffers what arrived and returns what to do for every whole frame: a frame to send at
once (the handshake, an error), or a `Run` of a statement request for the shell to execute (in any order, many at a
time: responses are matched by stream id); `answered(stream)` releases its place. The handshake is the driver's:
OPTIONS (any time) -> SUPPORTED; STARTUP -> AUTHENTICATE PasswordAuthenticator; AUTH_RESPONSE with SASL PLAIN
(`\\0user\\0password`) -> AUTH_SUCCESS once `login` accepts it, ERROR 0x0100 else. A frame of another version is
answered ERROR 0x000A ("Invalid or unsupported protocol version: N", which makes the driver step down); a frame above
the size limit, or a body that breaks the protocol, is answered ERROR 0x000A and the connection closes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cql import native_protocol as native

PASSWORD_AUTHENTICATOR = "org.apache.cassandra.auth.PasswordAuthenticator"
CQL_VERSION = "3.4.5"
MAX_FRAME = 16 * 1024 * 1024  # a frame's body, at most (ScyllaDB's default is 16 MiB too)
MAX_IN_FLIGHT = 1024  # statements run at once per connection before it stops reading
MAX_IN_FLIGHT_BYTES = 64 * 1024 * 1024  # the request bytes of those statements, at most (then it stops reading)
MAX_UNAUTHENTICATED_FRAME = 128 * 1024  # a frame's body before the login succeeded (ScyllaDB caps it too)

Login = Callable[[str, str], object]  # (user, password) -> the session's principal; raises LookupError if refused


@dataclass(frozen=True)
class Send:
    frame: bytes


@dataclass(frozen=True)
class Close:
    """Send `frame`, then close the connection: what arrived cannot be framed any more."""

    frame: bytes


@dataclass(frozen=True)
class Run:
    """A statement request to execute for the session's `principal`; its answer goes out with `stream`."""

    stream: int
    request: object
    principal: object


class NativeConnection:
    """The protocol state of one client connection (see the module docstring)."""

    def __init__(self, login: Login | None, max_frame: int = MAX_FRAME, max_in_flight: int = MAX_IN_FLIGHT,
                 open_principal: object = None):
        """`login` None: a node without authentication, where STARTUP is answered READY and every statement runs
        for `open_principal`."""
        self._login = login
        self._open_principal = open_principal
        self._max_frame = max_frame
        self._max_in_flight = max_in_flight
        self._buffer = bytearray()
        self._started = False
        self._principal: object | None = None
        self._authenticated = False
        self.registered: set[str] = set()  # the event types (SCHEMA_CHANGE, TOPOLOGY_CHANGE, ...) pushed to it
        self._in_flight: dict[int, list[int]] = {}  # stream -> the body sizes of its running requests
        self._in_flight_bytes = 0
        self._closed = False

    @property
    def authenticated(self) -> bool:
        return self._authenticated

    @property
    def wants_data(self) -> bool:
        """Whether the shell should read more: open, and fewer statements running than the bound."""
        return (not self._closed and len(self._in_flight) < self._max_in_flight
                and self._in_flight_bytes < MAX_IN_FLIGHT_BYTES)

    def receive(self, data: bytes) -> list[Send | Close | Run]:
        if self._closed:
            return []
        self._buffer += data
        actions: list[Send | Close | Run] = []
        while not self._closed and len(self._buffer) >= native.HEADER.size:
            try:
                header = native.read_header(bytes(self._buffer[:native.HEADER.size]))
            except native.ProtocolError as error:
                return actions + [self._close(0, str(error))]
            limit = self._max_frame if self._authenticated else min(self._max_frame, MAX_UNAUTHENTICATED_FRAME)
            if header.length > limit:
                return actions + [self._close(header.stream, f"frame of {header.length} bytes is above the "
                                                             f"{limit}-byte limit" + (
                                                                 "" if self._authenticated else " before a login"))]
            end = native.HEADER.size + header.length
            if len(self._buffer) < end:
                break
            body = bytes(self._buffer[native.HEADER.size:end])
            del self._buffer[:end]
            actions.append(self._frame(header, body))
        return actions

    def answered(self, stream: int) -> None:
        sizes = self._in_flight.get(stream)
        if sizes:
            self._in_flight_bytes -= sizes.pop()
            if not sizes:
                del self._in_flight[stream]

    def _frame(self, header: native.Header, body: bytes) -> Send | Close | Run:
        try:
            native.check_version(header)
        except native.ProtocolError as error:
            return Send(native.error(header.stream, native.PROTOCOL_ERROR, str(error)))
        try:
            request = native.decode_request(header.opcode, body)
        except native.ProtocolError as error:
            return self._close(header.stream, str(error))
        return self._request(header.stream, request, header.length)

    def _request(self, stream: int, request, size: int) -> Send | Run:
        if isinstance(request, native.Options):
            return Send(native.supported(stream, {"CQL_VERSION": [CQL_VERSION], "COMPRESSION": []}))
        if isinstance(request, native.Startup):
            return self._startup(stream)
        if isinstance(request, native.AuthResponse):
            return self._authenticate(stream, request.token)
        if not self._authenticated:
            return Send(native.error(stream, native.PROTOCOL_ERROR,
                                     "the connection is not authenticated yet: send STARTUP, then AUTH_RESPONSE"))
        if isinstance(request, native.Register):
            self.registered |= set(request.events)
            return Send(native.ready(stream))
        self._in_flight.setdefault(stream, []).append(size)
        self._in_flight_bytes += size
        return Run(stream, request, self._principal)

    def _startup(self, stream: int) -> Send:
        if self._started:
            return Send(native.error(stream, native.PROTOCOL_ERROR, "STARTUP was already sent on this connection"))
        self._started = True
        if self._login is None:
            self._principal, self._authenticated = self._open_principal, True
            return Send(native.ready(stream))
        return Send(native.authenticate(stream, PASSWORD_AUTHENTICATOR))

    def _authenticate(self, stream: int, token: bytes | None) -> Send:
        if not self._started:
            return Send(native.error(stream, native.PROTOCOL_ERROR, "AUTH_RESPONSE before STARTUP"))
        if self._login is None:
            return Send(native.error(stream, native.PROTOCOL_ERROR, "this node asks for no credentials"))
        parts = (token or b"").split(b"\x00")
        if len(parts) != 3:
            return Send(native.error(stream, native.BAD_CREDENTIALS,
                                     "the credentials are not SASL PLAIN (\\0user\\0password)"))
        try:
            user, password = parts[1].decode("utf-8"), parts[2].decode("utf-8")
            self._principal = self._login(user, password)
            self._authenticated = True
        except (LookupError, UnicodeDecodeError):
            return Send(native.error(stream, native.BAD_CREDENTIALS,
                                     "Provided username and/or password are incorrect"))
        return Send(native.auth_success(stream))

    def _close(self, stream: int, message: str) -> Close:
        self._closed = True
        return Close(native.error(stream, native.PROTOCOL_ERROR, message))
