"""Issue 9 item 1 over real unix sockets: plugins laid out as upstream drivers are (registration
socket in the registry, service socket in a directory of its own), service sockets inside the
registry never taken for plugins, and modern self-publishing drivers recognised."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
import trio
from prometheus_client import REGISTRY

from nodeagent.plugins import PluginManager
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.resources.inventory import InventoryTracker
from nodeagent.rpc import GrpcBridge
from nodeagent.sdk import Device, DevicePlugin
from tests.plugins.conftest import fast_settings
from tests.plugins.support import (
    WAIT,
    ScriptedRegistration,
    plugin_status,
    resources_of,
    state_of,
    wait_until,
)


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    """A kubelet-like root: <root>/plugins_registry and <root>/plugins (short: socket paths)."""
    path = tempfile.mkdtemp(prefix="na-kl-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _sockets(manager: PluginManager) -> list[str]:
    return [item["socket"] for item in manager.status()]


def _errors(kind: str) -> float:
    return REGISTRY.get_sample_value("nodeagent_plugin_errors_total", {"kind": kind}) or 0.0


async def test_a_driver_with_the_upstream_layout_registers_and_streams(
    bridge: GrpcBridge, kubelet_root: str, nursery: trio.Nursery
) -> None:
    registry = os.path.join(kubelet_root, "plugins_registry")
    endpoint = os.path.join(kubelet_root, "plugins", "gpu.example.com", "dra.sock")
    manager = PluginManager(fast_settings(registry), bridge)  # default endpoint_dirs
    await nursery.start(manager.run)
    channel = manager.channel("DRAPlugin")
    async with DevicePlugin.serve(
        name="gpu.example.com", registry_dir=registry, api="seed", endpoint=endpoint, bridge=bridge
    ) as plugin:
        assert plugin.socket_path == os.path.join(registry, "gpu.example.com-reg.sock")
        await plugin.publish([Device("gpu.0")])
        status = await plugin.wait_registration()
        assert status.plugin_registered, status.error
        await wait_until(manager, lambda: "gpu.example.com" in channel.value)
        row = plugin_status(manager, "gpu.example.com")
        assert row is not None
        assert (row["state"], row["api"], row["stream_state"]) == ("registered", "seed", "open")
        assert row["endpoint"] == endpoint
        message = resources_of(channel.value["gpu.example.com"])
        assert message.resources[0].namedResources.instances[0].name == "gpu.0"
    await wait_until(manager, lambda: state_of(manager, "gpu.example.com") == "deregistered")


async def test_a_service_socket_inside_the_registry_is_never_taken_for_a_plugin(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    # The service socket appears first: the scan sees it before the registration socket.
    endpoint = os.path.join(registry, "drv", "dra.sock")
    os.makedirs(os.path.dirname(endpoint))
    async with DevicePlugin.serve(
        name="drv", registry_dir=os.path.join(registry, "sub"), endpoint=endpoint, bridge=bridge
    ) as plugin:
        await plugin.publish([Device("dev-0")], pool="p")
        with trio.fail_after(WAIT):
            await plugin.wait_registered()
        await wait_until(manager, lambda: "drv" in manager.channel("DRAPlugin").value)
        # Whatever the scan made of the service socket before the registration named it as an
        # endpoint is gone, and later scans leave it alone.
        await wait_until(manager, lambda: _sockets(manager) == [plugin.socket_path])
        get_info_errors = _errors("get_info")
        manager._watcher.scan()
        assert manager._caches.desired.get(endpoint) is None
        assert endpoint not in manager._watcher.seen
        assert _sockets(manager) == [plugin.socket_path]
        assert state_of(manager, "drv") == "registered"
        assert _errors("get_info") == get_info_errors


async def test_a_service_socket_seen_before_its_plugin_registers_is_dropped_from_the_scan(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    endpoint = os.path.join(registry, "late", "dra.sock")
    os.makedirs(os.path.dirname(endpoint))
    info = reg.PluginInfo(
        type="DRAPlugin", name="late", endpoint=endpoint, supported_versions=["1.0.0"]
    )
    service = ScriptedRegistration(info)
    async with bridge.serve([], endpoint):
        # Alone, the service socket looks like a (failing) plugin to the scan.
        await wait_until(manager, lambda: endpoint in _sockets(manager))
        async with bridge.serve([service], os.path.join(registry, "late-reg.sock")):
            assert (await service.wait_notified()).plugin_registered
            await wait_until(manager, lambda: endpoint not in _sockets(manager))
            assert state_of(manager, "late") == "registered"


async def test_a_modern_self_publishing_driver_is_registered_and_left_alone(
    bridge: GrpcBridge, kubelet_root: str, nursery: trio.Nursery
) -> None:
    registry = os.path.join(kubelet_root, "plugins_registry")
    endpoint = os.path.join(kubelet_root, "plugins", "modern.example.com", "dra.sock")
    os.makedirs(os.path.dirname(endpoint))
    manager = PluginManager(fast_settings(registry), bridge)
    await nursery.start(manager.run)
    channel = manager.channel("DRAPlugin")
    # What the upstream helper (kubelet 1.32+) answers; its endpoint serves NodePrepareResources,
    # which the agent never calls (an empty server: any stream would be UNIMPLEMENTED).
    info = reg.PluginInfo(
        type="DRAPlugin",
        name="modern.example.com",
        endpoint=endpoint,
        supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    )
    service = ScriptedRegistration(info)
    service_socket = os.path.join(registry, "modern.example.com-reg.sock")
    async with bridge.serve([], endpoint), bridge.serve([service], service_socket):
        first = await service.wait_notified()
        assert first.plugin_registered and first.error == ""
        row = plugin_status(manager, "modern.example.com")
        assert row is not None
        assert (row["state"], row["api"], row["stream_state"]) == (
            "registered",
            "kubelet-v1",
            "self-publishing",
        )
        assert row["stream_restarts"] == 0 and row["stream_error"] == ""
        assert manager.readiness() == (
            True,
            "1 plugins registered (1 self-publishing), 0 not registered",
        )
        # Probed like any plugin, and nothing else: no stream, no error loop, nothing published.
        await service.wait_answered(4)
        assert len(service.statuses) == 1
        assert state_of(manager, "modern.example.com") == "registered"
        assert "modern.example.com" not in channel.value
        tracker = InventoryTracker("node-a")
        assert tracker.update(channel.value, 0.0) == set()
        assert "modern.example.com" not in tracker.drivers
        os.unlink(service_socket)
    await wait_until(manager, lambda: state_of(manager, "modern.example.com") == "deregistered")
    assert "modern.example.com" not in channel.value


async def test_a_driver_moving_to_self_publishing_stops_being_published_by_the_agent(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    # A rolling update from a native-API plugin to a modern driver of the same name: the newest
    # registration serves, so the agent stops publishing the old inventory (the resources side
    # sees the driver go and applies its disconnect grace to the slices the agent wrote).
    channel = manager.channel("DRAPlugin")
    async with DevicePlugin.serve(
        name="moving", registry_dir=os.path.join(registry, "old"), bridge=bridge
    ) as old:
        await old.publish([Device("dev-0")], pool="p")
        await wait_until(manager, lambda: "moving" in channel.value)
        info = reg.PluginInfo(
            type="DRAPlugin",
            name="moving",
            endpoint=os.path.join(registry, "new", "dra.sock"),
            supported_versions=["v1.DRAPlugin"],
        )
        service = ScriptedRegistration(info)
        os.makedirs(os.path.join(registry, "new"))
        async with (
            bridge.serve([], info.endpoint),
            bridge.serve([service], os.path.join(registry, "new", "moving-reg.sock")),
        ):
            assert (await service.wait_notified()).plugin_registered
            await wait_until(manager, lambda: "moving" not in channel.value)
            by_socket = {item["socket"]: item for item in manager.status()}
            assert by_socket[old.socket_path]["stream_state"] == (
                f"replaced by {os.path.join(registry, 'new', 'moving-reg.sock')}"
            )
        # The modern driver leaves while the old plugin is still there: the old one is served.
        await wait_until(
            manager, lambda: "moving" in channel.value and channel.value["moving"].registered
        )


async def test_an_endpoint_created_after_the_registration_socket_is_retried(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    endpoint = os.path.join(registry, ".later", "dra.sock")
    info = reg.PluginInfo(
        type="DRAPlugin", name="later", endpoint=endpoint, supported_versions=["1.0.0"]
    )
    service = ScriptedRegistration(info)
    async with bridge.serve([service], os.path.join(registry, "later-reg.sock")):
        first = await service.wait_notified(1)
        assert not first.plugin_registered
        assert "No such file" in first.error
        second = await service.wait_notified(2)  # retried, not rejected for good
        assert "No such file" in second.error
        os.makedirs(os.path.dirname(endpoint))
        async with bridge.serve([], endpoint):
            await wait_until(manager, lambda: state_of(manager, "later") == "registered")


async def test_naming_a_registered_plugins_socket_as_endpoint_does_not_deregister_it(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    async with DevicePlugin.serve(name="first", registry_dir=registry, bridge=bridge) as first:
        with trio.fail_after(WAIT):
            await first.wait_registered()
        info = reg.PluginInfo(
            type="DRAPlugin",
            name="second",
            endpoint=first.socket_path,
            supported_versions=["1.0.0"],
        )
        service = ScriptedRegistration(info)
        async with bridge.serve([service], os.path.join(registry, "second-reg.sock")):
            assert (await service.wait_notified()).plugin_registered
            manager._watcher.scan()
            assert manager._caches.desired.get(first.socket_path) is not None
            assert state_of(manager, "first") == "registered"
