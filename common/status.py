"""The gRPC status (code and a message a person can act on) for every error raised while serving a call."""
from __future__ import annotations

import functools
import logging

import grpc

from coordinator.core.errors import CoreError

log = logging.getLogger(__name__)


def status_for(error: Exception) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and message for an error raised while serving.

    A CoreError (every refusal of the core, a syntax error, group0 unavailable) carries its own code; a
    failed call to another node is UNAVAILABLE; anything else is a bug: INTERNAL, logged with its trace.
    """
    if isinstance(error, CoreError):
        return grpc.StatusCode[error.code], error.message
    if isinstance(error, grpc.RpcError):
        return grpc.StatusCode.UNAVAILABLE, f"a node this request needed failed: {error.code().name}: {error.details()}"
    log.exception("internal error while serving a request")
    return grpc.StatusCode.INTERNAL, f"internal error ({type(error).__name__}: {error}); see the node log"


def counted_status(servicer, error: Exception) -> tuple[grpc.StatusCode, str]:
    """`status_for(error)`, counted when the servicer has an error_counter (for an answer that carries it)."""
    code, message = status_for(error)
    counter = getattr(servicer, "error_counter", None)
    if counter is not None:
        counter.labels(code.name).inc()
    return code, message


def _abort(servicer, context, error: Exception) -> None:
    context.abort(*counted_status(servicer, error))


def unary(method):
    """Every error of the handler becomes a gRPC status (counted when the servicer has an error_counter)."""
    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except Exception as error:  # noqa: BLE001 - every error becomes a status; the daemon keeps serving
            _abort(self, context, error)

    return wrapper


def streaming(method):
    """Like `unary`, for server-streaming handlers."""
    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            yield from method(self, request, context)
        except Exception as error:  # noqa: BLE001
            _abort(self, context, error)

    return wrapper
