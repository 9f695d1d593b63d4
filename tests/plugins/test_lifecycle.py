"""End to end over real unix sockets: SDK plugins registering with a real PluginManager."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import trio
from prometheus_client import REGISTRY

from nodeagent.plugins import PluginData, PluginManager
from nodeagent.resources.inventory import InventoryTracker
from nodeagent.rpc import GrpcBridge
from nodeagent.sdk import Device, DevicePlugin, Quantity, ReporterPlugin, ReportItem
from tests.plugins.support import (
    WAIT,
    plugin_status,
    report_of,
    resources_of,
    state_of,
    wait_until,
)


def _item(value: object) -> ReportItem:
    return ReportItem(
        group="node.katalyst.kubewharf.io",
        version="v1alpha1",
        kind="CustomNodeResource",
        field_type="Status",
        field_name="resources",
        value=value,
    )


def _instances(data: PluginData) -> list[object]:
    return list(resources_of(data).resources[0].namedResources.instances)


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_reporter_appears_registers_streams_updates_leaves_and_returns(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    channel = manager.channel("ReporterPlugin")
    registered_before = _metric(
        "nodeagent_plugin_registrations_total", type="ReporterPlugin", outcome="success"
    )
    async with ReporterPlugin.serve(name="cpu", registry_dir=registry, bridge=bridge) as plugin:
        await plugin.report([_item({"cpu": 1})])
        with trio.fail_after(WAIT):
            await plugin.wait_registered()
            version, data = await channel.wait_newer(0)
            while "cpu" not in data:
                version, data = await channel.wait_newer(version)
        first = data["cpu"]
        assert first.registered
        assert json.loads(report_of(first).content[0].field[0].value) == {"cpu": 1}
        status = plugin_status(manager, "cpu")
        assert status is not None
        assert status["state"] == "registered"
        assert status["type"] == "ReporterPlugin"
        assert status["socket"] == os.path.join(registry, "cpu.sock")
        assert status["endpoint"] == os.path.join(registry, "cpu.sock")
        assert status["versions"] == ["v1alpha1"]
        assert status["stream_state"] == "open"
        assert (
            _metric(
                "nodeagent_plugin_registrations_total", type="ReporterPlugin", outcome="success"
            )
            == registered_before + 1
        )

        await plugin.report([_item({"cpu": 2})])
        with trio.fail_after(WAIT):
            while json.loads(report_of(data["cpu"]).content[0].field[0].value) != {"cpu": 2}:
                version, data = await channel.wait_newer(version)
        status = plugin_status(manager, "cpu")
        assert status is not None
        assert status["messages_received"] == 2
        assert status["last_message"]["content"][0]["groupVersionKind"]["kind"] == (
            "CustomNodeResource"
        )
        json.dumps(manager.status())  # the ops endpoint serves it as JSON

    # Removed: deregistered, the last data kept and marked stale.
    assert "cpu.sock" not in os.listdir(registry)
    await wait_until(manager, lambda: state_of(manager, "cpu") == "deregistered")
    stale = channel.value["cpu"]
    assert not stale.registered
    assert json.loads(report_of(stale).content[0].field[0].value) == {"cpu": 2}

    # Re-appears: registers again and streams again.
    async with ReporterPlugin.serve(name="cpu", registry_dir=registry, bridge=bridge) as plugin:
        await plugin.report([_item({"cpu": 3})])
        with trio.fail_after(WAIT):
            await plugin.wait_registered()
        await wait_until(
            manager,
            lambda: (
                channel.value.get("cpu") is not None
                and channel.value["cpu"].registered
                and json.loads(report_of(channel.value["cpu"]).content[0].field[0].value)
                == {"cpu": 3}
            ),
        )
        assert state_of(manager, "cpu") == "registered"
    ready, reason = manager.readiness()
    assert ready, reason


async def test_dra_plugin_with_separate_endpoint_streams_devices(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    channel = manager.channel("DRAPlugin")
    async with DevicePlugin.serve(
        name="gpu.example.com",
        registry_dir=registry,
        bridge=bridge,
        separate_endpoint=True,
        api="seed",
    ) as plugin:
        await plugin.publish([Device("gpu-0", {"memory": Quantity("40Gi"), "index": 0})])
        with trio.fail_after(WAIT):
            await plugin.wait_registered()
        await wait_until(manager, lambda: "gpu.example.com" in channel.value)
        status = plugin_status(manager, "gpu.example.com")
        assert status is not None
        assert status["endpoint"] == os.path.join(registry, ".gpu.example.com-dra.sock")
        message = resources_of(channel.value["gpu.example.com"])
        instance = message.resources[0].namedResources.instances[0]
        assert instance.name == "gpu-0"
        assert instance.attributes[0].attributeValue.quantity.string == "40Gi"

        await plugin.publish([Device("gpu-0"), Device("gpu-1")])
        await wait_until(
            manager,
            lambda: (
                len(
                    resources_of(channel.value["gpu.example.com"])
                    .resources[0]
                    .namedResources.instances
                )
                == 2
            ),
        )
    await wait_until(manager, lambda: state_of(manager, "gpu.example.com") == "deregistered")


async def test_socket_deleted_while_streaming_deregisters_and_keeps_data(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    channel = manager.channel("ReporterPlugin")
    async with ReporterPlugin.serve(name="mem", registry_dir=registry, bridge=bridge) as plugin:
        await plugin.report([_item({"mem": 1})])
        with trio.fail_after(WAIT):
            await plugin.wait_registered()
        await wait_until(manager, lambda: "mem" in channel.value)
        os.unlink(plugin.socket_path)
        await wait_until(manager, lambda: state_of(manager, "mem") == "deregistered")
        status = plugin_status(manager, "mem")
        assert status is not None
        assert status["stream_state"] == "stopped"
        assert not channel.value["mem"].registered
        assert json.loads(report_of(channel.value["mem"]).content[0].field[0].value) == {"mem": 1}


async def test_registry_dir_is_created_private_and_dot_files_are_ignored(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    from tests.plugins.conftest import fast_settings

    root = os.path.join(registry, "sub", "registry")
    manager = PluginManager(fast_settings(root), bridge)
    await nursery.start(manager.run)
    assert stat.S_IMODE(os.stat(root).st_mode) & 0o007 == 0
    os.makedirs(os.path.join(root, ".hidden"))
    async with (
        ReporterPlugin.serve(name="x", registry_dir=os.path.join(root, ".hidden"), bridge=bridge),
        ReporterPlugin.serve(
            name="nested", registry_dir=os.path.join(root, "a", "b"), bridge=bridge
        ) as nested,
    ):
        with trio.fail_after(WAIT):
            await nested.wait_registered()
        assert [item["name"] for item in manager.status()] == ["nested"]


async def test_manager_restarted_by_a_supervisor_registers_everything_again(
    bridge: GrpcBridge, registry: str
) -> None:
    from tests.plugins.conftest import fast_settings

    manager = PluginManager(fast_settings(registry), bridge)
    channel = manager.channel("ReporterPlugin")
    gauge = _metric("nodeagent_plugins_registered", type="ReporterPlugin")
    async with ReporterPlugin.serve(name="steady", registry_dir=registry, bridge=bridge) as plugin:
        await plugin.report([_item({"n": 1})])
        for _run in range(2):
            async with trio.open_nursery() as nursery:
                await nursery.start(manager.run)
                with trio.fail_after(WAIT):
                    await plugin.wait_registration()
                await wait_until(
                    manager,
                    lambda: (
                        (plugin_status(manager, "steady") or {}).get("stream_state") == "open"
                        and "steady" in channel.value
                    ),
                )
                assert _metric("nodeagent_plugins_registered", type="ReporterPlugin") == gauge + 1
                nursery.cancel_scope.cancel()  # the manager crashes or is restarted


async def test_a_plugin_gone_while_the_manager_was_down_is_deregistered_after_its_restart(
    bridge: GrpcBridge, registry: str
) -> None:
    from tests.plugins.conftest import fast_settings

    manager = PluginManager(fast_settings(registry), bridge)
    channel = manager.channel("DRAPlugin")
    tracker = InventoryTracker("node-a")
    async with DevicePlugin.serve(name="gone", registry_dir=registry, bridge=bridge) as plugin:
        await plugin.publish([Device("dev-0")], pool="p")
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            await wait_until(manager, lambda: "gone" in channel.value)
            tracker.update(channel.value, 0.0)
            assert tracker.drivers["gone"].registered
            nursery.cancel_scope.cancel()  # the plugins component fails
    # The plugin went away while the manager was down; the supervisor restarts the manager.
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await wait_until(manager, lambda: state_of(manager, "gone") == "deregistered")
        assert not channel.value["gone"].registered
        # The resources side sees it go, so its slices follow the disconnect grace.
        assert tracker.update(channel.value, 1.0) == {"gone"}
        assert tracker.drivers["gone"].gone_since is not None
        nursery.cancel_scope.cancel()


async def test_a_deregistered_plugins_data_is_dropped_after_the_grace(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    from tests.plugins.conftest import fast_settings

    grace = 1.0
    manager = PluginManager(fast_settings(registry, deregistered_data_grace=grace), bridge)
    await nursery.start(manager.run)
    channel = manager.channel("ReporterPlugin")
    async with ReporterPlugin.serve(name="brief", registry_dir=registry, bridge=bridge) as plugin:
        await plugin.report([_item({"n": 1})])
        await wait_until(manager, lambda: "brief" in channel.value)
    await wait_until(manager, lambda: state_of(manager, "brief") == "deregistered")
    assert not channel.value["brief"].registered  # deregistered, its data kept
    # The grace runs from the handler's own reading of the clock when the plugin left: the
    # test wakes up after it (later still on a loaded machine), so a reading of its own would
    # shorten the grace seen.
    handler: Any = manager._handlers["ReporterPlugin"]
    left = handler._registrations.entries["brief"].gone_at
    assert left is not None
    await wait_until(manager, lambda: "brief" not in channel.value)
    assert trio.current_time() - left >= grace - 1e-6  # (float rounding)
    assert plugin_status(manager, "brief") is None
