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


ERRORS_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, Unavailable,
                                            PermissionDenied)}


def error_from_code(code: str, message: str) -> CoreError:
    """Rebuild a typed error from its code name (used after a result crossed Raft or gRPC)."""
    return ERRORS_BY_CODE.get(code, CoreError)(message)
