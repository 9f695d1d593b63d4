"""HTTP/1.1 for the ops endpoint: `h11` parses the request head, within bounds and deadlines.

One request per connection and every response closes it, so there is no keep-alive, pipelining
or request body: the endpoint only serves GET/HEAD to scrapers, probes and `nodeagent status`.
Parsing is h11's (a well-kept, fuzzed parser, already in the tree through httpx); this module
adds the limits an unauthenticated port needs: head size and header count, a deadline for the
whole head and one per read (slowloris), and the rules h11 leaves to the application (HTTP
version, origin-form target).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlsplit

import h11
import trio

MAX_HEADERS = 64
# Room for the blank line that ends a head of exactly the allowed size.
_TERMINATOR = 4


class HttpError(Exception):
    """A request the endpoint refuses: answered with `status`, counted by `reason`."""

    def __init__(self, status: int, detail: str, reason: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.reason = reason


class HeadTimeout(HttpError):
    """The head did not arrive in time (whole head or one read): 408."""

    def __init__(self, detail: str) -> None:
        super().__init__(408, detail, "timeout")


class ClientGone(Exception):
    """The client closed the connection without sending anything (a TCP probe, a port scan)."""


@dataclass(frozen=True, slots=True)
class HeadLimits:
    max_bytes: int
    head_timeout: float
    read_timeout: float
    max_headers: int = MAX_HEADERS


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    version: str
    headers: dict[str, str]  # lowercase names; a repeated header keeps the last value

    def wants_json(self) -> bool:
        fmt = self.query.get("format", [""])[-1]
        if fmt:
            return fmt == "json"
        return "application/json" in self.headers.get("accept", "")


def new_connection(limits: HeadLimits) -> h11.Connection:
    return h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_bytes)


def _reason(exc: h11.RemoteProtocolError) -> str:
    return "head_too_large" if exc.error_status_hint == 431 else "malformed"


async def read_request(
    stream: trio.abc.ReceiveStream, conn: h11.Connection, limits: HeadLimits
) -> Request:
    """Read and parse one request head; HttpError (HeadTimeout on a deadline) if refused."""
    deadline = trio.current_time() + limits.head_timeout
    # h11 is never given more than a maximal head, so a larger one can never complete: it stays
    # incomplete and h11 refuses it (431) instead of buffering whatever the client sends.
    budget = limits.max_bytes + _TERMINATOR
    received = 0
    closed = False
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            if closed:
                raise HttpError(400, "connection closed within the request head", "eof") from None
            raise HttpError(exc.error_status_hint, str(exc), _reason(exc)) from None
        if isinstance(event, h11.Request):
            return _to_request(event, limits)
        if isinstance(event, h11.ConnectionClosed):
            if not received:
                raise ClientGone
            raise HttpError(400, "connection closed before the end of the request head", "eof")
        if event is not h11.NEED_DATA:  # pragma: no cover - h11 yields nothing else before
            raise HttpError(400, f"unexpected {type(event).__name__}", "malformed")
        if received >= budget:
            raise HttpError(
                431, f"request head larger than {limits.max_bytes} bytes", "head_too_large"
            )
        read_deadline = min(deadline, trio.current_time() + limits.read_timeout)
        with trio.move_on_at(read_deadline):
            chunk = await stream.receive_some(min(budget - received, 16384))
            received += len(chunk)
            closed = not chunk
            conn.receive_data(bytes(chunk))  # b"" is the end of the stream
            continue
        if read_deadline >= deadline:
            raise HeadTimeout(f"request head not received within {limits.head_timeout:g}s")
        raise HeadTimeout(f"no data for {limits.read_timeout:g}s while reading the request head")


def _to_request(event: h11.Request, limits: HeadLimits) -> Request:
    version = event.http_version.decode("ascii")
    if version not in ("1.0", "1.1"):
        raise HttpError(505, f"unsupported protocol version HTTP/{version}", "version")
    if len(event.headers) > limits.max_headers:
        raise HttpError(431, f"more than {limits.max_headers} header fields", "too_many_headers")
    # h11 checked the target's characters; only origin-form ("/path?query") is served.
    target = event.target.decode("ascii")
    if not target.startswith("/"):
        raise HttpError(400, "request target must be an absolute path", "target")
    headers = {name.decode("ascii"): value.decode("latin-1") for name, value in event.headers}
    split = urlsplit(target)
    return Request(
        method=event.method.decode("ascii"),
        path=unquote(split.path),
        query=parse_qs(split.query, keep_blank_values=True),
        version=f"HTTP/{version}",
        headers=headers,
    )


def _response_headers(body: bytes, content_type: str) -> list[tuple[str, str]]:
    return [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
        ("Connection", "close"),
    ]


def render_response(
    conn: h11.Connection | None,
    status: int,
    body: bytes,
    content_type: str,
    *,
    head_only: bool = False,
) -> bytes:
    """The response's bytes, through h11 when it saw a request (or refused one).

    Without a request to answer (a timeout, a refused connection) h11 has no response to send,
    so the same fixed head is written directly.
    """
    phrase = HTTPStatus(status).phrase
    headers = _response_headers(body, content_type)
    if conn is not None and (conn.our_state is h11.SEND_RESPONSE or conn.their_state is h11.ERROR):
        out = conn.send(h11.Response(status_code=status, headers=headers, reason=phrase)) or b""
        if body and not head_only:
            out += conn.send(h11.Data(data=body)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        return out
    lines = [f"HTTP/1.1 {status} {phrase}", *(f"{k}: {v}" for k, v in headers)]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    return head if head_only else head + body
