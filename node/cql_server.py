"""The node's CQL native protocol server: a listening socket (TLS with the node's certificate), a reader and a writer
thread per connection, and a pool running the statements of every connection, whose answers go out as they finish
(matched by stream id)."""
from __future__ import annotations

import collections
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent import futures

from cql.native_connection import MAX_FRAME, MAX_IN_FLIGHT, Close, Login, NativeConnection, Run, Send

from .cql_requests import NativeStatements, Session

log = logging.getLogger(__name__)

STATEMENT_THREADS = 32  # statements of every connection run at once on this many threads
STATEMENTS_PER_CONNECTION = 8  # of them, one connection's at most (the rest wait in its queue): one client cannot
# take every thread
MAX_CONNECTIONS = 2048  # a connection above it is closed at once
READ_BYTES = 256 * 1024
HANDSHAKE_TIMEOUT_S = 10.0
LOGIN_TIMEOUT_S = 30.0  # a connection that has not logged in by then is closed
MAX_QUEUED_EVENTS = 1000  # pushed events a client has not read yet; past it the connection is closed


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
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() that close() alone would leave blocked
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for sock in self._connections:
                _close(sock)
        self._accepting.join(timeout=5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def push(self, event_type: str, frame: bytes) -> None:
        """Queue an EVENT for every connection registered for `event_type` (REGISTER); never blocks."""
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            connection.push(event_type, frame)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError:
                return
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                threading.Thread(target=self._serve, args=(sock, peer), name=f"cql-{peer[1]}", daemon=True).start()
            except (OSError, RuntimeError) as error:  # no thread to spare: this one is refused, the next may not be
                log.warning("CQL connection from %s refused: %s", peer[0], error)
                _close(sock)

    def _serve(self, sock: socket.socket, peer) -> None:
        try:
            sock = self._secured(sock)
        except (OSError, ssl.SSLError) as error:
            log.info("CQL connection from %s refused during the TLS handshake: %s", peer[0], error)
            _close(sock)
            return
        connection = _Connection(sock, self._protocol_state(peer[0]), self._statements, self._pool)
        if not self._register(sock, connection, peer):
            return
        try:
            connection.serve()
        except OSError:
            pass  # the client went away, or did not log in in time
        finally:
            connection.close()
            with self._lock:
                self._connections.pop(sock, None)
                self._on_connections(len(self._connections))

    def _register(self, sock: socket.socket, connection: _Connection, peer) -> bool:
        with self._lock:
            if self._stopping.is_set() or len(self._connections) >= MAX_CONNECTIONS:
                refused = True
            else:
                refused = False
                self._connections[sock] = connection
                self._on_connections(len(self._connections))
        if refused:
            log.warning("CQL connection from %s closed: the node is stopping or serves %d connections already",
                        peer[0], MAX_CONNECTIONS)
            _close(sock)
        return not refused

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


class _Channel:
    """A connection's socket, non-blocking, read by the reader and written by the writer in turn: an SSL object must
    not read and write at once from two threads."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self._sock = sock
        self._lock = threading.Lock()

    def recv(self, size: int, timeout: float | None) -> bytes:
        """Up to `size` bytes (b"" once the client closed); TimeoutError after `timeout` seconds without any."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                try:
                    return self._sock.recv(size)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                    if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
                        continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError("no data in time")
            self._wait(select.POLLIN, remaining)

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            with self._lock:
                try:
                    view = view[self._sock.send(view):]
                    continue
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                    pass
            self._wait(select.POLLOUT, 1.0)

    def _wait(self, events: int, timeout: float | None) -> None:
        poller = select.poll()
        poller.register(self._sock.fileno(), events | select.POLLERR | select.POLLHUP)
        poller.poll(None if timeout is None else max(1, int(timeout * 1000)))


class _Connection:
    """One client connection: its reader hands statements to the pool (a few at a time, the rest queued), its writer
    sends answers and events in the order they are ready; nothing but the writer blocks on the client's socket."""

    def __init__(self, sock: socket.socket, state: NativeConnection, statements: NativeStatements,
                 pool: futures.ThreadPoolExecutor):
        self._sock = sock
        self._channel = _Channel(sock)
        self._state = state
        self._statements = statements
        self._pool = pool
        self._session = Session()
        self._room = threading.Condition()  # guards the protocol state, the queues and `_open`
        self._waiting: collections.deque[Run] = collections.deque()
        self._running = 0
        self._outbox: collections.deque[tuple[bytes, int | None, bool]] = collections.deque()  # frame, stream, event
        self._events = 0
        self._open = True
        self._writer = threading.Thread(target=self._write, name="cql-writer", daemon=True)

    def serve(self) -> None:
        self._writer.start()
        while True:
            with self._room:
                self._room.wait_for(lambda: self._state.wants_data or not self._open)
                if not self._open:
                    return
                timeout = None if self._state.authenticated else LOGIN_TIMEOUT_S
            data = self._channel.recv(READ_BYTES, timeout)
            if not data:
                return
            with self._room:
                for action in self._state.receive(data):
                    self._act(action)

    def close(self) -> None:
        with self._room:
            self._open = False
            self._waiting.clear()
            self._room.notify_all()
        _close(self._sock)

    def push(self, event_type: str, frame: bytes) -> None:
        with self._room:
            if not self._open or event_type not in self._state.registered:
                return
            if self._events >= MAX_QUEUED_EVENTS:
                log.warning("a CQL client does not read its events: its connection is closed")
                self._open = False
                self._room.notify_all()
                return
            self._events += 1
            self._outbox.append((frame, None, True))
            self._room.notify_all()

    def _act(self, action: Send | Close | Run) -> None:
        """Under `_room`."""
        if isinstance(action, Run):
            if self._running < STATEMENTS_PER_CONNECTION:
                self._running += 1
                self._pool.submit(self._run, action)
            else:
                self._waiting.append(action)
            return
        self._outbox.append((action.frame, None, False))
        if isinstance(action, Close):
            self._outbox.append((b"", None, False))  # after the error frame: the writer closes the connection
        self._room.notify_all()

    def _run(self, run: Run) -> None:
        while run is not None:
            try:
                frame = self._statements.answer(run, self._session)
            except Exception:  # noqa: BLE001 - answer() answers every failure; this is a bug, not the client's
                log.exception("a CQL request failed without an answer")
                frame = None
            with self._room:
                if frame is not None:
                    self._outbox.append((frame, run.stream, False))
                else:
                    self._state.answered(run.stream)
                self._room.notify_all()
                run = self._waiting.popleft() if self._waiting and self._open else None
                if run is None:
                    self._running -= 1

    def _write(self) -> None:
        """Send what is ready, in order; a stream's place is freed once its answer left (so the bound on running
        statements bounds the answers waiting here too)."""
        while True:
            with self._room:
                self._room.wait_for(lambda: self._outbox or not self._open)
                if not self._outbox:
                    return
                frame, stream, event = self._outbox.popleft()
            if not frame:
                self.close()
                return
            try:
                self._channel.sendall(frame)
            except OSError:
                self.close()
                return
            with self._room:
                if stream is not None:
                    self._state.answered(stream)
                if event:
                    self._events -= 1
                self._room.notify_all()


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
