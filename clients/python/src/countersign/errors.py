"""Typed errors. Each carries the server's own message, which names what is wrong.

No error ever means "approved": code that gates an action must act only on an approval whose
``approved`` is true.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from countersign.model import Approval


class CountersignError(Exception):
    """Base of every error this package raises."""

    #: The gRPC status code, when the error came from the server or the transport.
    code: grpc.StatusCode | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def transient(self) -> bool:
        """True when the same call may succeed later (the server was unreachable, the
        connection broke, the call timed out)."""
        return False


class ConfigError(CountersignError, ValueError):
    """The client configuration cannot be used (address, CA file, token)."""


class RpcError(CountersignError):
    """A gRPC status the server (or the transport) answered with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    @property
    def transient(self) -> bool:
        # A connection torn down mid-call surfaces as CANCELLED or UNKNOWN, a server-side abort
        # as ABORTED (as in the Rust SDK).
        return self.code in _TRANSIENT_CODES


class Unavailable(RpcError):
    """The server could not be reached, or the connection broke."""


class DeadlineExceeded(RpcError):
    """The call did not complete in time."""


class NotFound(RpcError):
    """No approval (or grant) with that id."""


class InvalidArgument(RpcError):
    """The request was refused and nothing was stored; ``field`` names the offending field."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(code, message)
        field, sep, _ = message.partition(": ")
        #: The request field the server named ("arguments_json", "ttl_seconds", ...), or None.
        self.field: str | None = field if sep and " " not in field else None


class PermissionDenied(RpcError):
    """The token may not do this, or the decider is not an approver for this approval."""


class Unauthenticated(RpcError):
    """No token, or the server does not accept it."""


class AlreadyExists(RpcError):
    """The idempotency key was used before with other arguments."""


class FailedPrecondition(RpcError):
    """The approval is not in a state that allows this (e.g. a second consume)."""


class ResourceExhausted(RpcError):
    """A size or pending limit, or (on a watch) a consumer too slow for the server."""


class RateLimited(ResourceExhausted):
    """The agent exceeded its request rate; ``retry_after`` says when to try again."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after: float) -> None:
        super().__init__(code, message)
        #: Seconds to wait before the next request, from the server's ``retry-after-ms``.
        self.retry_after = retry_after


class OutOfRange(RpcError):
    """A watch cursor the server no longer retains (or that is ahead of it)."""


class AlreadyResolved(CountersignError):
    """A decision arrived after the approval was resolved; ``approval`` shows who or what won."""

    def __init__(self, approval: Approval) -> None:
        super().__init__(f"approval {approval.id} was already resolved: {approval.outcome}")
        self.approval = approval


class NotApproved(CountersignError):
    """Raised by ``requires_approval`` when a call may not run; ``approval`` is the record."""

    def __init__(self, approval: Approval) -> None:
        super().__init__(f"approval {approval.id}: {approval.outcome}")
        self.approval = approval


class ApprovalRejected(NotApproved):
    """A person (or a deny rule) rejected the call; ``reason`` is the approver's reason."""

    @property
    def reason(self) -> str:
        return self.approval.reason


class ApprovalNotGranted(NotApproved):
    """The call was not approved in time: expired, cancelled, or still pending at the
    deadline."""


_TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.ABORTED,
    }
)

_BY_CODE: dict[grpc.StatusCode, type[RpcError]] = {
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
}


def from_rpc_error(error: grpc.RpcError) -> RpcError:
    """The typed error for a grpcio (sync or asyncio) call failure."""
    code = error.code()
    message = error.details() or ""
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        for key, value in error.trailing_metadata() or ():
            if key == "retry-after-ms":
                try:
                    return RateLimited(code, message, int(value) / 1000)
                except ValueError:
                    break
    return _BY_CODE.get(code, RpcError)(code, message)
