"""A node's CQL endpoint: its native protocol server wired to the executor, the roles and group0, and the events it
pushes when the cluster's schema or nodes change."""
from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from common.metrics import NodeMetrics
from coordinator.core.auth import CLUSTER, Principal
from coordinator.core.errors import ResourceExhausted, Unauthenticated
from cql import native_protocol as native, system_tables
from cql.executor import Executor

from . import security
from .cql_requests import NativeDeps, NativeStatements
from .cql_server import CqlServer, server_ssl_context


class CqlEndpoint:
    """CQL on `address`: TLS with the node's certificate in `certs_dir` and password logins through `authenticator`
    (plaintext and no login when the node is insecure: `authenticator` None)."""

    def __init__(self, address: str, node_id: str, cluster_name: str, executor: Executor, read_state: Callable,
                 authenticator: security.Authenticator | None, certs_dir: Path, metrics: NodeMetrics):
        self._read = read_state
        self._authenticator = authenticator
        statements = NativeStatements(NativeDeps(
            executor, read_state, system_tables.Asker(node_id, cluster_name),
            failed=lambda code: metrics.statement_errors.labels(code).inc(),
            **({} if authenticator is None else {"still_allowed": authenticator.still_allowed})))
        context = None if authenticator is None else server_ssl_context(str(certs_dir / security.NODE_CERT),
                                                                         str(certs_dir / security.NODE_KEY))
        self._server = CqlServer(address, statements, None if authenticator is None else self._login_for, context,
                                 open_principal=CLUSTER, on_connections=metrics.cql_connections.set)
        ip = ip_of(address.rpartition(":")[0].strip("[]"))
        self.address = f"[{ip}]:{self._server.port}" if ":" in ip else f"{ip}:{self._server.port}"
        self._shape: system_tables.Shape | None = None

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    def state_applied(self) -> None:
        """Tell the connections that asked (REGISTER) what changed in the schema and the nodes since last time."""
        shape = self._read(system_tables.shape)
        if self._shape is not None:
            for event in system_tables.events(self._shape, shape):
                frame = (native.schema_change_event(*event[1:]) if event[0] == "SCHEMA_CHANGE"
                         else native.topology_change_event(*event[1:]))
                self._server.push(event[0], frame)
        self._shape = shape

    def _login_for(self, host: str) -> Callable[[str, str], Principal]:
        def login(user: str, password: str) -> Principal:
            try:
                return self._authenticator.password_login(user, password, host)
            except (Unauthenticated, ResourceExhausted) as error:
                raise LookupError(error.message) from None
        return login


def ip_of(host: str) -> str:
    """`host` as an IP address (a name resolved once, at start: CQL's system tables hold addresses)."""
    try:
        return socket.getaddrinfo(host or "0.0.0.0", None)[0][4][0]
    except OSError:
        return host
