"""Bounded decompression (issue 29 item 13): 127 KiB of gzip on the wire became a 128 MiB body
(peak 256 MiB), and a watch fed decoded chunks into a buffer with no cap. A response is bounded
by ``kube.max_response_bytes`` and a watch event by ``kube.max_event_bytes``: past either the
body is refused with an error naming the setting and counted
(``nodeagent_api_bodies_too_large_total``); a request is not retried, a watch relists. Each path
is driven by a real gzip bomb, and what the decoder holds meanwhile is measured."""

from __future__ import annotations

import functools
import logging
import random
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from nodeagent.core.errors import ConfigError
from nodeagent.kube import CONFIGMAPS, WatchOptions, WatchRequest, errors, run_watch
from nodeagent.kube.encoding import PIECE, BodyDecoder
from nodeagent.kube.settings import KubeSettings, load_client
from tests.support.fake_http_apiserver import line, mock_client, obj
from tests.unit.kube.test_kube_gzip_bodies import INITIAL, LATER, Scripted, gz_stream, member
from tests.unit.kube.test_kube_streaming_list import Sink

REQUEST = WatchRequest(CONFIGMAPS, "ns")
MiB = 1 << 20


@functools.cache
def bomb(size: int, prefix: bytes = b"") -> bytes:
    """One gzip member of ``prefix`` then ``size`` bytes of spaces and no newline (~1/1000 of
    its size on the wire), compressed a MiB at a time: never held whole, here either."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [z.compress(prefix)]
    block = b" " * MiB
    parts += [z.compress(block) for _ in range(size // MiB)]
    parts.append(z.flush())
    return b"".join(parts)


def too_large(limit: str) -> float:
    labels = {"resource": "configmaps", "limit": limit}
    return REGISTRY.get_sample_value("nodeagent_api_bodies_too_large_total", labels) or 0.0


def chunks_of(data: bytes, size: int = 16384) -> httpx.Response:
    async def gen() -> AsyncIterator[bytes]:
        for i in range(0, len(data), size):
            yield data[i : i + size]

    return httpx.Response(200, content=gen(), headers={"Content-Encoding": "gzip"})


# -- the decoder ------------------------------------------------------------------------------


def test_a_bomb_is_refused_without_ever_being_held() -> None:
    wire = bomb(128 * MiB)
    assert len(wire) < 200 * 1024  # as observed: ~127 KiB on the wire
    decoder = BodyDecoder("gzip", max_bytes=4 * MiB)
    tracemalloc.start()
    try:
        with pytest.raises(errors.BodyTooLarge, match=r"kube.max_response_bytes \(4194304 bytes\)"):
            for _ in decoder.pieces(wire):
                pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * PIECE, f"held {peak} bytes decoding a bomb"
    assert decoder.decoded_bytes <= 4 * MiB + PIECE


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(st.integers(0, 300), min_size=1, max_size=30),
    max_line=st.integers(1, 300),
    gzip=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_an_event_over_the_limit_is_refused_wherever_the_body_is_cut(
    lines: list[int], max_line: int, gzip: bool, seed: int
) -> None:
    """Lines of the given lengths (the last one unterminated): refused iff one is longer than
    ``max_line``, whatever the chunking and the member boundaries."""
    rng = random.Random(seed)
    body = b"\n".join(bytes([97 + i % 26]) * n for i, n in enumerate(lines))
    raw = member(body) if gzip else body
    decoder = BodyDecoder("gzip" if gzip else None, max_line=max_line)
    out: list[bytes] = []
    over = max(lines) > max_line
    try:
        i = 0
        while i < len(raw):
            n = rng.randint(1, 64)
            out += decoder.pieces(raw[i : i + n])
            i += n
    except errors.BodyTooLarge as exc:
        assert over and exc.limit == "event" and "kube.max_event_bytes" in str(exc)
    else:
        assert not over and b"".join(out) == body


# -- a request: refused at once, counted, not retried ------------------------------------------


async def test_a_response_bomb_fails_the_request_once_with_a_clear_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="nodeagent.kube.transport")
    calls: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return chunks_of(bomb(32 * MiB, b'{"kind":"ConfigMapList","items":["'))

    before = too_large("response")
    async with mock_client(handler, max_response_bytes=2 * MiB) as client:
        with pytest.raises(errors.BodyTooLarge, match=r"kube\.max_response_bytes") as raised:
            await client.list(CONFIGMAPS, "ns")
    assert raised.value.limit == "response"
    assert "GET /api/v1/namespaces/ns/configmaps" in str(raised.value)
    assert len(calls) == 1  # the same answer would be as large again
    assert too_large("response") - before == 1
    assert "response body too large" in caplog.text


# -- a watch: the event refused, counted, logged, relisted -------------------------------------


async def test_an_event_bomb_on_a_watch_relists(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="nodeagent.kube.watch")
    wire = bomb(64 * MiB, b'{"type":"ADDED","object":{"metadata":{"name":"')
    server = Scripted([gz_stream([INITIAL, LATER, wire])])
    sink = Sink()
    before = too_large("event")
    options = WatchOptions(streaming_list="on", max_event_bytes=MiB)
    client = mock_client(server, watch=options)
    tracemalloc.start()
    try:
        async with client, trio.open_nursery() as nursery:
            nursery.start_soon(run_watch, client, REQUEST, sink)
            await server.wait(2)
            nursery.cancel_scope.cancel()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert too_large("event") - before == 1
    [record] = [r for r in caplog.records if r.getMessage() == "watch body too large: relisting"]
    assert "kube.max_event_bytes (1048576 bytes" in record.__dict__["fields"]["error"]
    # Relisted, never resumed from rv 11 as if nothing was lost.
    assert server.requests[1].get("sendInitialEvents") == "true"
    assert "resourceVersion" not in server.requests[1]
    assert [name for _, name, _ in sink.events] == ["a", "b"]
    assert peak < 8 * MiB, f"held {peak} bytes of a 64 MiB event"


async def test_an_event_bomb_in_a_streaming_list_fails_the_list_and_it_is_retried(
    autojump_clock: Any,
) -> None:
    first = member(line("ADDED", obj("a", "5"))) + bomb(64 * MiB, b'{"type":"ADDED"')
    server = Scripted([gz_stream([first]), gz_stream([INITIAL, LATER])])
    sink = Sink()
    before = too_large("event")
    client = mock_client(server, watch=WatchOptions(streaming_list="on", max_event_bytes=MiB))
    async with client, trio.open_nursery() as nursery:
        nursery.start_soon(run_watch, client, REQUEST, sink)
        await server.wait(3)
        nursery.cancel_scope.cancel()
    assert too_large("event") - before == 1
    assert len(sink.failures) == 1 and "kube.max_event_bytes" in sink.failures[0][0]
    assert sink.lists_ended == ["10"]
    assert [name for _, name, _ in sink.events] == ["a", "b"]


async def test_a_list_page_bomb_fails_the_list_and_it_is_retried(autojump_clock: Any) -> None:
    lists: list[int] = []
    synced = trio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch") == "true":
            synced.set()
            return httpx.Response(200, content=_silent())
        lists.append(1)
        if len(lists) == 1:
            return chunks_of(bomb(32 * MiB, b'{"kind":"ConfigMapList","items":["'))
        items = [obj("a", "5")]
        return httpx.Response(200, json={"metadata": {"resourceVersion": "9"}, "items": items})

    sink = Sink()
    before = too_large("response")
    client = mock_client(handler, watch=WatchOptions(streaming_list="off"), max_response_bytes=MiB)
    async with client, trio.open_nursery() as nursery:
        nursery.start_soon(run_watch, client, REQUEST, sink)
        await synced.wait()
        nursery.cancel_scope.cancel()
    assert too_large("response") - before == 1
    assert len(sink.failures) == 1 and "kube.max_response_bytes" in sink.failures[0][0]
    assert len(lists) == 2 and sink.lists_ended == ["9"]


async def _silent() -> AsyncIterator[bytes]:
    await trio.sleep_forever()
    yield b""  # pragma: no cover


# -- the settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("max_response_bytes", 1000, "must be >= 1048576"),
        ("max_event_bytes", 0, "must be >= 1048576"),
        ("watch_reconnect_spread", -1.0, "must be in 0..60"),
        ("watch_reconnect_spread", 61.0, "must be in 0..60"),
    ],
)
def test_limits_out_of_range_name_the_field(field: str, value: float, rule: str) -> None:
    with pytest.raises(ConfigError, match=rule) as raised:
        msgspec.structs.replace(KubeSettings(), **{field: value}).validate()
    assert f"kube.{field}" in str(raised.value)


def test_the_settings_reach_the_client(tmp_path: Any) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    settings = KubeSettings(
        kubeconfig=str(kubeconfig),
        max_response_bytes=3 * MiB,
        max_event_bytes=2 * MiB,
        watch_reconnect_spread=7.5,
    )
    client = load_client(settings)
    assert client is not None
    assert client.transport.max_response_bytes == 3 * MiB
    assert client.watch_options.max_event_bytes == 2 * MiB
    assert client.watch_options.reconnect_spread == 7.5
    defaults = KubeSettings()
    assert (defaults.max_response_bytes, defaults.max_event_bytes) == (64 * MiB, 16 * MiB)
