"""The connection monitor: consecutive failed probes drop a plugin from the desired state; a
dropped socket that answers again comes back with a new generation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import cast

import trio

from nodeagent.plugins.executor import OperationExecutor
from nodeagent.plugins.monitor import ConnectionMonitor
from nodeagent.plugins.state import ActualPlugin, Caches, PluginState, SocketIdentity
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.rpc.bridge import RpcError
from tests.support.fake_plugins import (
    PLUGIN_TYPE,
    FakeBridge,
    FakeExecutor,
    FakeRegistration,
    Kicks,
    identity,
    record,
    settings,
)

SOCKET = "/r/p.sock"


class Rig:
    def __init__(self, registry: Path) -> None:
        self.caches, self.kicks, self.bridge = Caches(), Kicks(), FakeBridge()
        self.executor = FakeExecutor()
        self.seen: dict[str, SocketIdentity] = {SOCKET: identity(1)}
        self.plugin = FakeRegistration(reg.PluginInfo(type=PLUGIN_TYPE, name="p"))
        self.bridge.plugins[SOCKET] = self.plugin
        self.monitor = ConnectionMonitor(
            settings(registry, probe_failures=2),
            self.bridge.as_bridge(),
            self.caches,
            cast(OperationExecutor, self.executor),
            self._seen,
            kick=self.kicks.kick,
        )
        wanted = self.caches.desired.add_or_update(SOCKET, identity(1))
        self.caches.actual.add(ActualPlugin(SOCKET, wanted.generation, PLUGIN_TYPE, "p", "", ()))
        self.record = record(self.caches, SOCKET, wanted.generation, state=PluginState.REGISTERED)

    def _seen(self) -> Mapping[str, SocketIdentity]:
        return self.seen


async def test_a_plugin_is_dropped_after_consecutive_failed_probes(registry: Path) -> None:
    rig = Rig(registry)
    rig.plugin.error = RpcError("DEADLINE_EXCEEDED", "slow")
    await rig.monitor.probe_all()
    assert rig.record.probe_failures == 1
    assert rig.caches.desired.get(SOCKET) is not None and rig.kicks.kicks == 0
    await rig.monitor.probe_all()
    assert rig.record.state is PluginState.FAILED
    assert rig.record.last_error == "deregistered after 2 failed probes"
    assert rig.caches.desired.get(SOCKET) is None and rig.kicks.kicks == 1


async def test_an_answer_resets_the_count(registry: Path) -> None:
    rig = Rig(registry)
    rig.plugin.error = RpcError("UNAVAILABLE", "down")
    await rig.monitor.probe_all()
    rig.plugin.error = None
    await rig.monitor.probe_all()
    assert rig.record.probe_failures == 0
    rig.plugin.error = RpcError("UNAVAILABLE", "down")
    await rig.monitor.probe_all()
    assert rig.caches.desired.get(SOCKET) is not None


async def test_a_socket_with_an_operation_under_way_is_not_probed(registry: Path) -> None:
    rig = Rig(registry)
    rig.executor.busy_sockets.add(SOCKET)
    await rig.monitor.probe_all()
    assert rig.plugin.get_info_calls == 0


async def test_a_dropped_socket_that_answers_again_gets_a_new_generation(registry: Path) -> None:
    rig = Rig(registry)
    old = rig.caches.desired.get(SOCKET)
    assert old is not None
    rig.caches.desired.remove(SOCKET)
    rig.caches.actual.remove(SOCKET)
    rig.plugin.error = RpcError("UNAVAILABLE", "down")
    await rig.monitor.probe_all()
    assert rig.caches.desired.get(SOCKET) is None
    rig.plugin.error = None
    await rig.monitor.probe_all()
    back = rig.caches.desired.get(SOCKET)
    assert back is not None and back.generation != old.generation
    assert rig.kicks.kicks == 1


async def test_a_socket_that_cannot_be_dialled_counts_as_a_failure(registry: Path) -> None:
    rig = Rig(registry)
    del rig.bridge.plugins[SOCKET]
    await rig.monitor.probe_all()
    assert rig.record.probe_failures == 1


async def test_probes_run_every_probe_interval(
    registry: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(registry)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rig.monitor.run)
        await trio.sleep(5.0 * 3 + 0.1)
        nursery.cancel_scope.cancel()
    assert rig.plugin.get_info_calls == 3


def refused() -> RpcError:
    """What the bridge raises when nobody listens on a socket (the OSError is its cause)."""
    error = RpcError("UNAVAILABLE", "connection failed: [Errno 111] Connection refused")
    error.__cause__ = ConnectionRefusedError(111, "Connection refused")
    return error


async def test_a_plugin_whose_socket_refuses_is_dropped_as_stale(registry: Path) -> None:
    # Issue 29 item 1: a plugin killed without removing its socket left, it is not unreachable.
    rig = Rig(registry)
    rig.plugin.error = refused()
    await rig.monitor.probe_all()
    assert rig.record.probe_failures == 1  # one failure: still the kubelet's count
    await rig.monitor.probe_all()
    assert rig.record.state is PluginState.STALE
    assert rig.record.last_error == (
        "deregistered after 2 failed probes: socket /r/p.sock refuses connections: a stale "
        "socket (nobody listening): remove it or restart the plugin"
    )
    assert rig.caches.desired.get(SOCKET) is None and rig.kicks.kicks == 1


async def test_a_dropped_socket_that_starts_refusing_turns_stale(registry: Path) -> None:
    # Dropped while hung (its probes timing out), then killed: its socket is left behind.
    rig = Rig(registry)
    rig.plugin.error = RpcError("DEADLINE_EXCEEDED", "slow")
    await rig.monitor.probe_all()
    await rig.monitor.probe_all()
    rig.caches.actual.remove(SOCKET)  # the reconciler deregistered it
    assert rig.record.last_error == "deregistered after 2 failed probes"
    rig.plugin.error = refused()
    await rig.monitor.probe_all()
    assert rig.record.state is PluginState.STALE
    assert rig.record.last_error.startswith("deregistered after 2 failed probes: socket /r/p.sock")
    assert rig.kicks.kicks == 2
