"""Typed errors for API failures, built from the server's ``metav1.Status``."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from nodeagent.kube.models import Status, StatusCause, StatusDetails


class KubeError(Exception):
    """Base of every error the Kubernetes client raises."""


class TransportError(KubeError):
    """The request got no HTTP answer: connect failure, reset, TLS error, or timeout.

    ``sent`` is False when the request provably never reached the server (connect phase).
    """

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.message = message
        self.sent = sent


class ApiError(KubeError):
    """The server answered with an error status."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: StatusDetails | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.retry_after = retry_after

    @property
    def causes(self) -> list[StatusCause]:
        return list(self.details.causes) if self.details else []


class NotFound(ApiError):
    pass


class AlreadyExists(ApiError):
    pass


class Conflict(ApiError):
    pass


class Invalid(ApiError):
    """A rejected object; ``causes`` name each offending field."""


class BadRequest(ApiError):
    pass


class Forbidden(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Gone(ApiError):
    """410: the resourceVersion is too old (reason ``Gone`` or ``Expired``)."""


class TooManyRequests(ApiError):
    pass


class ServerTimeout(ApiError):
    pass


class InternalError(ApiError):
    pass


class ServiceUnavailable(ApiError):
    pass


class BadResponse(ApiError):
    """A success answer whose body is not what the API promises (not JSON, no metadata)."""

    def __init__(self, message: str) -> None:
        super().__init__(200, "BadResponse", message)


class DecodeError(BadResponse):
    """A body whose ``Content-Encoding`` could not be decoded to its end: an encoding the
    client did not ask for, bytes that are not gzip, a gzip member cut short. Never silently
    dropped: the request fails, a watch relists (`nodeagent.kube.encoding`)."""


class BodyTooLarge(DecodeError):
    """A body that decoded past a limit: ``limit`` is "response" (a whole response past
    ``kube.max_response_bytes``) or "event" (one watch event past ``kube.max_event_bytes``).
    Not retried as a request: the same answer would decode as large again."""

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


_BY_REASON: dict[str, type[ApiError]] = {
    "NotFound": NotFound,
    "AlreadyExists": AlreadyExists,
    "Conflict": Conflict,
    "Invalid": Invalid,
    "BadRequest": BadRequest,
    "Forbidden": Forbidden,
    "Unauthorized": Unauthorized,
    "Gone": Gone,
    "Expired": Gone,
    "TooManyRequests": TooManyRequests,
    "ServerTimeout": ServerTimeout,
    "Timeout": ServerTimeout,
    "InternalError": InternalError,
    "ServiceUnavailable": ServiceUnavailable,
}

_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
    500: InternalError,
    503: ServiceUnavailable,
    504: ServerTimeout,
}

_status_decoder = msgspec.json.Decoder(Status)


def _retry_after(headers: Mapping[str, str], details: StatusDetails | None) -> float | None:
    value = headers.get("retry-after")
    if value is not None:
        try:
            return max(0.0, float(value))
        except ValueError:
            pass  # an HTTP-date: fall back to the Status body or the caller's backoff
    if details is not None and details.retry_after_seconds > 0:
        return float(details.retry_after_seconds)
    return None


def error_class(code: int, reason: str) -> type[ApiError]:
    return _BY_REASON.get(reason) or _BY_CODE.get(code) or ApiError


def error_from_status(status: Status, headers: Mapping[str, str] | None = None) -> ApiError:
    """An exception for a decoded ``Status`` (as in a watch ERROR event)."""
    cls = error_class(status.code, status.reason)
    retry = _retry_after(headers or {}, status.details)
    return cls(status.code, status.reason, status.message, status.details, retry)


def error_from_response(code: int, body: bytes, headers: Mapping[str, str]) -> ApiError:
    """An exception for an HTTP error answer, whose body is usually a ``Status``."""
    status: Status | None
    try:
        status = _status_decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        status = None
    if status is None or status.kind != "Status":
        # Not a Status (a proxy's HTML page, an aggregated API's plain text): keep its text.
        text = body.decode("utf-8", "replace").strip()[:1000] or f"HTTP {code}"
        cls = _BY_CODE.get(code, ApiError)
        return cls(code, "", text, None, _retry_after(headers, None))
    # The HTTP code is authoritative when the body omits it.
    if not status.code:
        status.code = code
    return error_from_status(status, headers)


class CredentialError(KubeError):
    """Credentials could not be obtained: an exec plugin failed, a token file is unreadable."""
