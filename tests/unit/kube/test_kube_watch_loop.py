"""The watch loop's resume / relist / backoff decisions, driven by a scripted fake server."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from nodeagent.kube import (
    CONFIGMAPS,
    KubeClient,
    ListFailureSink,
    WatchOptions,
    WatchRequest,
    errors,
    run_watch,
)
from nodeagent.kube.kubeconfig import ClusterConfig
from nodeagent.kube.watch import FORBIDDEN_WATCHES_BEFORE_RELIST
from tests.support.fake_http_apiserver import FakeCluster, line, mock_client, obj, status
from tests.support.informer import EventType, Informer, ObjectCache

NS_CONFIGMAPS = WatchRequest(CONFIGMAPS, "ns")


class Sink(ObjectCache):
    def __init__(self) -> None:
        super().__init__(self._record)
        self.events: list[tuple[EventType, str, str]] = []

    async def _record(self, type: EventType, raw: bytes) -> None:
        meta = json.loads(raw)["metadata"]
        self.events.append((type, meta["name"], meta["resourceVersion"]))


async def _run(fake: FakeCluster, until: Any, **kwargs: Any) -> tuple[Sink, int]:
    sink = Sink()
    synced = 0

    def on_synced() -> None:
        nonlocal synced
        synced += 1

    async with mock_client(fake, **kwargs) as client, trio.open_nursery() as nursery:
        nursery.start_soon(lambda: run_watch(client, NS_CONFIGMAPS, sink, on_synced=on_synced))
        await fake.wait(until)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return sink, synced


async def test_resume_from_newest_rv_without_relist(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    fake.objects = {"a": "9"}
    bookmark = {"kind": "ConfigMap", "metadata": {"resourceVersion": "15"}}
    event = line("ADDED", obj("b", "11"))
    fake.scripts = [
        # An event split across chunks, then a bookmark; the server closes the stream.
        [event[:7], event[7:], line("BOOKMARK", bookmark)],
        [line("MODIFIED", obj("b", "16"))],
        status(500, "InternalError"),
    ]
    sink, synced = await _run(fake, lambda: len(fake.watches) == 4)
    assert [rv for _, rv in fake.watches] == ["10", "15", "16", "16"]
    assert len(fake.lists) == 1 and synced == 1
    assert sink.events == [("ADDED", "a", "9"), ("ADDED", "b", "11"), ("MODIFIED", "b", "16")]


async def test_error_event_410_relists_and_reports_difference(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    fake.objects = {"keep": "5", "change": "6", "gone": "7"}
    expired = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}

    def relisted() -> None:
        fake.objects = {"keep": "5", "change": "20", "new": "21"}
        fake.rv = "30"

    fake.scripts = [[line("ERROR", expired)]]
    async with mock_client(fake) as client, trio.open_nursery() as nursery:
        sink = Sink()
        nursery.start_soon(lambda: run_watch(client, NS_CONFIGMAPS, sink))
        await fake.wait(lambda: len(fake.watches) == 1)
        relisted()
        await fake.wait(lambda: len(fake.watches) == 2)
        nursery.cancel_scope.cancel()
    assert len(fake.lists) == 2
    assert [rv for _, rv in fake.watches] == ["10", "30"]  # never the stale one again
    assert sorted(sink.events[3:]) == [
        ("ADDED", "new", "21"),
        ("DELETED", "gone", "7"),
        ("MODIFIED", "change", "20"),
    ]


async def test_http_410_at_watch_start_relists(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    fake.scripts = [status(410, "Gone", "too old resource version")]
    await _run(fake, lambda: len(fake.watches) == 2)
    assert len(fake.lists) == 2


async def test_failed_list_retried_with_backoff_but_forbidden_raised(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    fake.list_errors = [status(500, "InternalError")] * 3 + [status(403, "Forbidden", "no")]
    # max_attempts=1: each failed list is one request, then the watch loop's own backoff.
    async with mock_client(fake, max_attempts=1) as client:
        with pytest.raises(errors.Forbidden, match="no"):
            await run_watch(client, NS_CONFIGMAPS, Sink())
    gaps = [b - a for a, b in zip(fake.lists, fake.lists[1:], strict=False)]
    assert [round(g, 3) > 0 for g in gaps] == [True] * 3
    assert gaps[0] <= 0.5 < gaps[2]  # 0.5 s growing toward 30 s, jittered


async def test_failed_list_then_success_syncs_once(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    fake.list_errors = [status(503, "ServiceUnavailable")]
    fake.scripts = [status(410, "Gone")]
    _, synced = await _run(fake, lambda: len(fake.watches) == 2, max_attempts=1)
    assert len(fake.lists) == 3 and synced == 1


async def test_backoff_grows_on_failing_watches_and_resets_after_healthy_stream(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    failing = [status(500, "InternalError")] * 5
    fake.scripts = [*failing, [line("ADDED", obj("x", "11"))], *failing[:2]]
    await _run(fake, lambda: len(fake.watches) == 9)
    times = [t for t, _ in fake.watches]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    bases = [0.5, 1, 2, 4, 8]
    for gap, base in zip(gaps[:5], bases, strict=True):
        # A refused watch (5xx) retries with full jitter: anywhere in [0, the step].
        assert 0 <= gap <= base
    assert gaps[5] == 0  # after a healthy stream: reconnect at once...
    assert gaps[6] <= 0.5  # ...and the backoff starts over
    assert len(fake.lists) == 1


async def test_watch_429_honours_retry_after(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    fake.scripts = [status(429, "TooManyRequests", **{"Retry-After": "12"})]
    await _run(fake, lambda: len(fake.watches) == 2)
    assert fake.watches[1][0] - fake.watches[0][0] == pytest.approx(12)


async def test_watch_request_parameters(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    seen: list[httpx.Request] = []

    async def spy(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return await fake(request)

    sink = Sink()
    async with (
        mock_client(spy, watch=WatchOptions(server_timeout=(240, 300))) as client,
        trio.open_nursery() as n,
    ):
        n.start_soon(lambda: run_watch(client, WatchRequest(CONFIGMAPS, "ns", "a=b", "x=y"), sink))
        await fake.wait(lambda: len(fake.watches) == 1)
        n.cancel_scope.cancel()
    listing, watch = seen
    assert listing.url.path == watch.url.path == "/api/v1/namespaces/ns/configmaps"
    assert listing.url.params["labelSelector"] == watch.url.params["labelSelector"] == "a=b"
    assert listing.url.params["fieldSelector"] == watch.url.params["fieldSelector"] == "x=y"
    assert watch.url.params["allowWatchBookmarks"] == "true"
    assert 240 <= int(watch.url.params["timeoutSeconds"]) <= 300


async def _stalling_server(
    requests: list[bytes], second_watch: trio.Event, stream: trio.SocketStream
) -> None:
    """Answers the list, then opens a watch and never writes a byte."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        if not chunk:
            return
        data += chunk
    head = data.split(b"\r\n", 1)[0]
    requests.append(head)
    if b"watch=true" not in head:
        body = json.dumps({"metadata": {"resourceVersion": "7"}, "items": []}).encode()
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        return
    if sum(b"watch=true" in r for r in requests) >= 2:
        second_watch.set()
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    await trio.sleep_forever()


async def test_silent_stream_detected_by_inactivity_timeout() -> None:
    # Real sockets, so real time: a small inactivity timeout keeps this quick.
    requests: list[bytes] = []
    second_watch = trio.Event()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            trio.serve_tcp,
            lambda s: _stalling_server(requests, second_watch, s),
            0,
        )
        port = listeners[0].socket.getsockname()[1]
        cfg = ClusterConfig(server=f"http://127.0.0.1:{port}")
        async with KubeClient(
            cfg, watch=WatchOptions(inactivity_timeout=0.3, backoff=(0.01, 0.02))
        ) as c:
            nursery.start_soon(lambda: run_watch(c, NS_CONFIGMAPS, Sink()))
            start = trio.current_time()
            with trio.fail_after(10):
                await second_watch.wait()
            elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert 0.3 <= elapsed < 5
    watches = [r for r in requests if b"watch=true" in r]
    assert all(b"resourceVersion=7" in r for r in watches)  # resumed, not relisted
    assert sum(b"watch=true" not in r for r in requests) == 1


async def test_garbage_list_is_reported_and_retried(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    from prometheus_client import REGISTRY

    def bad() -> float:
        return REGISTRY.get_sample_value("tests_informer_bad_events_total", {"resource": ""}) or 0

    before = bad()
    fake.objects = {"a": "3"}
    fake.list_errors = [
        httpx.Response(200, content=b"<html>proxy error</html>"),
        httpx.Response(200, json={"metadata": {}, "items": "not a list"}),
    ]
    sink, synced = await _run(fake, lambda: len(fake.watches) == 1)
    assert len(fake.lists) == 3 and synced == 1
    assert sink.events == [("ADDED", "a", "3")]
    assert bad() == before + 1  # the undecodable page; the HTML failed before the sink


async def test_informer_yields_decoded_events_and_relist_difference(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    from nodeagent.kube.models import ConfigMap

    fake.objects = {"a": "1", "b": "2"}
    expired = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    fake.scripts = [[line("MODIFIED", obj("a", "3")), line("ERROR", expired)]]

    async def server(request: httpx.Request) -> httpx.Response:
        if fake.lists and request.url.params.get("watch") != "true":
            fake.objects = {"a": "3", "c": "4"}  # what the relist after the 410 sees
        return await fake(request)

    seen: list[tuple[str, str, str]] = []
    async with (
        mock_client(server) as client,
        Informer(client, NS_CONFIGMAPS, into=ConfigMap) as events,
    ):
        async for ev in events:
            assert isinstance(ev.object, ConfigMap) and ev.raw.startswith(b"{")
            seen.append((ev.type, ev.object.metadata.name, ev.object.metadata.resource_version))
            if len(seen) == 5:
                break
        assert events.synced.is_set()
    assert seen[:3] == [("ADDED", "a", "1"), ("ADDED", "b", "2"), ("MODIFIED", "a", "3")]
    # "a" is unchanged since the event at rv 3: no spurious update.
    assert sorted(seen[3:]) == [("ADDED", "c", "4"), ("DELETED", "b", "2")]


class ReportingSink(Sink):
    """A sink that also wants to know why a list failed (`ListFailureSink`)."""

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[tuple[str, float]] = []

    def list_failed(self, error: Exception, retry_in: float) -> None:
        self.failures.append((str(error), retry_in))


async def test_list_failures_are_reported_to_a_sink_that_asks(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    assert isinstance(ReportingSink(), ListFailureSink) and not isinstance(Sink(), ListFailureSink)
    fake.objects = {"a": "1"}
    fake.list_errors = [status(500, "InternalError", "etcd"), status(503, "Unavailable", "busy")]
    sink = ReportingSink()
    async with mock_client(fake, max_attempts=1) as client, trio.open_nursery() as nursery:
        nursery.start_soon(lambda: run_watch(client, NS_CONFIGMAPS, sink))
        await fake.wait(lambda: len(fake.watches) == 1)
        nursery.cancel_scope.cancel()
    assert [msg for msg, _ in sink.failures] == ["500 InternalError: etcd", "503 Unavailable: busy"]
    gaps = [b - a for a, b in itertools.pairwise(fake.lists)]
    assert [delay for _, delay in sink.failures] == pytest.approx(gaps)
    assert sink.events == [("ADDED", "a", "1")]


def _revoke_after_first_list(fake: FakeCluster, *errors_after: httpx.Response) -> Any:
    async def server(request: httpx.Request) -> httpx.Response:
        response = await fake(request)
        if request.url.params.get("watch") != "true" and len(fake.lists) == 1:
            fake.list_errors = list(errors_after)
        return response

    return server


async def test_forbidden_watch_relists_and_a_forbidden_relist_is_raised(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    # Access revoked after a good list: the watch reconnect is refused first (3 times in a
    # row: fewer could be an apiserver warming up its authorizer), then the relist.
    fake.objects = {"a": "1"}
    fake.scripts = [status(403, "Forbidden", "revoked")] * FORBIDDEN_WATCHES_BEFORE_RELIST
    server = _revoke_after_first_list(fake, status(403, "Forbidden", "revoked"))
    sink = Sink()
    async with mock_client(server, max_attempts=1) as client:
        with trio.fail_after(60), pytest.raises(errors.Forbidden, match="revoked"):
            await run_watch(client, NS_CONFIGMAPS, sink)
    assert [rv for _, rv in fake.watches] == ["10"] * FORBIDDEN_WATCHES_BEFORE_RELIST
    assert len(fake.lists) == 2


async def test_a_forbidden_watch_is_retried_before_relisting(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    # A restarted apiserver refuses requests until its RBAC caches are synced: the watch is
    # retried from where it was, with backoff, and nothing is relisted.
    fake.objects = {"a": "1"}
    warmup = status(403, "Forbidden", "authorizer warming up")
    fake.scripts = [warmup] * (FORBIDDEN_WATCHES_BEFORE_RELIST - 1)
    sink, _ = await _run(fake, lambda: len(fake.watches) == FORBIDDEN_WATCHES_BEFORE_RELIST)
    assert [rv for _, rv in fake.watches] == ["10"] * FORBIDDEN_WATCHES_BEFORE_RELIST
    assert len(fake.lists) == 1 and sink.events == [("ADDED", "a", "1")]
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(fake.watches)]
    assert all(g > 0 for g in gaps)  # after the watch backoff


async def test_transiently_forbidden_watch_relists_and_resumes(
    autojump_clock: trio.testing.MockClock, fake: FakeCluster
) -> None:
    fake.objects = {"a": "1"}
    fake.scripts = [status(403, "Forbidden", "authorizer hiccup")] * FORBIDDEN_WATCHES_BEFORE_RELIST

    async def server(request: httpx.Request) -> httpx.Response:
        if len(fake.lists) == 1 and request.url.params.get("watch") != "true":
            fake.objects, fake.rv = {"a": "1", "b": "12"}, "12"  # changed meanwhile
        return await fake(request)

    sink = Sink()
    async with mock_client(server, max_attempts=1) as client, trio.open_nursery() as nursery:
        nursery.start_soon(lambda: run_watch(client, NS_CONFIGMAPS, sink))
        await fake.wait(lambda: len(fake.watches) == FORBIDDEN_WATCHES_BEFORE_RELIST + 1)
        nursery.cancel_scope.cancel()
    # Refused 3 times from "10", relisted, then watched from there.
    assert [rv for _, rv in fake.watches] == ["10"] * FORBIDDEN_WATCHES_BEFORE_RELIST + ["12"]
    assert sink.events == [("ADDED", "a", "1"), ("ADDED", "b", "12")]
