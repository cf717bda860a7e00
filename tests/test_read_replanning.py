"""Unit tests of reads that span a tablet migration, without processes: the replica refuses a range it no longer reads
from (at the start, between pages, after a page that ran into the cleanup), the coordinator plans the rest again and
returns every row, bounded re-plans, and the typed refusal crossing a real in-process gRPC call."""
from __future__ import annotations

import copy
import uuid
from concurrent import futures

import grpc
import pyarrow as pa
import pytest

from common.injection import Injections
from common.internode import InternodeTransport
from common.metrics import NodeMetrics
from common.open_calls import OpenCalls
from common.peers import Peers
from common.replica_messages import ScanPage, ScanRequest
from coordinator.core import migrations
from coordinator.core.commands import AdvanceTabletMigration, StartTabletMigration
from coordinator.core.errors import RangeMoved, Unavailable
from coordinator.core.schema import Replica
from coordinator.core.tokens import tablet_range
from coordinator.core.types import sort_key
from node.internode_service import InternodeDeps, InternodeService
from replica.inflight import InflightWrites
from replica.local import LocalData, SchemaAccess
from replica.read_path import MAX_REPLANS, ReadQuery
from replica.rows import upsert_row
from replica.streaming import TabletStream
from storage.reads import Aggregate
from storage.store import NodeStore
from tests.replica_fakes import InProcessCluster, cluster_state
from vbcpb import vbc_pb2_grpc as rpc

TS = 1_000
ROWS = 200
TERM = 1
LAST = 1  # the tablet that moves: the last of two


@pytest.fixture
def cluster(tmp_path):
    cluster = InProcessCluster(tmp_path, cluster_state(nodes=("n1", "n2"), rf=1, tablets=2))
    assert _holder(cluster, 0) != _holder(cluster, LAST), "one tablet on each node"
    table = cluster.schema.table
    cluster.nodes["n1"].writer.write([(table, upsert_row(table, _values(i), TS)) for i in range(ROWS)], TS)
    yield cluster
    cluster.close()


def _values(i: int) -> dict:
    return {"key": i // 4, "c": i % 4, "v": f"row{i}"}


def _in_order(cluster) -> list[tuple]:
    table = cluster.schema.table

    def order(values: dict):
        return upsert_row(table, values, TS).token, tuple(sort_key(values[c]) for c in table.primary_key)

    return [tuple(v[c.name] for c in table.columns) for v in sorted(map(_values, range(ROWS)), key=order)]


def _token(cluster, row: tuple) -> int:
    return upsert_row(cluster.schema.table, dict(zip(("key", "c", "v"), row)), TS).token


def _rows(pages) -> list[tuple]:
    return [(row["key"], row["c"], row["v"]) for page in pages for row in page.to_pylist()]


def _holder(cluster, tablet: int = LAST) -> str:
    return cluster.schema.state.tablets[cluster.schema.table_id].replicas[tablet][0].node


def _other(node: str) -> str:
    return "n2" if node == "n1" else "n1"


def _tablet_request(cluster, tablet: int = LAST, **fields) -> ScanRequest:
    first, last = tablet_range(tablet, 2)
    fields = {"schema_version": cluster.schema.state.schema_version, **fields}
    return ScanRequest(cluster.schema.table_id, first, last, columns=("key", "c", "v"), **fields)


class Migration:
    """One move of a tablet's replica to the other node, stage by stage, doing what the leader's driver does at each:
    streaming the rows before reads switch, deleting the leaving replica's rows at `cleanup`."""

    def __init__(self, cluster, tablet: int = LAST):
        self.cluster, self.tablet = cluster, tablet
        self.state = cluster.schema.state
        self.table_id = cluster.schema.table_id
        self.leaving = self.state.tablets[self.table_id].replicas[tablet][0]
        self.pending = Replica(_other(self.leaving.node), 0)
        self.id = uuid.uuid4().hex
        self._apply(StartTabletMigration(
            cmd_id=uuid.uuid4().hex, migration_id=self.id, table_id=self.table_id, tablet_id=tablet,
            leaving_node=self.leaving.node, leaving_shard=self.leaving.shard, pending_node=self.pending.node,
            pending_shard=self.pending.shard))

    @property
    def stage(self) -> str:
        transition = migrations.transition_of(self.state, self.table_id, self.tablet)
        return migrations.END_MIGRATION if transition is None else transition.stage

    def run_to(self, stage: str) -> None:
        """Advance until the tablet is at `stage` (END_MIGRATION: the migration ended)."""
        while self.stage != stage:
            self._do_step()
            self._apply(AdvanceTabletMigration(
                cmd_id=uuid.uuid4().hex, term=TERM, migration_id=self.id, table_id=self.table_id,
                tablet_id=self.tablet, from_stage=self.stage, to_stage=migrations.NEXT_STAGE[self.stage]))

    def _do_step(self) -> None:
        first, last = tablet_range(self.tablet, 2)
        version = self.state.schema_version
        if self.stage == migrations.STREAMING:
            self.cluster.nodes[self.pending.node].local.stream_tablet(TabletStream(
                TERM, self.id, self.table_id, first, last, self.leaving.node, version), current_term=TERM)
        elif self.stage == migrations.CLEANUP:
            self.cleanup()

    def cleanup(self) -> int:
        first, last = tablet_range(self.tablet, 2)
        return self.cluster.nodes[self.leaving.node].local.cleanup_tablet(
            TERM, TERM, self.id, self.table_id, first, last, self.state.schema_version)

    def _apply(self, command) -> None:
        outcome = self.state.apply(command)
        assert outcome.ok, outcome


class Interposed:
    """A node's replica as the network reaches it, running `before(request)` ahead of each scan and `between(n)`
    after its n-th page was handed on (a migration overtaking the scan); every other call goes straight through."""

    def __init__(self, local: LocalData, before=lambda request: None, between=lambda pages: None):
        self._local, self._before, self._between = local, before, between

    def scan(self, request: ScanRequest):
        self._before(request)
        pages = self._local.scan(request)

        def interposed():
            for count, page in enumerate(pages, start=1):
                yield page
                self._between(count)

        return interposed()

    def __getattr__(self, name):
        return getattr(self._local, name)


def _interpose(cluster, node: str, **hooks) -> None:
    cluster.network.replicas[node] = Interposed(cluster.nodes[node].local, **hooks)


def _scans_to(cluster, node: str) -> list[ScanRequest]:
    return [c.message for c in cluster.network.calls_of("scan") if c.target == node]


# ----------------------------------------------------------------- the replica's side


def test_a_replica_refuses_a_range_it_no_longer_reads_from_naming_table_tablet_and_new_node(cluster):
    holder = _holder(cluster)
    request = _tablet_request(cluster)
    Migration(cluster).run_to(migrations.WRITE_BOTH_READ_NEW)
    with pytest.raises(RangeMoved) as refused:
        cluster.nodes[holder].local.scan(request)
    assert refused.value.code == "UNAVAILABLE"
    assert f"ks.t tablet {LAST} " in refused.value.message
    assert f"no longer read from node {holder}: {_other(holder)} serves it now" in refused.value.message


def test_the_pending_replica_refuses_reads_until_reads_switch_to_it(cluster):
    pending = _other(_holder(cluster))
    migration = Migration(cluster)
    migration.run_to(migrations.STREAMING)
    with pytest.raises(RangeMoved, match=f"no longer read from node {pending}: {_holder(cluster)} serves it now"):
        cluster.nodes[pending].local.scan(_tablet_request(cluster))
    migration.run_to(migrations.WRITE_BOTH_READ_NEW)
    assert len(_rows(p.batch for p in cluster.nodes[pending].local.scan(_tablet_request(cluster)))) > 0


def test_a_range_over_several_tablets_is_refused_when_any_of_them_moved(cluster):
    holder = _holder(cluster)
    Migration(cluster, tablet=0).run_to(migrations.END_MIGRATION)  # the holder of the last tablet now holds both

    def everything() -> ScanRequest:
        return ScanRequest(cluster.schema.table_id, tablet_range(0, 2)[0], tablet_range(1, 2)[1],
                           aggregates=(Aggregate("count"),), schema_version=cluster.schema.state.schema_version)

    assert next(cluster.nodes[holder].local.scan(everything())).partials == [[ROWS]]
    request = everything()
    Migration(cluster).run_to(migrations.USE_NEW)
    with pytest.raises(RangeMoved, match=f"ks.t tablet {LAST} .*no longer read from node {holder}"):
        cluster.nodes[holder].local.scan(request)


def test_an_unversioned_scan_of_one_replica_is_served_as_it_stands(cluster):
    pending = _other(_holder(cluster))
    Migration(cluster).run_to(migrations.STREAMING)
    unversioned = _tablet_request(cluster, schema_version=0)
    assert _rows(p.batch for p in cluster.nodes[pending].local.scan(unversioned)) == []


def test_the_replica_catches_up_to_the_version_of_the_request_before_it_checks(cluster, tmp_path):
    """A replica behind the request judges by the state it caught up to: by its own, it would still serve the range."""
    holder = _holder(cluster)
    applied = {"state": copy.deepcopy(cluster.schema.state)}  # what the lagging replica applied: before the move
    migration = Migration(cluster)
    migration.run_to(migrations.WRITE_BOTH_READ_NEW)
    caught_up = []

    def catch_up(version: int) -> None:
        caught_up.append(version)
        if version > applied["state"].schema_version:
            applied["state"] = cluster.schema.state

    store = NodeStore.for_data_dir(tmp_path / "lagging")
    try:
        local = LocalData(holder, store, SchemaAccess(lambda fn: fn(applied["state"]), catch_up, InflightWrites()),
                          cluster.network.transport_of(holder), Injections(), NodeMetrics())
        request = _tablet_request(cluster)
        with pytest.raises(RangeMoved, match=f"no longer read from node {holder}"):
            local.scan(request)
        assert caught_up == [request.schema_version]
    finally:
        store.close()


def test_a_scan_overtaken_by_a_migration_between_pages_is_refused_at_the_next_page(cluster):
    holder = _holder(cluster)
    pages = cluster.nodes[holder].local.scan(_tablet_request(cluster, page_size=5))
    first = next(pages)
    assert first.batch.num_rows == 5
    Migration(cluster).run_to(migrations.WRITE_BOTH_READ_NEW)
    with pytest.raises(RangeMoved, match=f"tablet {LAST} "):
        next(pages)


def test_a_page_read_while_its_range_was_cleaned_up_is_never_served(cluster, monkeypatch):
    """The check after each page: a page whose read overlapped the cleanup (possible only once this node applied the
    `cleanup` stage) is refused, not handed on short."""
    holder = _holder(cluster)
    local = cluster.nodes[holder].local
    migration = Migration(cluster)
    migration.run_to(migrations.STREAMING)
    request = _tablet_request(cluster, page_size=1000)
    scan = local.tables.scan

    def racing_cleanup(table, one: ScanRequest):
        for page in scan(table, one):
            migration.run_to(migrations.CLEANUP)
            migration.cleanup()
            yield ScanPage(batch=page.batch.slice(0, 3))  # what a read racing the deletes could have seen

    monkeypatch.setattr(local.tables, "scan", racing_cleanup)
    with pytest.raises(RangeMoved, match=f"no longer read from node {holder}"):
        next(local.scan(request))


# ----------------------------------------------------------------- the coordinator's side


def test_a_full_scan_planned_before_a_move_returns_every_row(cluster):
    """The reported case: the read of the last tablet reaches its old replica after the migration ended."""
    holder, coordinator = _holder(cluster), _other(_holder(cluster))
    migration = Migration(cluster)
    _interpose(cluster, holder, before=lambda request: migration.run_to(migrations.END_MIGRATION))
    table = cluster.schema.table
    rows = _rows(cluster.nodes[coordinator].reader.pages(table, ReadQuery(columns=("key", "c", "v"))))
    assert rows == _in_order(cluster)
    assert migration.stage == migrations.END_MIGRATION and _holder(cluster) == coordinator
    assert len([r for r in _scans_to(cluster, holder) if r.last_token == tablet_range(LAST, 2)[1]]) == 1


def test_a_scan_overtaken_in_the_middle_of_a_tablet_resumes_strictly_after_its_last_row(cluster):
    holder, coordinator = _holder(cluster), _other(_holder(cluster))
    migration = Migration(cluster)
    _interpose(cluster, holder, between=lambda pages: migration.run_to(migrations.END_MIGRATION))
    table = cluster.schema.table
    query = ReadQuery(columns=("key", "c", "v"), page_rows=7)
    rows = _rows(cluster.nodes[coordinator].reader.pages(table, query))
    assert rows == _in_order(cluster)  # every row once, in order: nothing skipped, nothing read twice


def test_a_limit_counts_the_rows_read_before_and_after_the_move(cluster):
    holder, coordinator = _holder(cluster), _other(_holder(cluster))
    migration = Migration(cluster)
    _interpose(cluster, holder, between=lambda pages: migration.run_to(migrations.END_MIGRATION))
    first_tablet = [r for r in _in_order(cluster) if _token(cluster, r) <= tablet_range(0, 2)[1]]
    limit = len(first_tablet) + 12
    query = ReadQuery(columns=("key", "c", "v"), page_rows=5, limit=limit)
    rows = _rows(cluster.nodes[coordinator].reader.pages(cluster.schema.table, query))
    assert rows == _in_order(cluster)[:limit]


def test_a_partition_read_is_planned_again_too(cluster):
    holder, coordinator = _holder(cluster), _other(_holder(cluster))
    migration = Migration(cluster)
    _interpose(cluster, holder, before=lambda request: migration.run_to(migrations.END_MIGRATION))
    partitions = [(k,) for k in range(ROWS // 4)]
    query = ReadQuery(columns=("key", "c", "v"), partitions=partitions)
    rows = _rows(cluster.nodes[coordinator].reader.pages(cluster.schema.table, query))
    assert sorted(rows) == sorted(_in_order(cluster)) and len(rows) == ROWS


def test_aggregates_run_the_refused_range_again_whole(cluster):
    holder, coordinator = _holder(cluster), _other(_holder(cluster))
    migration = Migration(cluster)
    _interpose(cluster, holder, before=lambda request: migration.run_to(migrations.END_MIGRATION))
    aggregates = (Aggregate("count"), Aggregate("sum", "c"), Aggregate("max", "key"))
    values = cluster.nodes[coordinator].reader.aggregate(cluster.schema.table, ReadQuery(columns=()), aggregates)
    assert values == [ROWS, sum(_values(i)["c"] for i in range(ROWS)), (ROWS - 1) // 4]


def test_a_range_that_keeps_moving_fails_unavailable_after_bounded_replans(cluster):
    holder, coordinator = _holder(cluster), _other(_holder(cluster))

    def refuse(request: ScanRequest) -> None:
        raise RangeMoved(f"ks.t tablet {LAST} is no longer read from node {holder}")

    _interpose(cluster, holder, before=refuse)
    query = ReadQuery(columns=("key", "c", "v"))
    with pytest.raises(Unavailable, match="kept moving") as failed:
        list(cluster.nodes[coordinator].reader.pages(cluster.schema.table, query))
    assert not isinstance(failed.value, RangeMoved)
    assert len(_scans_to(cluster, holder)) == MAX_REPLANS + 1
    with pytest.raises(Unavailable, match="kept moving"):
        cluster.nodes[coordinator].reader.aggregate(cluster.schema.table, ReadQuery(columns=()),
                                                    (Aggregate("count"),))


def test_a_read_carries_the_schema_version_it_was_planned_at(cluster):
    holder, coordinator = _holder(cluster), _other(_holder(cluster))
    version = cluster.schema.state.schema_version
    list(cluster.nodes[coordinator].reader.pages(cluster.schema.table, ReadQuery(columns=("key",))))
    assert {r.schema_version for r in _scans_to(cluster, holder)} == {version}


# ----------------------------------------------------------------- the refusal over gRPC


class RefusingReplica:
    """Serves one page of every scan, then refuses the rest: the range moved away meanwhile."""

    def __init__(self):
        self.requests: list[ScanRequest] = []

    def scan(self, request: ScanRequest):
        self.requests.append(request)
        yield ScanPage(batch=pa.record_batch({"token": pa.array([5], pa.int64())}))
        raise RangeMoved("ks.t tablet 1 (tokens 0..9) is no longer read from node n2: n1 serves it now")


@pytest.fixture
def remote():
    replica, calls = RefusingReplica(), OpenCalls(2)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rpc.add_InternodeServicer_to_server(InternodeService(InternodeDeps(
        replica=replica, observe_timestamp=lambda ts: None, local_status=lambda: None,
        wait_schema_applied=lambda version, timeout: None, wait_schema_version=lambda version, timeout: None,
        open_calls=calls)), server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    peers = Peers({"n2": address}.get)
    yield InternodeTransport(peers), replica
    peers.close()
    calls.end_all()
    server.stop(0)


def test_a_refusal_crosses_grpc_as_range_moved_with_its_message_and_the_version_arrives(remote):
    transport, replica = remote
    pages = transport.scan("n2", ScanRequest("ef" * 16, 0, 9, schema_version=42))
    assert next(pages).batch.num_rows == 1
    with pytest.raises(RangeMoved, match="no longer read from node n2: n1 serves it now"):
        next(pages)
    assert [r.schema_version for r in replica.requests] == [42]
