"""Wiring of one node: the only place that starts Raft, storage, the gRPC server and the background loops."""
from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common.codec import batch_from_proto_bytes
from common.injection import Injections
from common.internode import InternodeTransport
from common.internode_endpoint import InternodeEndpoint
from common.metrics import NodeMetrics, serve_metrics
from common.open_calls import OpenCalls
from common.peers import Peers
from common.worker_client import WorkerClient
from coordinator.core.build_settings import chunk_limit
from coordinator.core.commands import RecordTaskProgress, RegisterNode
from coordinator.core.errors import Unavailable
from coordinator.core.hlc import HybridClock
from coordinator.core.schema import TASK_PROCESS_STAGING
from coordinator.core.state import Group0State
from coordinator.core.tablets import dead_nodes
from coordinator.raft import Group0, Group0Unavailable, StateMachineError, secret_fingerprint
from coordinator.tablet_migration import MigrationCalls, MigrationDriver
from coordinator.view_building import ViewBuildingLoop
from cql.executor import Executor
from cql.limits import Limits
from replica.inflight import InflightWrites
from replica.local import LocalData, SchemaAccess
from replica.read_path import ReadCoordinator
from replica.write_path import WriteCoordinator
from storage import bulk
from storage.ledger import FinishedTaskLedger
from storage.store import NodeStore
from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc
from worker.build_job import BuildJob, Chunking
from worker.check import CheckResult, check_plan, check_view
from worker.executor import BatchControl, WorkerExecutor
from worker.service import WorkerService
from worker.spark_session import DEFAULT_JAVA_OPTIONS, NodeSpark, SparkConfig, default_master
from worker.spark_warmup import warm_up
from worker.staging_job import StagingJob
from worker.tasks import StartBatch
from worker.throttle import Throttle

from . import security
from .admin_service import AdminDeps, AdminService
from .client_service import ClientService
from .cql_endpoint import CqlEndpoint
from .health import HealthService
from .staged_registry import StagedRegistry
from .view_row_holds import ViewRowHolds
from .internode_service import InternodeDeps, InternodeService

log = logging.getLogger("node.wiring")

OUTBOX_FLUSH_INTERVAL = 0.5
VIEW_UPDATE_POLL = 0.05  # a migration barrier waiting for the outbox's older entries to be delivered
# The store's WAL is checkpointed in the background (NodeStore.checkpoint) after this many write transactions, or
# after any once this much time passed, looked at every WAL_CHECKPOINT_INTERVAL seconds.
WAL_CHECKPOINT_INTERVAL = 0.5
WAL_CHECKPOINT_WRITES = 500
WAL_CHECKPOINT_MAX_AGE = 30.0
GRPC_WORKERS = 48  # threads for unary and server-streaming calls
# Open calls (common.open_calls) each hold a server thread on top of those: replica write and view update
# streams from peers (up to 4 + 4 per peer: 8 peers' worth), and client sessions.
INTERNODE_OPEN_CALLS = 64
CLIENT_SESSIONS = 32
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # Peers ping every 10 s (common.peers); gRPC's default (one ping per 5 minutes without data) would answer
    # that with GOAWAY "too_many_pings", which fails every call in flight on the connection.
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]
MAX_CLOCK_SKEW_MICROS = 500_000
SCHEMA_WAIT_TIMEOUT = 60.0  # a batch waits this long for writes begun under an older schema
LEDGER_PRUNE_INTERVAL = 10.0
CATCH_UP_WAIT = 1.0  # a follower usually applies the leader's commands within milliseconds; then a read barrier
CATCH_UP_TIMEOUT = 10.0  # read barriers to catch up, tried again in slices: one sent to a leader that left is lost
BARRIER_SLICE = 2.0


@dataclass
class NodeConfig:
    node_id: str
    data_dir: Path
    grpc_addr: str
    raft_addr: str
    peers: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (grpc, raft) of the OTHER nodes
    shards: int = 1
    storage_url: str | None = None
    raft_password: str = ""  # the cluster's Raft secret (`vbc cluster up` writes DIR/raft.secret)
    insecure: bool = False  # serve plaintext gRPC; else mutual TLS with the certificates in certs_dir
    certs_dir: Path | None = None  # ca.crt, node.crt, node.key (default: the data directory)
    client_addr: str | None = None  # a second port, TLS without client certificates, for password logins
    cql_addr: str | None = None  # CQL's native protocol (v4), TLS with the node's certificate and password logins
    cluster_name: str = "vbc"
    metrics_addr: str | None = None
    metrics_tls: bool = False  # serve the metrics over HTTPS with the node's certificate
    spark_master: str = field(default_factory=default_master)
    spark_memory: str = "1g"
    spark_java_options: str = DEFAULT_JAVA_OPTIONS
    spark_driver_host: str | None = None  # where a Spark cluster's executors reach the driver (default: the gRPC host)
    spark_remote: str | None = None  # a Spark Connect server (sc://HOST:PORT) instead of a driver JVM of the node's
    limits: Limits = field(default_factory=Limits)
    enable_injections: bool = False  # Admin.Inject may switch fault injection points on (tests, local clusters)
    spark_prestart: bool = True  # start and warm up Spark in the background at start (else at the first batch)


def host_of(address: str) -> str:
    """The host of HOST:PORT (an IPv6 host without its brackets)."""
    return address.rsplit(":", 1)[0].strip("[]")


class Node:
    """One running node of the cluster."""

    def __init__(self, config: NodeConfig):
        self.config = config
        self.node_id = config.node_id
        self.data_dir = Path(config.data_dir).expanduser().resolve()  # Spark takes file URIs: absolute paths only
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.injections = Injections()
        self.metrics = NodeMetrics()
        self.inflight = InflightWrites()
        self._clock = HybridClock()
        self._clock_lock = threading.Lock()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._join_failure = ""
        self._schema_changed = threading.Event()
        self.store = NodeStore(config.storage_url) if config.storage_url else NodeStore.for_data_dir(self.data_dir)
        self.group0 = Group0(
            node_id=config.node_id, raft_addr=config.raft_addr,
            peers={peer_id: raft for peer_id, (_, raft) in config.peers.items()},
            data_dir=self.data_dir / "raft", state_machine=Group0State(),
            password=config.raft_password,
            on_applied=self._on_applied,
        )
        self._tls = None if config.insecure else security.load_node_material(
            Path(config.certs_dir or self.data_dir).expanduser().resolve())
        if config.insecure:
            log.warning("node %s serves gRPC WITHOUT TLS (--insecure): any host that reaches %s can read and write "
                        "every table and act as a node of the cluster", config.node_id, config.grpc_addr)
        self.peers = Peers(self._grpc_address_of,
                           credentials=None if self._tls is None else security.channel_credentials(self._tls))
        transport = InternodeTransport(self.peers)
        self.staged_registry = StagedRegistry(self.node_id, self.group0)
        self.local = LocalData(self.node_id, self.store, SchemaAccess(self.group0.read, self.catch_up, self.inflight),
                               transport, self.injections, self.metrics, read_outbox_version_1=batch_from_proto_bytes,
                               register_staged=self.staged_registry)
        self.writer = WriteCoordinator(self.node_id, self.group0.read, self.local, transport, self.injections,
                                       track_write=lambda: self.inflight.track(self.schema_version))
        self.reader = ReadCoordinator(self.node_id, self.group0.read, self.local, transport)
        self.executor = Executor(self.group0, self.writer, self.reader, self.now, self.injections, self.metrics,
                                 config.limits, schema_agreement=self.schema_agreement,
                                 cluster_name=config.cluster_name)
        self._transport = transport
        self.endpoint = InternodeEndpoint(self.node_id, self.local, self.local_status, transport, self.peers)
        self.spark = NodeSpark(SparkConfig(master=config.spark_master, driver_memory=config.spark_memory,
                                           java_options=config.spark_java_options, data_dir=str(self.data_dir),
                                           driver_host=config.spark_driver_host or host_of(config.grpc_addr),
                                           remote=config.spark_remote))
        self.ledger = FinishedTaskLedger.for_data_dir(self.data_dir)
        self.view_row_holds = ViewRowHolds(self.node_id, self.group0, self.local, self.store)
        self.build_job = BuildJob(self.node_id, self.store, self.spark, self.group0.read,
                                  lambda version: self.wait_schema_applied(version, SCHEMA_WAIT_TIMEOUT),
                                  self.endpoint.merge_view_rows, self.injections,
                                  track_write=lambda: self.inflight.track(self.schema_version),
                                  read_view_rows=self.endpoint.view_rows,
                                  delete_view_rows=self.endpoint.delete_view_rows,
                                  chunking=Chunking(self.ledger, self._chunk_rows, self._report_task_progress,
                                                    throttle=Throttle(self._build_rate),
                                                    paused=lambda: self.group0.read(lambda s: frozenset(
                                                        s.paused_views))),
                                  unreachable=self.view_row_holds)
        self._parallel_batches = max(2, config.shards)
        self.staging_job = StagingJob(self.local.staging, self._chunk_rows, self.injections)
        self.worker = WorkerExecutor(self.node_id, self.ledger, lambda: self.group0.read(lambda s: dict(s.tasks)),
                                     self._run_batch, lambda: self.group0.term, max_parallel=self._parallel_batches)
        self._worker_client = WorkerClient(self.peers.channel)
        self.view_building = ViewBuildingLoop(
            group0=self.group0, leadership=self.group0.leadership, send_batch=self._worker_client.send_batch,
            applied_index=lambda: self.group0.applied_index,
            injections=self.injections, metrics=self.metrics)
        self.migrations = MigrationDriver(group0=self.group0, leadership=self.group0.leadership, calls=MigrationCalls(
            barrier=transport.write_barrier,
            stream=lambda *args: transport.stream_tablet(*args),
            cleanup=lambda *args: transport.cleanup_tablet(*args)), injections=self.injections, metrics=self.metrics,
            node_id=self.node_id, leave=lambda: os.kill(os.getpid(), signal.SIGTERM))
        self._last_prune = 0.0
        self._health = HealthService()
        self._internode_calls = OpenCalls(INTERNODE_OPEN_CALLS)
        self._sessions = OpenCalls(CLIENT_SESSIONS)
        self._server = self._build_server()
        self._cql = None if not config.cql_addr else CqlEndpoint(
            config.cql_addr, self.node_id, config.cluster_name, self.executor, self.group0.read, self._authenticator,
            Path(config.certs_dir or self.data_dir), self.metrics)
        self._threads: list[threading.Thread] = []
        self._metrics_server = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._server.start()
        if self._cql is not None:
            self._cql.start()
            log.info("node %s serving CQL on %s", self.node_id, self._cql.address)
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.group0.start()
        self.view_building.start()
        self.migrations.start()
        bulk.prestart_children(self.store, self._parallel_batches)
        if self.config.spark_prestart:
            self.spark.prestart(lambda spark, stopping: warm_up(spark, stopping,
                                                                busy=lambda: self.worker.running_batches() > 0))
        if self.config.metrics_addr:
            self._start_metrics(self.config.metrics_addr)
        for target, name in ((self._join, "join"), (self._watch_schema, "schema-watch"),
                             (self._flush_outbox_loop, "outbox"), (self._checkpoint_loop, "checkpoint")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("node %s serving gRPC on %s, Raft on %s", self.node_id, self.config.grpc_addr, self.config.raft_addr)
        if self.config.enable_injections:
            log.warning("fault injection is enabled (--enable-injections): any host that reaches %s can stall or "
                        "fail this node; leave it off outside tests and local clusters", self.config.grpc_addr)

    def stop(self) -> None:
        self._stopping.set()
        self._schema_changed.set()
        self.injections.disable_all()
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.view_building.stop()
        self.migrations.stop()
        self._worker_client.close()
        self.worker.close(wait=False)
        self._sessions.end_all()
        if self._cql is not None:
            self._cql.stop()
        self._internode_calls.end_all()
        self._server.stop(grace=2.0).wait(5.0)
        self._admin.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        for thread in self._threads:
            thread.join(timeout=5.0)
        self.spark.stop()
        self.group0.close()
        self.peers.close()
        self.ledger.close()
        bulk.shutdown()
        self.store.close()
        log.info("node %s stopped", self.node_id)

    def _build_server(self) -> grpc.Server:
        threads = GRPC_WORKERS + INTERNODE_OPEN_CALLS + CLIENT_SESSIONS
        authenticator = self._authenticator = (None if self._tls is None
                                               else security.Authenticator(self.group0.read, self.metrics.failed_logins))
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
                             options=SERVER_OPTIONS,
                             interceptors=() if authenticator is None else (security.Access(authenticator),))
        rpc.add_ClientServicer_to_server(ClientService(
            self.executor, self.metrics.statement_errors, self._sessions,
            principal_of=None if authenticator is None else authenticator.principal,
            **({} if authenticator is None else {"still_allowed": authenticator.still_allowed})), server)
        self._admin = AdminService(AdminDeps(
            node_id=self.node_id, read_state=self.group0.read, raft_status=self.group0.status,
            require_ready=self.require_ready, probe=self.endpoint.local_status, injections=self.injections,
            catch_up=self._status_barrier, clock=time.monotonic, check_view=self.check_view,
            injections_enabled=self.config.enable_injections,
            propose=lambda command: self.group0.propose(command, timeout=20.0),
            add_member=lambda raft_addr: self.group0.add_member(raft_addr, timeout=20.0)))
        rpc.add_AdminServicer_to_server(self._admin, server)
        rpc.add_InternodeServicer_to_server(InternodeService(InternodeDeps(
            replica=self.local, observe_timestamp=self.observe_timestamp, local_status=self.local_status,
            wait_schema_applied=self.wait_schema_applied, wait_schema_version=self.wait_schema_version,
            wait_view_updates=self.wait_view_updates_delivered,
            open_calls=self._internode_calls, raft_term=lambda: self.group0.term)), server)
        rpc.add_WorkerServicer_to_server(
            WorkerService(self.worker, self.catch_up_index, self.injections), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = [pb.DESCRIPTOR.services_by_name[s].full_name for s in ("Client", "Admin", "Internode", "Worker")]
        reflection.enable_server_reflection(names + [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                                     reflection.SERVICE_NAME], server)
        port = (server.add_insecure_port(self.config.grpc_addr) if self._tls is None
                else server.add_secure_port(self.config.grpc_addr, security.server_credentials(self._tls)))
        if port == 0:
            raise OSError(f"cannot listen for gRPC on {self.config.grpc_addr}: port in use or address not local")
        if self.config.client_addr:
            self._add_client_port(server)
        return server

    def _add_client_port(self, server: grpc.Server) -> None:
        """The port for password logins: TLS without client certificates (plaintext on an insecure node)."""
        address = self.config.client_addr
        port = (server.add_insecure_port(address) if self._tls is None
                else server.add_secure_port(address, security.client_server_credentials(self._tls)))
        if port == 0:
            raise OSError(f"cannot listen for client logins on {address}: port in use or address not local")
        log.info("node %s serving client logins on %s", self.node_id, address)

    def _set_health(self, status) -> None:
        for name in ("", "vbc.v1.Client", "vbc.v1.Admin", "vbc.v1.Internode", "vbc.v1.Worker"):
            self._health.set(name, status)

    def _start_metrics(self, address: str) -> None:
        self.metrics.bind_gauges(
            outbox_pending=self.store.outbox_size, raft_term=lambda: self.group0.term,
            raft_applied=lambda: self.group0.applied_index, raft_leader=lambda: 1 if self.group0.is_leader else 0,
            schema_version=self.schema_version)
        self.metrics.bind_worker(self.worker_stats)
        tls = {}
        if self.config.metrics_tls:
            folder = Path(self.config.certs_dir or self.data_dir)
            tls = {"certfile": str(folder / security.NODE_CERT), "keyfile": str(folder / security.NODE_KEY)}
        self._metrics_server, _ = serve_metrics(address, self.metrics.registry, **tls)

    def _run_batch(self, start: StartBatch, control: BatchControl):
        """A batch of process_staging tasks moves staged rows into the base; any other builds views."""
        if start.tasks and start.tasks[0].type == TASK_PROCESS_STAGING:
            return self.staging_job(start, control)
        return self.build_job(start, control)

    def _chunk_rows(self) -> int:
        return self.group0.read(lambda state: chunk_limit(state.build_settings))

    def _build_rate(self) -> int:
        return self.group0.read(lambda state: state.build_settings.rate_rows_per_s)

    def _report_task_progress(self, rows: Mapping[str, int]) -> None:
        """The rows each task's running batch scanned so far, to group0 (the views' rows_done)."""
        task_ids = tuple(sorted(rows))
        self.group0.propose(RecordTaskProgress(cmd_id=uuid.uuid4().hex, task_ids=task_ids,
                                               rows_scanned=tuple(rows[t] for t in task_ids)), timeout=5.0)

    def _join(self) -> None:
        """Register this node in group0 (retrying until a leader commits it), then report SERVING."""
        config = self.config
        cql = self._cql.address if self._cql is not None else ""
        command = RegisterNode(node_id=self.node_id, grpc=config.grpc_addr, raft=config.raft_addr, shards=config.shards,
                               cql=cql, cmd_id=f"register/{self.node_id}/{config.grpc_addr}/{config.raft_addr}/"
                                               f"{config.shards}/{cql}")
        while not self._stopping.is_set():
            try:
                outcome = self.group0.propose(command, timeout=5.0)
            except Group0Unavailable as error:
                log.info("waiting to join group0: %s", error)
                continue
            except StateMachineError as error:
                self._join_failure = f"group0 failed to apply its registration (a bug): {error}"
                log.error("%s", self._join_failure)
                return
            if not outcome.ok:
                self._join_failure = f"group0 refused this node: {outcome.error_message}"
                log.error("%s", self._join_failure)
                return
            self._ready.set()
            self._set_health(health_pb2.HealthCheckResponse.SERVING)
            log.info("node %s joined group0", self.node_id)
            self.staged_registry.register_again(self.local.staging, self._stopping)
            return

    def require_ready(self) -> None:
        if not self._ready.is_set():
            if self._join_failure:
                raise Unavailable(f"node {self.node_id} cannot serve: {self._join_failure}; see its log")
            leader = self.group0.leader_id or "none yet"
            raise Unavailable(f"node {self.node_id} is starting: waiting to join group0 (Raft leader: {leader})")

    # ------------------------------------------------------------ background loops

    def _on_applied(self, _index: int) -> None:
        """group0 applied a command (on the Raft thread: only wake-ups here)."""
        self._schema_changed.set()
        for loop in (getattr(self, "view_building", None), getattr(self, "migrations", None)):
            if loop is not None:  # None while the constructor is still running
                loop.notify_applied()

    def _watch_schema(self) -> None:
        """After each applied command: drop the storage of dropped tables and create that of new ones, wake
        schema-barrier waiters, let the worker's batches follow deleted or aborted tasks, and prune the worker's
        ledger now and then."""
        seen_version = -1
        while not self._stopping.is_set():
            self._schema_changed.wait(LEDGER_PRUNE_INTERVAL)
            self._schema_changed.clear()
            self.inflight.notify()
            self._follow_tasks()
            try:
                version = self.schema_version()
                if version != seen_version:
                    self.local.drop_dropped_tables()
                    self.local.create_new_tables()
                    seen_version = version
                if self._cql is not None:
                    self._cql.state_applied()
            except Exception:  # noqa: BLE001 - keep watching; the next schema change retries
                log.exception("creating or dropping the storage of tables failed; will retry")

    def _follow_tasks(self) -> None:
        try:
            self.worker.tasks_changed()
            if self._ready.is_set() and time.monotonic() - self._last_prune >= LEDGER_PRUNE_INTERVAL:
                self.worker.prune()
                self._last_prune = time.monotonic()
        except Exception:  # noqa: BLE001 - the next applied command retries
            log.exception("updating the view building worker after a group0 change failed; will retry")

    def _flush_outbox_loop(self) -> None:
        while not self._stopping.wait(OUTBOX_FLUSH_INTERVAL):
            try:
                self.local.flush_outbox()
                self.view_row_holds.release_delivered()
            except Exception:  # noqa: BLE001 - the loop must survive; the entries stay queued
                log.exception("flushing view updates failed; will retry")

    def _checkpoint_loop(self) -> None:
        last = time.monotonic()
        while not self._stopping.wait(WAL_CHECKPOINT_INTERVAL):
            overdue = time.monotonic() - last >= WAL_CHECKPOINT_MAX_AGE
            try:
                if self.store.checkpoint(min_writes=1 if overdue else WAL_CHECKPOINT_WRITES) is not None:
                    last = time.monotonic()
            except Exception:  # noqa: BLE001 - the loop must survive; a write checkpoints itself meanwhile
                log.exception("checkpointing the store's WAL failed; will retry")

    # ------------------------------------------------------------ services for the roles

    def now(self) -> int:
        with self._clock_lock:
            return self._clock.now(time.time_ns() // 1000)

    def observe_timestamp(self, micros: int) -> None:
        with self._clock_lock:
            self._clock.observe(micros, time.time_ns() // 1000, MAX_CLOCK_SKEW_MICROS)

    def _grpc_address_of(self, node_id: str) -> str | None:
        member = self.group0.read(lambda s: s.nodes.get(node_id))
        if member is not None:
            return member.grpc
        if node_id == self.node_id:
            return self.config.grpc_addr
        peer = self.config.peers.get(node_id)
        return peer[0] if peer else None

    def schema_version(self) -> int:
        return self.group0.read(lambda s: s.schema_version)

    def catch_up(self, version: int) -> None:
        """Make sure this node has applied schema `version` (a sender saw it, so it is committed)."""
        if self.group0.wait_for(lambda s: s.schema_version >= version, CATCH_UP_WAIT):
            return
        self._barriers_until(lambda: self.schema_version() >= version,
                             lambda: f"has schema version {self.schema_version()}, the request needs {version}")

    def catch_up_index(self, index: int) -> None:
        """Make sure this node has applied group0 up to `index` (a leader applied it, so it is committed)."""
        if self.group0.applied_index >= index or self.group0.wait_applied(index, CATCH_UP_WAIT):
            return
        self._barriers_until(lambda: self.group0.applied_index >= index,
                             lambda: f"applied group0 up to {self.group0.applied_index}, the request needs {index}")

    def _barriers_until(self, caught_up: Callable[[], bool], behind: Callable[[], str]) -> None:
        """Read barriers until `caught_up()`, for CATCH_UP_TIMEOUT at most: each in a short slice, so that one sent to
        a leader that stepped down or left (a drained leader stops itself) is sent again to the next leader."""
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        last_error = ""
        while not self._stopping.is_set():
            try:
                self.group0.barrier(timeout=max(0.1, min(BARRIER_SLICE, deadline - time.monotonic())))
            except Group0Unavailable as error:
                last_error = f" ({error})"
            if caught_up():
                return
            if time.monotonic() >= deadline:
                break
        raise Unavailable(f"node {self.node_id} {behind()} after read barriers for {CATCH_UP_TIMEOUT:g}s{last_error}")

    def _status_barrier(self) -> None:
        """Before answering a status: apply what the leader has applied, so progress read here never goes back.

        Asks the leader for its applied index and waits for it (no Raft entry is written: status is polled)."""
        leader = self.group0.leader_id
        if not leader or leader == self.node_id:
            return
        local = self.endpoint.local_status(leader)
        if local is not None:
            self.group0.wait_applied(local.applied_index, 1.0)

    def check_view(self, keyspace: str, name: str, max_examples: int) -> CheckResult:
        """`vbc check`: compare the view with its function of the base table (worker/check.py)."""
        self._status_barrier()
        plan = self.group0.read(lambda s: check_plan(s, keyspace, name))
        return check_view(plan, self.endpoint.read_range, self.spark, max_examples)

    def worker_stats(self) -> dict:
        """The worker's counters, its Spark session's state and its failing views (the fields of pb.WorkerStats)."""
        build, counters, spark = self.build_job.stats, self.worker.counters, self.spark.state
        return {"spark_jobs": build.spark_jobs, "tablet_scans": build.tablet_scans, "rows_scanned": build.rows_scanned,
                "tasks_finished": counters.tasks_finished,
                "tasks_answered_from_ledger": counters.tasks_answered_from_ledger,
                "batches_running": self.worker.running_batches(), "batches_failed": counters.batches_failed,
                "spark_state": spark.state, "spark_error": spark.error, "spark_start_s": spark.start_seconds,
                "view_rows_repaired": build.view_rows_repaired,
                "read_s": build.read_seconds, "spark_s": build.spark_seconds, "merge_s": build.merge_seconds,
                "throttled_s": build.throttled_seconds, "view_rows_kept": build.view_rows_kept,
                "failures": [{"view_id": f.view_id, "error": f.error, "attempts": f.attempts}
                             for f in self.worker.failures()]}

    def wait_schema_applied(self, version: int, timeout: float) -> None:
        if not self.inflight.wait_applied(version, self.schema_version, timeout):
            raise Unavailable(f"node {self.node_id} did not apply schema version {version} within {timeout:g}s "
                              "(writes started under an older schema are still running)")

    def wait_view_updates_delivered(self, timeout: float) -> None:
        """Deliver the view updates queued so far (flushing the outbox meanwhile); Unavailable after `timeout`."""
        upto = self.store.outbox_last_id()
        deadline = time.monotonic() + timeout
        dead = self.group0.read(dead_nodes)  # their view replicas are rebuilt elsewhere: nothing to wait for
        while self.store.outbox_holds_upto(upto, dead):
            if time.monotonic() >= deadline or self._stopping.is_set():
                raise Unavailable(f"node {self.node_id} still holds view updates queued before this barrier after "
                                  f"{timeout:g}s (a view replica it sends to is unreachable?)")
            self.local.flush_outbox()
            self._stopping.wait(VIEW_UPDATE_POLL)

    def wait_schema_version(self, version: int, timeout: float) -> None:
        if not self.inflight.wait_version(version, self.schema_version, timeout):
            raise Unavailable(f"node {self.node_id} has not applied schema version {version} within {timeout:g}s")

    def schema_agreement(self, version: int) -> list[str]:
        """Wait until every other node of the cluster applied schema `version`; those that did not confirm."""
        others = self.group0.read(lambda s: sorted(node for node in s.nodes if node != self.node_id))
        return self._transport.schema_agreement(others, version)

    def local_status(self, state_digest: bool = False) -> pb.LocalStatusResponse:
        digest, digest_index = self.group0.read(lambda s: (s.digest(), self.group0.applied_index)) if (
            state_digest) else ("", 0)
        return pb.LocalStatusResponse(
            state_digest=digest, digest_applied_index=digest_index,
            node_id=self.node_id, schema_version=self.inflight.applied_version(self.schema_version()),
            applied_index=self.group0.applied_index, pending_view_updates=self.store.outbox_size(),
            term=self.group0.term, leader=self.group0.leader_id or "", worker=pb.WorkerStats(**self.worker_stats()),
            raft_secret_fingerprint=secret_fingerprint(self.config.raft_password), insecure=self.config.insecure,
            streams=[pb.TabletStreamProgress(migration_id=p.migration_id, table_id=p.table_id,
                                             source_node=p.source_node, rows=p.rows, seconds=p.seconds,
                                             rows_per_s=p.rows_per_s) for p in self.local.tablet_stream_progress()],
        )


def freeze_startup_objects() -> None:
    """Keep the objects alive after start (modules, services, the Spark gateway) out of the collector's full
    passes: measured, a full pass over them took ~60 ms and stalled every request running meanwhile."""
    gc.collect()
    gc.freeze()


def serve(config: NodeConfig) -> None:
    """Run a node in the foreground until SIGTERM or SIGINT, then stop it cleanly."""
    logging.basicConfig(level=os.environ.get("VBC_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    node = Node(config)
    node.start()
    freeze_startup_objects()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        node.stop()
