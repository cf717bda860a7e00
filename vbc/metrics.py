"""Prometheus metrics of a node (served over HTTP when the node is started with --metrics HOST:PORT)."""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

STATEMENTS = Counter("vbc_statements_total", "Statements executed by this node as coordinator", ["kind"])
STATEMENT_ERRORS = Counter("vbc_statement_errors_total", "Statements that failed, by gRPC status code", ["code"])
STATEMENT_SECONDS = Histogram("vbc_statement_seconds", "Statement latency at the coordinating node", ["kind"])
ROWS_APPLIED = Counter("vbc_rows_applied_total", "Rows whose stored state changed on this replica", ["role"])
VIEW_UPDATES_SENT = Counter("vbc_view_updates_sent_total", "View mutations delivered to paired view replicas")
VIEW_UPDATES_DEFERRED = Counter("vbc_view_updates_deferred_total",
                                "View mutations whose delivery failed and stay queued in the outbox")
OUTBOX_PENDING = Gauge("vbc_outbox_pending", "View mutations waiting in this node's outbox")
RAFT_TERM = Gauge("vbc_raft_term", "Current group0 Raft term")
RAFT_APPLIED = Gauge("vbc_raft_applied_index", "group0 commands applied on this node")
RAFT_LEADER = Gauge("vbc_raft_is_leader", "1 when this node is the group0 leader")
SCHEMA_VERSION = Gauge("vbc_schema_version", "Schema version applied on this node")


def serve_metrics(address: str, node) -> None:
    """Bind the node's live gauges and start the HTTP endpoint on `address` (HOST:PORT)."""
    host, _, port = address.rpartition(":")
    OUTBOX_PENDING.set_function(node.store.outbox_size)
    RAFT_TERM.set_function(lambda: node.group0.term)
    RAFT_APPLIED.set_function(lambda: node.group0.applied_index)
    RAFT_LEADER.set_function(lambda: 1 if node.group0.is_leader else 0)
    SCHEMA_VERSION.set_function(node.schema_version)
    start_http_server(int(port), addr=host or "127.0.0.1")
