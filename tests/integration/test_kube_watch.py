"""Watch semantics against the real apiserver: bookmarks, resume, 410 relist, restarts."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import httpx
import pytest
import trio

from nodeagent.kube import (
    CONFIGMAPS,
    CORE_EVENTS,
    NAMESPACES,
    KubeClient,
    WatchOptions,
    WatchRequest,
    errors,
    run_watch,
)
from nodeagent.kube.models import ConfigMap
from nodeagent.kube.watch import FeedResult
from tests.integration.conftest import client_for, core_event
from tests.support.apiserver import ApiServer
from tests.support.informer import Event, EventType, Informer, ObjectCache

pytestmark = pytest.mark.integration


class GatedClient(KubeClient):
    """Records every watch request and can hold the next one until released."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watch_params: list[dict[str, str]] = []
        self.hold = False
        self.notify: RecordingCache | None = None
        self.held = trio.Event()
        self.release = trio.Event()

    def stream(
        self, path: str, params: Mapping[str, str], **kwargs: Any
    ) -> AbstractAsyncContextManager[httpx.Response]:
        return self._gated(path, dict(params), **kwargs)

    async def _gated_wait(self) -> None:
        if self.hold:
            self.held.set()
            await self.release.wait()

    def _gated(
        self, path: str, params: dict[str, str], **kwargs: Any
    ) -> AbstractAsyncContextManager[httpx.Response]:
        outer = super().stream

        class _CM:
            async def __aenter__(cm) -> httpx.Response:
                await self._gated_wait()
                self.watch_params.append(params)
                if self.notify is not None:
                    self.notify.changed.set()
                cm.inner = outer(path, params, **kwargs)
                return await cm.inner.__aenter__()

            async def __aexit__(cm, *exc: Any) -> bool | None:
                return await cm.inner.__aexit__(*exc)

        return _CM()


class RecordingCache(ObjectCache):
    """The plain-Python sink, recording what the watch loop asked of it."""

    def __init__(self) -> None:
        super().__init__(self._record, resource="test")
        self.events: list[tuple[EventType, str, str]] = []
        self.lists_begun = 0
        self.lists_ended: list[str] = []
        self.bookmark_rvs: list[str] = []
        self.changed = trio.Event()

    async def _record(self, type: EventType, raw: bytes) -> None:
        meta = json.loads(raw)["metadata"]
        self.events.append((type, meta["name"], meta["resourceVersion"]))

    async def begin_list(self) -> None:
        self.lists_begun += 1
        await super().begin_list()

    async def end_list(self, resource_version: str) -> None:
        await super().end_list(resource_version)
        self.lists_ended.append(resource_version)
        self.changed.set()

    async def feed(self, chunk: bytes) -> FeedResult:
        for line in chunk.split(b"\n"):
            if b'"BOOKMARK"' in line:
                self.bookmark_rvs.append(json.loads(line)["object"]["metadata"]["resourceVersion"])
        result = await super().feed(chunk)
        self.changed.set()
        return result

    async def wait_for(self, predicate: Any, limit: float = 30) -> None:
        with trio.fail_after(limit):
            while not predicate():
                self.changed = trio.Event()
                await self.changed.wait()


async def _namespace(admin: KubeClient) -> str:
    name = f"watch-{uuid.uuid4().hex[:8]}"
    await admin.create(NAMESPACES, {"metadata": {"name": name}})
    return name


def _cm(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


async def test_bookmarks_advance_rv_and_reconnect_resumes_without_relist(
    apiserver: ApiServer, admin_client: KubeClient
) -> None:
    ns = await _namespace(admin_client)
    await admin_client.create(CONFIGMAPS, _cm("a"), ns)
    sink = RecordingCache()
    # The watch cache sends a bookmark 2 s before the server timeout, if there is time for it.
    async with (
        GatedClient(
            client_for(apiserver, "admin").config, watch=WatchOptions(server_timeout=(5, 5))
        ) as client,
        trio.open_nursery() as nursery,
    ):
        client.notify = sink
        nursery.start_soon(lambda: run_watch(client, WatchRequest(CONFIGMAPS, ns), sink))
        await sink.wait_for(lambda: sink.lists_ended)
        list_rv = sink.lists_ended[0]
        assert sink.events == [("ADDED", "a", sink.events[0][2])]
        # A write the watch does not match moves the apiserver's revision forward: only a
        # bookmark can tell the watch about it.
        other = await admin_client.create(
            CONFIGMAPS, _cm(f"other-{uuid.uuid4().hex[:6]}"), "default"
        )
        other_rv = int(json.loads(other)["metadata"]["resourceVersion"])
        await sink.wait_for(lambda: len(client.watch_params) >= 3, limit=40)
        nursery.cancel_scope.cancel()
    assert client.watch_params[0]["resourceVersion"] == list_rv
    assert client.watch_params[0]["allowWatchBookmarks"] == "true"
    assert sink.bookmark_rvs, "the server sent no bookmark"
    # Each reconnect resumes from the newest bookmark, which passed the unrelated write.
    resumed = [int(p["resourceVersion"]) for p in client.watch_params[1:]]
    assert max(resumed) >= other_rv > int(list_rv)
    assert str(resumed[0]) in sink.bookmark_rvs
    assert sink.lists_begun == 1  # clean ends resumed; nothing relisted
    assert sink.events == [("ADDED", "a", sink.events[0][2])]


async def test_expired_rv_relists_and_reports_exact_difference(
    apiserver: ApiServer, admin_client: KubeClient
) -> None:
    # core/v1 events have no watch cache: a watch from a compacted revision gets 410.
    ns = await _namespace(admin_client)
    for name in ("e1", "e2", "e3"):
        await admin_client.create(CORE_EVENTS, core_event(name, ns, "v1"), ns)
    sink = RecordingCache()
    async with (
        GatedClient(
            client_for(apiserver, "admin").config,
            watch=WatchOptions(server_timeout=(1, 1), backoff=(0.05, 0.2)),
        ) as client,
        trio.open_nursery() as nursery,
    ):
        client.notify = sink
        nursery.start_soon(lambda: run_watch(client, WatchRequest(CORE_EVENTS, ns), sink))
        await sink.wait_for(lambda: len(sink.events) == 3)
        assert {(t, n) for t, n, _ in sink.events} == {
            ("ADDED", "e1"),
            ("ADDED", "e2"),
            ("ADDED", "e3"),
        }
        client.hold = True  # the next reconnect waits: the watch is down
        with trio.fail_after(30):
            await client.held.wait()
        known_rvs = {n: rv for _, n, rv in sink.events}
        sink.events.clear()
        await admin_client.patch(CORE_EVENTS, "e1", {"message": "v2"}, ns)
        await admin_client.delete(CORE_EVENTS, "e2", ns)
        await admin_client.create(CORE_EVENTS, core_event("e4", ns, "new"), ns)
        await trio.to_thread.run_sync(apiserver.compact)
        client.release.set()
        await sink.wait_for(lambda: len(sink.lists_ended) == 2)
        watches_before_relist = len(client.watch_params)
        await sink.wait_for(lambda: len(client.watch_params) > watches_before_relist)
        nursery.cancel_scope.cancel()
    assert sink.lists_begun == 2
    assert sorted((t, n) for t, n, _ in sink.events) == [
        ("ADDED", "e4"),
        ("DELETED", "e2"),
        ("MODIFIED", "e1"),
    ]
    deleted_rv = next(rv for t, n, rv in sink.events if t == "DELETED")
    assert deleted_rv == known_rvs["e2"]  # the last state known before it vanished
    # After the 410 the watch goes on from the relist, never from the stale revision.
    assert client.watch_params[watches_before_relist]["resourceVersion"] == sink.lists_ended[-1]


async def test_server_restart_mid_watch_loses_no_event(
    apiserver: ApiServer, admin_client: KubeClient
) -> None:
    ns = await _namespace(admin_client)
    for i in range(5):
        await admin_client.create(CONFIGMAPS, _cm(f"cm{i}", v="0"), ns)
    view: dict[str, str] = {}
    seen = trio.Event()

    async def consume(events: AsyncIterable[Event[ConfigMap]]) -> None:
        nonlocal seen
        async for ev in events:
            if ev.type == "DELETED":
                view.pop(ev.object.metadata.name, None)
            else:
                view[ev.object.metadata.name] = ev.object.metadata.resource_version
            seen.set()

    async with (
        client_for(apiserver, "admin", watch=WatchOptions(backoff=(0.1, 1.0))) as client,
        Informer(client, WatchRequest(CONFIGMAPS, ns), into=ConfigMap) as informer,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(consume, informer)
        with trio.fail_after(30):
            await informer.synced.wait()
        await admin_client.patch(CONFIGMAPS, "cm0", {"data": {"v": "1"}}, ns)
        await trio.to_thread.run_sync(apiserver.restart)
        async with client_for(apiserver, "admin") as fresh_admin:
            await fresh_admin.patch(CONFIGMAPS, "cm1", {"data": {"v": "2"}}, ns)
            await fresh_admin.delete(CONFIGMAPS, "cm2", ns)
            await fresh_admin.create(CONFIGMAPS, _cm("cm9", v="9"), ns)
            truth = await fresh_admin.list(CONFIGMAPS, ns, into=ConfigMap)
        expected = {c.metadata.name: c.metadata.resource_version for c in truth.items}
        with trio.fail_after(60):
            while view != expected:
                seen = trio.Event()
                await seen.wait()
        nursery.cancel_scope.cancel()
    cache = {key[1]: rv for key, (rv, _) in informer.cache.objects.items()}
    assert cache == expected


async def test_forbidden_list_is_raised(node_client: KubeClient) -> None:
    sink = RecordingCache()
    with pytest.raises(errors.Forbidden):
        await run_watch(node_client, WatchRequest(CONFIGMAPS), sink)
    async with Informer(node_client, WatchRequest(CONFIGMAPS), into=ConfigMap) as informer:
        with pytest.raises(errors.Forbidden):
            async for _ in informer:
                pass
