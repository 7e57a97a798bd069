"""Exception hierarchy of mooncake.sparse; C++ status codes map onto it."""

from __future__ import annotations

__all__ = [
    "Error",
    "InvalidArgument",
    "NotFound",
    "StaleGeneration",
    "Conflict",
    "OutOfRange",
    "ResourceExhausted",
    "FailedPrecondition",
    "Unavailable",
    "Internal",
    "Unimplemented",
    "DataLoss",
    "PermissionDenied",
    "DeadlineExceeded",
    "error_class",
    "code_of",
]


class Error(Exception):
    """Base class of every error raised by mooncake.sparse."""


class InvalidArgument(Error, ValueError):
    """Malformed input: shapes, dtypes, coordinates, boxes, options."""


class NotFound(Error, KeyError):
    """A key, object, member or source does not exist (or a target is not covered)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class StaleGeneration(Error):
    """Generation fencing rejected a commit."""


class Conflict(Error):
    """A different payload under an existing logical key, or a lost exclusive create."""


class OutOfRange(Error, IndexError):
    """A range or offset outside an object."""


class ResourceExhausted(Error, MemoryError):
    """A quota, capacity or planning budget was exceeded."""


class FailedPrecondition(Error):
    """The operation is valid but not in the current state."""


class Unavailable(Error, ConnectionError):
    """A peer (node daemon, master) is unreachable."""


class Internal(Error, RuntimeError):
    """An internal invariant broke (a bug: please report it)."""


class Unimplemented(Error, NotImplementedError):
    """A capability this build or machine lacks."""


class DataLoss(Error):
    """A checksum mismatch or torn data was detected."""


class DeadlineExceeded(Error, TimeoutError):
    """A wait (wait_generation) reached its deadline first."""


class PermissionDenied(Error, PermissionError):
    """The caller may not do this (e.g. a node daemon peer running as another user)."""


_BY_CODE = {
    1: InvalidArgument,
    2: NotFound,
    3: StaleGeneration,
    4: Conflict,
    5: OutOfRange,
    6: ResourceExhausted,
    7: FailedPrecondition,
    8: Unavailable,
    9: Internal,
    10: Unimplemented,
    11: DataLoss,
    12: PermissionDenied,
    13: DeadlineExceeded,
}


def error_class(code: int) -> type[Error]:
    """The exception class for a C++ StatusCode value."""
    return _BY_CODE.get(code, Internal)


def code_of(exc: BaseException) -> int:
    """The C++ StatusCode value of an exception (Internal for anything not a mooncake.sparse
    error): how a backend written in Python reports errors to the native core."""
    for cls in type(exc).__mro__:
        for code, known in _BY_CODE.items():
            if cls is known:
                return code
    return 9  # Internal
