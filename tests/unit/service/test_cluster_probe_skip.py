"""The cluster probe is skipped while every watch shows the apiserver answering (issue 24 s4: two
thirds of an idle agent's requests were `GET /readyz` every 30 s): a watch event, a bookmark or
a completed list is proof of reachability. It resumes when a watch fails (at once) or stalls
(silent past kube.watch_inactivity_timeout), and readiness holds through an outage shorter than
agent.apiserver_unreachable_bound (issue 24 s5)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, NoReturn

import trio
import trio.testing

from nodeagent.accumulator import Accumulator, AccumulatorSettings, Query
from nodeagent.kube.resource import NODES
from nodeagent.kube.settings import KubeSettings
from nodeagent.kube.watch import WatchRequest, WatchSink
from nodeagent.service.cluster import ClusterComponent
from tests.support.fake_watch import FakeClient as AccumulatorClient
from tests.unit.accumulator.helpers import bookmark, obj, page
from tests.unit.service.test_cluster_probe_retry import RecordingClient

NODE_Q: Query[Any] = Query("node", "v1", NODES, field_selector="metadata.name=node-a")
STALL = 70.0  # kube.watch_inactivity_timeout


class Upstream:
    """The watch behind the hub: hands out its sink."""

    def __init__(self) -> None:
        self.sink: WatchSink | None = None
        self.started = trio.Event()

    async def watch(self, _client: Any, request: WatchRequest, sink: WatchSink) -> NoReturn:
        self.sink = sink
        self.started.set()
        await trio.sleep_forever()

    async def listed(self, rv: int) -> WatchSink:
        await self.started.wait()
        assert self.sink is not None
        await self.sink.begin_list()
        await self.sink.list_page(page([obj("node-a", rv, None, kind="Node")], rv, "NodeList"))
        await self.sink.end_list(str(rv))
        return self.sink


@asynccontextmanager
async def agent() -> AsyncIterator[tuple[ClusterComponent, RecordingClient, Upstream]]:
    client, up = RecordingClient(), Upstream()
    cluster = ClusterComponent(
        KubeSettings(watch_inactivity_timeout=STALL),
        load_client=lambda s: client,  # type: ignore[arg-type,return-value]  # a fake KubeClient
        probe_interval=30,
        watch=lambda c: partial(up.watch, c),
    )
    async with cluster.connected(), trio.open_nursery() as nursery:
        await nursery.start(cluster.run)
        assert cluster.watches is not None
        acc = Accumulator(
            AccumulatorClient(), [NODE_Q], AccumulatorSettings(), watch=cluster.watches.watch
        )
        await nursery.start(acc.run)
        yield cluster, client, up
        nursery.cancel_scope.cancel()


async def test_no_probe_while_the_watches_show_the_apiserver(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with agent() as (cluster, client, up):
        sink = await up.listed(1)
        assert client.paths == ["/version", "/readyz"]  # connecting: the version is asked
        # Ten minutes of bookmarks (the apiserver sends one about every minute): no probe.
        for _ in range(10):
            await trio.sleep(60)
            await sink.feed(bookmark(2))
        await trio.sleep(1)
        assert client.paths == ["/version", "/readyz"]
        assert cluster.probes_skipped >= 19
        ready, reason = cluster.readiness()
        assert ready and reason.startswith("connected (apiserver v1.35.4; 1 watches live"), reason


async def test_the_probe_resumes_at_once_when_a_watch_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with agent() as (cluster, client, up):
        sink = await up.listed(1)
        await trio.sleep(45)  # a look at 30 s skipped the probe
        assert client.paths == ["/version", "/readyz"]
        sink.events_missing("gone")  # type: ignore[attr-defined]
        await trio.sleep(2.1)  # looked at again 2 s later (a healthy watch reconnects by then)
        assert client.paths == ["/version", "/readyz", "/readyz"]
        # Listed again: skipped again from the next look.
        await up.listed(2)
        await trio.sleep(60)
        assert client.paths == ["/version", "/readyz", "/readyz"]
        ready, reason = cluster.readiness()
        assert ready and "watches live" in reason, reason


async def test_the_probe_resumes_when_a_watch_stalls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with agent() as (_cluster, client, up):
        await up.listed(1)
        listed_at = trio.current_time()
        # No event nor bookmark: silent past 70 s, seen at the next look (every 30 s).
        await trio.sleep(STALL - 1)
        assert client.paths == ["/version", "/readyz"]
        await trio.sleep(30 + 2)
        assert client.paths == ["/version", "/readyz", "/readyz"]
        assert trio.current_time() - listed_at <= STALL + 30 + 1


async def test_ready_through_an_outage_shorter_than_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A control-plane restart: the apiserver does not answer for 100 s (the kubelet keeps its
    # node Ready through that; a DaemonSet's pods going NotReady would page its operators).
    async with agent() as (cluster, client, up):
        sink = await up.listed(1)
        await trio.sleep(10)
        client.down = True
        sink.events_missing("broken")  # type: ignore[attr-defined]
        for _ in range(100):
            await trio.sleep(1)
            ready, reason = cluster.readiness()
            assert ready, reason
        assert reason.startswith("apiserver unreachable for "), reason
        assert "(bound 120s)" in reason
        # Back: the probe (retried with backoff, at most 30 s apart) sees it, and the watch
        # lists again: skipped again.
        client.down = False
        await trio.sleep(31)
        await up.listed(2)
        await trio.sleep(31)
        ready, reason = cluster.readiness()
        assert ready and "watches live" in reason, reason
        # Down for longer than the bound: not ready.
        client.down = True
        sink.events_missing("broken")  # type: ignore[attr-defined]
        await trio.sleep(125)
        ready, reason = cluster.readiness()
        assert not ready and reason.startswith("apiserver unreachable: "), reason


async def test_watches_that_cannot_reconnect_show_the_apiserver_unreachable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The apiserver gone: every stream ends and does not open again (a healthy watch whose
    # server timeout ended reconnects at once, and its next event may be a minute away). Their
    # reconnect attempts are what finds it back: no probe in step across the fleet, one only if
    # this lasts a jittered interval (issue 24 s5).
    async with agent() as (cluster, client, up):
        sink = await up.listed(1)
        shared: Any = sink  # the hub's watch, which the streams tell
        shared.stream_opened()
        await trio.sleep(45)
        shared.stream_closed()
        shared.stream_opened()  # a healthy reconnect: nothing to probe
        await trio.sleep(5)
        assert client.paths == ["/version", "/readyz"]
        shared.stream_closed()
        closed_at = trio.current_time()
        await trio.sleep(5)
        assert client.paths == ["/version", "/readyz"]
        ready, reason = cluster.readiness()
        assert ready, reason
        assert reason == (
            "apiserver unreachable for 5s (bound 120s): the watches cannot reconnect"
        ), reason
        # Still lost after 15-30 s: the apiserver is probed, its version asked again (a
        # restarted apiserver may be an upgraded one). Here it answers: a watch that cannot
        # reconnect while the server answers is its accumulator's to report.
        await trio.sleep(30)
        assert client.paths == ["/version", "/readyz", "/version", "/readyz"]
        assert trio.current_time() - closed_at <= 2 + 30 + 5
        assert cluster.readiness() == (True, "connected (apiserver v1.35.4)")


async def test_after_an_outage_the_watches_show_the_server_back_without_probing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Issue 24 s5: retrying the probe from 1 s, a fleet probed its restarting apiserver 3.5
    # times per agent (/readyz answering 500 until ready); now the watches, looked at every
    # second without a request, find it back.
    async with agent() as (cluster, client, up):
        sink = await up.listed(1)
        shared: Any = sink
        shared.stream_opened()
        await trio.sleep(45)
        client.down = True
        shared.stream_closed()  # the apiserver crashed
        await trio.sleep(4.5)
        ready, reason = cluster.readiness()
        assert ready and reason.startswith("apiserver unreachable for "), reason
        client.down = False
        shared.stream_opened()  # the new process accepts the watch, which lists again
        await up.listed(2)
        await trio.sleep(1.1)
        ready, reason = cluster.readiness()
        assert ready and "watches live" in reason, reason
        assert client.paths == ["/version", "/readyz"]  # no probe was needed
