"""The streaming list (`kube.streaming_list`, the apiserver's WatchList) against the real
kube-apiserver of the selected release: the initial events and the `k8s.io/initial-events-end`
bookmark on one connection that goes on as the watch, an object carrying the marker in its data, the
accumulator's bootstrap (its exact relist difference after a 410 is test_accumulator.py's
test_relist_after_410_yields_exact_difference[on]), and the fallback to LIST on a server started
with the WatchList feature gate off. From 1.37 the server gzips a streaming list with one gzip
member per flush (WatchListCompression): every event after the list is still heard."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from nodeagent.accumulator import Query
from nodeagent.kube import (
    CONFIGMAPS,
    CORE_EVENTS,
    KubeClient,
    WatchOptions,
    WatchRequest,
    run_watch,
)
from nodeagent.kube.encoding import BodyDecoder
from nodeagent.kube.watch import INITIAL_EVENTS_END
from tests.integration.conftest import client_for, core_event
from tests.integration.test_accumulator import (
    Snap,
    accumulating,
    cm,
    cm_query,
    data_of,
    namespace,
)
from tests.integration.test_kube_watch import GatedClient, RecordingCache
from tests.support.apiserver import ApiServer, start_apiserver

pytestmark = pytest.mark.integration

STREAM = WatchOptions(server_timeout=(5, 5), backoff=(0.05, 0.2), streaming_list="on")


class ListRecorder(RecordingCache):
    """Records List pages (a paged LIST) and list failures besides what RecordingCache does."""

    def __init__(self) -> None:
        super().__init__()
        self.pages = 0
        self.failures: list[str] = []
        self.synced_after_lists: list[int] = []

    async def list_page(self, page: bytes) -> None:
        self.pages += 1
        await super().list_page(page)

    def list_failed(self, error: Exception, retry_in: float) -> None:
        self.failures.append(str(error))
        self.changed.set()

    def on_synced(self) -> None:
        self.synced_after_lists.append(len(self.lists_ended))


async def test_initial_events_end_bookmark_then_the_same_stream_watches(
    apiserver: ApiServer, admin_client: KubeClient
) -> None:
    ns = await namespace(admin_client)
    await admin_client.create(CONFIGMAPS, cm("a", v="1"), ns)
    # The marker and a BOOKMARK look-alike inside an object do not end the list.
    fake = json.dumps({"type": "BOOKMARK", INITIAL_EVENTS_END: "true"})
    hostile = cm("b", v=fake)
    hostile["metadata"]["annotations"] = {INITIAL_EVENTS_END: "true"}
    await admin_client.create(CONFIGMAPS, hostile, ns)
    last = json.loads(await admin_client.create(CONFIGMAPS, cm("c", v="1"), ns))
    sink = ListRecorder()
    config = client_for(apiserver, "admin").config
    # The one connection must outlive the list and the new object's event on a loaded machine:
    # a watch the server ends after STREAM's 5 s would reconnect and fail the count below.
    one = dataclasses.replace(STREAM, server_timeout=(120, 120))
    async with GatedClient(config, watch=one) as client, trio.open_nursery() as nursery:
        client.notify = sink
        nursery.start_soon(
            lambda: run_watch(client, WatchRequest(CONFIGMAPS, ns), sink, on_synced=sink.on_synced)
        )
        await sink.wait_for(lambda: len(sink.lists_ended) == 1)
        assert sorted(n for _, n, _ in sink.events) == ["a", "b", "c"]
        await admin_client.create(CONFIGMAPS, cm("d", v="1"), ns)
        await sink.wait_for(lambda: any(n == "d" for _, n, _ in sink.events))
        first = client.watch_params[0]
        nursery.cancel_scope.cancel()
    assert first["sendInitialEvents"] == "true"
    assert first["resourceVersionMatch"] == "NotOlderThan"
    assert "resourceVersion" not in first and first["allowWatchBookmarks"] == "true"
    assert sink.pages == 0 and sink.lists_begun == 1  # no LIST request at all
    # The list is complete at the bookmark: as fresh as the last write before it, synced once
    # the list ended, and the new object came on the same connection.
    assert int(sink.lists_ended[0]) >= int(last["metadata"]["resourceVersion"])
    assert sink.lists_ended[0] in sink.bookmark_rvs
    assert sink.synced_after_lists == [1]
    assert len(client.watch_params) == 1
    assert [(t, n) for t, n, _ in sink.events if n == "d"] == [("ADDED", "d")]


async def test_accumulator_offers_nothing_before_every_end_bookmark(
    apiserver: ApiServer, admin_client: KubeClient
) -> None:
    # core/v1 Events have no watch cache: their streaming list is served from etcd. (The relist
    # after a 410 with streaming lists: test_accumulator.py::test_relist_after_410_...[on].)
    ns = await namespace(admin_client)
    for name in ("e1", "e2", "e3"):
        await admin_client.create(CORE_EVENTS, core_event(name, ns, "v1"), ns)
    await admin_client.create(CONFIGMAPS, cm("x", v="1"), ns)
    events: Query[bytes] = Query("events", "v1", "Event", namespace=ns)
    async with (
        client_for(apiserver, "admin", watch=STREAM) as client,
        accumulating(client, [events, cm_query(ns)]) as acc,
    ):
        snap = Snap()
        with trio.fail_after(30):
            await acc.changed()
        # Observed complete: the first snapshot holds every object of both queries.
        assert acc.update(snap)
        assert len(snap.events) == 3 and data_of(snap.cms) == {"x": {"v": "1"}}
        assert acc.status("events").known and acc.status("cms").known


@pytest.fixture(scope="module")
def old_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """A kube-apiserver without streaming lists (WatchList off, as before 1.32)."""
    srv = start_apiserver(
        tmp_path_factory.mktemp("nowatchlist"),
        nodes=("node-a",),
        extra_args=["--feature-gates=WatchList=false"],
    )
    try:
        yield srv
    finally:
        srv.close()


async def _watch_old(
    old: ApiServer, mode: str, done: Callable[[ListRecorder, GatedClient], bool]
) -> tuple[ListRecorder, GatedClient]:
    async with client_for(old, "admin") as admin:
        ns = await namespace(admin)
        await admin.create(CONFIGMAPS, cm("a", v="1"), ns)
    sink = ListRecorder()
    options = WatchOptions(server_timeout=(5, 5), backoff=(0.05, 0.2), streaming_list=mode)  # type: ignore[arg-type]
    config = client_for(old, "admin").config
    async with GatedClient(config, watch=options) as client, trio.open_nursery() as nursery:
        client.notify = sink
        nursery.start_soon(
            lambda: run_watch(client, WatchRequest(CONFIGMAPS, ns), sink, on_synced=sink.on_synced)
        )
        await sink.wait_for(lambda: done(sink, client))
        nursery.cancel_scope.cancel()
    return sink, client


async def test_auto_falls_back_to_list_on_a_server_without_watchlist(
    old_apiserver: ApiServer,
) -> None:
    sink, client = await _watch_old(
        old_apiserver, "auto", lambda s, c: bool(s.lists_ended) and len(c.watch_params) >= 2
    )
    assert client.watch_params[0]["sendInitialEvents"] == "true"  # tried, refused (422)
    assert sink.pages == 1 and sink.lists_ended and sink.synced_after_lists == [1]
    assert sink.failures == []  # the fallback is not a failure
    assert [n for _, n, _ in sink.events] == ["a"]
    # Then an ordinary watch from the LIST's resourceVersion.
    assert client.watch_params[1]["resourceVersion"] == sink.lists_ended[0]
    assert "sendInitialEvents" not in client.watch_params[1]


async def test_on_reports_the_refusal_and_never_lists(old_apiserver: ApiServer) -> None:
    sink, client = await _watch_old(old_apiserver, "on", lambda s, c: len(s.failures) >= 2)
    assert all("sendInitialEvents is forbidden" in f for f in sink.failures)
    assert sink.pages == 0 and sink.lists_ended == [] and sink.synced_after_lists == []
    assert all(p.get("sendInitialEvents") == "true" for p in client.watch_params)


# -- compressed streaming lists (WatchListCompression, beta and on from 1.37) --------------------

EVENTS_AFTER = 200


class HeaderRecorder(GatedClient):
    """Records the response headers of every watch it opens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response_headers: list[httpx.Headers] = []

    def stream(
        self, path: str, params: Mapping[str, str], **kwargs: Any
    ) -> AbstractAsyncContextManager[httpx.Response]:
        outer = super().stream

        @asynccontextmanager
        async def recording() -> AsyncIterator[httpx.Response]:
            async with outer(path, params, **kwargs) as resp:
                self.response_headers.append(resp.headers)
                yield resp

        return recording()


def compressed(apiserver: ApiServer) -> bool:
    return apiserver.feature_enabled("WatchListCompression")


async def test_compressed_streaming_list_hears_every_event_after_the_list(
    apiserver: ApiServer, admin_client: KubeClient
) -> None:
    ns = await namespace(admin_client)
    for name in ("a", "b", "c"):
        await admin_client.create(CONFIGMAPS, cm(name, v="1"), ns)
    sink = ListRecorder()
    # One connection for the whole test: a resumed watch (resourceVersion=...) is never
    # compressed, so a reconnect would hide lost events.
    options = WatchOptions(server_timeout=(120, 120), backoff=(0.05, 0.2), streaming_list="on")
    config = client_for(apiserver, "admin").config
    async with HeaderRecorder(config, watch=options) as client, trio.open_nursery() as nursery:
        client.notify = sink
        nursery.start_soon(lambda: run_watch(client, WatchRequest(CONFIGMAPS, ns), sink))
        await sink.wait_for(lambda: len(sink.lists_ended) == 1)
        for i in range(EVENTS_AFTER):
            await admin_client.create(CONFIGMAPS, cm(f"after{i}", v=str(i)), ns)
        await sink.wait_for(lambda: len(sink.events) >= 3 + EVENTS_AFTER, limit=60)
        nursery.cancel_scope.cancel()
    assert len(client.watch_params) == 1 and sink.failures == []
    encoding = client.response_headers[0].get("content-encoding")
    assert encoding == ("gzip" if compressed(apiserver) else None), apiserver.version
    assert [n for _, n, _ in sink.events] == ["a", "b", "c"] + [
        f"after{i}" for i in range(EVENTS_AFTER)
    ]


async def test_raw_wire_of_a_compressed_streaming_list(
    apiserver: ApiServer, admin_client: KubeClient
) -> None:
    """What the server sends, read without the client's watch loop: on 1.37 a gzip member per
    flush, and each later event in a member of its own that httpx's decoder would drop."""
    ns = await namespace(admin_client)
    await admin_client.create(CONFIGMAPS, cm("a", v="1"), ns)
    params = {
        "watch": "true",
        "allowWatchBookmarks": "true",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "timeoutSeconds": "60",
    }
    names: list[str] = []
    async with httpx.AsyncClient(
        base_url=apiserver.url,
        verify=apiserver.ssl_context("admin"),
        headers={"Accept": "application/json", "Accept-Encoding": "gzip"},
    ) as http:
        req = http.build_request("GET", f"/api/v1/namespaces/{ns}/configmaps", params=params)
        resp = await http.send(req, stream=True)
        try:
            decoder = BodyDecoder(resp.headers.get("content-encoding"))
            buf, listed, members_at_end = b"", False, 0
            with trio.fail_after(60):
                async for raw in resp.aiter_raw():
                    buf += decoder.decode(raw)
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        ev = json.loads(line)
                        meta = ev["object"]["metadata"]
                        if ev["type"] == "ADDED":
                            names.append(meta["name"])
                        elif INITIAL_EVENTS_END in meta.get("annotations", {}):
                            listed, members_at_end = True, decoder.members
                            for i in range(20):
                                await admin_client.create(CONFIGMAPS, cm(f"x{i}", v="1"), ns)
                    if listed and len(names) == 21:
                        break
        finally:
            await resp.aclose()
    assert names == ["a"] + [f"x{i}" for i in range(20)]
    if compressed(apiserver):
        assert resp.headers["content-encoding"] == "gzip"
        # The list, its bookmark and the later events did not all fit in one member: the
        # events after the bookmark came in members of their own.
        assert decoder.members > members_at_end >= 1
    else:
        assert decoder.members == 0 and "content-encoding" not in resp.headers
