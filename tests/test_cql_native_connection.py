"""A native protocol connection without I/O (cql.native_connection), fed the frames the Python driver writes."""
from __future__ import annotations

import pytest

protocol = pytest.importorskip("cassandra.protocol")
from cassandra import ConsistencyLevel  # noqa: E402
from cassandra.protocol import ProtocolHandler  # noqa: E402

from cql import native_protocol as native  # noqa: E402
from cql.native_connection import (  # noqa: E402
    PASSWORD_AUTHENTICATOR, Close, NativeConnection, Run, Send,
)


def frame(message, stream: int = 1, version: int = native.VERSION) -> bytes:
    return bytes(ProtocolHandler.encode_message(message, stream, version, None, version > 4))


def decoded(action):
    data = action.frame
    header = native.read_header(data)
    return ProtocolHandler.decode_message(native.VERSION, {}, header.stream, header.flags, header.opcode,
                                          data[native.HEADER.size:], None, None)


def login(user: str, password: str) -> str:
    if (user, password) != ("alice", "secret"):
        raise LookupError(user)
    return f"role {user}"


def authenticated() -> NativeConnection:
    connection = NativeConnection(login)
    connection.receive(frame(protocol.StartupMessage(cqlversion="3.0.0", options={})))
    [success] = connection.receive(frame(protocol.AuthResponseMessage(b"\x00alice\x00secret")))
    assert isinstance(decoded(success), protocol.AuthSuccessMessage)
    return connection


def test_the_drivers_handshake_ends_in_a_session_of_the_role_that_logged_in():
    connection = NativeConnection(login)
    [options] = connection.receive(frame(protocol.OptionsMessage()))
    assert decoded(options).options == {"COMPRESSION": []} and decoded(options).cql_versions
    [refused] = connection.receive(frame(protocol.QueryMessage("SELECT 1", ConsistencyLevel.ONE)))
    assert decoded(refused).code == native.PROTOCOL_ERROR
    [challenge] = connection.receive(frame(protocol.StartupMessage(cqlversion="3.0.0", options={})))
    assert decoded(challenge).authenticator == PASSWORD_AUTHENTICATOR
    [wrong] = connection.receive(frame(protocol.AuthResponseMessage(b"\x00alice\x00guess")))
    assert decoded(wrong).code == native.BAD_CREDENTIALS
    [success] = connection.receive(frame(protocol.AuthResponseMessage(b"\x00alice\x00secret")))
    assert isinstance(decoded(success), protocol.AuthSuccessMessage)
    [run] = connection.receive(frame(protocol.QueryMessage("SELECT * FROM ks.t", ConsistencyLevel.ONE), stream=9))
    assert isinstance(run, Run) and run.stream == 9 and run.principal == "role alice"
    assert run.request.query == "SELECT * FROM ks.t"


def test_frames_split_anywhere_and_several_in_one_read_are_all_taken():
    connection = authenticated()
    data = b"".join(frame(protocol.QueryMessage(f"SELECT {i}", ConsistencyLevel.ONE), stream=i) for i in range(3))
    actions = []
    for byte in data:
        actions += connection.receive(bytes([byte]))
    assert [a.stream for a in actions] == [0, 1, 2]
    actions = connection.receive(data)
    assert [a.request.query for a in actions] == ["SELECT 0", "SELECT 1", "SELECT 2"]


def test_another_protocol_version_is_refused_so_the_driver_steps_down():
    connection = NativeConnection(login)
    [refused] = connection.receive(frame(protocol.OptionsMessage(), version=5))
    assert decoded(refused).code == native.PROTOCOL_ERROR
    assert "Invalid or unsupported protocol version: 5" in decoded(refused).message
    assert connection.wants_data


def test_an_oversized_or_malformed_frame_closes_the_connection_with_an_error():
    connection = NativeConnection(login, max_frame=100)
    [close] = connection.receive(frame(protocol.QueryMessage("x" * 200, ConsistencyLevel.ONE)))
    assert isinstance(close, Close) and "above the 100-byte limit" in decoded(close).message
    assert not connection.wants_data and connection.receive(frame(protocol.OptionsMessage())) == []
    connection = authenticated()
    [close] = connection.receive(native.HEADER.pack(native.VERSION, 0, 3, native.QUERY, 4) + b"\x00\x00\x00\x09")
    assert isinstance(close, Close) and decoded(close).code == native.PROTOCOL_ERROR


def test_reading_stops_while_the_bound_of_running_statements_is_reached():
    connection = NativeConnection(login, max_in_flight=2)
    connection.receive(frame(protocol.StartupMessage(cqlversion="3.0.0", options={})))
    connection.receive(frame(protocol.AuthResponseMessage(b"\x00alice\x00secret")))
    for stream in (1, 2):
        [run] = connection.receive(frame(protocol.QueryMessage("SELECT 1", ConsistencyLevel.ONE), stream=stream))
        assert isinstance(run, Run)
    assert not connection.wants_data
    connection.answered(1)
    assert connection.wants_data
    [ready] = connection.receive(frame(protocol.RegisterMessage(["SCHEMA_CHANGE"]), stream=4))
    assert isinstance(ready, Send) and isinstance(decoded(ready), protocol.ReadyMessage)
    assert connection.registered == {"SCHEMA_CHANGE"}


def test_before_a_login_a_frame_is_small_and_running_requests_are_bounded_in_bytes(monkeypatch):
    import cql.native_connection as native_connection
    connection = NativeConnection(login)
    [close] = connection.receive(frame(protocol.QueryMessage("x" * 200_000, ConsistencyLevel.ONE)))
    assert isinstance(close, Close) and "before a login" in decoded(close).message
    monkeypatch.setattr(native_connection, "MAX_IN_FLIGHT_BYTES", 300)
    connection = authenticated()
    [run] = connection.receive(frame(protocol.QueryMessage("x" * 400, ConsistencyLevel.ONE), stream=5))
    assert isinstance(run, Run) and not connection.wants_data  # one large request fills the byte bound
    connection.answered(5)
    assert connection.wants_data
