"""The operation executor: the register steps and their outcomes, one operation per socket,
backoff, unregister. Plugins answer through a fake bridge; their sockets are real (the path and
peer checks dial them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from nodeagent.plugins.executor import OperationExecutor
from nodeagent.plugins.state import Caches, DesiredPlugin, PluginState
from nodeagent.plugins.watcher import RegistryWatcher
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.rpc.bridge import RpcError
from tests.support.fake_plugins import (
    PLUGIN_TYPE,
    FakeBridge,
    FakeHandler,
    FakeRegistration,
    Kicks,
    identity,
    listen,
    settings,
)


class Rig:
    def __init__(self, registry: Path, *, uid_ok: bool = True, **overrides: Any) -> None:
        self.caches, self.kicks = Caches(), Kicks()
        self.bridge, self.handler = FakeBridge(), FakeHandler()
        self.watcher = RegistryWatcher(
            str(registry), 1.0, self.caches, kick=self.kicks.kick, changed=self.kicks.changed
        )
        self.watcher.prepare_root()
        self.executor = OperationExecutor(
            settings(registry, **overrides),
            self.bridge.as_bridge(),
            {PLUGIN_TYPE: self.handler},
            lambda uid: uid_ok,
            self.caches,
            self.watcher,
            kick=self.kicks.kick,
        )
        self.socket = str(registry / "p.sock")
        self.plugin = FakeRegistration(
            reg.PluginInfo(type=PLUGIN_TYPE, name="p", supported_versions=["v1"])
        )
        self.bridge.plugins[self.socket] = self.plugin
        self.wanted = self.caches.desired.add_or_update(self.socket, identity(1))

    async def register(self, wanted: DesiredPlugin | None = None) -> None:
        async with trio.open_nursery() as nursery:
            self.executor.start_register(nursery, wanted or self.wanted)

    def state(self) -> PluginState:
        return self.caches.records[self.socket].state

    def last_notified(self) -> reg.RegistrationStatus:
        return self.plugin.notified[-1]


@pytest.fixture
def rig(registry: Path) -> Iterator[Rig]:
    made = Rig(registry)
    with listen(Path(made.socket)):
        yield made


async def test_a_plugin_is_registered_and_told_so(rig: Rig) -> None:
    await rig.register()
    assert rig.state() is PluginState.REGISTERED
    actual = rig.caches.actual.get(rig.socket)
    assert actual is not None and actual.generation == rig.wanted.generation
    assert [p.name for p in rig.handler.registered] == ["p"]
    assert rig.last_notified().plugin_registered
    assert not rig.executor.busy(rig.socket) and rig.caches.retry_at(rig.wanted) is None
    assert rig.kicks.kicks == 1


async def test_an_unknown_type_fails_is_told_and_backs_off(rig: Rig) -> None:
    rig.plugin.info.type = "Other"
    await rig.register()
    assert rig.state() is PluginState.FAILED
    assert "no handler registered for plugin type: 'Other'" in rig.last_notified().error
    retry = rig.caches.retry_at(rig.wanted)
    assert retry is not None and retry == pytest.approx(trio.current_time() + 0.5, abs=0.1)


async def test_backoff_doubles_with_each_failure_and_success_clears_it(
    rig: Rig, autojump_clock: trio.testing.MockClock
) -> None:
    rig.plugin.error = RpcError("UNAVAILABLE", "down")
    await rig.register()
    first = rig.caches.retry_at(rig.wanted)
    await rig.register()
    second = rig.caches.retry_at(rig.wanted)
    assert first is not None and second is not None
    assert second - trio.current_time() == pytest.approx(1.0)
    assert rig.caches.records[rig.socket].last_error.startswith("GetInfo failed")
    rig.plugin.error = None
    await rig.register()
    assert rig.state() is PluginState.REGISTERED and rig.caches.retry_at(rig.wanted) is None


async def test_a_validation_failure_is_told_and_not_in_the_actual_state(rig: Rig) -> None:
    rig.handler.validate_error = "bad name"
    await rig.register()
    assert rig.state() is PluginState.FAILED
    assert rig.last_notified().error == "plugin validation failed with err: bad name"
    assert rig.caches.actual.get(rig.socket) is None


async def test_a_failed_register_step_leaves_the_actual_state(rig: Rig) -> None:
    rig.handler.register_error = RuntimeError("boom")
    await rig.register()
    assert rig.state() is PluginState.FAILED
    assert rig.caches.actual.get(rig.socket) is None
    assert "RegisterPlugin error" in rig.last_notified().error


async def test_a_disallowed_peer_is_rejected_for_this_generation_without_backoff(
    registry: Path,
) -> None:
    rig = Rig(registry, uid_ok=False)
    with listen(Path(rig.socket)):
        await rig.register()
    record = rig.caches.records[rig.socket]
    assert record.state is PluginState.REJECTED
    assert record.rejected_generation == rig.wanted.generation
    assert "not an allowed plugin UID" in rig.last_notified().error
    assert rig.caches.retry_at(rig.wanted) is None
    assert rig.plugin.get_info_calls == 0


async def test_a_missing_socket_fails_and_is_retried(registry: Path) -> None:
    rig = Rig(registry)  # no socket file at rig.socket
    await rig.register()
    assert rig.state() is PluginState.FAILED
    assert rig.caches.retry_at(rig.wanted) is not None


async def test_an_endpoint_outside_the_allowed_dirs_is_rejected(rig: Rig) -> None:
    rig.plugin.info.endpoint = "/etc/passwd"
    await rig.register()
    assert rig.state() is PluginState.REJECTED
    assert not rig.last_notified().plugin_registered


async def test_an_operation_keeps_its_socket_busy_until_it_ends(rig: Rig) -> None:
    rig.handler.register_gate = trio.Event()
    async with trio.open_nursery() as nursery:
        rig.executor.start_register(nursery, rig.wanted)
        await trio.testing.wait_all_tasks_blocked()
        assert rig.executor.busy(rig.socket)
        # In the actual state before Register returns: a delete meanwhile deregisters it.
        assert rig.caches.actual.get(rig.socket) is not None
        assert rig.state() is PluginState.REGISTERING
        rig.handler.register_gate.set()
    assert not rig.executor.busy(rig.socket)


async def test_unregister_removes_the_plugin_and_the_handler_is_told(rig: Rig) -> None:
    await rig.register()
    actual = rig.caches.actual.get(rig.socket)
    assert actual is not None
    rig.handler.deregister_error = RuntimeError("handler bug")  # logged, not fatal
    async with trio.open_nursery() as nursery:
        rig.executor.start_unregister(nursery, actual)
    assert rig.caches.actual.get(rig.socket) is None
    assert [p.name for p in rig.handler.deregistered] == ["p"]
    assert rig.state() is PluginState.REGISTERING
    assert not rig.executor.busy(rig.socket)


async def test_a_new_generation_starts_a_fresh_record_keeping_the_endpoint(rig: Rig) -> None:
    rig.plugin.error = RpcError("UNAVAILABLE", "down")
    await rig.register()
    rig.caches.records[rig.socket].endpoint_real = "/somewhere/dra.sock"
    renewed = rig.caches.desired.force_new_generation(rig.socket, identity(2))
    assert rig.caches.retry_at(rig.wanted) is not None
    assert rig.caches.retry_at(renewed) is None  # the backoff was the old generation's
    await rig.register(renewed)
    record = rig.caches.records[rig.socket]
    assert record.generation == renewed.generation
    assert record.endpoint_real == "/somewhere/dra.sock"


async def test_reset_forgets_operations_and_backoff(rig: Rig) -> None:
    rig.plugin.error = RpcError("UNAVAILABLE", "down")
    await rig.register()
    rig.executor.reset()
    rig.caches.clear()  # as the manager's reset does: the backoff goes with the records
    assert not rig.executor.busy(rig.socket)
    assert rig.caches.retry_at(rig.wanted) is None
