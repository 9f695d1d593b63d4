"""Cluster mode: the desired slices the ops endpoint shows (/v1/resourceslices) follow a gone
driver as standalone mode does since issue 29 item 14: shown, not registered, while its slices
stay published (`resources.disconnect_grace`), then not at all, neither the driver nor its pool
(it stayed listed with its pool's name and no slices). Virtual time stands in for the grace."""

from __future__ import annotations

from typing import Any

import trio

from tests.support.fake_resourceslices import FakeCluster
from tests.unit.resources.test_publisher import DRIVER, Plugins, inventory, running, settle


async def test_a_gone_driver_is_shown_while_its_slices_are_published_only(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, startup_grace=0.0, disconnect_grace=30.0) as pub:
        plugins.send(inventory(3))
        await settle()
        plugins.disconnect()
        await trio.sleep(29)
        view = pub.desired_view()
        assert view[DRIVER]["registered"] is False
        assert [len(s["devices"]) for s in view[DRIVER]["pools"]["node-a"]] == [3]
        assert pub.counts() == (1, 1, 1)
        await trio.sleep(2)
        await settle()
        assert cluster.objects == {}  # its slices deleted
        assert pub.desired_view() == {}
        assert pub.counts() == (0, 0, 0)
        plugins.send(inventory(2))  # it comes back: shown again
        await settle()
        assert [len(s["devices"]) for s in pub.desired_view()[DRIVER]["pools"]["node-a"]] == [2]
