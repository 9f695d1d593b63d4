"""Plugin settings swapped at run time (a config reload): the registry scan and the connection
monitor take a new scan_interval / probe_interval at once, without a restart and without waiting
out a sleep begun with the old one."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import msgspec
import trio

from nodeagent.core.latest import LatestValue
from nodeagent.plugins.executor import OperationExecutor
from nodeagent.plugins.manager import PluginManager
from nodeagent.plugins.monitor import ConnectionMonitor
from nodeagent.plugins.settings import PluginSettings
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.rpc.bridge import RpcError
from tests.support.fake_plugins import (
    PLUGIN_TYPE,
    FakeBridge,
    FakeHandler,
    FakeRegistration,
    listen,
    settings,
)

from .test_monitor import SOCKET, Rig


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


async def test_a_new_probe_interval_applies_to_the_running_monitor(
    registry: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(registry)
    live: LatestValue[PluginSettings] = LatestValue(
        settings(registry, probe_failures=2, probe_interval=3600.0)
    )
    rig.monitor = ConnectionMonitor(
        live,
        rig.bridge.as_bridge(),
        rig.caches,
        cast(OperationExecutor, rig.executor),
        rig._seen,
        kick=rig.kicks.kick,
    )
    rig.plugin.error = RpcError("DEADLINE_EXCEEDED", "slow")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rig.monitor.run)
        await trio.sleep(10)
        assert rig.record.probe_failures == 0  # the first probe is an hour away
        live.set(msgspec.structs.replace(live.value, probe_interval=5.0))
        await trio.sleep(6)  # probed at the change, then 5 s later: two failures
        assert rig.caches.desired.get(SOCKET) is None
        nursery.cancel_scope.cancel()
