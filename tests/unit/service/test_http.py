"""The ops endpoint's request parsing (h11 plus our limits) over in-memory streams."""

from __future__ import annotations

import h11
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.service.http import (
    ClientGone,
    HeadLimits,
    HeadTimeout,
    HttpError,
    new_connection,
    read_request,
    render_response,
)

LIMITS = HeadLimits(max_bytes=1024, head_timeout=3.0, read_timeout=1.0)


async def parse(*chunks: bytes, eof: bool = True, limits: HeadLimits = LIMITS) -> object:
    send, receive = trio.testing.memory_stream_pair()
    for chunk in chunks:
        await send.send_all(chunk)
    if eof:
        await send.aclose()
    return await read_request(receive, new_connection(limits), limits)


async def test_parses_request_line_headers_and_query() -> None:
    req = await parse(
        b"GET /readyz?verbose&format=json HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n\r\n"
    )
    assert (req.method, req.path, req.version) == ("GET", "/readyz", "HTTP/1.1")  # type: ignore[attr-defined]
    assert req.query == {"verbose": [""], "format": ["json"]}  # type: ignore[attr-defined]
    assert req.headers == {"host": "x", "accept": "application/json"}  # type: ignore[attr-defined]
    assert req.wants_json()  # type: ignore[attr-defined]


async def test_head_split_across_reads_and_http10_without_host() -> None:
    req = await parse(b"GET /healthz HT", b"TP/1.0\r\nX-A: 1\r", b"\n\r\nBODY", eof=False)
    assert (req.path, req.version, req.headers) == ("/healthz", "HTTP/1.0", {"x-a": "1"})  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("head", "status", "reason"),
    [
        (b"GET /\r\nHost: x\r\n\r\n", 400, "malformed"),
        (b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed"),
        (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, "version"),
        (b"GET / HTTP/1.1\r\n\r\n", 400, "malformed"),  # HTTP/1.1 requires Host
        (b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n", 400, "target"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", 400, "malformed"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: x\r\n\r\n", 400, "malformed"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n: empty\r\n\r\n", 400, "malformed"),
        (b"GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, "malformed"),  # a TLS hello
        (b"\r\n\r\n\r\n", 400, "malformed"),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(65)),
            431,
            "too_many_headers",
        ),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 1100 + b"\r\n\r\n", 431, "head_too_large"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n", 400, "eof"),
    ],
)
async def test_rejects_malformed_heads(head: bytes, status: int, reason: str) -> None:
    if reason == "too_many_headers":
        head += b"\r\n"
    # 65 header lines fit in 4 KiB: the count is refused, not the size.
    limits = LIMITS if reason == "head_too_large" else HeadLimits(4096, 3.0, 1.0)
    with pytest.raises(HttpError) as info:
        await parse(head, limits=limits)
    assert (info.value.status, info.value.reason) == (status, reason)


class Endless(trio.abc.ReceiveStream):
    """A client sending a head that never ends; counts what the server reads."""

    def __init__(self) -> None:
        self.read = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        chunk = b"GET / HTTP/1.1\r\n" if not self.read else b"X: " + b"a" * 60000
        chunk = chunk[: max_bytes or len(chunk)]
        self.read += len(chunk)
        return chunk

    async def aclose(self) -> None:
        pass


async def test_an_oversized_head_is_refused_without_reading_it_all() -> None:
    stream = Endless()
    with pytest.raises(HttpError) as info:
        await read_request(stream, new_connection(LIMITS), LIMITS)
    assert info.value.status == 431
    assert stream.read <= 1024 + 4


async def test_a_head_of_exactly_the_limit_is_accepted() -> None:
    line = b"GET / HTTP/1.1\r\nHost: x\r\nX: "
    head = line + b"a" * (1024 - len(line) - 2) + b"\r\n"
    assert len(head) == 1024
    assert (await parse(head + b"\r\n", eof=False)).path == "/"  # type: ignore[attr-defined]


async def test_client_gone_without_sending_anything() -> None:
    with pytest.raises(ClientGone):
        await parse()


async def test_slowloris_hits_the_whole_head_deadline(autojump_clock: trio.abc.Clock) -> None:
    send, receive = trio.testing.memory_stream_pair()

    async def drip() -> None:
        # One byte every 0.5 s: each read is within read_timeout, the head never completes.
        for byte in b"GET / HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            await send.send_all(bytes([byte]))
            await trio.sleep(0.5)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drip)
        start = trio.current_time()
        with pytest.raises(HeadTimeout, match="not received within 3s") as info:
            await read_request(receive, new_connection(LIMITS), LIMITS)
        nursery.cancel_scope.cancel()
    assert info.value.status == 408 and info.value.reason == "timeout"
    assert trio.current_time() - start == pytest.approx(3.0)


async def test_idle_connection_hits_the_read_deadline(autojump_clock: trio.abc.Clock) -> None:
    send, receive = trio.testing.memory_stream_pair()
    await send.send_all(b"GET / HT")
    start = trio.current_time()
    with pytest.raises(HeadTimeout, match="no data for 1s"):
        await read_request(receive, new_connection(LIMITS), LIMITS)
    assert trio.current_time() - start == pytest.approx(1.0)


async def test_response_through_h11_closes_and_head_has_no_body() -> None:
    conn = new_connection(LIMITS)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert isinstance(conn.next_event(), h11.Request)
    full = render_response(conn, 200, b"ok\n", "text/plain")
    assert full.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"connection: close\r\n" in full.lower() and b"content-length: 3\r\n" in full.lower()
    assert full.endswith(b"\r\n\r\nok\n")
    head = new_connection(LIMITS)
    head.receive_data(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
    head.next_event()
    assert render_response(head, 200, b"ok\n", "text/plain", head_only=True).endswith(b"\r\n\r\n")


async def test_error_response_after_a_parse_error_and_without_a_request() -> None:
    conn = new_connection(LIMITS)
    conn.receive_data(b"garbage\r\n\r\n")
    with pytest.raises(h11.RemoteProtocolError):
        conn.next_event()
    assert render_response(conn, 400, b"bad\n", "text/plain").startswith(b"HTTP/1.1 400 ")
    # No request at all (a timeout): the same head, written directly.
    out = render_response(None, 408, b"late\n", "text/plain")
    assert out.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and out.endswith(b"\r\n\r\nlate\n")


class Chunks(trio.abc.ReceiveStream):
    """A client whose bytes arrive in the given pieces, then EOF."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)
        self.read = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if max_bytes is not None and len(chunk) > max_bytes:
            chunk, rest = chunk[:max_bytes], chunk[max_bytes:]
            self.chunks.insert(0, rest)
        self.read += len(chunk)
        return chunk

    async def aclose(self) -> None:
        pass


HEAD_PIECES = st.sampled_from(
    [
        b"GET ",
        b"HEAD ",
        b"/healthz",
        b"/%00",
        b"?a=b",
        b" HTTP/1.1",
        b" HTTP/1.0",
        b"\r\n",
        b"\n",
        b"\r",
        b"Host: x",
        b": ",
        b"\x00",
        b"\xff",
        b"\x1b[2J",
        b" ",
        b"\t",
        b"X" * 700,
        b"Content-Length: 5",
        b"Transfer-Encoding: chunked",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(st.binary(max_size=3000), st.lists(HEAD_PIECES, max_size=40).map(b"".join)),
    cuts=st.lists(st.integers(min_value=1, max_value=64), max_size=20),
)
def test_any_input_gives_a_request_or_a_refusal(data: bytes, cuts: list[int]) -> None:
    # Whatever a client sends, in whatever pieces: a parsed request, an HttpError with a
    # status to answer, or "gone"; never another exception, never more than the limit read.
    chunks, rest = [], data
    for cut in cuts:
        chunks.append(rest[:cut])
        rest = rest[cut:]
    chunks = [c for c in chunks if c] + ([rest] if rest else [])

    client = Chunks(chunks)

    async def main() -> None:
        try:
            request = await read_request(client, new_connection(LIMITS), LIMITS)
        except HttpError as exc:
            assert 400 <= exc.status < 600 and exc.reason
        except ClientGone:
            assert not data
        else:
            assert request.method and request.path.startswith("/")
            assert request.version in ("HTTP/1.0", "HTTP/1.1")

    trio.run(main)
    assert client.read <= LIMITS.max_bytes + 4
