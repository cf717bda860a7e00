"""CQL native protocol requests run through an executor on an in-process group0 (node.cql_requests): requests the
Python driver encodes, answers its own decoder reads."""
from __future__ import annotations

import uuid

import pytest

protocol = pytest.importorskip("cassandra.protocol")
from cassandra import ConsistencyLevel  # noqa: E402
from cassandra.protocol import ProtocolHandler  # noqa: E402
from cassandra.query import BatchType  # noqa: E402

from common.injection import Injections  # noqa: E402
from common.metrics import NodeMetrics  # noqa: E402
from coordinator.core.auth import CLUSTER, Principal  # noqa: E402
from cql import native_protocol as native  # noqa: E402
from cql.keyspaces import in_keyspace  # noqa: E402
from cql import parse  # noqa: E402
from cql.native_connection import NativeConnection  # noqa: E402
from cql.system_tables import Asker, host_id  # noqa: E402
from node.cql_requests import NativeDeps, NativeStatements, Session  # noqa: E402

from .cluster_executor import ClusterExecutor  # noqa: E402
from .fakes import FakeGroup0  # noqa: E402
from .test_executor_routing import NOW, RecordingReader, RecordingWriter, register_node  # noqa: E402


@pytest.fixture
def node():
    group0 = FakeGroup0()
    register_node(group0, "n1")
    writer = RecordingWriter()
    executor = ClusterExecutor(group0, writer, RecordingReader(), now=lambda: NOW, injections=Injections(),
                               metrics=NodeMetrics())
    executor.execute("CREATE KEYSPACE ks WITH replication = {'replication_factor': 1}")
    executor.execute("CREATE TABLE ks.t (p int, c bigint, v text, PRIMARY KEY (p, c))")
    statements = NativeStatements(NativeDeps(executor, group0.read, Asker("n1", "test cluster")))
    return statements, writer, group0


class Client:
    """One connection: driver messages in, the driver's decoding of each answer out."""

    def __init__(self, statements: NativeStatements, principal: Principal = CLUSTER):
        self.statements = statements
        self.connection = NativeConnection(None, open_principal=principal)
        self.connection.receive(frame(protocol.StartupMessage(cqlversion="3.0.0", options={})))
        self.session = Session()
        self.prepared = {}

    def send(self, message):
        [run] = self.connection.receive(frame(message))
        answer = self.statements.answer(run, self.session)
        self.connection.answered(run.stream)
        header = native.read_header(answer)
        return ProtocolHandler.decode_message(native.VERSION, {}, header.stream, header.flags, header.opcode,
                                              answer[native.HEADER.size:], None, self.prepared)

    def query(self, text: str, values=None, **options):
        return self.send(protocol.QueryMessage(text, ConsistencyLevel.ONE, values, **options))


def frame(message, stream: int = 1) -> bytes:
    return bytes(ProtocolHandler.encode_message(message, stream, native.VERSION, None, False))


def test_use_sets_the_connection_keyspace_and_prepared_ids_follow_it(node):
    statements, writer, _ = node
    client = Client(statements)
    answer = client.query("USE ks")
    assert answer.kind == 3 and answer.new_keyspace == "ks" and client.session.keyspace == "ks"
    assert isinstance(client.query("INSERT INTO t (p, c, v) VALUES (1, 2, 'x')"), protocol.ResultMessage)
    [(mutations, _)] = writer.writes
    assert mutations[0][0].qualified_name == "ks.t"
    missing = client.query("USE nowhere")
    assert missing.code == native.INVALID and "nowhere" in missing.message and client.session.keyspace == "ks"
    prepared = client.send(protocol.PrepareMessage("INSERT INTO t (p, c, v) VALUES (?, ?, ?)"))
    elsewhere = Client(statements).send(protocol.PrepareMessage("INSERT INTO ks.t (p, c, v) VALUES (?, ?, ?)"))
    assert prepared.query_id != elsewhere.query_id  # the same text in another keyspace is another statement


def test_a_prepared_insert_takes_the_drivers_typed_values_and_its_default_timestamp(node):
    statements, writer, _ = node
    client = Client(statements)
    prepared = client.send(protocol.PrepareMessage("INSERT INTO ks.t (p, c, v) VALUES (?, ?, ?)"))
    assert [c[2] for c in prepared.bind_metadata] == ["p", "c", "v"] and prepared.pk_indexes == [0]
    values = [b"\x00\x00\x00\x07", (2**40).to_bytes(8, "big"), "seven".encode()]
    answer = client.send(protocol.ExecuteMessage(prepared.query_id, values, ConsistencyLevel.QUORUM,
                                                 timestamp=1_700_000_000_000_001))
    assert answer.kind == 1  # Void
    [(mutations, default_ts)] = writer.writes
    table, row = mutations[0]
    assert default_ts == 1_700_000_000_000_001 and row.key == (7, 2**40)


def test_an_unknown_prepared_id_is_unprepared_with_its_id(node):
    statements, _, _ = node
    answer = Client(statements).send(protocol.ExecuteMessage(b"\xab" * 16, [], ConsistencyLevel.ONE))
    assert answer.code == native.UNPREPARED and answer.info == b"\xab" * 16


def test_a_batch_of_text_and_prepared_statements_is_one_write(node):
    statements, writer, _ = node
    client = Client(statements)
    prepared = client.send(protocol.PrepareMessage("INSERT INTO ks.t (p, c, v) VALUES (?, ?, ?)"))
    batch = protocol.BatchMessage(BatchType.LOGGED, [
        (True, prepared.query_id, [b"\x00\x00\x00\x01", (1).to_bytes(8, "big"), b"a"]),
        (False, "UPDATE ks.t SET v = 'b' WHERE p = 2 AND c = 2", []),
    ], ConsistencyLevel.ALL)
    assert client.send(batch).kind == 1
    [(mutations, _)] = writer.writes
    assert [row.key for _, row in mutations] == [(1, 1), (2, 2)]


def test_errors_get_the_protocols_codes(node):
    statements, _, _ = node
    client = Client(statements)
    assert client.query("SELEC * FROM ks.t").code == native.SYNTAX_ERROR
    assert client.query("SELECT * FROM ks.missing").code == native.INVALID
    assert client.query("SELECT * FROM t").code == native.INVALID  # no keyspace given, none in use
    serial = client.send(protocol.QueryMessage("SELECT * FROM ks.t", ConsistencyLevel.SERIAL))
    assert serial.code == native.INVALID and "lightweight transactions" in serial.message
    alice = Client(statements, Principal("alice"))
    assert alice.query("SELECT * FROM ks.t").code == native.UNAUTHORIZED


def test_ddl_answers_schema_change_and_the_system_tables_describe_it(node):
    statements, _, _ = node
    client = Client(statements)
    created = client.query("CREATE TABLE ks.u (k int PRIMARY KEY, a int)")
    assert created.kind == 5 and created.schema_change_event == {
        "target_type": "TABLE", "change_type": "CREATED", "keyspace": "ks", "table": "u"}
    local = client.query("SELECT * FROM system.local WHERE key='local'")
    row = dict(zip(local.column_names, local.parsed_rows[0]))
    assert row["host_id"] == uuid.UUID(host_id("n1")) and row["cluster_name"] == "test cluster"
    assert row["partitioner"] == "vbc.TabletPartitioner" and row["release_version"] == "4.0.11"
    columns = client.query("SELECT * FROM system_schema.columns WHERE keyspace_name = 'ks' AND table_name = 'u'")
    described = {r[2]: (r[5], r[6], r[7]) for r in columns.parsed_rows}
    assert described == {"k": ("partition_key", 0, "int"), "a": ("regular", -1, "int")}
    tables = client.query("SELECT table_name, flags FROM system_schema.tables WHERE keyspace_name = 'ks'")
    assert sorted(r[0] for r in tables.parsed_rows) == ["t", "u"] and "compound" in tables.parsed_rows[0][1]
    assert client.query("SELECT * FROM system.nothing").code == native.INVALID


def test_in_keyspace_leaves_qualified_names_alone():
    statement = parse("BEGIN BATCH INSERT INTO t (k) VALUES (1); DELETE FROM other.u WHERE k = 1; APPLY BATCH")
    qualified = in_keyspace(statement, "ks")
    assert [str(s.table) for s in qualified.statements] == ["ks.t", "other.u"]
    assert in_keyspace(statement, None) is statement


def test_schema_and_node_changes_become_the_events_drivers_registered_for(node):
    statements, _, group0 = node
    from cql import system_tables
    from cql.executor import Executor  # noqa: F401 - the node fixture's executor made the schema
    before = group0.read(system_tables.shape)
    executor = statements._executor
    executor.execute("CREATE TABLE ks.u (k int PRIMARY KEY, a int)")
    executor.execute("CREATE INDEX ON ks.t (v)")
    executor.execute("DROP TABLE ks.u")
    executor.execute("CREATE KEYSPACE other WITH replication = {'replication_factor': 1}")
    after = group0.read(system_tables.shape)
    assert system_tables.events(before, after) == [
        ("SCHEMA_CHANGE", "CREATED", "KEYSPACE", "other"), ("SCHEMA_CHANGE", "UPDATED", "TABLE", "ks", "t")]
    frame = native.schema_change_event("UPDATED", "TABLE", "ks", "t")
    header = native.read_header(frame)
    event = ProtocolHandler.decode_message(native.VERSION, {}, header.stream, header.flags, header.opcode,
                                           frame[native.HEADER.size:], None, None)
    assert header.stream == -1 and event.event_type == "SCHEMA_CHANGE"
    assert event.event_args == {"change_type": "UPDATED", "target_type": "TABLE", "keyspace": "ks", "table": "t"}
    topology = native.topology_change_event("NEW_NODE", "127.0.0.1", 9042)
    header = native.read_header(topology)
    event = ProtocolHandler.decode_message(native.VERSION, {}, header.stream, header.flags, header.opcode,
                                           topology[native.HEADER.size:], None, None)
    assert event.event_args == {"change_type": "NEW_NODE", "address": ("127.0.0.1", 9042)}


def test_an_unset_value_leaves_its_column_alone_and_is_refused_in_a_key(node):
    statements, writer, _ = node
    client = Client(statements)
    insert = client.send(protocol.PrepareMessage("INSERT INTO ks.t (p, c, v) VALUES (?, ?, ?)"))
    unset = protocol._UNSET_VALUE
    assert client.send(protocol.ExecuteMessage(insert.query_id, [b"\x00\x00\x00\x01", (2).to_bytes(8, "big"), unset],
                                               ConsistencyLevel.ONE)).kind == 1
    [(mutations, _)] = writer.writes
    assert set(mutations[0][1].cells) == set()  # v was not written: the row's marker only
    update = client.send(protocol.PrepareMessage("UPDATE ks.t SET v = ? WHERE p = ? AND c = ?"))
    refused = client.send(protocol.ExecuteMessage(update.query_id, [b"x", unset, (2).to_bytes(8, "big")],
                                                  ConsistencyLevel.ONE))
    assert refused.code == native.INVALID and "UNSET" in refused.message


def test_an_update_whose_every_value_is_unset_writes_nothing_and_errors_name_their_statement(node):
    statements, writer, _ = node
    client = Client(statements)
    update = client.send(protocol.PrepareMessage("UPDATE ks.t SET v = ? WHERE p = ? AND c = ?"))
    answer = client.send(protocol.ExecuteMessage(update.query_id, [protocol._UNSET_VALUE, b"\x00\x00\x00\x01",
                                                                   (2).to_bytes(8, "big")], ConsistencyLevel.ONE))
    assert answer.kind == 1 and writer.writes == []
    exists = client.query("CREATE TABLE ks.t (p int PRIMARY KEY)")
    assert exists.code in (native.ALREADY_EXISTS, native.INVALID)
    huge = client.query("SELECT * FROM ks.t WHERE v = '" + "x" * (5 * 1024 * 1024) + "'")
    assert huge.code == native.INVALID and "statement" in huge.message
