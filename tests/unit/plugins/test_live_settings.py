"""Plugin settings swapped at run time (a config reload): the registry scan takes a new
scan_interval at once, without a restart and without waiting out a sleep begun with the old one."""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio

from nodeagent.core.latest import LatestValue
from nodeagent.plugins.manager import PluginManager
from nodeagent.plugins.settings import PluginSettings
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg

from .fakes import PLUGIN_TYPE, FakeBridge, FakeHandler, FakeRegistration, listen, settings


async def test_a_new_scan_interval_applies_to_the_running_watcher(
    registry: Path, autojump_clock: trio.testing.MockClock
) -> None:
    bridge, handler = FakeBridge(), FakeHandler()
    live: LatestValue[PluginSettings] = LatestValue(settings(registry, scan_interval=3600.0))
    manager = PluginManager(live, bridge.as_bridge(), [handler])
    socket = registry / "p.sock"
    bridge.plugins[str(socket)] = FakeRegistration(
        reg.PluginInfo(type=PLUGIN_TYPE, name="p", supported_versions=["v1"])
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        live.set(msgspec.structs.replace(live.value, scan_interval=5.0))
        await trio.sleep(1.0)  # the retimed scan ran (empty registry); the next is due in 5 s
        with listen(socket):
            start = trio.current_time()
            with trio.fail_after(60):  # the old interval would take an hour
                while [i["state"] for i in manager.status()] != ["registered"]:
                    await manager.changes.wait_newer(manager.changes.version)
            assert trio.current_time() - start <= 5.0 + 1e-6
            nursery.cancel_scope.cancel()
