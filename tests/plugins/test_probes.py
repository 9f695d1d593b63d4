"""Issue 9 item 2 over real unix sockets: the connection monitor uses its own (kubelet monitor)
timeouts, so slow answers do not deregister a healthy plugin, and a probe-based deregistration
is an ordinary one: the publisher keeps the plugin's slices for its disconnect grace."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import SimpleNamespace

import trio

from nodeagent.plugins import PluginManager
from nodeagent.plugins.versions import NATIVE_DRA_SERVICE
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.resources.publisher import Publisher
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.rpc import GrpcBridge
from nodeagent.sdk import Device, DevicePlugin
from tests.plugins.conftest import fast_settings
from tests.plugins.support import (
    WAIT,
    CrashingReporter,
    ScriptedRegistration,
    plugin_status,
    state_of,
    wait_until,
)
from tests.support.fake_resourceslices import FakeCluster


async def test_slow_probe_answers_within_the_monitor_timeout_keep_the_plugin(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    # Registration keeps the kubelet's 1 s GetInfo (scaled here to 0.3 s); probes get their own.
    settings = fast_settings(
        registry, get_info_timeout=0.3, probe_get_info_timeout=3.0, probe_interval=0.1
    )
    manager = PluginManager(settings, bridge)
    await nursery.start(manager.run)
    channel = manager.channel("ReporterPlugin")
    info = reg.PluginInfo(type="ReporterPlugin", name="slow", supported_versions=["v1alpha1"])
    service = ScriptedRegistration(info)
    async with bridge.serve([service, CrashingReporter(0)], os.path.join(registry, "slow.sock")):
        await wait_until(manager, lambda: "slow" in channel.value)
        answered = service.answered.value
        # Busy node: every answer now takes twice registration's timeout.
        service.get_info_delay = 0.6
        await service.wait_answered(answered + 4)
        status = plugin_status(manager, "slow")
        assert status is not None
        assert (status["state"], status["stream_state"]) == ("registered", "open")
        assert channel.value["slow"].registered
        assert len(service.statuses) == 1  # never deregistered and registered again


async def test_probe_deregistration_keeps_the_slices_for_the_disconnect_grace(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    manager = PluginManager(fast_settings(registry, probe_interval=0.1), bridge)
    await nursery.start(manager.run)
    channel = manager.channel("DRAPlugin")
    cluster = FakeCluster()
    grace = 1.0
    publisher = Publisher(
        node_name="node-a",
        inventories=channel,
        settings=ResourcesSettings(startup_grace=0.0, disconnect_grace=grace),
        client=cluster,
        slices=cluster.source,
    )
    await nursery.start(publisher.run)
    watcher = cluster.source

    async def wait_objects(predicate: Callable[[], bool]) -> None:
        with trio.fail_after(WAIT):
            while not predicate():
                await watcher.changed()
                watcher.update(SimpleNamespace())

    # A native SDK plugin whose GetInfo answers are scripted.
    path = os.path.join(registry, "gpu-reg.sock")
    plugin = DevicePlugin("gpu.example.com", path, "", [NATIVE_DRA_SERVICE], pool="node-a")
    service = ScriptedRegistration(plugin.registration.info)
    await plugin.publish([Device("gpu-0")])
    async with bridge.serve([service, *plugin.services()], path):
        await wait_objects(lambda: bool(cluster.objects))
        # The plugin stops answering probes; its socket stays, so only the monitor can tell.
        service.fail_get_info = True
        await wait_until(manager, lambda: not channel.value["gpu.example.com"].registered)
        assert state_of(manager, "gpu.example.com") == "failed"
        assert len(cluster.objects) == 1  # nothing deleted at deregistration
        # The grace runs from the publisher's own reading of the clock when it took the
        # deregistration in: the test wakes up after it (later still on a loaded machine), so a
        # reading of its own would shorten the grace seen.
        await publisher.wait_inventories()
        gone_at = publisher._tracker.drivers["gpu.example.com"].gone_since
        assert gone_at is not None
        await wait_objects(lambda: not cluster.objects)
        # The publisher's disconnect grace applied, as for any deregistration.
        assert trio.current_time() - gone_at >= grace - 1e-6  # (float rounding)
        assert [verb for verb, _ in cluster.writes()] == ["create", "delete"]
