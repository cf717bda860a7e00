"""The gRPC status (code and a message a person can act on) for every error raised while serving a call.

A typed refusal (`StaleTerm`, `RangeMoved`: a class of `errors.ERRORS_BY_NAME`) also names its class in the trailing
metadata `vbc-error-kind`, so the caller rebuilds the type (`error_kind_of`) without reading the message text.
"""
from __future__ import annotations

import functools
import logging

import grpc

from coordinator.core.errors import ERRORS_BY_NAME, CoreError

log = logging.getLogger(__name__)

ERROR_KIND_KEY = "vbc-error-kind"


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


def error_kind(error: Exception) -> str | None:
    """The class name of a typed refusal a caller can rebuild (`errors.ERRORS_BY_NAME`); None for any other error."""
    name = type(error).__name__
    return name if ERRORS_BY_NAME.get(name) is type(error) else None


def error_kind_of(error: grpc.RpcError) -> str | None:
    """The typed refusal's class name a failed call carries in its trailing metadata (None when it carries none)."""
    try:
        metadata = error.trailing_metadata() or ()
    except (AttributeError, TypeError):  # a call that failed before any metadata (or a stand-in error)
        return None
    return next((value for key, value in metadata if key == ERROR_KIND_KEY), None)


def _abort(servicer, context, error: Exception) -> None:
    code, message = counted_status(servicer, error)
    kind = error_kind(error)
    if kind is not None and hasattr(context, "set_trailing_metadata"):
        context.set_trailing_metadata(((ERROR_KIND_KEY, kind),))
    context.abort(code, message)


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
