"""Open bidirectional gRPC calls to one server, pooled: a request and its answer as one message each way.

A message on an open call costs gRPC Python about half the server CPU of a unary call (docs/architecture.md,
choices made for speed), and a single-row write is little else. Each stream carries one request at a time: the caller that took it
sends a request and reads its answer, then gives it back. A pool opens at most `STREAMS_PER_SERVER` streams
(each holds a thread of the server: `common.open_calls` bounds them there too); a caller that finds them all
busy, or the pool backing off, gets None and makes a unary call instead. A server that ends a stream without
answering (it is stopping, holds as many open calls as it may, or does not have the method) did not run
the request: the caller makes it a unary call, and the pool opens no stream to that server for
`BACKOFF_SECONDS`. `StreamWatch` cancels a stream whose answer is late (the request's deadline) and closes
streams left idle.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

import grpc

STREAMS_PER_SERVER = 4
IDLE_SECONDS = 30.0
BACKOFF_SECONDS = 5.0
WATCH_INTERVAL = 0.2

log = logging.getLogger(__name__)

_END = object()
# A call the server ended by cancelling it (common.open_calls.end_all), or a server without the method.
_UNANSWERED = (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNIMPLEMENTED)
# A call the server refused because it holds as many open calls as it may: its other calls stay good.
_REFUSED = grpc.StatusCode.RESOURCE_EXHAUSTED

OpenCall = Callable[[Iterator], Iterator]  # a stream-stream multi-callable: request iterator in, answers out


class Unanswered(Exception):
    """The server ended the stream without answering: the request did not run."""

    def __init__(self, refused: bool = False):
        super().__init__()
        self.refused = refused  # at its limit of open calls, not stopping


class Stream:
    """One open call."""

    def __init__(self, pool: StreamPool, open_call: OpenCall):
        self.pool = pool
        self.deadline: float | None = None  # monotonic seconds, while a request is unanswered
        self.idle_since = 0.0
        self.timed_out = False
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._answers = open_call(iter(self._requests.get, _END))

    @property
    def alive(self) -> bool:
        return not self._answers.done()

    def send(self, request, timeout: float, now: float) -> None:
        self.deadline = now + timeout
        self._requests.put(request)

    def receive(self):
        """The answer to the request sent.

        Raises Unanswered when the server ended the call first (normally, by cancelling it, refusing it at its
        limit, or not having the method), grpc.RpcError when the call failed otherwise (the request may have
        run) or when `timed_out` was set.
        """
        try:
            answer = next(self._answers)
        except StopIteration:
            raise Unanswered() from None
        except grpc.RpcError as error:
            if self.timed_out or self.pool.closed:
                raise
            if error.code() is _REFUSED:
                raise Unanswered(refused=True) from None
            if error.code() in _UNANSWERED:
                raise Unanswered() from None
            raise
        self.deadline = None
        return answer

    def close(self) -> None:
        self._requests.put(_END)
        self._answers.cancel()


class StreamPool:
    """The streams to one server: taken for one request, given back after its answer."""

    def __init__(self, open_call: OpenCall, limit: int = STREAMS_PER_SERVER):
        self._open_call = open_call
        self._limit = limit
        self._idle: list[Stream] = []
        self._busy: set[Stream] = set()
        self._backoff_until = 0.0
        self.closed = False
        self._lock = threading.Lock()

    def take(self, now: float) -> Stream | None:
        """An open stream for one request, or None: all busy, backing off, or the pool closed."""
        with self._lock:
            while self._idle:
                stream = self._idle.pop()
                if stream.alive:
                    self._busy.add(stream)
                    return stream
                stream.close()
            if self.closed or now < self._backoff_until or len(self._busy) >= self._limit:
                return None
            stream = Stream(self, self._open_call)
            self._busy.add(stream)
            return stream

    def give_back(self, stream: Stream, now: float) -> None:
        """Return a stream whose answer was read."""
        with self._lock:
            self._busy.discard(stream)
            if self.closed or stream.timed_out or not stream.alive:
                stream.close()
                return
            stream.idle_since = now
            self._idle.append(stream)

    def discard(self, stream: Stream, now: float, unanswered: Unanswered | None = None) -> None:
        """Close a stream whose call ended. One the server ended `unanswered` starts a back-off; unless it was
        refused at the server's limit, the server is stopping, so the idle streams to it are closed too."""
        with self._lock:
            self._busy.discard(stream)
            idle = []
            if unanswered is not None:
                self._backoff_until = now + BACKOFF_SECONDS
                if not unanswered.refused:
                    idle, self._idle = self._idle, []
        for each in (stream, *idle):
            each.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for stream in idle:
            stream.close()

    def expire(self, now: float) -> None:
        """Cancel the streams whose answer is past its deadline; close those idle for IDLE_SECONDS."""
        with self._lock:
            late = [s for s in self._busy if s.deadline is not None and now > s.deadline]
            for stream in late:  # marked under the lock: an answer arriving meanwhile closes it in give_back
                stream.timed_out = True
                self._busy.discard(stream)
            stale = [s for s in self._idle if now - s.idle_since > IDLE_SECONDS]
            self._idle = [s for s in self._idle if now - s.idle_since <= IDLE_SECONDS]
        for stream in late:
            stream.close()
        for stream in stale:
            stream.close()


class StreamWatch:
    """A thread that runs `expire` on every pool every WATCH_INTERVAL seconds, started with the first pool."""

    def __init__(self, pools: Callable[[], list[StreamPool]]):
        self._pools = pools
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._run, name="stream-watch", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(WATCH_INTERVAL):
            try:
                now = time.monotonic()
                for pool in self._pools():
                    pool.expire(now)
            except Exception:  # noqa: BLE001 - the watch is every stream's deadline: it must keep running
                log.exception("expiring open calls failed; retrying")


class StreamPools:
    """Pools by key (a server, or a server and a method), one StreamWatch over them all."""

    def __init__(self):
        self._pools: dict[object, StreamPool] = {}
        self._lock = threading.Lock()
        self._watch = StreamWatch(self._all)

    def get(self, key, open_call: Callable[[], OpenCall]) -> StreamPool:
        """The pool of `key`, made with the multi-callable `open_call()` gives the first time."""
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = self._pools[key] = StreamPool(open_call())
                self._watch.start()
            return pool

    def close(self, stop_watch: bool = False) -> None:
        """Close every pool (`get` makes new ones); with `stop_watch`, for good."""
        if stop_watch:
            self._watch.stop()
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()

    def discard(self, keys) -> None:
        """Close the pools of `keys` (their connections changed); `get` makes new ones."""
        with self._lock:
            pools = [self._pools.pop(key) for key in keys if key in self._pools]
        for pool in pools:
            pool.close()

    def _all(self) -> list[StreamPool]:
        with self._lock:
            return list(self._pools.values())


class Exchange:
    """A request sent on a stream of a pool; `answer` waits for its answer."""

    def __init__(self, stream: Stream, timeout: float, idempotent: bool):
        self._stream = stream
        self._timeout = timeout
        self._idempotent = idempotent

    def answer(self, unary: Callable[[], object]):
        """The stream's answer message, or `unary()` (the request again as a unary call) when the server ended
        the stream unanswered or, for an `idempotent` request, when the stream failed (so an answer may take up
        to the timeout on the stream plus the unary call's own). Raises grpc.RpcError as a unary call would;
        a StatusError DEADLINE_EXCEEDED when the answer is late."""
        stream, pool = self._stream, self._stream.pool
        try:
            answered = stream.receive()
        except Unanswered as unanswered:
            pool.discard(stream, time.monotonic(), unanswered)
            return unary()
        except grpc.RpcError:
            pool.discard(stream, time.monotonic())
            if stream.timed_out:
                raise StatusError("DEADLINE_EXCEEDED", f"no answer within {self._timeout:g} s") from None
            if self._idempotent:
                return unary()
            raise
        pool.give_back(stream, time.monotonic())
        return answered


def start_exchange(pool: StreamPool, request, timeout: float, idempotent: bool = False) -> Exchange | None:
    """Send `request` on a stream of `pool`; None when no stream is free (make it a unary call)."""
    stream = pool.take(time.monotonic())
    if stream is None:
        return None
    stream.send(request, timeout, time.monotonic())
    return Exchange(stream, timeout, idempotent)


class StatusError(grpc.RpcError):
    """An error given as a gRPC status code name and details (an answer's refusal, a late answer), raised as the
    error of a unary call would be: `code()` and `details()`."""

    def __init__(self, code: str, details: str):
        super().__init__(f"{code}: {details}")
        self._code = grpc.StatusCode[code] if code in grpc.StatusCode.__members__ else grpc.StatusCode.UNKNOWN
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details
