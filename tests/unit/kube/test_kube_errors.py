from __future__ import annotations

import json

import pytest

from nodeagent.kube import errors
from nodeagent.kube.models import Status


def _status(code: int, reason: str, message: str = "msg", **details: object) -> bytes:
    body: dict[str, object] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        (404, "NotFound", errors.NotFound),
        (409, "AlreadyExists", errors.AlreadyExists),
        (409, "Conflict", errors.Conflict),
        (422, "Invalid", errors.Invalid),
        (400, "BadRequest", errors.BadRequest),
        (403, "Forbidden", errors.Forbidden),
        (401, "Unauthorized", errors.Unauthorized),
        (410, "Gone", errors.Gone),
        (410, "Expired", errors.Gone),
        (429, "TooManyRequests", errors.TooManyRequests),
        (500, "ServerTimeout", errors.ServerTimeout),
        (504, "Timeout", errors.ServerTimeout),
        (500, "InternalError", errors.InternalError),
        (503, "ServiceUnavailable", errors.ServiceUnavailable),
        (418, "Teapot", errors.ApiError),
    ],
)
def test_status_maps_to_typed_error(code: int, reason: str, cls: type[errors.ApiError]) -> None:
    err = errors.error_from_response(code, _status(code, reason, "the server said so"), {})
    assert type(err) is cls
    assert (err.code, err.reason, err.message) == (code, reason, "the server said so")
    assert "the server said so" in str(err)


def test_reason_wins_over_code_and_code_fills_gaps() -> None:
    # 409 is both AlreadyExists and Conflict: the reason decides.
    assert type(errors.error_from_response(409, _status(409, "AlreadyExists"), {})) is (
        errors.AlreadyExists
    )
    # No reason: the HTTP code decides.
    assert type(errors.error_from_response(404, _status(404, ""), {})) is errors.NotFound
    body = json.dumps({"kind": "Status", "reason": "NotFound", "message": "x"}).encode()
    err = errors.error_from_response(404, body, {})
    assert err.code == 404


def test_invalid_carries_field_causes() -> None:
    body = _status(
        422,
        "Invalid",
        'ConfigMap "Bad" is invalid',
        name="Bad",
        kind="ConfigMap",
        causes=[
            {"reason": "FieldValueInvalid", "message": "Invalid value", "field": "metadata.name"},
            {"reason": "FieldValueRequired", "message": "Required", "field": "data"},
        ],
    )
    err = errors.error_from_response(422, body, {})
    assert isinstance(err, errors.Invalid)
    assert [c.field for c in err.causes] == ["metadata.name", "data"]
    assert err.details is not None and err.details.name == "Bad"


def test_retry_after_from_header_or_details() -> None:
    err = errors.error_from_response(429, _status(429, "TooManyRequests"), {"retry-after": "7"})
    assert err.retry_after == 7.0
    err = errors.error_from_response(429, _status(429, "TooManyRequests", retryAfterSeconds=3), {})
    assert err.retry_after == 3.0
    # An HTTP-date header is not a number: fall back to the body, else nothing.
    err = errors.error_from_response(
        503, _status(503, "ServiceUnavailable"), {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}
    )
    assert err.retry_after is None


def test_non_status_body_keeps_text() -> None:
    err = errors.error_from_response(502, b"<html>bad gateway</html>", {})
    assert type(err) is errors.ApiError and err.code == 502
    assert "bad gateway" in err.message
    err = errors.error_from_response(503, b"", {"retry-after": "2"})
    assert type(err) is errors.ServiceUnavailable and err.retry_after == 2.0
    assert err.message == "HTTP 503"


def test_error_from_status_for_watch_events() -> None:
    status = Status(kind="Status", code=410, reason="Expired", message="too old resource version")
    err = errors.error_from_status(status)
    assert isinstance(err, errors.Gone) and "too old" in err.message
