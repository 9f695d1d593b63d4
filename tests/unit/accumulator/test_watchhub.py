"""The watch hub (issue 24 s4): one watch per distinct request for every accumulator that asks
(the publisher's and the dynamic configuration's Node), late subscribers replayed the current
state, a Forbidden list reaching every subscriber, the watch stopped with its last subscriber,
and whether the watches show the apiserver reachable (the cluster probe skips while they do)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, NoReturn

import pytest
import trio
import trio.testing

from nodeagent.accumulator import Accumulator, AccumulatorSettings, ObjectMap, Query, QueryState
from nodeagent.accumulator.watchhub import WatchHub
from nodeagent.kube import errors
from nodeagent.kube.resource import NODES
from nodeagent.kube.watch import WatchRequest, WatchSink
from tests.support.fake_watch import FakeClient
from tests.unit.accumulator.helpers import bookmark, event, obj, page

NODE_Q: Query[Any] = Query("node", "v1", NODES, field_selector="metadata.name=node-a")
NODE_REQ = WatchRequest(NODES, None, None, "metadata.name=node-a")


def node(rv: int, **labels: str) -> dict[str, Any]:
    return obj("node-a", rv, None, labels=labels or None, kind="Node")


class Snap:
    node: ObjectMap[bytes]


class Upstream:
    """The one real watch behind the hub: counts its starts, hands out its sink."""

    def __init__(self) -> None:
        self.starts = 0
        self.running = 0
        self.sink: WatchSink | None = None
        self.started = trio.Event()
        self.fail = trio.Event()
        self.forbidden = False

    async def watch(self, request: WatchRequest, sink: WatchSink) -> NoReturn:
        assert request == NODE_REQ
        self.starts += 1
        if self.forbidden:
            raise errors.Forbidden(403, "Forbidden", "nodes is forbidden")
        self.running += 1
        self.sink = sink
        self.started.set()
        try:
            await self.fail.wait()
            raise errors.Forbidden(403, "Forbidden", "nodes is forbidden")
        finally:
            self.running -= 1
            self.started = trio.Event()

    async def listed(self, *items: dict[str, Any], rv: int) -> WatchSink:
        await self.started.wait()
        assert self.sink is not None
        await self.sink.begin_list()
        await self.sink.list_page(page(list(items), rv, "NodeList"))
        await self.sink.end_list(str(rv))
        return self.sink


@asynccontextmanager
async def hub_running() -> AsyncIterator[tuple[WatchHub, Upstream, trio.Nursery]]:
    up = Upstream()
    hub = WatchHub(up.watch)
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        yield hub, up, nursery
        nursery.cancel_scope.cancel()


def accumulator(hub: WatchHub) -> Accumulator:
    return Accumulator(FakeClient(), [NODE_Q], AccumulatorSettings(), watch=hub.watch)


async def test_two_consumers_share_one_watch(autojump_clock: trio.testing.MockClock) -> None:
    async with hub_running() as (hub, up, nursery):
        a, b = accumulator(hub), accumulator(hub)
        await nursery.start(a.run)
        await nursery.start(b.run)
        sink = await up.listed(node(1, zone="x"), rv=1)
        snap_a, snap_b = Snap(), Snap()
        for acc, snap in ((a, snap_a), (b, snap_b)):
            await acc.changed()
            assert acc.update(snap) and len(snap.node) == 1
        assert up.starts == 1 and hub.watches == 1 and hub.subscribers(NODE_REQ) == 2
        # An event reaches both.
        await sink.feed(event("MODIFIED", node(2, zone="y")))
        for acc, snap in ((a, snap_a), (b, snap_b)):
            await acc.changed()
            assert acc.update(snap)
            assert b'"zone":"y"' in snap.node.values_list()[0]
        assert up.starts == 1


async def test_a_late_subscriber_is_replayed_the_current_state(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with hub_running() as (hub, up, nursery):
        a = accumulator(hub)
        await nursery.start(a.run)
        sink = await up.listed(node(1), rv=1)
        await sink.feed(event("MODIFIED", node(5, role="gpu")) + bookmark(7))
        # The second consumer starts later (dynconfig after its CRD lookup): no second watch,
        # the hub's store is replayed to it as a list.
        b = accumulator(hub)
        await nursery.start(b.run)
        snap = Snap()
        await b.changed()
        assert b.update(snap) and b.status("node").known
        [raw] = snap.node.values_list()
        assert b'"role":"gpu"' in raw and b'"resourceVersion":"5"' in raw
        assert up.starts == 1
        # And it follows the watch from there.
        await sink.feed(event("DELETED", node(8, role="gpu")))
        await b.changed()
        assert b.update(snap) and len(snap.node) == 0


async def test_a_subscriber_joining_mid_list_gets_the_whole_list(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with hub_running() as (hub, up, nursery):
        a = accumulator(hub)
        await nursery.start(a.run)
        await up.started.wait()
        sink = up.sink
        assert sink is not None
        await sink.begin_list()
        await sink.list_page(page([node(3)], 3, "NodeList"))
        b = accumulator(hub)
        await nursery.start(b.run)
        await trio.testing.wait_all_tasks_blocked()
        assert not b.bootstrapped
        await sink.end_list("3")
        snap = Snap()
        await b.changed()
        assert b.update(snap) and len(snap.node) == 1 and b.status("node").known
        assert up.starts == 1


async def test_forbidden_reaches_every_subscriber(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with hub_running() as (hub, up, nursery):
        up.forbidden = True
        a, b = accumulator(hub), accumulator(hub)
        await nursery.start(a.run)
        await nursery.start(b.run)
        await trio.testing.wait_all_tasks_blocked()
        for acc in (a, b):
            assert acc.status("node").state is QueryState.FORBIDDEN
        # Allowed again: both list through one watch once they retry.
        up.forbidden = False
        await trio.sleep(AccumulatorSettings().forbidden_retry + 1)
        await up.listed(node(1), rv=1)
        for acc in (a, b):
            await acc.changed()
            assert acc.update(Snap()) and acc.status("node").known
        assert up.running == 1


async def test_the_watch_stops_with_its_last_subscriber(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with hub_running() as (hub, up, _nursery):
        a, b = accumulator(hub), accumulator(hub)
        async with trio.open_nursery() as for_a:
            await for_a.start(a.run)
            async with trio.open_nursery() as for_b:
                await for_b.start(b.run)
                await up.listed(node(1), rv=1)
                for_b.cancel_scope.cancel()  # b stops (a component restart)
            await trio.testing.wait_all_tasks_blocked()
            assert up.running == 1 and hub.subscribers(NODE_REQ) == 1
            for_a.cancel_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert up.running == 0 and hub.watches == 0
        # A new subscriber starts it again.
        c = accumulator(hub)
        async with trio.open_nursery() as for_c:
            await for_c.start(c.run)
            await up.listed(node(2), rv=2)
            await c.changed()
            assert c.update(Snap())
            assert up.starts == 2
            for_c.cancel_scope.cancel()


async def test_reachable_while_every_watch_shows_proof(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with hub_running() as (hub, up, nursery):
        assert hub.reachable(trio.current_time(), 70) == (False, "no watch running")
        a = accumulator(hub)
        await nursery.start(a.run)
        await up.started.wait()
        ok, why = hub.reachable(trio.current_time(), 70)
        assert not ok and why == "watch of nodes: not listed yet"
        sink = await up.listed(node(1), rv=1)
        assert hub.reachable(trio.current_time(), 70)[0]
        # Bookmarks (about one a minute) keep it proven.
        for _ in range(3):
            await trio.sleep(60)
            await sink.feed(bookmark(2))
            assert hub.reachable(trio.current_time(), 70)[0]
        # Silent past the bound: stalled.
        await trio.sleep(71)
        ok, why = hub.reachable(trio.current_time(), 70)
        assert not ok and why == "watch of nodes: silent for 71s"
        await sink.feed(event("MODIFIED", node(3)))
        assert hub.reachable(trio.current_time(), 70)[0]
        # A failure is news at once (trouble() returns), and no proof until a list completes.
        async with trio.open_nursery() as inner:
            inner.start_soon(hub.trouble)
            await trio.testing.wait_all_tasks_blocked()
            sink.events_missing("gone")  # type: ignore[attr-defined]
        ok, why = hub.reachable(trio.current_time(), 70)
        assert not ok and why == "watch of nodes: events missing (gone)"
        await up.listed(node(4), rv=4)
        assert hub.reachable(trio.current_time(), 70)[0]


async def test_watch_needs_the_hub_running() -> None:
    hub = WatchHub(Upstream().watch)
    with pytest.raises(RuntimeError, match="not running"):
        await hub.watch(NODE_REQ, FakeSink())


class FakeSink:
    async def begin_list(self) -> None: ...

    async def list_page(self, page: bytes) -> None: ...

    async def end_list(self, resource_version: str) -> None: ...

    async def feed(self, chunk: bytes) -> Any: ...

    async def end_stream(self) -> None: ...


async def test_requests_not_shared_get_a_watch_each(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # This node's slices: one consumer, and no copy of (possibly large) objects in the hub.
    up = Upstream()
    hub = WatchHub(up.watch, share=lambda _request: False)
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        a, b = accumulator(hub), accumulator(hub)
        await nursery.start(a.run)
        await nursery.start(b.run)
        await trio.testing.wait_all_tasks_blocked()
        assert up.starts == 2 and hub.watches == 2 and hub.subscribers(NODE_REQ) == 2
        # Each is counted for reachability: one never listed keeps it unproven.
        await up.listed(node(1), rv=1)  # the last one started
        assert not hub.reachable(trio.current_time(), 70)[0]
        nursery.cancel_scope.cancel()
