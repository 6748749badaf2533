"""Typed errors for attnd's answers.

attnd's error body is ``{"error": {"message", "type", "code", "param"}}`` with a stable ``code``
(proto/errors.json). Callers branch on *what kind* of failure it was (retry a 429, resync a
session after a 409, recreate one after a 410), so each code family gets its own class, and the
raw fields stay available for the cases a class does not settle.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "AttndError",
    "InvalidRequest",
    "Unauthorized",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "Gone",
    "PayloadTooLarge",
    "QueueFull",
    "ServerError",
    "Unavailable",
    "InsufficientStorage",
    "TransportError",
    "error_from_body",
    "error_from_response",
]


class AttndError(Exception):
    """An error answer from attnd (or from a proxy in front of it, which answers in the same shape).

    ``status`` is the HTTP status (for a failed step of a batch, that step's own status), ``code``
    the stable machine-readable name, ``param`` the offending field, header or path parameter (or
    None) and ``message`` the human text, which may change between versions: match on ``code``.
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        param: Optional[str] = None,
        type: Optional[str] = None,
        retry_after: Optional[float] = None,
        request_id: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param
        self.type = type
        # Sent with 429 and 503: how long the server asks to be left alone before a retry.
        self.retry_after = retry_after
        # The server's X-Request-Id, to find the request's line in attnd's log.
        self.request_id = request_id

    def __str__(self) -> str:
        where = f" (param {self.param})" if self.param else ""
        what = " ".join(str(v) for v in (self.status, self.code) if v is not None)
        return f"{what}: {self.message}{where}" if what else f"{self.message}{where}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, "
            f"param={self.param!r}, message={self.message!r})"
        )


class InvalidRequest(AttndError):
    """400: the request itself is wrong (shape, field, JSON, context length, session file, a key
    or value past the KV cache dtype's range: ``kv_out_of_range``): retrying it unchanged cannot
    succeed."""


class Unauthorized(AttndError):
    """401: the server runs with --api-key and the bearer token is missing or wrong."""


class NotFound(AttndError):
    """404: ``session_not_found`` (the id is not live: never made, or deleted) or ``not_found`` (no
    such route: usually a client/server version mismatch)."""


class MethodNotAllowed(AttndError):
    """405: the route exists but not with this method (a client/server version mismatch)."""


class Conflict(AttndError):
    """409: the request disagrees with the session's state and changed nothing: ``n_past_mismatch``,
    ``session_exists``, ``fingerprint_mismatch``, ``tokens_dropped``, ``context_exists``. The
    usual reaction is to read the session (``Session.info()``) and resynchronise. Also
    ``queries_not_kept``: ``Session.attention()`` on a server started without
    ``--keep-queries 1``, which no retry mends; and ``session_file_foreign``: the server's
    --state-dir holds a file of that id it leaves alone (another model's): use another id."""


class Gone(AttndError):
    """410: the session's cache is gone for good (``session_evicted``: budget, TTL;
    ``session_lost``: its file failed its checks). The sequence must be prefilled again, after
    ``Session.delete()`` clears the tombstone."""


class PayloadTooLarge(AttndError):
    """413: the body is over the server's --max-body-mb (or the proxy's limit): split the call."""


class QueueFull(AttndError):
    """429: too many queued requests; ``retry_after`` says when to try again."""


class ServerError(AttndError):
    """500 (and any other 5xx not listed): an unexpected failure on the server."""


class Unavailable(AttndError):
    """503 (``draining``, ``too_many_connections``, ``server_busy``), and a proxy's 502
    ``replica_unavailable`` and 504 ``upstream_timeout``: the server cannot take the request now;
    another replica or a later retry may."""


class InsufficientStorage(AttndError):
    """507 ``kv_budget_exhausted``: the KV pool cannot hold the request even after evicting every
    idle session."""


class TransportError(AttndError):
    """No usable answer at all: the connection failed, or the answer was not attnd's framing.
    It has no status; it is an AttndError so that one ``except AttndError`` covers every failure
    of a call."""


# The status each code is answered with (proto/errors.json), for the errors that arrive without
# one of their own: a stream's error event comes after the stream's 200.
STATUS_BY_CODE: Dict[str, int] = {
    "invalid_json": 400,
    "invalid_request": 400,
    "context_length_exceeded": 400,
    "kv_out_of_range": 400,
    "corrupt_session": 400,
    "unsupported_session_version": 400,
    "unauthorized": 401,
    "not_found": 404,
    "session_not_found": 404,
    "method_not_allowed": 405,
    "n_past_mismatch": 409,
    "session_exists": 409,
    "tokens_dropped": 409,
    "context_exists": 409,
    "fingerprint_mismatch": 409,
    "queries_not_kept": 409,
    "session_file_foreign": 409,
    "session_evicted": 410,
    "session_lost": 410,
    "payload_too_large": 413,
    "queue_full": 429,
    "internal_error": 500,
    "replica_unavailable": 502,
    "draining": 503,
    "too_many_connections": 503,
    "server_busy": 503,
    "upstream_timeout": 504,
    "kv_budget_exhausted": 507,
}

# The class of each status; a code this client does not know yet (a newer server) still gets
# the class of its status.
_BY_STATUS: Dict[int, Type[AttndError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    429: QueueFull,
    500: ServerError,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
    507: InsufficientStorage,
}


def _class_for(status: Optional[int], code: Optional[str]) -> Type[AttndError]:
    # The code decides when known (a proxy's 502 and attnd's 503 are both Unavailable).
    if code is not None and code in STATUS_BY_CODE:
        return _BY_STATUS[STATUS_BY_CODE[code]]
    if status is not None and status in _BY_STATUS:
        return _BY_STATUS[status]
    if status is not None and status >= 500:
        return ServerError
    return AttndError


def error_from_body(
    status: Optional[int],
    body: Any,
    *,
    retry_after: Optional[float] = None,
    request_id: Optional[str] = None,
) -> AttndError:
    """The typed error for an error object: a whole error body ``{"error": {...}}`` or its inner
    object (a batch step's ``error`` and a stream's error event carry the same one)."""
    err: Mapping[str, Any] = {}
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            err = inner
    code = err.get("code") if isinstance(err.get("code"), str) else None
    message = err.get("message") if isinstance(err.get("message"), str) else None
    param = err.get("param") if isinstance(err.get("param"), str) else None
    etype = err.get("type") if isinstance(err.get("type"), str) else None
    if status is None and code is not None:
        status = STATUS_BY_CODE.get(code)
    cls = _class_for(status, code)
    return cls(
        message or f"HTTP {status}",
        status=status,
        code=code,
        param=param,
        type=etype,
        retry_after=retry_after,
        request_id=request_id,
    )


def error_from_response(
    status: int, body: bytes, headers: Mapping[str, str]
) -> AttndError:
    """The typed error for a non-2xx answer, whatever its body (a proxy may send HTML)."""
    try:
        parsed: Any = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        text = body.decode("utf-8", "replace").strip()
        parsed = {"error": {"message": text[:200] or f"HTTP {status}"}}
    retry_after: Optional[float] = None
    ra = headers.get("retry-after")
    if ra is not None:
        try:
            retry_after = float(ra)
        except ValueError:
            retry_after = None
    return error_from_body(
        status, parsed, retry_after=retry_after, request_id=headers.get("x-request-id")
    )
