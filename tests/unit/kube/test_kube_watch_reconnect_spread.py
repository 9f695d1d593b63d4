"""Reconnects spread after an apiserver restart (issue 29 item 15): with 40 agents the watch
reconnects peaked at 187 requests/s, all released together when the new apiserver served (it
accepts connections seconds before it serves them). While the apiserver does not answer, one
watch of a client goes on trying (with its backoff) and the others wait; once the server answers,
each reconnects after a random 0..``kube.watch_reconnect_spread`` s. A watch that broke first
reconnects after a random part of the spread too; the routine close at the watch's
``timeoutSeconds`` still resumes at once. The load figures are on docs/performance ("Load: many
agents against one apiserver")."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import trio

from nodeagent.kube import CONFIGMAPS, KubeClient, WatchOptions, WatchRequest, run_watch
from nodeagent.kube.kubeconfig import ClusterConfig
from tests.support.fake_http_apiserver import line, obj, status
from tests.support.wait import wait_until
from tests.unit.kube.test_kube_gzip_bodies import end_bookmark
from tests.unit.kube.test_kube_streaming_list import Sink

WATCHES = 40
SPREAD = 5.0


class Apiserver:
    """Streaming lists that deliver, then stay open until ``restart`` breaks them all at once
    (or, ``close_on_time``, until the watch's timeoutSeconds, then a clean end). From the
    restart every connection is refused (each attempt recorded in ``refused``) until
    ``serving``; then each watch's first request is recorded with its time and left open."""

    def __init__(self, *, close_on_time: bool = False) -> None:
        self.restart = trio.Event()
        self.serving = trio.Event()
        self.close_on_time = close_on_time
        self.first: dict[str, float] = {}
        self.refused: list[str] = []
        self.again: dict[str, float] = {}

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 2)[-2]  # the namespace: one per watch
        if name in self.first:
            if self.restart.is_set() and not self.serving.is_set():
                self.refused.append(name)
                raise httpx.ConnectError("connection refused")
            self.again.setdefault(name, trio.current_time())
            return httpx.Response(200, content=_silent())
        self.first[name] = trio.current_time()
        timeout = float(request.url.params["timeoutSeconds"])
        return httpx.Response(200, content=self._stream(seconds=timeout))

    async def _stream(self, *, seconds: float) -> AsyncIterator[bytes]:
        yield line("ADDED", obj("a", "5")) + end_bookmark("10")
        if self.close_on_time:
            await trio.sleep(seconds)
            return
        await self.restart.wait()
        raise httpx.ReadError("connection reset by peer")


async def _silent() -> AsyncIterator[bytes]:
    await trio.sleep_forever()
    yield b""  # pragma: no cover


async def test_watches_broken_together_come_back_spread_within_the_bound(
    autojump_clock: Any,
) -> None:
    server = Apiserver()
    options = WatchOptions(streaming_list="on", reconnect_spread=SPREAD)
    client = KubeClient(
        ClusterConfig(server="http://kube.test"),
        transport=httpx.MockTransport(server),
        watch=options,
        rng=random.Random(7),
        burst=1000,
    )
    sinks = {f"ns{i}": Sink() for i in range(WATCHES)}
    async with client, trio.open_nursery() as nursery:
        for ns, sink in sinks.items():
            nursery.start_soon(run_watch, client, WatchRequest(CONFIGMAPS, ns), sink)
        await wait_until(lambda: all(s.lists_ended for s in sinks.values()), "every watch listed")
        server.restart.set()
        await wait_until(lambda: len(server.refused) >= 5, "attempts while the server is down")
        server.serving.set()
        await wait_until(
            lambda: len(server.again) == WATCHES, "every watch reconnected", timeout=120
        )
        nursery.cancel_scope.cancel()
    # While down, one watch tried (again and again), not every one.
    assert len(set(server.refused)) == 1
    # Once it answered, the others came within the spread, not together.
    answered = min(server.again.values())
    delays = sorted(t - answered for t in server.again.values())
    assert delays[-1] <= SPREAD  # bounded
    # Spread over the window, not released together: no second holds more than a third.
    per_second = [sum(1 for d in delays if s <= d < s + 1) for s in range(int(SPREAD))]
    assert max(per_second) <= WATCHES // 3, per_second
    assert len(set(delays)) == WATCHES


def client_of(server: Apiserver) -> KubeClient:
    return KubeClient(
        ClusterConfig(server="http://kube.test"),
        transport=httpx.MockTransport(server),
        watch=WatchOptions(streaming_list="on", reconnect_spread=SPREAD, backoff=(0.5, 30.0)),
        rng=random.Random(7),
        burst=1000,
    )


async def test_a_prober_failing_for_long_holds_the_others_back_only_so_long(
    autojump_clock: Any,
) -> None:
    server = Apiserver()
    client = client_of(server)
    sinks = {f"ns{i}": Sink() for i in range(3)}
    async with client, trio.open_nursery() as nursery:
        for ns, sink in sinks.items():
            nursery.start_soon(run_watch, client, WatchRequest(CONFIGMAPS, ns), sink)
        await wait_until(lambda: all(s.lists_ended for s in sinks.values()), "every watch listed")
        broke_at = trio.current_time()
        server.restart.set()
        await wait_until(lambda: len(set(server.refused)) == 3, "every watch trying", timeout=120)
        nursery.cancel_scope.cancel()
    # Each waited at most the backoff's maximum (30 s) after its first delay (<= the spread).
    assert trio.current_time() - broke_at <= 30.0 + SPREAD + 1


async def test_a_watch_closed_at_its_timeout_resumes_at_once(autojump_clock: Any) -> None:
    server = Apiserver(close_on_time=True)
    options = WatchOptions(
        streaming_list="on", reconnect_spread=SPREAD, server_timeout=(60.0, 60.0)
    )
    client = KubeClient(
        ClusterConfig(server="http://kube.test"),
        transport=httpx.MockTransport(server),
        watch=options,
        rng=random.Random(7),
    )
    sink = Sink()
    async with client, trio.open_nursery() as nursery:
        nursery.start_soon(run_watch, client, WatchRequest(CONFIGMAPS, "ns0"), sink)
        await wait_until(lambda: "ns0" in server.again, "the watch reconnected", timeout=120)
        nursery.cancel_scope.cancel()
    assert server.again.keys() == server.first.keys() == {"ns0"}, (server.first, server.again)
    assert server.again["ns0"] - server.first["ns0"] == 60.0


class RefusingApiserver:
    """Streaming lists that deliver and stay open until ``refuse``; then the watches end and
    each one resumed from its resourceVersion is answered 403 twice (a restarted apiserver whose
    authorizer is not ready yet), each refusal recorded with its time, then served."""

    def __init__(self) -> None:
        self.refuse = trio.Event()
        self.listed: set[str] = set()
        self.refusals: dict[str, list[float]] = {}

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 2)[-2]
        if name not in self.listed:
            self.listed.add(name)
            return httpx.Response(200, content=self._stream())
        refusals = self.refusals.setdefault(name, [])
        if len(refusals) == 2:  # then it serves (a third refusal would relist)
            return httpx.Response(200, content=_silent())
        refusals.append(trio.current_time())
        return status(403, "Forbidden", "authorizer not ready")

    async def _stream(self) -> AsyncIterator[bytes]:
        yield line("ADDED", obj("a", "5")) + end_bookmark("10")
        await self.refuse.wait()


async def test_watches_refused_together_retry_spread_over_the_whole_bound(
    autojump_clock: Any,
) -> None:
    """Watches that had listed fine and are all refused (403) in the same instant retry with
    full jitter: anywhere in [0, the backoff's bound], not all in its upper half (100 agents:
    the refusals of one second came back in one second)."""
    server = RefusingApiserver()
    client = KubeClient(
        ClusterConfig(server="http://kube.test"),
        transport=httpx.MockTransport(server),
        # No reconnect spread: every watch is refused in the same instant.
        watch=WatchOptions(streaming_list="on", reconnect_spread=0.0, backoff=(0.5, 30.0)),
        rng=random.Random(7),
        burst=1000,
    )
    sinks = {f"ns{i}": Sink() for i in range(WATCHES)}
    async with client, trio.open_nursery() as nursery:
        for ns, sink in sinks.items():
            nursery.start_soon(run_watch, client, WatchRequest(CONFIGMAPS, ns), sink)
        await wait_until(lambda: all(s.lists_ended for s in sinks.values()), "every watch listed")
        server.refuse.set()
        await wait_until(
            lambda: (
                len(server.refusals) == WATCHES
                and all(len(r) >= 2 for r in server.refusals.values())
            ),
            "every watch refused twice",
        )
        nursery.cancel_scope.cancel()
    firsts = {r[0] for r in server.refusals.values()}
    assert len(firsts) == 1, firsts  # refused together
    delays = sorted(r[1] - r[0] for r in server.refusals.values())
    assert delays[-1] <= 0.5  # the bound (the first backoff step) holds
    # Over the whole bound: some retry in its first quarter, some in its last.
    assert delays[0] < 0.125 and delays[-1] > 0.375, delays
    per_tenth = [sum(1 for d in delays if s / 10 <= d < (s + 1) / 10) for s in range(5)]
    assert max(per_tenth) <= WATCHES // 3, per_tenth


async def test_a_prober_backed_off_for_long_tries_again_within_the_spread(
    autojump_clock: Any,
) -> None:
    """The soak's 41 s: after a long outage the prober's backoff had grown to 15..30 s and the
    others waited up to 30 s each, so a server serving again went unnoticed for up to ~30 s.
    While the server does not answer the prober tries at least every ``reconnect_spread`` s,
    so once it serves every watch is back within two spreads."""
    server = Apiserver()
    client = client_of(server)
    sinks = {f"ns{i}": Sink() for i in range(4)}
    async with client, trio.open_nursery() as nursery:
        for ns, sink in sinks.items():
            nursery.start_soon(run_watch, client, WatchRequest(CONFIGMAPS, ns), sink)
        await wait_until(lambda: all(s.lists_ended for s in sinks.values()), "every watch listed")
        broke_at = trio.current_time()
        server.restart.set()
        seen = len(server.refused)
        # Serve right after an attempt refused long into the outage (backoffs grown).
        await wait_until(
            lambda: trio.current_time() - broke_at >= 120 and len(server.refused) > seen,
            "an attempt refused two minutes into the outage",
            timeout=300,
        )
        served_at = trio.current_time()
        server.serving.set()
        await wait_until(
            lambda: len(server.again) == len(sinks), "every watch reconnected", timeout=120
        )
        nursery.cancel_scope.cancel()
    assert max(server.again.values()) - served_at <= 2 * SPREAD, sorted(
        t - served_at for t in server.again.values()
    )
