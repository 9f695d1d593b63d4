"""The composed manager: a plugin found in the registry is registered through the pieces, and
status and readiness show plain strings (the enum's values)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import trio

from nodeagent.plugins.manager import PluginManager
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from tests.support.fake_plugins import (
    PLUGIN_TYPE,
    FakeBridge,
    FakeHandler,
    FakeRegistration,
    listen,
    settings,
)


async def _until(manager: PluginManager, predicate: Callable[[], bool]) -> None:
    with trio.fail_after(5):
        while not predicate():
            await manager.changes.wait_newer(manager.changes.version)


def _states(manager: PluginManager) -> list[object]:
    return [item["state"] for item in manager.status()]


async def test_a_plugin_registers_through_the_pieces_and_shows_plain_strings(
    registry: Path,
) -> None:
    bridge, handler = FakeBridge(), FakeHandler()
    socket = registry / "p.sock"
    bridge.plugins[str(socket)] = FakeRegistration(
        reg.PluginInfo(type=PLUGIN_TYPE, name="p", supported_versions=["v1"])
    )
    manager = PluginManager(settings(registry, scan_interval=0.05), bridge.as_bridge(), [handler])
    assert manager.readiness() == (False, "plugin registry not scanned yet")
    with listen(socket):
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await _until(manager, lambda: _states(manager) == ["registered"])
            assert type(manager.status()[0]["state"]) is str
            assert json.loads(json.dumps(manager.status()))[0]["state"] == "registered"
            assert manager.readiness() == (True, "1 plugins registered, 0 not registered")
            os.unlink(socket)
            await _until(manager, lambda: _states(manager) == [])
            assert [p.name for p in handler.deregistered] == ["p"]
            nursery.cancel_scope.cancel()


async def test_a_restarted_manager_registers_every_socket_afresh(registry: Path) -> None:
    bridge, handler = FakeBridge(), FakeHandler()
    socket = registry / "p.sock"
    bridge.plugins[str(socket)] = FakeRegistration(reg.PluginInfo(type=PLUGIN_TYPE, name="p"))
    manager = PluginManager(settings(registry, scan_interval=0.05), bridge.as_bridge(), [handler])
    with listen(socket):
        for _ in range(2):
            async with trio.open_nursery() as nursery:
                await nursery.start(manager.run)
                await _until(manager, lambda: _states(manager) == ["registered"])
                nursery.cancel_scope.cancel()
    assert len(handler.registered) == 2
