"""Open `ReplicaWrites` calls to one peer, pooled: a replica write as one message each way on a call kept open.

A message on an open call costs gRPC Python about half the CPU and latency of a unary call on both nodes
(README, Benchmarks), and a single-row write is little else. Each stream carries one batch at a time: the
caller that took it sends a batch and reads its answer, then gives it back. A pool opens at most
`STREAMS_PER_PEER` streams (each holds a thread of the peer's server); a caller that finds them all busy, or
the peer draining, gets None and makes a unary call instead. `StreamWatch` cancels a stream whose answer is
late (the batch's deadline) and closes streams left idle, so a quiet peer's server threads are given back.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import grpc

from vbcpb import vbc_pb2 as pb
from vbcpb import vbc_pb2_grpc as rpc

STREAMS_PER_PEER = 4
IDLE_SECONDS = 30.0
WATCH_INTERVAL = 0.2

_END = object()


class WriteStream:
    """One open ReplicaWrites call."""

    def __init__(self, pool: StreamPool, stub: rpc.InternodeStub):
        self.pool = pool
        self.deadline: float | None = None  # monotonic seconds, while a batch is unanswered
        self.idle_since = 0.0
        self.timed_out = False
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._answers = stub.ReplicaWrites(iter(self._requests.get, _END))

    @property
    def alive(self) -> bool:
        return not self._answers.done()

    def send(self, batch: pb.MutationBatch, timeout: float, now: float) -> None:
        self.deadline = now + timeout
        self._requests.put(batch)

    def receive(self) -> pb.ReplicaOutcome:
        """The answer to the batch sent; raises grpc.RpcError (or StopIteration) when the call ended instead."""
        answer = next(self._answers)
        self.deadline = None
        return answer

    def close(self) -> None:
        self._requests.put(_END)
        self._answers.cancel()


class StreamPool:
    """The streams to one peer: taken for one batch, given back after its answer."""

    def __init__(self, stub: rpc.InternodeStub, draining: bool = False, limit: int = STREAMS_PER_PEER):
        self._stub = stub
        self._limit = limit
        self._idle: list[WriteStream] = []
        self._busy: set[WriteStream] = set()
        self._draining = draining
        self._closed = False
        self._lock = threading.Lock()

    def take(self) -> WriteStream | None:
        """An open stream for one batch, or None: all busy, the peer draining or the pool closed."""
        with self._lock:
            while self._idle:
                stream = self._idle.pop()
                if stream.alive:
                    self._busy.add(stream)
                    return stream
                stream.close()
            if self._draining or self._closed or len(self._busy) >= self._limit:
                return None
            stream = WriteStream(self, self._stub)
            self._busy.add(stream)
            return stream

    def give_back(self, stream: WriteStream, now: float) -> None:
        """Return a stream whose answer was read; it is closed instead if the peer is draining."""
        with self._lock:
            self._busy.discard(stream)
            if self._draining or self._closed or not stream.alive:
                stream.close()
                return
            stream.idle_since = now
            self._idle.append(stream)

    def discard(self, stream: WriteStream) -> None:
        """Close a stream whose call failed or was cancelled."""
        with self._lock:
            self._busy.discard(stream)
        stream.close()

    def drain(self, draining: bool) -> None:
        """The peer says it is stopping (True: close the idle streams and open no more) or serving again."""
        with self._lock:
            self._draining = draining
            idle, self._idle = (self._idle, []) if draining else ([], self._idle)
        for stream in idle:
            stream.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for stream in idle:
            stream.close()

    def expire(self, now: float) -> None:
        """Cancel the streams whose answer is past its deadline; close those idle for IDLE_SECONDS."""
        with self._lock:
            late = [s for s in self._busy if s.deadline is not None and now > s.deadline]
            stale = [s for s in self._idle if now - s.idle_since > IDLE_SECONDS]
            self._idle = [s for s in self._idle if now - s.idle_since <= IDLE_SECONDS]
        for stream in late:
            stream.timed_out = True
            stream.close()
        for stream in stale:
            stream.close()


class StreamWatch:
    """A thread that runs `expire` on every pool every WATCH_INTERVAL seconds."""

    def __init__(self, pools: Callable[[], list[StreamPool]], clock: Callable[[], float] = time.monotonic):
        self._pools = pools
        self._clock = clock
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._run, name="write-stream-watch", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(WATCH_INTERVAL):
            now = self._clock()
            for pool in self._pools():
                pool.expire(now)

