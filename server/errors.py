"""Domain errors raised by services, and the one table mapping them to HTTP statuses."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """An error the client can fix; `detail` says what is wrong and how to fix it."""

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class BadRequest(DomainError):
    """The request cannot be acted on as asked (e.g. nothing selected, a locked field)."""


class InvalidValue(DomainError):
    """A value fails validation; the message names the field."""


class NotFound(DomainError):
    """An environment, run or checkpoint that does not exist."""


class Conflict(DomainError):
    """The request clashes with the current state (e.g. resume of a running run)."""


class Unauthorized(DomainError):
    """Missing or wrong bearer token."""


class Forbidden(DomainError):
    """A valid token whose scope does not cover this request (a read-only token writing)."""


class Gone(DomainError):
    """Something that existed and ended (a finished Tinker session, an expired future): the
    Tinker SDK stops heartbeating on it, or sends the request again."""


class TooMany(DomainError):
    """A per-client limit is reached (open log streams); closing one frees a place."""


class Unavailable(DomainError):
    """A dependency (inference worker, model, backend) is not usable right now; retrying may
    help, after `retry_after_s` (sent as Retry-After)."""

    def __init__(self, detail: str, retry_after_s: int = 5, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after_s = retry_after_s


STATUS_FOR: dict[type[DomainError], int] = {
    BadRequest: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    Gone: 410,
    InvalidValue: 422,
    TooMany: 429,
    Unavailable: 503,
}


def headers_for(exc: DomainError) -> dict[str, str] | None:
    """What the answer's headers add: how to authenticate, or when to try again."""
    if isinstance(exc, Unauthorized):
        return {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, Unavailable):
        return {"Retry-After": str(exc.retry_after_s)}
    return None


def status_for(exc: DomainError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS_FOR:
            return STATUS_FOR[cls]
    return 400
