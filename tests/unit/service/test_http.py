from __future__ import annotations

import pytest
import trio
import trio.testing

from nodeagent.service.http import HttpError, parse_request_head, read_head, render_response


def test_parses_request_line_headers_and_query() -> None:
    req = parse_request_head(
        b"GET /readyz?verbose&format=json HTTP/1.1\r\nHost: x\r\nAccept: application/json"
    )
    assert (req.method, req.path, req.version) == ("GET", "/readyz", "HTTP/1.1")
    assert req.query == {"verbose": [""], "format": ["json"]}
    assert req.headers == {"host": "x", "accept": "application/json"}
    assert req.wants_json()


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /\r\nHost: x", 400),
        (b"GET  / HTTP/1.1", 400),
        (b"GET / HTTP/2.0", 505),
        (b"get / HTTP/1.1", 400),
        (b"GET http://x/ HTTP/1.1", 400),
        (b"GET / HTTP/1.1\r\nNoColon", 400),
        (b"GET / HTTP/1.1\r\nBad Name: x", 400),
        (b"GET / HTTP/1.1\r\n: empty", 400),
        (b"GET /\xff HTTP/1.1", 400),
        (b"GET /" + b"a" * 5000 + b" HTTP/1.1", 414),
        (b"GET / HTTP/1.1\r\n" + b"\r\n".join(b"X-%d: 1" % i for i in range(65)), 431),
    ],
)
def test_rejects_malformed_heads(head: bytes, status: int) -> None:
    with pytest.raises(HttpError) as info:
        parse_request_head(head)
    assert info.value.status == status


async def test_read_head_stops_at_blank_line_across_chunks() -> None:
    send, receive = trio.testing.memory_stream_pair()
    await send.send_all(b"GET / HTTP/1.1\r\nHo")
    await send.send_all(b"st: x\r\n\r\nBODY")
    assert await read_head(receive, 1024) == b"GET / HTTP/1.1\r\nHost: x"


async def test_read_head_limits_size() -> None:
    send, receive = trio.testing.memory_stream_pair()
    await send.send_all(b"GET / HTTP/1.1\r\nX: " + b"a" * 3000)
    with pytest.raises(HttpError) as info:
        await read_head(receive, 1024)
    assert info.value.status == 431


async def test_read_head_eof_is_bad_request() -> None:
    send, receive = trio.testing.memory_stream_pair()
    await send.send_all(b"GET / HT")
    await send.aclose()
    with pytest.raises(HttpError) as info:
        await read_head(receive, 1024)
    assert info.value.status == 400


def test_response_closes_and_head_has_no_body() -> None:
    full = render_response(200, b"ok\n", "text/plain")
    assert full.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Connection: close\r\n" in full and b"Content-Length: 3\r\n" in full
    assert full.endswith(b"\r\n\r\nok\n")
    assert render_response(200, b"ok\n", "text/plain", head_only=True).endswith(b"\r\n\r\n")
