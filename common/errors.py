"""The one exception tree of squall, and its mapping to and from HTTP.

    SquallError                     base of everything squall raises
    ├── TransportError              could not reach a server (connect, timeout)
    └── StatusError                 a server answered with an error status
        ├── BadRequest        400   malformed input; the message says what is wrong
        ├── Unauthorized      401   missing or invalid token
        ├── Forbidden         403   token valid but not for this resource
        ├── NotFound          404   no such task / queue / blob
        ├── Conflict          409   state does not allow it
        │   └── LeaseError          lease token problems
        │       └── LeaseLost       token is stale: the task was re-leased, released,
        │                           reset or dequeued since this token was issued
        ├── PayloadTooLarge   413   body, batch or pid over its limit
        ├── UnsupportedMediaType 415 wrong Content-Type (JSON routes take application/json)
        ├── InsufficientStorage 507 a data node is out of space
        ├── DataCorrupt       500   a stored replica failed its checksum (read another)
        ├── Overloaded        429   slow down; retry after `retry_after` seconds
        ├── Unavailable       503   not ready (recovering, no data nodes); retry
        └── OutcomeUnknown    502   may have been applied: an answer was lost on the way

An error promises that nothing was applied ("refused means not applied": docs/design.md)
unless ``squall.client.may_have_applied`` says otherwise.

Servers raise these in domain code; one handler turns them into
``{"error": {"code": ..., "message": ..., "details": ...}}`` with ``status``.
Clients turn such a body back into the same class with :func:`from_response`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class SquallError(Exception):
    """Base of every squall error."""


class TransportError(SquallError):
    """The server could not be reached, or the connection broke mid-request."""


class StatusError(SquallError):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"

    def __init__(self, message: str, details: Any = None, retry_after: float | None = None):
        super().__init__(message)
        self.message = message
        self.details = details
        self.retry_after = retry_after

    def to_body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            err["details"] = self.details
        return {"error": err}


class BadRequest(StatusError):
    status, code = 400, "bad_request"


class Unauthorized(StatusError):
    status, code = 401, "unauthorized"


class Forbidden(StatusError):
    status, code = 403, "forbidden"


class NotFound(StatusError):
    status, code = 404, "not_found"


class Conflict(StatusError):
    status, code = 409, "conflict"


class LeaseError(Conflict):
    code = "lease_error"


class LeaseLost(LeaseError):
    code = "lease_lost"


class PayloadTooLarge(StatusError):
    status, code = 413, "too_large"


class UnsupportedMediaType(StatusError):
    status, code = 415, "unsupported_media_type"


class HeadersTooLarge(StatusError):
    status, code = 431, "headers_too_large"


class RequestTimeout(StatusError):
    status, code = 408, "request_timeout"


class Overloaded(StatusError):
    status, code = 429, "overloaded"


class Unavailable(StatusError):
    status, code = 503, "unavailable"


class InsufficientStorage(StatusError):
    status, code = 507, "insufficient_storage"


class DataCorrupt(StatusError):
    status, code = 500, "data_corrupt"


class ServerError(StatusError):
    status, code = 500, "internal"


class OutcomeUnknown(StatusError):
    """The request may or may not have been applied: a data node's front door sent the
    enqueue to the master and lost the answer, or an earlier attempt of a resent call
    lost its answer before a later one was refused. Resending an enqueue is safe (its
    pids collapse into the first attempt while its tasks are queued; idempotency keys
    cover tasks already dequeued)."""

    status, code = 502, "outcome_unknown"


_BY_CODE: dict[str, type[StatusError]] = {
    cls.code: cls
    for cls in (
        BadRequest, Unauthorized, Forbidden, NotFound, Conflict, LeaseError, LeaseLost,
        PayloadTooLarge, UnsupportedMediaType, HeadersTooLarge, RequestTimeout, Overloaded,
        Unavailable, InsufficientStorage, DataCorrupt, ServerError, OutcomeUnknown,
    )
}
_BY_STATUS: dict[int, type[StatusError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    408: RequestTimeout, 413: PayloadTooLarge, 415: UnsupportedMediaType, 422: BadRequest,
    429: Overloaded, 431: HeadersTooLarge, 502: OutcomeUnknown, 503: Unavailable,
    504: OutcomeUnknown, 507: InsufficientStorage,
}


def from_response(status: int, body: Any, retry_after: float | None = None) -> StatusError:
    """Rebuild the error a server sent (``{"error": {...}}``), or a generic one for its status."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        cls = _BY_CODE.get(str(err.get("code")), _BY_STATUS.get(status, ServerError))
        return cls(str(err.get("message", "")), err.get("details"), retry_after)
    cls = _BY_STATUS.get(status, ServerError)
    return cls(f"HTTP {status}: {str(body)[:200]}", None, retry_after)
