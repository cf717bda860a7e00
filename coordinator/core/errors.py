"""Typed errors of the core, each carrying the gRPC status code name it maps to."""
from __future__ import annotations


class CoreError(Exception):
    """A request the core refuses; `code` names the gRPC status it maps to."""

    code = "INVALID_ARGUMENT"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgument(CoreError):
    code = "INVALID_ARGUMENT"


class NotFound(CoreError):
    code = "NOT_FOUND"


class AlreadyExists(CoreError):
    code = "ALREADY_EXISTS"


class FailedPrecondition(CoreError):
    code = "FAILED_PRECONDITION"


class Unavailable(CoreError):
    code = "UNAVAILABLE"


class PermissionDenied(CoreError):
    code = "PERMISSION_DENIED"


class Unauthenticated(CoreError):
    """No credentials, or credentials that name nobody allowed to log in; the message never holds a password."""

    code = "UNAUTHENTICATED"


class DeadlineExceeded(CoreError):
    """A statement ran past its caller's deadline; the message says how far it got."""

    code = "DEADLINE_EXCEEDED"


class ResourceExhausted(CoreError):
    """A caller went past a limit (too many failed logins, say); the message says when to try again."""

    code = "RESOURCE_EXHAUSTED"


class StaleTerm(FailedPrecondition):
    """A leader's command or call from a Raft term older than the newest one seen: a newer leader took over."""


class RangeMoved(Unavailable):
    """A replica asked for a token range it no longer reads from (a tablet moved away since the read was planned): the
    coordinator catches up with group0, plans the rest of the range again and reads on."""


ERRORS_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Unavailable,
                                            PermissionDenied, Unauthenticated, ResourceExhausted)}


ERRORS_BY_NAME = {cls.__name__: cls for cls in (*ERRORS_BY_CODE.values(), StaleTerm, RangeMoved)}


def error_from_code(code: str, message: str, kind: str | None = None) -> CoreError:
    """Rebuild a typed error from its code name, or its class name `kind` when given (used after a result crossed
    Raft or gRPC)."""
    cls = ERRORS_BY_NAME.get(kind or "") or ERRORS_BY_CODE.get(code, CoreError)
    return cls(message)
