"""Just enough HTTP/1.1 for the ops endpoint: bounded request-head parsing and plain responses.

Every response closes the connection, so there is no keep-alive, pipelining or body handling:
the endpoint only serves GET/HEAD to scrapers, probes and `nodeagent status`.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qs, unquote, urlsplit

import trio

MAX_HEADERS = 64
MAX_REQUEST_LINE = 4096


class HttpError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


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


def parse_request_head(head: bytes, *, max_headers: int = MAX_HEADERS) -> Request:
    """Parse the request line and headers (everything before the blank line)."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise HttpError(400, "request head is not ASCII") from None
    lines = text.split("\r\n")
    request_line = lines[0]
    if len(request_line) > MAX_REQUEST_LINE:
        raise HttpError(414, "request line too long")
    parts = request_line.split(" ")
    if len(parts) != 3 or not all(parts):
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise HttpError(505, f"unsupported protocol version {version!r}")
    if not method.isalpha() or not method.isupper():
        raise HttpError(400, "malformed method")
    if not target.startswith("/"):
        raise HttpError(400, "request target must be an absolute path")
    header_lines = [line for line in lines[1:] if line]
    if len(header_lines) > max_headers:
        raise HttpError(431, f"more than {max_headers} header fields")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name:
            raise HttpError(400, "malformed header field")
        headers[name.lower()] = value.strip()
    split = urlsplit(target)
    return Request(
        method=method,
        path=unquote(split.path),
        query=parse_qs(split.query, keep_blank_values=True),
        version=version,
        headers=headers,
    )


async def read_head(stream: trio.abc.ReceiveStream, max_bytes: int) -> bytes:
    """Bytes up to (excluding) the first blank line; HttpError if too large or cut short."""
    buffer = bytearray()
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            if end > max_bytes:
                raise HttpError(431, f"request head larger than {max_bytes} bytes")
            return bytes(buffer[:end])
        if len(buffer) > max_bytes:
            raise HttpError(431, f"request head larger than {max_bytes} bytes")
        chunk = await stream.receive_some(4096)
        if not chunk:
            raise HttpError(400, "connection closed before the end of the request head")
        buffer += chunk


def render_response(
    status: int, body: bytes, content_type: str, *, head_only: bool = False
) -> bytes:
    reason = HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    return head if head_only else head + body
