"""The node's gRPC health service: grpc_health's, with statuses sent outside the lock a Watch's close takes."""
from __future__ import annotations

import threading

from grpc_health.v1 import health, health_pb2

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthService(health.HealthServicer):
    """grpc_health's `HealthServicer` whose `set` and `Watch` send outside the servicer's state lock.

    Upstream, `set` holds that lock while it sends the new status to every watcher, and a send waits for the
    server's polling thread to complete it. When that thread is meanwhile closing another Watch (a peer that
    stops ends its standing Watch), it runs the call's close callback, which waits for the same lock: neither
    ever goes on. A node stopping beside its peers hung so in `set(NOT_SERVING)` until it was SIGKILLed (in 4
    of 5 `make demo` runs, at the end). Here the state changes under the lock and the sends happen after it,
    under a lock of their own that keeps each watcher's statuses in order and that no close callback takes.
    """

    def __init__(self):
        super().__init__()
        self._send_lock = threading.Lock()

    def Watch(self, request, context, send_response_callback=None):
        if send_response_callback is None:  # a server without non-blocking handlers: a queue, sent from elsewhere
            return super().Watch(request, context, send_response_callback)
        service = request.service
        with self._send_lock:
            with self._lock:
                status = self._server_status.get(service, SERVICE_UNKNOWN)
                self._send_response_callbacks.setdefault(service, set()).add(send_response_callback)
                context.add_callback(self._on_close_callback(send_response_callback, service))
            send_response_callback(health_pb2.HealthCheckResponse(status=status))
        return None

    def set(self, service, status):
        with self._send_lock:
            with self._lock:
                if self._gracefully_shutting_down:
                    return
                self._server_status[service] = status
                watchers = list(self._send_response_callbacks.get(service, ()))
            for send_response_callback in watchers:
                send_response_callback(health_pb2.HealthCheckResponse(status=status))

    def enter_graceful_shutdown(self):
        with self._lock:
            if self._gracefully_shutting_down:
                return
            services = list(self._server_status)
        for service in services:
            self.set(service, NOT_SERVING)
        with self._lock:
            self._gracefully_shutting_down = True
