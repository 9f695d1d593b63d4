"""Publisher settings swapped at run time (a config reload): min_sync_interval and
disconnect_grace take effect for pools already waiting, without a restart."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio
import trio.testing

from nodeagent.core.latest import LatestValue
from nodeagent.resources.publisher import Publisher
from nodeagent.resources.settings import ResourcesSettings
from tests.support.fake_resourceslices import FakeCluster
from tests.unit.resources.test_publisher import Plugins, inventory, settle, slices


@asynccontextmanager
async def running_live(
    cluster: FakeCluster, plugins: Plugins, live: LatestValue[ResourcesSettings]
) -> AsyncIterator[Publisher]:
    pub = Publisher(
        node_name="node-a",
        inventories=plugins.latest,
        settings=live,
        client=cluster,
        slices=cluster.source,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(pub.run)
        await settle()
        yield pub
        nursery.cancel_scope.cancel()


def _swap(live: LatestValue[ResourcesSettings], **changes: Any) -> None:
    live.set(msgspec.structs.replace(live.value, **changes))


async def test_a_shorter_min_sync_interval_releases_a_held_pool(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    live = LatestValue(ResourcesSettings(startup_grace=0.0, min_sync_interval=1000.0))
    async with running_live(cluster, plugins, live):
        plugins.send(inventory(3))
        await settle()
        assert len(cluster.writes()) == 1
        plugins.send(inventory(3, memory="2Gi"))
        await trio.sleep(10)
        assert len(cluster.writes()) == 1  # held for the 1000 s interval
        _swap(live, min_sync_interval=1.0)
        await trio.sleep(1)
        await settle()
        assert [c[0] for c in cluster.writes()] == ["create", "update"]
        (obj,) = slices(cluster)
        assert obj["spec"]["devices"][0]["capacity"]["memory"]["value"] == "2Gi"


async def test_a_shorter_disconnect_grace_applies_to_a_plugin_already_gone(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    live = LatestValue(ResourcesSettings(startup_grace=0.0, disconnect_grace=3600.0))
    async with running_live(cluster, plugins, live):
        plugins.send(inventory(3))
        await settle()
        plugins.disconnect()
        await trio.sleep(10)
        _swap(live, disconnect_grace=30.0)
        await trio.sleep(15)
        assert len(cluster.objects) == 1  # 25 s after the disconnect: within the new grace
        await trio.sleep(6)
        await settle()
        assert cluster.objects == {}


async def test_a_settings_change_leaves_a_published_pool_not_waiting(autojump_clock: Any) -> None:
    # A long min_sync_interval (an operator throttling writes): a settings change used to
    # queue every pool again, and a pool whose slices already were what it wants waited out
    # the interval counted by readiness as "its changes are not written yet" (the soak's
    # config_slow rollback named such a pool).
    cluster, plugins = FakeCluster(), Plugins()
    live = LatestValue(ResourcesSettings(startup_grace=0.0, min_sync_interval=1000.0))
    async with running_live(cluster, plugins, live) as pub:
        plugins.send(inventory(3))
        await settle()
        assert len(cluster.writes()) == 1
        assert pub.waiting() == {}
        _swap(live, min_sync_interval=900.0)
        await settle()
        assert pub.waiting() == {}
        assert pub.pending() == 0
        await trio.sleep(1000)
        assert len(cluster.writes()) == 1
