"""The open calls a node's server holds (replica write streams, client sessions): how many, and their end.

Each open call holds a thread of the server's pool for as long as it is open, so at most `limit` are held: a
call beyond that is refused at once (RESOURCE_EXHAUSTED, unanswered) and its caller turns to unary calls for a
while (common.stream_pool). When the node stops, `end_all` ends every open call without waiting for the
server's grace period: an idle one at once (cancelled), a busy one after its answer. A call never runs a
request it received after `end_all`, so a caller whose stream ended unanswered knows its request did not run.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import grpc

from common.status import counted_status


class _OpenCall:
    def __init__(self, context: grpc.ServicerContext):
        self.context = context
        self.idle = False


class OpenCalls:
    def __init__(self, limit: int):
        self._limit = limit
        self._open: set[_OpenCall] = set()
        self._ending = False
        self._lock = threading.Lock()

    def requests(self, request_iterator: Iterator, context: grpc.ServicerContext) -> Iterator:
        """The requests of one open call, for as long as the node keeps it (none beyond the limit)."""
        call = _OpenCall(context)
        with self._lock:
            if self._ending:
                return
            full = len(self._open) >= self._limit
            if not full:
                self._open.add(call)
        if full:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"this node holds its {self._limit} open calls; "
                                                              "send requests as unary calls")
        context.add_callback(lambda: self._forget(call))  # the call may end while no request is being read
        try:
            while (request := self._next_request(call, request_iterator)) is not None:
                yield request
        finally:
            self._forget(call)

    def answers(self, servicer, request_iterator: Iterator, context: grpc.ServicerContext,
                answer: Callable, refusal: Callable[[str, str], object]) -> Iterator:
        """`answer(request)` for each request of one open call, or `refusal(code name, message)` when it raised
        (counted by the servicer's error_counter, if any): a refused request ends nothing."""
        for request in self.requests(request_iterator, context):
            try:
                answered = answer(request)
            except Exception as error:  # noqa: BLE001 - a refused request is answered; the call goes on
                code, message = counted_status(servicer, error)
                answered = refusal(code.name, message)
            yield answered

    def _forget(self, call: _OpenCall) -> None:
        with self._lock:
            self._open.discard(call)

    def end_all(self) -> None:
        """End every open call (the node is stopping) and refuse new ones."""
        with self._lock:
            self._ending = True
            idle = [call for call in self._open if call.idle]
        for call in idle:
            call.context.cancel()

    def _next_request(self, call: _OpenCall, request_iterator: Iterator):
        with self._lock:
            if self._ending:
                return None
            call.idle = True
        try:
            request = next(request_iterator, None)
        except grpc.RpcError:  # the caller cancelled the call, or end_all did
            request = None
        with self._lock:
            call.idle = False
            return None if self._ending else request
