"""The native protocol codec (cql.native_protocol) against the Python driver's own: requests the driver encodes are
read by ours, responses ours writes are read by the driver's."""
from __future__ import annotations

import struct

import pytest
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

protocol = pytest.importorskip("cassandra.protocol")
from cassandra import ConsistencyLevel  # noqa: E402
from cassandra.protocol import ProtocolHandler  # noqa: E402

from cql import native_protocol as native  # noqa: E402

STREAM = 7


def driver_request(message) -> tuple[native.Header, bytes]:
    frame = ProtocolHandler.encode_message(message, STREAM, native.VERSION, None, False)
    header = native.read_header(bytes(frame[:native.HEADER.size]))
    return header, bytes(frame[native.HEADER.size:])


def driver_reads(frame: bytes):
    header = native.read_header(frame)
    assert header.version == native.RESPONSE | native.VERSION and header.stream == STREAM
    assert header.length == len(frame) - native.HEADER.size
    return ProtocolHandler.decode_message(native.VERSION, {}, header.stream, header.flags, header.opcode,
                                          frame[native.HEADER.size:], None, None)


def test_options_startup_and_the_password_reach_us_as_the_driver_sent_them():
    header, body = driver_request(protocol.OptionsMessage())
    native.check_version(header)
    assert native.decode_request(header.opcode, body) == native.Options()
    header, body = driver_request(protocol.StartupMessage(cqlversion="3.0.0", options={}))
    assert native.decode_request(header.opcode, body) == native.Startup({"CQL_VERSION": "3.0.0"})
    header, body = driver_request(protocol.AuthResponseMessage(b"\x00alice\x00secret"))
    assert native.decode_request(header.opcode, body) == native.AuthResponse(b"\x00alice\x00secret")


@settings(max_examples=60, deadline=None)
@given(query=st.text(max_size=40), page_size=st.none() | st.integers(1, 2**31 - 1),
       paging_state=st.none() | st.binary(min_size=1, max_size=20), timestamp=st.none() | st.integers(0, 2**63 - 1),
       serial=st.sampled_from([None, ConsistencyLevel.SERIAL, ConsistencyLevel.LOCAL_SERIAL]),
       consistency=st.sampled_from([ConsistencyLevel.ONE, ConsistencyLevel.QUORUM, ConsistencyLevel.ALL]))
def test_a_query_and_its_parameters_read_as_the_driver_wrote_them(query, page_size, paging_state, timestamp, serial,
                                                                   consistency):
    message = protocol.QueryMessage(query, consistency, serial, page_size, paging_state, timestamp)
    header, body = driver_request(message)
    request = native.decode_request(header.opcode, body)
    assert request.query == query
    parameters = request.parameters
    assert (parameters.consistency, parameters.serial_consistency) == (consistency, serial)
    assert (parameters.page_size, parameters.paging_state, parameters.timestamp) == (page_size, paging_state,
                                                                                      timestamp)


def test_bound_values_of_an_execute_come_with_null_and_unset():
    values = [struct.pack(">i", 5), None, protocol._UNSET_VALUE, "é".encode()]
    message = protocol.ExecuteMessage(b"\x01\x02", values, ConsistencyLevel.ONE, fetch_size=100)
    header, body = driver_request(message)
    request = native.decode_request(header.opcode, body)
    assert request.statement_id == b"\x01\x02" and request.parameters.page_size == 100
    assert request.parameters.values == (struct.pack(">i", 5), None, native.UNSET, "é".encode())
    assert [native.decode_value(t, v) for t, v in zip(("int", "int", "int", "text"), request.parameters.values)] == \
        [5, None, native.UNSET, "é"]
    header, body = driver_request(protocol.PrepareMessage("SELECT * FROM ks.t WHERE k = ?"))
    assert native.decode_request(header.opcode, body) == native.Prepare("SELECT * FROM ks.t WHERE k = ?")


def test_named_values_and_skip_metadata_as_the_spec_lays_them_out():
    flags = 0x01 | 0x02 | 0x40  # values, skip_metadata, names for values
    body = (native.int_(len("q")) + b"q" + native.short(ConsistencyLevel.ONE) + bytes([flags])
            + native.short(1) + native.string("k") + native.bytes_(struct.pack(">i", 3)))
    request = native.decode_request(native.QUERY, body)
    assert request.parameters.names == ("k",) and request.parameters.values == (struct.pack(">i", 3),)
    assert request.parameters.skip_metadata


def test_the_driver_reads_our_handshake_and_simple_results():
    supported = driver_reads(native.supported(STREAM, {"CQL_VERSION": ["3.4.5"], "COMPRESSION": []}))
    assert (supported.cql_versions, supported.options) == (["3.4.5"], {"COMPRESSION": []})
    assert isinstance(driver_reads(native.ready(STREAM)), protocol.ReadyMessage)
    assert driver_reads(native.authenticate(
        STREAM, "org.apache.cassandra.auth.PasswordAuthenticator")).authenticator == \
        "org.apache.cassandra.auth.PasswordAuthenticator"
    assert isinstance(driver_reads(native.auth_success(STREAM)), protocol.AuthSuccessMessage)
    assert driver_reads(native.void(STREAM)).kind == protocol.RESULT_KIND_VOID
    assert driver_reads(native.set_keyspace(STREAM, "ks")).new_keyspace == "ks"


def test_the_driver_reads_our_errors_with_their_codes():
    message = driver_reads(native.error(STREAM, native.SYNTAX_ERROR, "line 1: no viable alternative"))
    assert isinstance(message, protocol.SyntaxException)
    assert (message.code, message.message) == (native.SYNTAX_ERROR, "line 1: no viable alternative")
    assert driver_reads(native.error(STREAM, native.BAD_CREDENTIALS, "bad password")).code == 0x0100
    assert isinstance(driver_reads(native.error(STREAM, native.INVALID, "no such table")),
                      protocol.InvalidRequestException)
    assert isinstance(driver_reads(native.error(STREAM, native.PROTOCOL_ERROR,
                                                "Invalid or unsupported protocol version: 5")),
                      protocol.ProtocolException)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.none() | st.text(max_size=8),
                               st.none() | st.floats(allow_nan=False), st.booleans(),
                               st.integers(-(2**63), 2**63 - 1)), max_size=8),
       paging_state=st.none() | st.binary(min_size=1, max_size=12))
def test_the_driver_reads_our_rows_with_their_types_and_paging_state(rows, paging_state):
    columns = tuple(native.Column("ks", "t", name, kind) for name, kind in
                    (("k", "int"), ("name", "text"), ("score", "double"), ("flag", "boolean"), ("big", "bigint")))
    message = driver_reads(native.rows(STREAM, native.Rows(columns, rows, paging_state)))
    assert message.kind == protocol.RESULT_KIND_ROWS
    assert message.column_names == ["k", "name", "score", "flag", "big"]
    assert [tuple(row) for row in message.parsed_rows] == rows
    assert message.paging_state == paging_state


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(st.none() | st.integers(-(2**31), 2**31 - 1), st.none() | st.text(max_size=8),
                               st.none() | st.floats(allow_nan=False), st.none() | st.booleans(),
                               st.none() | st.integers(-(2**63), 2**63 - 1)), max_size=12),
       start=st.integers(0, 3), paging_state=st.none() | st.binary(min_size=1, max_size=12))
def test_rows_laid_out_from_arrow_columns_are_the_rows_of_the_row_by_row_encoder(rows, start, paging_state):
    columns = tuple(native.Column("ks", "t", name, kind) for name, kind in
                    (("k", "int"), ("name", "text"), ("score", "double"), ("flag", "boolean"), ("big", "bigint")))
    types = (pa.int32(), pa.string(), pa.float64(), pa.bool_(), pa.int64())
    batch = pa.RecordBatch.from_arrays([pa.array([row[i] for row in rows], kind) for i, kind in enumerate(types)],
                                       names=[c.name for c in columns]).slice(min(start, len(rows)))
    expected = native.rows(STREAM, native.Rows(columns, [tuple(r.values()) for r in batch.to_pylist()], paging_state))
    assert native.rows_from_arrow(STREAM, columns, batch, paging_state) == expected


def test_frames_and_bodies_that_break_the_protocol_are_refused():
    with pytest.raises(native.ProtocolError, match="unsupported protocol version: 5"):
        native.check_version(native.Header(5, 0, 0, native.OPTIONS, 0))
    with pytest.raises(native.ProtocolError, match="outside"):
        native.read_header(native.HEADER.pack(4, 0, 1, native.QUERY, native.MAX_BODY + 1))
    with pytest.raises(native.ProtocolError, match="ends in the middle"):
        native.decode_request(native.QUERY, native.int_(100) + b"SELECT")
    with pytest.raises(native.ProtocolError, match="left over"):
        native.decode_request(native.OPTIONS, b"\x00")
    with pytest.raises(native.ProtocolError, match="not a request"):
        native.decode_request(native.RESULT, b"")
    with pytest.raises(native.ProtocolError, match="cannot be read"):
        native.decode_value("int", b"\x00\x01")


def test_a_batch_of_text_and_prepared_statements_reads_as_the_driver_wrote_it():
    from cassandra.query import BatchType
    queries = [(False, "INSERT INTO ks.t (k, v) VALUES (?, ?)", [struct.pack(">i", 1), b"a"]),
               (True, b"\x0a\x0b", [struct.pack(">i", 2), None])]
    message = protocol.BatchMessage(BatchType.UNLOGGED, queries, ConsistencyLevel.QUORUM,
                                    ConsistencyLevel.LOCAL_SERIAL, timestamp=1_700_000_000_000_000)
    header, body = driver_request(message)
    assert native.decode_request(header.opcode, body) == native.Batch(
        1, (native.BatchStatement("INSERT INTO ks.t (k, v) VALUES (?, ?)", None, (struct.pack(">i", 1), b"a")),
            native.BatchStatement(None, b"\x0a\x0b", (struct.pack(">i", 2), None))),
        ConsistencyLevel.QUORUM, ConsistencyLevel.LOCAL_SERIAL, 1_700_000_000_000_000)


def test_the_driver_reads_our_prepared_results_and_schema_changes():
    bound = (native.Column("ks", "t", "k", "int"), native.Column("ks", "t", "v", "text"))
    result = bound + (native.Column("ks", "t", "score", "double"),)
    message = driver_reads(native.prepared(STREAM, b"\x01" * 16, bound, (0,), result))
    assert message.query_id == b"\x01" * 16 and message.pk_indexes == [0]
    assert [(c.keyspace_name, c.table_name, c.name) for c in message.bind_metadata] == \
        [("ks", "t", "k"), ("ks", "t", "v")]
    assert [c[2] for c in message.column_metadata] == ["k", "v", "score"]
    no_rows = driver_reads(native.prepared(STREAM, b"\x02", bound, (0,), ()))
    assert not no_rows.column_metadata
    change = driver_reads(native.schema_change(STREAM, "CREATED", "TABLE", "ks", "t")).schema_change_event
    assert (change["change_type"], change["target_type"], change["keyspace"], change["table"]) == (
        "CREATED", "TABLE", "ks", "t")
    assert driver_reads(native.schema_change(STREAM, "DROPPED", "KEYSPACE", "ks")).schema_change_event == {
        "change_type": "DROPPED", "target_type": "KEYSPACE", "keyspace": "ks"}
