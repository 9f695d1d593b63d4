"""A pool handed over: its plugin left (a driver upgraded to one on the upstream helper, which
registers as self-publishing and writes its own slices), and another publisher's slices appear in
it. The pool is not refused and not kept for the disconnect grace: what nodeagent wrote for the
plugin that left goes at once, the successor's slices are never touched. A plugin that streams
again beside the successor is refused as before (two publishers of one pool)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import trio

from nodeagent.resources import metrics
from tests.support.fake_resourceslices import FakeCluster
from tests.unit.resources.test_publisher import DRIVER, Plugins, inventory, running, settle
from tests.unit.resources.test_publisher_write_safety import POOL, foreign_slice, value


def leave(plugins: Plugins, name: str = DRIVER) -> None:
    """The plugin's entry goes from the channel: what the DRA handler does when a
    self-publishing registration of the name serves instead."""
    plugins.data.pop(name)
    plugins.latest.set(MappingProxyType(dict(plugins.data)))


async def test_a_pool_taken_over_after_its_plugin_left_is_handed_over_at_once(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, startup_grace=0.0, disconnect_grace=30.0) as pub:
        plugins.send(inventory(3))
        await settle()
        (ours,) = cluster.objects
        leave(plugins)
        await trio.sleep(1)
        assert list(cluster.objects) == [ours]  # the grace: nothing else publishes the pool
        successor = cluster.put_external(foreign_slice())
        await trio.sleep(0.5)  # well within the grace
        assert cluster.objects == {"someone-elses-slice": successor}
        assert [c[0] for c in cluster.writes()] == ["create", "delete"]
        assert pub.failing() == {} and pub.refused() == set()
        assert value(metrics.REFUSED_POOLS) == 0
        assert [e for e in cluster.events if e["reason"] == "ResourceSlicePoolConflict"] == []
        # The grace ends: nothing more to do, the successor's slice untouched.
        await trio.sleep(60)
        assert cluster.objects == {"someone-elses-slice": successor}
        assert len(cluster.writes()) == 2


async def test_a_plugin_streaming_again_beside_the_successor_is_refused(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, startup_grace=0.0, disconnect_grace=30.0) as pub:
        plugins.send(inventory(3))
        await settle()
        leave(plugins)
        successor = cluster.put_external(foreign_slice())
        await trio.sleep(1)
        plugins.send(inventory(3))
        await trio.sleep(10)
        assert cluster.objects == {"someone-elses-slice": successor}
        assert [c[0] for c in cluster.writes()] == ["create", "delete"]
        assert POOL in pub.refused()
        (event,) = [e for e in cluster.events if e["reason"] == "ResourceSlicePoolConflict"]
        assert "not managed by nodeagent (someone-elses-slice)" in event["message"]


async def test_a_disconnected_plugin_with_no_successor_keeps_its_grace(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, startup_grace=0.0, disconnect_grace=30.0):
        plugins.send(inventory(3))
        await settle()
        (ours,) = cluster.objects
        # Another driver's slices in a pool of the same name are no successor.
        other = foreign_slice()
        other["spec"]["driver"] = "other.example.com"
        cluster.put_external(other)
        leave(plugins)
        await trio.sleep(29)
        assert ours in cluster.objects
        await trio.sleep(2)
        assert list(cluster.objects) == ["someone-elses-slice"]


async def test_after_a_restart_a_taken_over_pool_waits_for_the_startup_grace(
    autojump_clock: Any,
) -> None:
    # The agent restarts: its old slice and a successor's slice share the pool, and the plugin
    # has not registered (yet). It may still come back within the start-up grace, so nothing is
    # deleted before it ends; nothing is refused either. Then the pool is handed over.
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, startup_grace=0.0):
        plugins.send(inventory(3))
        await settle()
    (ours,) = cluster.objects
    successor = cluster.put_external(foreign_slice())
    writes = len(cluster.writes())
    async with running(cluster, Plugins(), startup_grace=30.0) as pub:
        await trio.sleep(29)
        assert set(cluster.objects) == {ours, "someone-elses-slice"}
        assert pub.failing() == {} and pub.refused() == set()
        await trio.sleep(2)
        assert cluster.objects == {"someone-elses-slice": successor}
        assert [c[0] for c in cluster.writes()[writes:]] == ["delete"]
        assert [e for e in cluster.events if e["reason"] == "ResourceSlicePoolConflict"] == []
