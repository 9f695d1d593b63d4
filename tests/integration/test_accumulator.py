"""The accumulator against the real kube-apiserver: kates' five behaviours, read-your-writes
coherence, multi-kind gating with a CRD, a relist after 410, a Forbidden list (first, and after a
good list when RBAC is revoked), and objects deleted and re-created under one name."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

import httpx
import msgspec
import pytest
import trio

from nodeagent.accumulator import (
    Accumulator,
    AccumulatorSettings,
    Delta,
    DeltaType,
    ObjectMap,
    Query,
    QueryState,
)
from nodeagent.kube import (
    CONFIGMAPS,
    CORE_EVENTS,
    CUSTOMRESOURCEDEFINITIONS,
    NAMESPACES,
    KubeClient,
    Resource,
    WatchOptions,
    errors,
)
from nodeagent.kube.models import ConfigMap, ObjectMeta
from nodeagent.kube.watch import FeedResult, WatchRequest, WatchSink, run_watch
from tests.integration.conftest import client_for, core_event
from tests.support.apiserver import ApiServer
from tests.support.resources import ROLEBINDINGS, ROLES, SECRETS

pytestmark = pytest.mark.integration

GROUP = "acc.nodeagent.io"
# Watches that end and reconnect within seconds.
FAST_WATCH = WatchOptions(server_timeout=(1, 1), backoff=(0.05, 0.2))


class Secret(msgspec.Struct, kw_only=True):
    metadata: ObjectMeta
    string_data: dict[str, str] = msgspec.field(default_factory=dict, name="stringData")
    data: dict[str, str] = msgspec.field(default_factory=dict)


class Gizmo(msgspec.Struct, kw_only=True):
    metadata: ObjectMeta
    spec: dict[str, int] = msgspec.field(default_factory=dict)


@dataclass
class Snap:
    cms: ObjectMap[Any] = field(default_factory=ObjectMap)
    secrets: ObjectMap[Any] = field(default_factory=ObjectMap)
    gizmos: ObjectMap[Any] = field(default_factory=ObjectMap)
    events: ObjectMap[Any] = field(default_factory=ObjectMap)


class Gate:
    """Holds a sink's calls while closed (a delayed watch), and can slow every call."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.open = trio.Event()
        self.open.set()
        self.calls = 0
        self.fed = bytearray()  # every watch chunk the inner sink has ingested
        self.progress = trio.Event()
        self.entered = trio.Event()  # the first call has reached the gate
        self.listed = trio.Event()  # the inner sink has ended a list

    def close(self) -> None:
        if self.open.is_set():
            self.open = trio.Event()

    async def __call__(self) -> None:
        self.calls += 1
        self.entered.set()
        await self.open.wait()
        if self.delay:
            await trio.sleep(self.delay)

    def ingested(self, chunk: bytes) -> None:
        self.fed += chunk
        self.progress.set()
        self.progress = trio.Event()

    async def wait_ingested(self, resource_version: str) -> None:
        """Wait until the watch has delivered (and the sink ingested) `resource_version`."""
        needle = f'"resourceVersion":"{resource_version}"'.encode()
        while needle not in self.fed:
            await self.progress.wait()


class GatedSink:
    def __init__(self, inner: WatchSink, gate: Gate) -> None:
        self.inner = inner
        self.gate = gate

    async def begin_list(self) -> None:
        await self.inner.begin_list()

    async def list_page(self, page: bytes) -> None:
        await self.gate()
        await self.inner.list_page(page)

    async def end_list(self, resource_version: str) -> None:
        await self.gate()
        await self.inner.end_list(resource_version)
        self.gate.listed.set()

    async def feed(self, chunk: bytes) -> FeedResult:
        await self.gate()
        result = await self.inner.feed(chunk)
        self.gate.ingested(chunk)
        return result

    async def end_stream(self) -> None:
        await self.inner.end_stream()


class GatedWatches:
    """A client whose watches of chosen resources go through a `Gate` (the accumulator's
    ``watch=``); writes, discovery and write observers are the real client's."""

    def __init__(self, client: KubeClient, gates: Mapping[str, Gate]) -> None:
        self.client = client
        self.gates = gates

    async def run_watch(self, request: WatchRequest, sink: WatchSink) -> NoReturn:
        gate = self.gates.get(request.resource.plural)
        await run_watch(self.client, request, GatedSink(sink, gate) if gate else sink)


class HoldableStreams(KubeClient):
    """Holds the next watch connection while ``hold`` is set: the watch is down."""

    hold = False
    held: trio.Event
    release: trio.Event

    def stream(
        self, path: str, params: Mapping[str, str], **kwargs: Any
    ) -> AbstractAsyncContextManager[httpx.Response]:
        outer = super().stream

        @asynccontextmanager
        async def gated() -> AsyncIterator[httpx.Response]:
            if self.hold:
                self.held.set()
                await self.release.wait()
            async with outer(path, params, **kwargs) as resp:
                yield resp

        return gated()


@asynccontextmanager
async def accumulating(
    client: KubeClient | GatedWatches, queries: list[Query[Any]], **settings: Any
) -> AsyncIterator[Accumulator]:
    if isinstance(client, GatedWatches):
        acc = Accumulator(
            client.client, queries, AccumulatorSettings(**settings), watch=client.run_watch
        )
    else:
        acc = Accumulator(client, queries, AccumulatorSettings(**settings))
    async with trio.open_nursery() as nursery:
        await nursery.start(acc.run)
        yield acc
        nursery.cancel_scope.cancel()


async def until_snapshot(
    acc: Accumulator, snap: Snap, cond: Callable[[Snap], bool], limit: float = 30
) -> list[Delta[Any]]:
    """Consumes notifications until the snapshot satisfies ``cond``; returns all deltas."""
    seen: list[Delta[Any]] = []
    with trio.fail_after(limit):
        while True:
            await acc.changed()
            deltas: list[Delta[Any]] = []
            acc.update(snap, deltas)
            seen += deltas
            if cond(snap):
                return seen


async def namespace(admin: KubeClient) -> str:
    name = f"acc-{uuid.uuid4().hex[:8]}"
    await admin.create(NAMESPACES, {"metadata": {"name": name}})
    return name


def cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def cm_query(ns: str, **kw: Any) -> Query[ConfigMap]:
    return Query("cms", "v1", "ConfigMap", namespace=ns, into=ConfigMap, **kw)


def data_of(m: ObjectMap[Any]) -> dict[str, dict[str, str]]:
    return {k.name: v.data for k, v in m.items()}


@pytest.fixture
async def ns(admin_client: KubeClient) -> str:
    return await namespace(admin_client)


async def test_bootstrap_waits_for_slow_list_with_objects_present(
    apiserver: ApiServer, admin_client: KubeClient, ns: str
) -> None:
    for i in range(10):
        await admin_client.create(CONFIGMAPS, cm(f"cm{i}", v="0"), ns)
    gate = Gate(delay=0.3)  # every page (2 objects) is dispatched slowly
    async with client_for(apiserver, "admin", page_size=2) as client:
        slow = GatedWatches(client, {"configmaps": gate})
        async with accumulating(slow, [cm_query(ns)]) as acc:
            snap = Snap()
            with trio.fail_after(30):
                await acc.changed()
            assert acc.update(snap)
            assert gate.calls >= 6  # 5 pages and the end of the list, all before the snapshot
            assert sorted(data_of(snap.cms)) == [f"cm{i}" for i in range(10)]


async def test_notifies_on_empty_watch(
    apiserver: ApiServer, admin_client: KubeClient, ns: str
) -> None:
    await admin_client.create(CONFIGMAPS, cm("unrelated"), ns)
    async with (
        client_for(apiserver, "admin") as client,
        accumulating(client, [cm_query(ns, label_selector="nothing=matches")]) as acc,
    ):
        snap = Snap()
        with trio.fail_after(30):
            await acc.changed()
        assert acc.update(snap)
        assert len(snap.cms) == 0


async def test_batches_changes_under_long_interval(
    apiserver: ApiServer, admin_client: KubeClient, ns: str
) -> None:
    interval = 5.0
    async with (
        client_for(apiserver, "admin") as client,
        accumulating(client, [cm_query(ns)], max_interval=interval) as acc,
    ):
        snap = Snap()
        with trio.fail_after(30):
            await acc.changed()
        first = time.monotonic()
        assert acc.update(snap) and len(snap.cms) == 0
        # All at once, so that all ten land well within the interval on a loaded machine too
        # (one after the other, they and their watch events had to fit in it end to end).
        async with trio.open_nursery() as creating:
            for i in range(10):
                creating.start_soon(admin_client.create, CONFIGMAPS, cm(f"cm{i}"), ns)
        with trio.fail_after(30):
            await acc.changed()
        # The creates landed within the interval: one notification, all ten in it, held until
        # the interval since the last one was over. (`first` is taken when this task ran after
        # that notification, which a loaded machine may delay: the margin is for that, not
        # the 0.05 s it was; unheld, the notification would come with the first create.)
        assert time.monotonic() - first >= interval - 0.5
        deltas: list[Delta[Any]] = []
        assert acc.update(snap, deltas)
        assert len(snap.cms) == 10
        assert [d.type for d in deltas] == [DeltaType.ADD] * 10


async def test_notification_not_starved_by_continuous_churn(
    apiserver: ApiServer, admin_client: KubeClient, ns: str
) -> None:
    interval = 3.0
    async with (
        client_for(apiserver, "admin") as client,
        accumulating(client, [cm_query(ns)], max_interval=interval) as acc,
    ):
        snap = Snap()
        with trio.fail_after(30):
            await acc.changed()
        acc.update(snap)

        async def churn() -> None:
            for i in range(1000):
                await admin_client.create(CONFIGMAPS, cm(f"churn{i}"), ns)
                await trio.sleep(1.0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(churn)
            start = time.monotonic()
            counts = []
            for _ in range(3):
                with trio.fail_after(2 * interval + 5):
                    await acc.changed()
                assert acc.update(snap)
                counts.append(len(snap.cms))
            elapsed = time.monotonic() - start
            nursery.cancel_scope.cancel()
        assert counts == sorted(counts) and counts[-1] > counts[0] > 0
        # Three notifications despite constant churn, each waiting about one interval.
        assert elapsed < 3 * interval + 6


async def test_notifies_on_update(apiserver: ApiServer, admin_client: KubeClient, ns: str) -> None:
    async with (
        client_for(apiserver, "admin") as client,
        accumulating(client, [cm_query(ns)], max_interval=1.0) as acc,
    ):
        snap = Snap()
        await until_snapshot(acc, snap, lambda s: True)
        await admin_client.create(CONFIGMAPS, cm("one", v="1"), ns)
        await until_snapshot(acc, snap, lambda s: len(s.cms) == 1)
        await admin_client.create(CONFIGMAPS, cm("two", v="1"), ns)
        await until_snapshot(acc, snap, lambda s: len(s.cms) == 2)
        await admin_client.patch(CONFIGMAPS, "one", {"data": {"v": "2"}}, ns)
        deltas = await until_snapshot(acc, snap, lambda s: data_of(s.cms)["one"] == {"v": "2"})
        assert [(d.type, d.key.name) for d in deltas] == [(DeltaType.UPDATE, "one")]


async def test_read_your_writes_while_watch_is_delayed(apiserver: ApiServer, ns: str) -> None:
    gates = {"configmaps": Gate(), "secrets": Gate()}
    queries: list[Query[Any]] = [
        cm_query(ns),
        Query("secrets", "v1", SECRETS, namespace=ns, into=Secret),
    ]
    async with client_for(apiserver, "admin") as client:
        delayed = GatedWatches(client, gates)
        async with accumulating(delayed, queries) as acc:
            snap = Snap()
            await until_snapshot(acc, snap, lambda s: True)
            for g in gates.values():
                g.close()  # from now on the watch delivers nothing
            last_rv: dict[str, str] = {}
            for i in range(25):
                cm_obj = cm("counter", n=str(i))
                secret = {"metadata": {"name": "counter"}, "stringData": {"n": str(i)}}
                written: list[ConfigMap | Secret]
                if i == 0:
                    written = [
                        await client.create(CONFIGMAPS, cm_obj, ns, into=ConfigMap),
                        await client.create(SECRETS, secret, ns, into=Secret),
                    ]
                else:
                    written = [
                        await client.patch(
                            CONFIGMAPS, "counter", {"data": {"n": str(i)}}, ns, into=ConfigMap
                        ),
                        await client.patch(
                            SECRETS, "counter", {"stringData": {"n": str(i)}}, ns, into=Secret
                        ),
                    ]
                for plural, obj in zip(("configmaps", "secrets"), written, strict=True):
                    assert obj.metadata.resource_version
                    last_rv[plural] = obj.metadata.resource_version
                assert acc.update(snap)
                assert data_of(snap.cms) == {"counter": {"n": str(i)}}
                (sec,) = snap.secrets.values_list()
                assert sec.data == {"n": _b64(str(i))}
            for g in gates.values():
                g.open.set()
            # The watch replays 25 versions of each; the snapshot never moves backwards, and
            # once the watch has caught up with the last write nothing is reported again.
            deltas: list[Delta[Any]] = []

            async def consume() -> None:
                while True:
                    await acc.changed()
                    acc.update(snap, deltas)
                    assert data_of(snap.cms) == {"counter": {"n": "24"}}
                    assert deltas == []

            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume)
                with trio.fail_after(30):
                    for plural, g in gates.items():
                        await g.wait_ingested(last_rv[plural])
                nursery.cancel_scope.cancel()
            acc.update(snap, deltas)
            assert data_of(snap.cms) == {"counter": {"n": "24"}}
            (sec,) = snap.secrets.values_list()
            assert sec.data == {"n": _b64("24")}
            assert deltas == []
            await client.delete(CONFIGMAPS, "counter", ns)
            deltas = []
            assert acc.update(snap, deltas)
            assert len(snap.cms) == 0
            assert [(d.type, d.key.name) for d in deltas] == [(DeltaType.DELETE, "counter")]


def _b64(s: str) -> str:
    import base64

    return base64.b64encode(s.encode()).decode()


def _crd() -> dict[str, Any]:
    spec_schema = {"type": "object", "properties": {"size": {"type": "integer"}}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gizmos.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": spec_schema},
                        }
                    },
                }
            ],
        },
    }


async def _gizmos_served(admin: KubeClient) -> None:
    with contextlib.suppress(errors.AlreadyExists):
        await admin.create(CUSTOMRESOURCEDEFINITIONS, _crd())
    with trio.fail_after(60):
        while True:
            try:
                await admin.discover(f"{GROUP}/v1", "Gizmo")
                return
            except errors.NotFound:
                await trio.sleep(0.2)


async def test_multi_kind_gating_with_a_crd(
    apiserver: ApiServer, admin_client: KubeClient, ns: str
) -> None:
    await _gizmos_served(admin_client)
    await admin_client.create(CONFIGMAPS, cm("c1"), ns)
    gizmos = Resource(group=GROUP, version="v1", plural="gizmos", kind="Gizmo", namespaced=True)
    await admin_client.create(
        gizmos,
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "Gizmo",
            "metadata": {"name": "g1"},
            "spec": {"size": 3},
        },
        ns,
    )
    gate = Gate()
    gate.close()  # the CRD's list does not complete until released
    cms_gate = Gate()  # open: only observes when the ConfigMap list has ended
    queries: list[Query[Any]] = [
        cm_query(ns),
        Query("gizmos", f"{GROUP}/v1", "Gizmo", namespace=ns, into=Gizmo),
    ]
    async with (
        client_for(apiserver, "admin") as client,
        accumulating(
            GatedWatches(client, {"gizmos": gate, "configmaps": cms_gate}), queries
        ) as acc,
    ):
        snap = Snap()
        with trio.fail_after(30):
            await cms_gate.listed.wait()  # the ConfigMap query has synced
            await gate.entered.wait()  # the CRD's list has arrived and is held
        # One query synced, one not: no snapshot is offered.
        assert not acc.update(snap)
        assert acc.not_ready_reason() == "gizmos: not synced"
        gate.open.set()
        with trio.fail_after(30):
            await acc.changed()
        assert acc.update(snap)
        assert list(data_of(snap.cms)) == ["c1"]
        (g,) = snap.gizmos.values_list()
        assert (g.metadata.name, g.spec) == ("g1", {"size": 3})


# "on": the relist is a streaming list (tests/integration/test_streaming_list.py has the rest).
@pytest.mark.parametrize("streaming_list", ["off", "on"])
async def test_relist_after_410_yields_exact_difference(
    apiserver: ApiServer,
    admin_client: KubeClient,
    ns: str,
    streaming_list: Literal["on", "off"],
) -> None:
    # core/v1 Events have no watch cache: a watch from a compacted revision gets 410.
    for name in ("e1", "e2", "e3"):
        await admin_client.create(CORE_EVENTS, core_event(name, ns, "v1"), ns)
    config = client_for(apiserver, "admin").config
    watch = dataclasses.replace(FAST_WATCH, streaming_list=streaming_list)
    async with HoldableStreams(config, watch=watch) as client:
        client.held, client.release = trio.Event(), trio.Event()
        query: Query[bytes] = Query("events", "v1", "Event", namespace=ns)
        async with accumulating(client, [query]) as acc:
            snap = Snap()
            await until_snapshot(acc, snap, lambda s: len(s.events) == 3)
            before = dict(snap.events.items())
            client.hold = True
            with trio.fail_after(30):
                await client.held.wait()  # the watch ended and cannot reconnect
            await admin_client.patch(CORE_EVENTS, "e1", {"message": "v2"}, ns)
            await admin_client.delete(CORE_EVENTS, "e2", ns)
            await admin_client.create(CORE_EVENTS, core_event("e4", ns, "new"), ns)
            await trio.to_thread.run_sync(apiserver.compact)
            client.hold = False
            client.release.set()
            deltas = await until_snapshot(acc, snap, lambda s: "e4" in {k.name for k in s.events})
    assert sorted((d.type.value, d.key.name) for d in deltas) == [
        ("add", "e4"),
        ("delete", "e2"),
        ("update", "e1"),
    ]
    assert snap.events.lookup(ns, "e3") is before[next(k for k in before if k.name == "e3")]
    deleted = next(d for d in deltas if d.type is DeltaType.DELETE)
    assert deleted.obj == before[deleted.key]


async def test_forbidden_list_counts_as_synced_empty(apiserver: ApiServer) -> None:
    # node-a may read Nodes but not list ConfigMaps across the cluster (Node authorizer).
    queries: list[Query[Any]] = [
        Query("cms", "v1", "ConfigMap"),
        Query("events", "v1", "Node", field_selector="metadata.name=node-a"),
    ]
    async with (
        client_for(apiserver, "node-a") as client,
        accumulating(client, queries, forbidden_retry=3600) as acc,
    ):
        snap = Snap()
        with trio.fail_after(30):
            await acc.changed()
        assert acc.update(snap)
        assert len(snap.cms) == 0
        reason = acc.not_ready_reason()
        assert reason is not None and reason.startswith("cms: list forbidden")


# -- issue 9: re-created objects, Forbidden after a good list ---------------------------------


def _uids(deltas: list[Delta[Any]]) -> list[tuple[str, str, str]]:
    return [(d.type.value, d.key.name, d.obj.metadata.uid) for d in deltas]


async def test_recreated_configmap_is_a_delete_and_an_add(
    apiserver: ApiServer, admin_client: KubeClient, ns: str
) -> None:
    gate = Gate()  # open: only tells when the watch has delivered a resourceVersion
    async with (
        client_for(apiserver, "admin") as client,
        accumulating(GatedWatches(client, {"configmaps": gate}), [cm_query(ns)]) as acc,
    ):
        snap = Snap()
        await until_snapshot(acc, snap, lambda s: True)
        first = await admin_client.create(CONFIGMAPS, cm("x", v="old"), ns, into=ConfigMap)
        await until_snapshot(acc, snap, lambda s: "x" in data_of(s.cms))
        # Between two wake-ups of the consumer, the ConfigMap is deleted and re-created.
        await admin_client.delete(CONFIGMAPS, "x", ns)
        second = await admin_client.create(CONFIGMAPS, cm("x", v="new"), ns, into=ConfigMap)
        with trio.fail_after(30):
            await gate.wait_ingested(second.metadata.resource_version)
            await acc.changed()
        deltas: list[Delta[Any]] = []
        assert acc.update(snap, deltas)
    old_uid, new_uid = first.metadata.uid, second.metadata.uid
    assert old_uid != new_uid
    assert _uids(deltas) == [("delete", "x", old_uid), ("add", "x", new_uid)]
    assert deltas[0].obj.data == {"v": "old"} and deltas[1].obj.data == {"v": "new"}
    (shown,) = snap.cms.values_list()
    assert shown.metadata.uid == new_uid


async def test_recreated_while_the_watch_was_away_is_a_delete_and_an_add(
    apiserver: ApiServer, admin_client: KubeClient, ns: str
) -> None:
    # core/v1 Events have no watch cache: after compaction the watch gets 410 and relists.
    await admin_client.create(CORE_EVENTS, core_event("e1", ns, "old"), ns)
    config = client_for(apiserver, "admin").config
    async with HoldableStreams(config, watch=FAST_WATCH) as client:
        client.held, client.release = trio.Event(), trio.Event()
        query = Query("events", "v1", "Event", namespace=ns, into=Gizmo)  # metadata is enough
        async with accumulating(client, [query]) as acc:
            snap = Snap()
            await until_snapshot(acc, snap, lambda s: len(s.events) == 1)
            (before,) = snap.events.values_list()
            client.hold = True
            with trio.fail_after(30):
                await client.held.wait()
            await admin_client.delete(CORE_EVENTS, "e1", ns)
            await admin_client.create(CORE_EVENTS, core_event("e1", ns, "new"), ns)
            await trio.to_thread.run_sync(apiserver.compact)
            client.hold = False
            client.release.set()
            deltas = await until_snapshot(
                acc, snap, lambda s: s.events.values_list()[0].metadata.uid != before.metadata.uid
            )
    (after,) = snap.events.values_list()
    assert _uids(deltas) == [
        ("delete", "e1", before.metadata.uid),
        ("add", "e1", after.metadata.uid),
    ]


def _cm_reader_binding() -> dict[str, Any]:
    return {
        "metadata": {"name": "cm-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:node:node-a"}
        ],
    }


async def test_forbidden_after_a_good_list_is_served_empty(
    apiserver: ApiServer, admin_client: KubeClient, ns: str
) -> None:
    # node-a may list and watch this namespace's ConfigMaps only through this RoleBinding.
    rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}
    await admin_client.create(ROLES, {"metadata": {"name": "cm-reader"}, "rules": [rule]}, ns)
    await admin_client.create(ROLEBINDINGS, _cm_reader_binding(), ns)
    for name in ("a", "b"):
        await admin_client.create(CONFIGMAPS, cm(name, v="1"), ns)
    # Watches end every second, so the revocation is noticed when the watch reconnects.
    node = client_for(apiserver, "node-a", watch=FAST_WATCH)
    # A Forbidden relist keeps the last state for unknown_bound (a restarting apiserver's
    # authorizer refuses for a while, issue 24 s5); then it is served as empty.
    settings = {"forbidden_retry": 1, "unknown_bound": 3}
    async with node as client, accumulating(client, [cm_query(ns)], **settings) as acc:
        snap = Snap()
        with trio.fail_after(30):
            while len(snap.cms) < 2 or not acc.status("cms").known:
                await acc.changed()
                acc.update(snap)
        await admin_client.delete(ROLEBINDINGS, "cm-reader", ns)
        deltas = await until_snapshot(acc, snap, lambda s: len(s.cms) == 0)
        assert sorted((d.type.value, d.key.name) for d in deltas) == [
            ("delete", "a"),
            ("delete", "b"),
        ]
        status = acc.status("cms")
        assert status.state is QueryState.FORBIDDEN and not status.known
        reason = acc.not_ready_reason()
        assert reason is not None and reason.startswith("cms: list forbidden: ")
        assert 'cannot list resource "configmaps"' in reason
        # Access restored: the next attempt lists for real and the objects come back.
        await admin_client.create(ROLEBINDINGS, _cm_reader_binding(), ns)
        await until_snapshot(acc, snap, lambda s: len(s.cms) == 2, limit=60)
        assert acc.status("cms").known and acc.not_ready_reason() is None
