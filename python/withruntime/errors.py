"""Typed exceptions for everything the daemon (or reaching it) can answer with.

The daemon answers an error as ``{"error": {"code": "...", "message": "..."}}`` with a matching
HTTP status. Each code has its own exception class here, all below :class:`WithruntimeError`,
so callers can catch as narrowly or as broadly as they like::

    try:
        sbx.files.read("missing.txt")
    except withruntime.NotFound as e:
        print(e.code, e.message)   # not_found  read /workspace/missing.txt: No such file ...
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "WithruntimeError",
    "InvalidRequest",
    "AuthError",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "PayloadTooLarge",
    "SandboxError",
    "FileError",
    "FileTooLarge",
    "ExecFailed",
    "ServerError",
    "CapacityError",
    "DaemonUnavailable",
    "ConfigurationError",
    "error_from_response",
]


class WithruntimeError(Exception):
    """Base class of every error the SDK raises.

    Attributes:
        code: The daemon's error code (``"not_found"``, ``"conflict"``, ...), or an SDK code
            such as ``"unavailable"`` when the daemon could not be reached.
        message: The daemon's human-readable message.
        status: The HTTP status of the answer, or None when there was no answer.
        errno: For file errors, the errno number the sandbox reported, else None.
        details: The whole ``error`` object the daemon sent (may hold more fields).
    """

    default_code = "error"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        errno: Optional[int] = None,
        details: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.status = status
        self.errno = errno
        self.details: Dict[str, Any] = dict(details or {})

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class InvalidRequest(WithruntimeError):
    """400: bad JSON, an unknown, missing or wrong-typed field (the message names it)."""

    default_code = "invalid_request"


class AuthError(WithruntimeError):
    """401 or 403: no key, a wrong key, or a key that may not do this."""

    default_code = "unauthorized"


class CostLimit(WithruntimeError):
    """402: a sandbox's ``max_cost_micros`` or the key's daily spending limit is reached."""

    default_code = "cost_limit"


class RateLimited(WithruntimeError):
    """429: too many attempts (e.g. wrong keys) from this client; try again later."""

    default_code = "rate_limited"


class NotFound(WithruntimeError):
    """404: an unknown sandbox, a missing file, or an unknown route."""

    default_code = "not_found"


class MethodNotAllowed(WithruntimeError):
    """405: the route exists with another method (the daemon may be older than the SDK)."""

    default_code = "method_not_allowed"


class Conflict(WithruntimeError):
    """409: the sandbox is not in a state that allows this (e.g. it is stopped)."""

    default_code = "conflict"


class PayloadTooLarge(WithruntimeError):
    """413: a request body over the daemon's limit."""

    default_code = "payload_too_large"


class SandboxError(WithruntimeError):
    """Something failed inside the sandbox: a file operation, a command that could not start,
    or the sandbox itself failing while a command ran."""

    default_code = "sandbox_error"


class FileError(SandboxError):
    """422 ``file_error``: a file operation failed inside the sandbox; ``errno`` holds the
    number (e.g. 21 for "Is a directory")."""

    default_code = "file_error"


class FileTooLarge(FileError):
    """Raised by the SDK, not the daemon: a read would return more than its ``max_bytes``
    (``sbx.files.read`` defaults to 100 MiB). Read such a file in parts with
    ``sbx.files.read_stream(path)`` or ``sbx.files.read(path, offset, length)``, or pass a
    larger ``max_bytes``. ``size`` is the file's size when known."""

    default_code = "file_too_large"

    def __init__(self, message: str, *, size: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.size = size


class ExecFailed(SandboxError):
    """422 ``exec_failed``: the command could not start (not found, bad ``cwd``)."""

    default_code = "exec_failed"


class ServerError(WithruntimeError):
    """500: a failure inside the daemon (e.g. a sandbox that could not be created)."""

    default_code = "internal"


class CapacityError(WithruntimeError):
    """503 ``capacity``: the daemon's host has no room for one more sandbox now (its memory or
    disk, or a limit of ``withruntime serve``); the message says what is short and what frees
    it (stop or delete sandboxes, ``withruntime sandbox prune``, a smaller ``memory_mib`` or
    ``disk_mib``). The daemon answered: this is not a :class:`DaemonUnavailable`.

    Attributes:
        retry_after: Seconds the daemon asks to wait before trying again (its ``Retry-After``
            header), or None if it sent none.
    """

    default_code = "capacity"

    def __init__(self, message: str, *, retry_after: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class DaemonUnavailable(WithruntimeError, ConnectionError):
    """The daemon could not be reached, dropped the connection, did not answer in time, or
    answered 503 because it is shutting down. Also a :class:`ConnectionError`."""

    default_code = "unavailable"


class ConfigurationError(WithruntimeError):
    """The connection settings are unusable: a malformed ``RUNTIME_URL`` or saved connection, a
    key that would go over plain ``http://`` to a host that is not loopback, an unreadable CA
    file, or an ``https://`` daemon whose certificate is not trusted (or names another host)."""

    default_code = "configuration"


_BY_CODE: Dict[str, Type[WithruntimeError]] = {
    "invalid_request": InvalidRequest,
    "unauthorized": AuthError,
    "forbidden": AuthError,
    "cost_limit": CostLimit,
    "rate_limited": RateLimited,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "conflict": Conflict,
    "payload_too_large": PayloadTooLarge,
    "unsupported_media_type": InvalidRequest,
    "file_error": FileError,
    "exec_failed": ExecFailed,
    "internal": ServerError,
    "unavailable": DaemonUnavailable,
    "capacity": CapacityError,
}

_BY_STATUS: Dict[int, Type[WithruntimeError]] = {
    400: InvalidRequest,
    401: AuthError,
    402: CostLimit,
    403: AuthError,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    422: SandboxError,
    429: RateLimited,
    503: DaemonUnavailable,
}


def _retry_after(headers: Optional[Mapping[str, str]]) -> Optional[int]:
    """A ``Retry-After`` of whole seconds (the daemon never sends a date), bounded to a day;
    None if absent or anything else."""
    value = (headers or {}).get("retry-after", "").strip()
    if not value.isdigit() or len(value) > 6:
        return None
    return min(int(value), 86400)


def error_from_response(status: Optional[int], error: Any, fallback_text: str = "",
                        headers: Optional[Mapping[str, str]] = None) -> WithruntimeError:
    """Builds the exception for an error answer.

    Args:
        status: The HTTP status, or None for an error line inside a stream.
        error: The decoded ``error`` object (a dict with ``code`` and ``message``), or None
            when the body was not the daemon's JSON.
        fallback_text: What to say when there is no message (e.g. a proxy's HTML body).
        headers: The answer's headers, lower-case names (for ``Retry-After``), if any.
    """
    details: Dict[str, Any] = dict(error) if isinstance(error, dict) else {}
    code = details.get("code") if isinstance(details.get("code"), str) else None
    message = details.get("message") if isinstance(details.get("message"), str) else None
    errno = details.get("errno") if isinstance(details.get("errno"), int) else None
    cls: Optional[Type[WithruntimeError]] = _BY_CODE.get(code) if code else None
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status)
        if cls is None:
            cls = ServerError if status >= 500 else WithruntimeError
    if cls is None:
        cls = SandboxError
    if not message:
        text = fallback_text.strip()
        if len(text) > 300:
            text = text[:300] + "..."
        message = f"HTTP {status}: {text}" if status is not None else (text or "unknown error")
        if not text and status is not None:
            message = f"HTTP {status} with no error message"
    if issubclass(cls, CapacityError):
        return cls(message, code=code, status=status, errno=errno, details=details,
                   retry_after=_retry_after(headers))
    return cls(message, code=code, status=status, errno=errno, details=details)
