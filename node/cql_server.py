"""The node's CQL native protocol server: a listening socket (TLS with the node's certificate), a thread reading each
connection, and a pool running its statements, whose answers go out as they finish (matched by stream id)."""
from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent import futures

from cql.native_connection import MAX_FRAME, MAX_IN_FLIGHT, Close, Login, NativeConnection, Run, Send

from .cql_requests import NativeStatements, Session

log = logging.getLogger(__name__)

STATEMENT_THREADS = 32  # statements of every connection run at once on this many threads
READ_BYTES = 256 * 1024
HANDSHAKE_TIMEOUT_S = 10.0


class CqlServer:
    """Serves CQL's native protocol v4 on `address` (HOST:PORT; port 0 picks a free one, see `port`).

    `login_for(client host)` gives a connection's password check (None: no authentication, every statement runs
    for `open_principal`)."""

    def __init__(self, address: str, statements: NativeStatements, login_for: Callable[[str], Login] | None,
                 ssl_context: ssl.SSLContext | None, open_principal: object = None,
                 max_frame: int = MAX_FRAME, max_in_flight: int = MAX_IN_FLIGHT,
                 on_connections: Callable[[int], None] = lambda count: None):
        self._statements = statements
        self._login_for = login_for
        self._ssl = ssl_context
        self._open_principal = open_principal
        self._max_frame = max_frame
        self._max_in_flight = max_in_flight
        self._on_connections = on_connections
        host, _, port = address.rpartition(":")
        self._listener = socket.create_server((host.strip("[]"), int(port)), backlog=512,
                                              family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.port = self._listener.getsockname()[1]
        self._pool = futures.ThreadPoolExecutor(max_workers=STATEMENT_THREADS, thread_name_prefix="cql")
        self._connections: dict[socket.socket, _Connection] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._accepting = threading.Thread(target=self._accept, name="cql-accept", daemon=True)

    def start(self) -> None:
        self._accepting.start()

    def stop(self) -> None:
        self._stopping.set()
        self._listener.close()
        with self._lock:
            sockets = list(self._connections)
        for sock in sockets:
            _close(sock)
        self._accepting.join(timeout=5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(sock, peer), name=f"cql-{peer[1]}", daemon=True).start()

    def _serve(self, sock: socket.socket, peer) -> None:
        try:
            sock = self._secured(sock)
        except (OSError, ssl.SSLError) as error:
            log.info("CQL connection from %s refused during the TLS handshake: %s", peer[0], error)
            _close(sock)
            return
        connection = _Connection(sock, self._protocol_state(peer[0]), self._statements, self._pool)
        with self._lock:
            self._connections[sock] = connection
            self._on_connections(len(self._connections))
        try:
            connection.serve()
        except OSError:
            pass  # the client went away
        finally:
            _close(sock)
            with self._lock:
                self._connections.pop(sock, None)
                self._on_connections(len(self._connections))

    def push(self, event_type: str, frame: bytes) -> None:
        """Send an EVENT to every connection registered for `event_type` (REGISTER)."""
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            connection.push(event_type, frame)

    def _secured(self, sock: socket.socket) -> socket.socket:
        if self._ssl is None:
            return sock
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        secured = self._ssl.wrap_socket(sock, server_side=True)
        secured.settimeout(None)
        return secured

    def _protocol_state(self, host: str) -> NativeConnection:
        login = None if self._login_for is None else self._login_for(host)
        return NativeConnection(login, self._max_frame, self._max_in_flight, self._open_principal)


class _Connection:
    """One client connection: reads while the protocol state wants data, hands statements to the pool."""

    def __init__(self, sock: socket.socket, state: NativeConnection, statements: NativeStatements,
                 pool: futures.ThreadPoolExecutor):
        self._sock = sock
        self._state = state
        self._statements = statements
        self._pool = pool
        self._session = Session()
        self._send_lock = threading.Lock()
        self._room = threading.Condition()
        self._open = True

    def serve(self) -> None:
        while self._open:
            with self._room:
                self._room.wait_for(lambda: self._state.wants_data or not self._open)
            data = self._sock.recv(READ_BYTES)
            if not data:
                return
            with self._room:
                actions = self._state.receive(data)
            for action in actions:
                self._act(action)

    def _act(self, action: Send | Close | Run) -> None:
        if isinstance(action, Run):
            self._pool.submit(self._run, action)
            return
        self._send(action.frame)
        if isinstance(action, Close):
            self._open = False
            self._sock.shutdown(socket.SHUT_RDWR)

    def _run(self, run: Run) -> None:
        try:
            frame = self._statements.answer(run, self._session)
            self._send(frame)
        except OSError:
            pass  # the client went away: its answer has nowhere to go
        finally:
            with self._room:
                self._state.answered(run.stream)
                self._room.notify_all()

    def push(self, event_type: str, frame: bytes) -> None:
        with self._room:
            wanted = event_type in self._state.registered
        if wanted:
            try:
                self._send(frame)
            except OSError:
                pass  # the client went away: its reader ends the connection

    def _send(self, frame: bytes) -> None:
        with self._send_lock:
            self._sock.sendall(frame)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def server_ssl_context(certificate: str, key: str) -> ssl.SSLContext:
    """TLS with the node's certificate, no client certificate asked (clients log in by password)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate, key)
    return context
