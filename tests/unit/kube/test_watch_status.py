"""A query's status through the real watch loop and client over an in-process fake apiserver
(issue 21 section 3): events known to be missing (a 410, a relist that cannot even connect, the
backoff sleep before a relist) make a query not known, in both list modes and for every way a
connection can fail before the server answers; and a query that becomes known again wakes the
consumer even when the relist found no difference."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY

from nodeagent.accumulator import (
    Accumulator,
    AccumulatorSettings,
    ObjectMap,
    Query,
    QueryState,
)
from nodeagent.kube import CONFIGMAPS, KubeClient, WatchOptions, errors
from nodeagent.kube.watch import INITIAL_EVENTS_END
from tests.support.fake_http_apiserver import line, mock_client, status
from tests.support.fake_http_apiserver import obj as kube_obj
from tests.support.fake_watch import FakeClient
from tests.unit.accumulator.helpers import obj, page

QUERY: Query[Any] = Query("cms", "v1", CONFIGMAPS, namespace="ns")
EXPIRED = line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})

Failure = Literal["503", "429", "refused", "credential"]
FAILURES: tuple[Failure, ...] = ("503", "429", "refused", "credential")
LAST_ERROR = {
    "503": "503 ServiceUnavailable",
    "429": "429 TooManyRequests",
    "refused": "Connection refused",
    "credential": "exec plugin /bin/cred exited 1",
}


@dataclass
class View:
    cms: ObjectMap[Any] = field(default_factory=ObjectMap)


def list_failures() -> float:
    labels = {"query": "cms"}
    return REGISTRY.get_sample_value("nodeagent_accumulator_list_failures_total", labels) or 0.0


def end_bookmark(rv: str) -> bytes:
    meta = {"resourceVersion": rv, "annotations": {INITIAL_EVENTS_END: "true"}}
    return line("BOOKMARK", {"kind": "ConfigMap", "metadata": meta})


class Tokens:
    """A token source whose credential helper can start failing (an exec plugin that exits 1)."""

    def __init__(self) -> None:
        self.failing = False
        self.asked = trio.Event()  # set at each call: a request is about to be made

    async def token(self) -> str:
        self.asked.set()
        self.asked = trio.Event()
        if self.failing:
            raise errors.CredentialError("exec plugin /bin/cred exited 1: no network")
        return "t"

    def invalidate(self) -> None:
        pass


class Server:
    """Serves ``objects`` at resourceVersion 10 as a List or as a streaming list's initial
    events (then closes the stream); the first watch resumed from there gets a 410 ERROR event,
    and from then on every request fails with ``failure`` before the server answers (while
    ``failing``)."""

    def __init__(self, failure: Failure, tokens: Tokens) -> None:
        self.failure = failure
        self.tokens = tokens
        self.objects = {"a": "5"}
        self.failing = False
        self.expired = False
        self.requests: list[tuple[float, str]] = []
        self.changed = trio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        kind = "list" if params.get("watch") != "true" else "watch"
        if params.get("sendInitialEvents") == "true":
            kind = "stream"
        self.requests.append((trio.current_time(), kind))
        self.changed.set()
        self.changed = trio.Event()
        if self.failing:
            if self.failure == "503":
                return status(503, "ServiceUnavailable", "the watch cache is not ready")
            if self.failure == "429":
                return status(429, "TooManyRequests", "slow down", **{"Retry-After": "2"})
            raise httpx.ConnectError("[Errno 111] Connection refused")
        items = [kube_obj(n, rv) for n, rv in sorted(self.objects.items())]
        if kind == "list":
            return httpx.Response(200, json={"metadata": {"resourceVersion": "10"}, "items": items})
        if kind == "stream":
            body = b"".join(line("ADDED", o) for o in items) + end_bookmark("10")
            return httpx.Response(200, content=_once(body))  # listed, then the stream closes
        if self.expired:
            return httpx.Response(200, content=_once(None))  # later watches: open and silent
        # The first resumed watch: its resourceVersion is already compacted.
        self.expired = True
        self.failing = True  # every later request fails
        self.tokens.failing = self.failure == "credential"
        return httpx.Response(200, content=_once(EXPIRED))

    def count(self, kind: str) -> int:
        return sum(1 for _, k in self.requests if k == kind)

    async def wait(self, predicate: Callable[[], bool]) -> None:
        with trio.fail_after(100_000):
            while not predicate():
                await self.changed.wait()


async def _once(data: bytes | None) -> AsyncIterator[bytes]:
    if data is None:
        await trio.sleep_forever()
    yield data or b""


def _client(server: Server, tokens: Tokens, mode: str, backoff: tuple[float, float]) -> KubeClient:
    options = WatchOptions(streaming_list=mode, backoff=backoff)  # type: ignore[arg-type]
    client = mock_client(server, watch=options, max_attempts=1)
    client.tokens = tokens
    return client


@pytest.mark.parametrize("failure", FAILURES)
async def test_streaming_relist_that_cannot_connect_is_not_synced(
    autojump_clock: trio.testing.MockClock, failure: Failure
) -> None:
    # Listed by a streaming list, then a 410: every relist attempt fails before the server
    # answers. The query must say so, as the paged mode does: events are known to be missing.
    tokens = Tokens()
    server = Server(failure, tokens)
    before = list_failures()
    async with _client(server, tokens, "on", (0.5, 30.0)) as client, trio.open_nursery() as n:
        acc = Accumulator(client, [QUERY], AccumulatorSettings())
        await n.start(acc.run)
        await acc.changed()
        assert acc.update(View())
        # Counted by the loop, not the server: a credential failure never reaches it. Each
        # attempt asks for a token first, after the previous failure was counted.
        with trio.fail_after(100_000):
            while list_failures() < before + 20:
                await tokens.asked.wait()
        st = acc.status("cms")
        assert st.state is QueryState.RELISTING and not st.known
        failed = int(list_failures() - before)
        assert st.reason is not None and st.reason.startswith(f"relist failed {failed}x, last: ")
        assert LAST_ERROR[failure] in st.reason
        assert acc.problems() == {"cms": st.reason}
        n.cancel_scope.cancel()


@pytest.mark.parametrize("mode", ["on", "off"])
async def test_backoff_before_a_relist_is_not_synced(
    autojump_clock: trio.testing.MockClock, mode: str
) -> None:
    # The watch gets a 410 before any event: the relist waits out the backoff (15-30 s here).
    # Events are missing from that moment, not only once the relist connects.
    tokens = Tokens()
    server = Server("refused", tokens)
    async with _client(server, tokens, mode, (30.0, 60.0)) as client, trio.open_nursery() as n:
        acc = Accumulator(client, [QUERY], AccumulatorSettings())
        await n.start(acc.run)
        await acc.changed()
        acc.update(View())
        first = "stream" if mode == "on" else "list"
        await server.wait(lambda: server.count("watch") >= 1)
        server.failing = False  # the relist will not be refused: this is about the wait before it
        tokens.failing = False
        await trio.sleep(1)
        assert server.count(first) == 1, server.requests  # still waiting out the backoff
        st = acc.status("cms")
        assert st.state is QueryState.RELISTING and not st.known, st
        n.cancel_scope.cancel()


# -- becoming known again wakes the consumer ------------------------------------------------


async def test_known_again_without_changes_wakes_the_consumer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = FakeClient()
    acc = Accumulator(client, [QUERY], AccumulatorSettings(), watch=client.run_watch)
    async with trio.open_nursery() as n:
        await n.start(acc.run)
        sink = await client.sink("configmaps")
        await sink.begin_list()
        await sink.list_page(page([obj("a", 5, "ns")], 10))
        await sink.end_list("10")
        await acc.changed()
        view = View()
        assert acc.update(view)
        # A relist begins (a 410): the consumer sees the query not known and skips its work.
        await sink.begin_list()
        assert not acc.status("cms").known
        # The relist lists exactly what was known: no object changed, but the query is known
        # again, and a consumer that held back must hear of it.
        await sink.list_page(page([obj("a", 5, "ns")], 12))
        await sink.end_list("12")
        assert acc.status("cms").known
        with trio.fail_after(600):
            await acc.changed()
        deltas: list[Any] = []
        # News for the consumer (update() True: the query is known again), with no object delta.
        assert acc.update(view, deltas) and deltas == []
        assert not acc.update(view)
        # And it is one wake-up, not a stream of them.
        with trio.move_on_after(600) as idle:
            await acc.changed()
        assert idle.cancelled_caught
        n.cancel_scope.cancel()


async def test_relist_after_failures_wakes_the_consumer_through_the_watch_loop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The real loop: a 410, three relists refused with 503, then the same objects listed again.
    tokens = Tokens()
    server = Server("503", tokens)
    async with _client(server, tokens, "off", (0.5, 30.0)) as client, trio.open_nursery() as n:
        acc = Accumulator(client, [QUERY], AccumulatorSettings())
        await n.start(acc.run)
        await acc.changed()
        view = View()
        assert acc.update(view)
        await server.wait(lambda: server.count("list") >= 4)
        assert not acc.status("cms").known
        server.failing = False  # the next relist lists what was known: no object changes
        woken = False
        with trio.move_on_after(600):
            await acc.changed()
            woken = True
        assert woken, "not woken when the query became known again"
        assert acc.status("cms").known
        deltas: list[Any] = []
        assert acc.update(view, deltas) and deltas == []
        n.cancel_scope.cancel()
