"""Prometheus metrics of one node, in a registry of its own, and the HTTP endpoint that serves them."""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class NodeMetrics:
    """Every metric a node exports; each node (also several in one process) has its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.statements = Counter("vbc_statements_total", "Statements executed by this node as coordinator",
                                  ["kind"], registry=r)
        self.statement_errors = Counter("vbc_statement_errors_total", "Statements that failed, by gRPC status code",
                                        ["code"], registry=r)
        self.statement_seconds = Histogram("vbc_statement_seconds", "Statement latency at the coordinating node",
                                           ["kind"], registry=r)
        self.failed_logins = Counter("vbc_failed_logins_total", "Logins refused by this node, by reason",
                                     ["reason"], registry=r)
        self.rows_applied = Counter("vbc_rows_applied_total", "Rows whose stored state changed on this replica",
                                    ["role"], registry=r)
        self.view_updates_sent = Counter("vbc_view_updates_sent_total",
                                         "View mutations delivered to paired view replicas", registry=r)
        self.view_updates_deferred = Counter("vbc_view_updates_deferred_total",
                                             "View mutations whose delivery failed and stay queued in the outbox",
                                             registry=r)
        self.view_updates_dropped = Counter("vbc_view_updates_dropped_total",
                                            "Queued view mutations dropped because their node was removed from the "
                                            "cluster", registry=r)
        self.outbox_pending = Gauge("vbc_outbox_pending", "View mutations waiting in this node's outbox", registry=r)
        self.raft_term = Gauge("vbc_raft_term", "Current group0 Raft term", registry=r)
        self.raft_applied = Gauge("vbc_raft_applied_index", "group0 commands applied on this node", registry=r)
        self.raft_leader = Gauge("vbc_raft_is_leader", "1 when this node is the group0 leader", registry=r)
        self.schema_version = Gauge("vbc_schema_version", "Schema version applied on this node", registry=r)
        self.cql_connections = Gauge("vbc_cql_connections", "Open CQL native protocol connections", registry=r)
        # tablet migration's data plane
        self.tablet_rows_streamed = Counter("vbc_tablet_streamed_rows_total",
                                            "Rows this node pulled from source replicas and merged (tablet streams)",
                                            registry=r)
        self.tablet_streams = Counter("vbc_tablet_streams_total", "Tablet streams run on this node, by outcome",
                                      ["outcome"], registry=r)
        self.tablet_cleanup_rows = Counter("vbc_tablet_cleanup_rows_total",
                                           "Rows deleted by tablet cleanups on this node", registry=r)
        # the tablet migration driver (runs on the group0 leader only)
        self.migration_stages = Counter("vbc_tablet_migration_stage_changes_total",
                                        "Migration stages this node's driver proposed, by the stage entered",
                                        ["stage"], registry=r)
        self.migrations_ended = Counter("vbc_tablet_migrations_total",
                                        "Migrations this node's driver ended, by outcome (done, reverted)",
                                        ["outcome"], registry=r)
        # the view building loop (runs on the group0 leader only)
        self.view_building_rounds = Counter("vbc_view_building_loop_rounds_total",
                                            "Rounds of the view building loop", registry=r)
        self.view_building_batches_sent = Counter("vbc_view_building_batches_sent_total",
                                                  "WorkOnViewBuildingTasks batches sent by the loop", registry=r)
        self.view_building_batch_failures = Counter("vbc_view_building_batch_failures_total",
                                                    "View building batches that failed (retried with backoff)",
                                                    registry=r)
        self.view_building_tasks_finished = Counter("vbc_view_building_tasks_finished_total",
                                                    "View building tasks reported finished by workers", registry=r)
        self.view_building_flushes = Counter("vbc_view_building_flush_commands_total",
                                             "FinishViewBuildingTasks commands proposed by the loop", registry=r)

    def bind_gauges(self, *, outbox_pending: Callable[[], float], raft_term: Callable[[], float],
                    raft_applied: Callable[[], float], raft_leader: Callable[[], float],
                    schema_version: Callable[[], float]) -> None:
        """Make the gauges read live values when scraped."""
        self.outbox_pending.set_function(outbox_pending)
        self.raft_term.set_function(raft_term)
        self.raft_applied.set_function(raft_applied)
        self.raft_leader.set_function(raft_leader)
        self.schema_version.set_function(schema_version)

    def bind_worker(self, stats: Callable[[], dict]) -> None:
        """Export the view building worker's counters (see WorkerCollector)."""
        self.registry.register(WorkerCollector(stats))


WORKER_COUNTERS = {
    "spark_jobs": "Spark jobs run by this node's view building worker",
    "tablet_scans": "Base tablet replicas scanned by view building batches",
    "rows_scanned": "Base rows scanned by view building batches",
    "tasks_finished": "View building tasks this worker finished and recorded in its ledger",
    "tasks_answered_from_ledger": "View building task ids answered from the ledger without running them again",
    "batches_failed": "View building batches that failed (the coordinator retries them)",
    "view_rows_repaired": "Stale view rows deleted by repair batches (after a base or view replica was lost)",
    "view_rows_kept": "View rows kept in the outbox for view replicas view building batches could not reach",
}
WORKER_SECONDS = {  # stats key -> (metric name, documentation): seconds spent by view building batches, per phase
    "read_s": ("read_seconds", "Seconds view building batches spent reading base tablet replicas"),
    "spark_s": ("spark_seconds", "Seconds view building batches spent in Spark"),
    "merge_s": ("merge_seconds", "Seconds view building batches spent merging view rows at their replicas"),
    "throttled_s": ("throttled_seconds", "Seconds view building batches waited out the build rate limit"),
}
SPARK_STATES = ("off", "starting", "warming", "ready", "failed")


class WorkerCollector(Collector):
    """The view building worker's counters, read from `stats()` (node.wiring's `worker_stats`: WORKER_COUNTERS,
    WORKER_SECONDS, `batches_running`, the Spark session's state and the failing views) when scraped."""

    def __init__(self, stats: Callable[[], dict]):
        self._stats = stats

    def collect(self):
        stats = self._stats()
        for name, documentation in WORKER_COUNTERS.items():
            family = CounterMetricFamily(f"vbc_worker_{name}", documentation)
            family.add_metric([], stats.get(name, 0))
            yield family
        for key, (name, documentation) in WORKER_SECONDS.items():
            family = CounterMetricFamily(f"vbc_worker_{name}", documentation)
            family.add_metric([], stats.get(key, 0.0))
            yield family
        yield gauge("vbc_worker_batches_running", "View building batches running on this node",
                    stats.get("batches_running", 0))
        yield from spark_metrics(stats)
        failing = GaugeMetricFamily("vbc_worker_view_failed_attempts",
                                    "View building batches of a view failed in a row on this node", labels=["view_id"])
        for failure in stats.get("failures", ()):
            failing.add_metric([failure["view_id"]], failure["attempts"])
        yield failing


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


def spark_metrics(stats: dict):
    """The Spark session's state (1 for the current one, 0 for the others) and the seconds its start took."""
    state = GaugeMetricFamily("vbc_worker_spark_state", "The node's Spark session state (1: current)",
                              labels=["state"])
    for name in SPARK_STATES:
        state.add_metric([name], 1 if stats.get("spark_state") == name else 0)
    yield state
    yield gauge("vbc_worker_spark_start_seconds", "Seconds the node's Spark session took to start and warm up",
                stats.get("spark_start_s", 0.0))


def serve_metrics(address: str, registry: CollectorRegistry, certfile: str | None = None,
                  keyfile: str | None = None):
    """Start the HTTP endpoint for `registry` on `address` (HOST:PORT), over HTTPS with `certfile` and `keyfile`;
    returns (server, thread)."""
    host, _, port = address.rpartition(":")
    return start_http_server(int(port), addr=host or "127.0.0.1", registry=registry, certfile=certfile,
                             keyfile=keyfile)
