"""Compressed bodies on the raw wire: Kubernetes 1.37 gzips a streaming list (WatchListCompression)
as one gzip member per flush, and httpx's own gzip decoder stops after the first member. The
client decodes every member, whatever the chunking, and fails loudly (metric, error log, relist)
on a body it cannot decode to its end. The same against the real 1.37 apiserver is in
tests/integration/test_streaming_list.py."""

from __future__ import annotations

import gzip
import json
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from nodeagent.kube import CONFIGMAPS, KubeClient, WatchOptions, WatchRequest, errors, run_watch
from nodeagent.kube.encoding import BodyDecoder, decode_body
from nodeagent.kube.kubeconfig import ClusterConfig
from nodeagent.kube.watch import INITIAL_EVENTS_END
from tests.support.fake_http_apiserver import line, mock_client, obj
from tests.unit.kube.test_kube_streaming_list import Sink

REQUEST = WatchRequest(CONFIGMAPS, "ns")


def member(data: bytes) -> bytes:
    """One gzip member, as Go's gzip.Writer closes it on every flush of a 1.37 watch."""
    return gzip.compress(data, mtime=0)


def end_bookmark(rv: str) -> bytes:
    meta = {"resourceVersion": rv, "annotations": {INITIAL_EVENTS_END: "true"}}
    return line("BOOKMARK", {"kind": "ConfigMap", "metadata": meta})


def cut(data: bytes, rng: random.Random, max_chunk: int) -> list[bytes]:
    """``data`` cut at random points (chunks of 1..max_chunk bytes)."""
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, max_chunk)
        out.append(data[i : i + n])
        i += n
    return out


def decode_errors() -> float:
    labels = {"resource": "configmaps"}
    return REGISTRY.get_sample_value("nodeagent_watch_decode_errors_total", labels) or 0.0


# -- the decoder ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=40),
    seed=st.integers(0, 2**32),
    max_chunk=st.integers(1, 400),
)
def test_every_member_decoded_wherever_the_body_is_cut(
    payloads: list[bytes], seed: int, max_chunk: int
) -> None:
    body = b"".join(member(p) for p in payloads)
    decoder = BodyDecoder("gzip")
    out = b"".join(decoder.decode(c) for c in cut(body, random.Random(seed), max_chunk))
    decoder.finish()
    assert out == b"".join(payloads)
    assert decoder.members == len(payloads)
    assert decoder.raw_bytes == len(body)


def test_httpx_alone_would_lose_every_member_after_the_first() -> None:
    """Why the client decodes bodies itself (encode/httpx PR #3270 was closed unmerged)."""
    body = member(b"first\n") + member(b"second\n") + member(b"third\n")
    assert httpx.Response(200, content=body, headers={"Content-Encoding": "gzip"}).content == (
        b"first\n"
    )
    assert decode_body("gzip", body) == b"first\nsecond\nthird\n"


@pytest.mark.parametrize("keep", [1, 10, 11, 20])
def test_a_member_cut_short_at_the_end_of_the_body_is_an_error(keep: int) -> None:
    body = member(b"whole\n") + member(b"cut short\n")[:keep]
    decoder = BodyDecoder("gzip")
    # What a cut member holds may come out (its trailer is missing, not its data) ...
    assert decoder.decode(body).startswith(b"whole\n")
    # ... but the body is refused.
    with pytest.raises(errors.DecodeError, match="ended inside member 2"):
        decoder.finish()


def test_bytes_that_are_not_gzip_are_an_error() -> None:
    with pytest.raises(errors.DecodeError, match="after 1 complete members"):
        decode_body("gzip", member(b"ok\n") + b'{"type":"ADDED"}\n')


@pytest.mark.parametrize("encoding", ["br", "deflate", "gzip, br", "zstd"])
def test_an_encoding_the_client_did_not_ask_for_is_an_error(encoding: str) -> None:
    with pytest.raises(errors.DecodeError, match="accepts only gzip"):
        BodyDecoder(encoding)


@pytest.mark.parametrize("encoding", [None, "", "identity", "Identity"])
def test_identity_passes_through(encoding: str | None) -> None:
    assert decode_body(encoding, b"plain\n") == b"plain\n"
    assert decode_body("GZIP", member(b"a") + member(b"b")) == b"ab"


async def test_plain_requests_decode_every_member_and_ask_for_gzip_only() -> None:
    items = [obj(f"cm{i}", str(i)) for i in range(50)]
    doc = json.dumps({"metadata": {"resourceVersion": "60"}, "items": items}).encode()
    seen: list[str] = []

    async def chunks() -> AsyncIterator[bytes]:
        body = member(doc[:1000]) + member(doc[1000:])
        for c in cut(body, random.Random(3), 97):
            yield c

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["accept-encoding"])
        return httpx.Response(200, content=chunks(), headers={"Content-Encoding": "gzip"})

    async with mock_client(handler) as client:
        result = await client.list(CONFIGMAPS, "ns")
    assert [json.loads(bytes(i))["metadata"]["name"] for i in result.items] == [
        f"cm{i}" for i in range(50)
    ]
    assert seen == ["gzip"]


# -- a watch on a real loopback HTTP server ---------------------------------------------------


class GzipWatchServer:
    """An HTTP/1.1 server on 127.0.0.1 answering watches like a 1.37 apiserver with
    WatchListCompression: a streaming list (``sendInitialEvents=true``) is gzipped with one member
    per flush (the initial events, the end bookmark, then each later event), sent in chunks that
    cut members anywhere; a resumed watch (``resourceVersion=``) is plain and stays open."""

    def __init__(self, events_after: int, seed: int = 7) -> None:
        self.events_after = events_after
        self.rng = random.Random(seed)
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.port = 0
        self.changed = trio.Event()

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = await stream.receive_some(65536)
            if not data:
                return
            buf += data
        head = buf.split(b"\r\n\r\n", 1)[0].decode()
        request_line, *header_lines = head.split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
        url = httpx.URL(request_line.split()[1])
        params = dict(url.params)
        self.requests.append((headers.get("accept-encoding", ""), params))
        self.changed.set()
        self.changed = trio.Event()
        if params.get("sendInitialEvents") != "true":
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            await trio.sleep_forever()
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
            b"Vary: Accept-Encoding\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        flushes = [line("ADDED", obj("a", "5")) + line("ADDED", obj("b", "6")), end_bookmark("10")]
        flushes += [line("ADDED", obj(f"after{i}", str(11 + i))) for i in range(self.events_after)]
        body = b"".join(member(f) for f in flushes)
        # HTTP chunks that end inside gzip headers, deflate blocks and trailers alike.
        for c in cut(body, self.rng, 61):
            await stream.send_all(b"%x\r\n%s\r\n" % (len(c), c))
        await stream.send_all(b"0\r\n\r\n")
        await stream.aclose()


class CountingSink(Sink):
    def __init__(self, want: int) -> None:
        super().__init__()
        self.want = want
        self.done = trio.Event()

    async def _record(self, type: Any, raw: bytes) -> None:
        await super()._record(type, raw)
        if len(self.events) >= self.want:
            self.done.set()


async def test_streaming_list_with_a_member_per_event_loses_nothing() -> None:
    server = GzipWatchServer(events_after=300)
    sink = CountingSink(2 + 300)
    options = WatchOptions(streaming_list="on", inactivity_timeout=30.0)
    async with trio.open_nursery() as servers:
        await servers.start(server.serve)
        config = ClusterConfig(server=f"http://127.0.0.1:{server.port}")
        client = KubeClient(config, watch=options, rng=random.Random(1))
        async with client, trio.open_nursery() as nursery:
            nursery.start_soon(run_watch, client, REQUEST, sink)
            with trio.fail_after(30):
                await sink.done.wait()
                # After the stream ended cleanly the watch resumes from the last event.
                while len(server.requests) < 2:
                    await server.changed.wait()
            nursery.cancel_scope.cancel()
        servers.cancel_scope.cancel()
    assert sink.lists_ended == ["10"]
    assert [name for _, name, _ in sink.events] == ["a", "b"] + [f"after{i}" for i in range(300)]
    assert server.requests[0][0] == "gzip"
    assert server.requests[1][1]["resourceVersion"] == "310"


# -- the guard: what could not be decoded fails loudly ---------------------------------------


def gz_stream(chunks: list[bytes]) -> httpx.Response:
    async def gen() -> AsyncIterator[bytes]:
        for c in chunks:
            yield c

    return httpx.Response(200, content=gen(), headers={"Content-Encoding": "gzip"})


async def silent() -> AsyncIterator[bytes]:
    await trio.sleep_forever()
    yield b""  # pragma: no cover


class Scripted:
    """Streaming lists answered from ``scripts`` in turn, then silent open watches."""

    def __init__(self, scripts: list[httpx.Response]) -> None:
        self.scripts = scripts
        self.requests: list[dict[str, str]] = []
        self.changed = trio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(dict(request.url.params))
        self.changed.set()
        self.changed = trio.Event()
        if self.scripts:
            return self.scripts.pop(0)
        return httpx.Response(200, content=silent())

    async def wait(self, n: int) -> None:
        with trio.fail_after(10_000):
            while len(self.requests) < n:
                await self.changed.wait()


INITIAL = member(line("ADDED", obj("a", "5")) + end_bookmark("10"))
LATER = member(line("ADDED", obj("b", "11")))


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(member(line("ADDED", obj("c", "12")))[:25], id="member-cut-short"),
        pytest.param(line("ADDED", obj("c", "12")), id="not-gzip"),
    ],
)
async def test_undecodable_bytes_after_the_list_count_log_and_relist(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture, tail: bytes
) -> None:
    caplog.set_level(logging.ERROR, logger="nodeagent.kube.watch")
    server = Scripted([gz_stream([INITIAL, LATER, tail])])
    sink = Sink()
    before = decode_errors()
    client = mock_client(server, watch=WatchOptions(streaming_list="on"))
    async with client, trio.open_nursery() as nursery:
        nursery.start_soon(run_watch, client, REQUEST, sink)
        await server.wait(2)
        nursery.cancel_scope.cancel()
    assert decode_errors() - before == 1
    assert "watch body not decodable: relisting" in caplog.text
    # Never resumed from rv 11 as if nothing was lost: the second request is a new list.
    assert server.requests[1].get("sendInitialEvents") == "true"
    assert "resourceVersion" not in server.requests[1]
    assert [name for _, name, _ in sink.events] == ["a", "b"]


async def test_undecodable_initial_events_fail_the_list_and_it_is_retried(
    autojump_clock: Any,
) -> None:
    server = Scripted([gz_stream([INITIAL[:12]]), gz_stream([INITIAL, LATER])])
    sink = Sink()
    before = decode_errors()
    client = mock_client(server, watch=WatchOptions(streaming_list="on"))
    async with client, trio.open_nursery() as nursery:
        nursery.start_soon(run_watch, client, REQUEST, sink)
        await server.wait(3)
        nursery.cancel_scope.cancel()
    assert decode_errors() - before == 1
    assert len(sink.failures) == 1 and "ended inside member 1" in sink.failures[0][0]
    assert sink.lists_ended == ["10"]
    assert [name for _, name, _ in sink.events] == ["a", "b"]
