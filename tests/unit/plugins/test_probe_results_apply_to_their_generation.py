"""Issue 20 item 3, the stale probe: a probe of a plugin's old socket that fails after the socket
was recreated (the container restarted during the probe) must not deregister the plugin that
registered at the same path meanwhile. The real `PluginManager`, plugins answering through the
fake bridge, real socket files, the virtual clock."""

from __future__ import annotations

import os
import socket as _socket
from pathlib import Path

import trio
import trio.testing

from nodeagent.plugins.manager import PluginManager
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
from tests.support.wait import wait_until

PROBE_INTERVAL = 5.0


def recreate(path: Path) -> _socket.socket:
    """A new socket file at `path` (a restarted container's): bound beside it and renamed over
    it, so it is another inode whatever the file system reuses."""
    fresh = path.with_name("." + path.name + ".new")  # dot-files are not scanned
    sock = listen(fresh)
    os.rename(fresh, path)
    return sock


def info() -> reg.PluginInfo:
    return reg.PluginInfo(type=PLUGIN_TYPE, name="p", supported_versions=["v1"])


def status(manager: PluginManager) -> tuple[str, str]:
    items = manager.status()
    assert len(items) <= 1, items
    return (items[0]["state"], items[0]["last_error"]) if items else ("absent", "")


async def test_a_failed_probe_of_the_old_socket_does_not_deregister_its_replacement(
    registry: Path, autojump_clock: trio.testing.MockClock
) -> None:
    bridge, handler = FakeBridge(), FakeHandler()
    path = registry / "p.sock"
    old = bridge.plugins[str(path)] = FakeRegistration(info())
    manager = PluginManager(
        settings(registry, probe_interval=PROBE_INTERVAL, probe_failures=2),
        bridge.as_bridge(),
        [handler],
    )
    with listen(path) as old_socket:
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await wait_until(
                lambda: status(manager)[0] == "registered", "the plugin registered", timeout=600
            )
            # The container is dying: one probe fails, the next hangs (up to the kubelet's
            # 30 s of dial and GetInfo) and fails only after the container restarted.
            old.error = RpcError("UNAVAILABLE", "container stopping")
            old.hold_from = 3  # GetInfo 1 registered it, 2 is the first failed probe
            await old.held.wait()
            old_socket.close()
            new = bridge.plugins[str(path)] = FakeRegistration(info())
            with recreate(path):
                await wait_until(
                    lambda: len(handler.registered) == 2, "the new socket registered", timeout=600
                )
                assert status(manager) == ("registered", "")
                assert len(handler.deregistered) == 1  # the old socket's: due
                old.release.set()  # the old probe's failure arrives
                await trio.testing.wait_all_tasks_blocked()
                assert len(handler.deregistered) == 1
                assert status(manager) == ("registered", "")
                # And it stays so: the new plugin answers its own probes.
                calls = new.get_info_calls
                await new.wait_calls(calls + 3)
                await trio.testing.wait_all_tasks_blocked()
                assert status(manager) == ("registered", "")
                assert (len(handler.registered), len(handler.deregistered)) == (2, 1)
            nursery.cancel_scope.cancel()
