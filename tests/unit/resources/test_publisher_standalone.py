"""Standalone (no cluster): the desired slices the ops endpoint shows follow the plugins'
lifecycle as cluster mode's writes do: a driver that left is shown (not registered) for
`resources.disconnect_grace`, then not at all (issue 29 item 14). Virtual time
(autojump_clock) stands in for the grace."""

from __future__ import annotations

from typing import Any

import trio

from nodeagent.core.latest import LatestValue
from nodeagent.resources.publisher import Publisher
from nodeagent.resources.settings import ResourcesSettings
from tests.unit.resources.test_publisher import DRIVER, Plugins, inventory, running, settle


async def test_a_gone_driver_is_shown_for_the_disconnect_grace_only(autojump_clock: Any) -> None:
    plugins = Plugins()
    async with running(None, plugins, disconnect_grace=30.0) as pub:
        plugins.send(inventory(3))
        await settle()
        plugins.disconnect()
        await trio.sleep(20)
        plugins.send(inventory(3))  # back within the grace: the grace starts again later
        await settle()
        plugins.disconnect()
        await trio.sleep(29)
        view = pub.desired_view()
        assert view[DRIVER]["registered"] is False
        assert [len(s["devices"]) for s in view[DRIVER]["pools"]["node-a"]] == [3]
        assert pub.counts() == (1, 1, 1)
        await trio.sleep(2)
        assert pub.desired_view() == {}
        assert pub.counts() == (0, 0, 0)
        plugins.send(inventory(2))  # it comes back: shown again
        await settle()
        assert [len(s["devices"]) for s in pub.desired_view()[DRIVER]["pools"]["node-a"]] == [2]


async def test_the_grace_is_the_configured_one_also_when_it_changes(autojump_clock: Any) -> None:
    plugins = Plugins()
    settings = LatestValue(ResourcesSettings(disconnect_grace=30.0, min_sync_interval=0.0))
    pub = Publisher(node_name="node-a", inventories=plugins.latest, settings=settings)
    async with trio.open_nursery() as nursery:
        await nursery.start(pub.run)
        plugins.send(inventory(3))
        await settle()
        plugins.disconnect()
        await trio.sleep(5)
        assert DRIVER in pub.desired_view()
        settings.set(ResourcesSettings(disconnect_grace=4.0, min_sync_interval=0.0))
        assert pub.desired_view() == {}
        nursery.cancel_scope.cancel()
