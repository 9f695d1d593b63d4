"""`Publisher.pending` (/v1/resourceslices `sync.pending_pools`) counts every pool not yet as
the agent will leave it: the pool being synced (its writes in flight) and a pool held for its
plugin's first valid inventory, beside the queued ones. Issue 29 item 3: the 2-hour soak (step
522) read a half-written pool, left by an agent stopped mid-write, while the next agent said
synced with 0 pools pending and was rewriting it. Virtual time stands in for the waits."""

from __future__ import annotations

from typing import Any

import trio

from tests.support.fake_resourceslices import FakeCluster
from tests.unit.resources.test_publisher import Plugins, inventory, running, settle
from tests.unit.resources.test_publisher_write_safety import bad_inventory


class GatedCluster(FakeCluster):
    """Creates wait for `gate`: a sync's writes in flight, for as long as the test wants."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()

    async def create(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes:
        await self.gate.wait()
        return await super().create(resource, obj, namespace)


async def test_a_pool_being_written_is_pending(autojump_clock: Any) -> None:
    cluster, plugins = GatedCluster(), Plugins()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(3))
        await settle()
        assert cluster.objects == {}  # its create in flight
        assert pub.pending() == 1
        cluster.gate.set()
        await settle()
        assert len(cluster.objects) == 1
        assert pub.pending() == 0


async def test_a_pool_held_for_its_plugins_first_valid_inventory_is_pending(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(3))
        await settle()
        assert pub.pending() == 0
    writes = len(cluster.writes())
    plugins = Plugins()
    async with running(cluster, plugins, startup_grace=1.0) as pub:
        plugins.send(bad_inventory())  # registered, nothing valid since the start
        await trio.sleep(10)  # past the start-up grace: held for the inventory, not a grace
        await settle()
        assert len(cluster.writes()) == writes
        assert pub.pending() == 1
        plugins.send(inventory(4))
        await settle()
        assert len(cluster.writes()) > writes
        assert pub.pending() == 0
