"""The streaming list (WatchList) in the watch loop, against a scripted fake server under Trio's
autojump clock: the initial-events-end bookmark found wherever the stream is cut, a stream that
ends before it is a failed list (retried with backoff, reported), the fallback to LIST in auto
mode and not in "on" mode. The same behaviour against the real apiserver is in
tests/integration/test_streaming_list.py."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY

from nodeagent.kube import CONFIGMAPS, WatchOptions, WatchRequest, errors, run_watch
from nodeagent.kube.watch import INITIAL_EVENTS_END, _InitialEvents, find_initial_events_end
from tests.support.fake_http_apiserver import line, mock_client, obj, status
from tests.support.informer import EventType, ObjectCache

REQUEST = WatchRequest(CONFIGMAPS, "ns")


def streaming_lists(result: str) -> float:
    labels = {"resource": "configmaps", "result": result}
    return REGISTRY.get_sample_value("nodeagent_watch_streaming_lists_total", labels) or 0.0


def counts() -> dict[str, float]:
    return {r: streaming_lists(r) for r in ("complete", "failed", "unsupported")}


def delta(before: dict[str, float]) -> dict[str, float]:
    return {r: v - before[r] for r, v in counts().items()}


def end_bookmark(rv: str) -> bytes:
    meta = {"resourceVersion": rv, "annotations": {INITIAL_EVENTS_END: "true"}}
    return line("BOOKMARK", {"kind": "ConfigMap", "metadata": meta})


def hostile(name: str, rv: str) -> dict[str, Any]:
    """An object whose data carries the marker and a BOOKMARK look-alike: not the end."""
    o = obj(name, rv)
    o["metadata"]["annotations"] = {INITIAL_EVENTS_END: "true"}
    o["data"] = {"x": json.dumps({"type": "BOOKMARK", INITIAL_EVENTS_END: "true"})}
    return o


INITIAL = line("ADDED", obj("a", "5")) + line("ADDED", hostile("b", "6"))
AFTER = line("ADDED", obj("c", "12"))
STREAM = INITIAL + end_bookmark("10") + AFTER


def test_end_bookmark_found_only_in_a_bookmark_event() -> None:
    end, rv = find_initial_events_end(STREAM) or (0, "")
    assert (STREAM[:end], rv) == (INITIAL + end_bookmark("10"), "10")
    assert find_initial_events_end(INITIAL) is None
    # A bookmark without the annotation, or with another value, is an ordinary bookmark.
    plain = line("BOOKMARK", {"metadata": {"resourceVersion": "7"}})
    other = line(
        "BOOKMARK", {"metadata": {"resourceVersion": "8", "annotations": {INITIAL_EVENTS_END: "x"}}}
    )
    assert find_initial_events_end(plain + other) is None


@pytest.mark.parametrize("step", [1, 7, 64, len(STREAM)])
def test_splitter_finds_the_end_wherever_the_stream_is_cut(step: int) -> None:
    for first in range(0, len(STREAM), max(1, step // 2)):
        cuts = [0, first, *range(first + step, len(STREAM), step), len(STREAM)]
        splitter = _InitialEvents()
        fed, rest, found = b"", b"", None
        for a, b in itertools.pairwise(cuts):
            if found is not None:
                rest += STREAM[a:b]
                continue
            lines, end = splitter.push(STREAM[a:b])
            fed += lines
            if end is not None:
                rest, found = end
        assert (fed, rest, found) == (INITIAL + end_bookmark("10"), AFTER, "10"), cuts


class Sink(ObjectCache):
    def __init__(self) -> None:
        super().__init__(self._record)
        self.events: list[tuple[EventType, str, str]] = []
        self.lists_ended: list[str] = []
        self.failures: list[tuple[str, float]] = []

    async def _record(self, type: EventType, raw: bytes) -> None:
        meta = json.loads(raw)["metadata"]
        self.events.append((type, meta["name"], meta["resourceVersion"]))

    async def end_list(self, resource_version: str) -> None:
        await super().end_list(resource_version)
        self.lists_ended.append(resource_version)

    def list_failed(self, error: Exception, retry_in: float) -> None:
        self.failures.append((str(error), retry_in))


class Server:
    """Answers streaming watches from ``streams`` (bytes streamed then closed, or a Response),
    plain LISTs with ``objects``, resumed watches by staying open and silent."""

    def __init__(self, streams: list[bytes | httpx.Response]) -> None:
        self.streams = streams
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.changed = trio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        kind = "list" if params.get("watch") != "true" else "watch"
        if params.get("sendInitialEvents") == "true":
            kind = "stream"
        self.requests.append((kind, params))
        self.changed.set()
        self.changed = trio.Event()
        if kind == "list":
            items = [obj("a", "5")]
            return httpx.Response(200, json={"metadata": {"resourceVersion": "9"}, "items": items})
        if kind == "stream" and self.streams:
            script = self.streams.pop(0)
            if isinstance(script, httpx.Response):
                return script
            return httpx.Response(200, content=_chunks(script))
        return httpx.Response(200, content=_chunks(None))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.requests]

    async def wait(self, n: int) -> None:
        with trio.fail_after(10_000):
            while len(self.requests) < n:
                await self.changed.wait()


async def _chunks(data: bytes | None) -> Any:
    if data is None:
        await trio.sleep_forever()
    yield data


async def _watch(server: Server, mode: str, requests: int) -> tuple[Sink, int]:
    sink, synced = Sink(), 0

    def on_synced() -> None:
        nonlocal synced
        synced += 1

    options = WatchOptions(streaming_list=mode, backoff=(0.5, 30.0))  # type: ignore[arg-type]
    async with mock_client(server, watch=options) as client, trio.open_nursery() as nursery:
        nursery.start_soon(lambda: run_watch(client, REQUEST, sink, on_synced=on_synced))
        await server.wait(requests)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return sink, synced


async def test_streaming_list_then_watch_on_one_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = Server([STREAM])
    sink, synced = await _watch(server, "on", 2)
    first = server.requests[0][1]
    assert first["resourceVersionMatch"] == "NotOlderThan" and "resourceVersion" not in first
    assert first["allowWatchBookmarks"] == "true"
    assert sink.lists_ended == ["10"] and synced == 1
    assert [n for _, n, _ in sink.events] == ["a", "b", "c"]
    # The stream closed after the list: the watch resumes from the newest event, no relist.
    assert server.kinds() == ["stream", "watch"]
    assert server.requests[1][1]["resourceVersion"] == "12"


async def test_stream_ending_before_the_bookmark_is_a_failed_list(
    autojump_clock: trio.testing.MockClock,
) -> None:
    error = line("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError"})
    server = Server([INITIAL, INITIAL + error, STREAM])
    before = counts()
    sink, synced = await _watch(server, "on", 4)
    assert delta(before) == {"complete": 1, "failed": 2, "unsupported": 0}
    assert server.kinds() == ["stream", "stream", "stream", "watch"]
    (early, early_delay), (failure, error_delay) = sink.failures
    assert early.endswith(f"before the {INITIAL_EVENTS_END} bookmark")
    assert "InternalError" in failure
    # Retried with the watch backoff: 0.5 s doubling, jittered up to half below.
    assert 0.25 <= early_delay <= 0.5 and 0.5 <= error_delay <= 1.0
    # Nothing was synced before the third stream's bookmark; then the same objects once each.
    assert sink.lists_ended == ["10"] and synced == 1
    assert sorted({n for _, n, _ in sink.events}) == ["a", "b", "c"]


async def test_auto_falls_back_to_list_when_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refused = status(422, "Invalid", "sendInitialEvents is forbidden for watch")
    server = Server([refused])
    before = counts()
    sink, synced = await _watch(server, "auto", 3)
    assert delta(before) == {"complete": 0, "failed": 0, "unsupported": 1}
    assert server.kinds() == ["stream", "list", "watch"]
    assert server.requests[2][1]["resourceVersion"] == "9"
    assert synced == 1 and sink.failures == []


async def test_on_does_not_fall_back_and_reports_the_refusal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refused = status(422, "Invalid", "sendInitialEvents is forbidden for watch")
    server = Server([refused, refused, STREAM])
    before = counts()
    sink, synced = await _watch(server, "on", 4)
    assert delta(before) == {"complete": 1, "failed": 2, "unsupported": 0}
    assert server.kinds() == ["stream", "stream", "stream", "watch"]
    assert all("sendInitialEvents is forbidden" in f for f, _ in sink.failures)
    assert len(sink.failures) == 2 and synced == 1


async def test_forbidden_streaming_list_is_raised(autojump_clock: trio.testing.MockClock) -> None:
    server = Server([status(403, "Forbidden", "no")])
    options = WatchOptions(streaming_list="auto")
    async with mock_client(server, watch=options) as client:
        with pytest.raises(errors.Forbidden, match="no"):
            await run_watch(client, REQUEST, Sink())
