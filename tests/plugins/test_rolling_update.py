"""Issue 9 item 5 over real unix sockets: two live plugins with the same name (a rolling update).
The newest registration serves; when it goes, the older one, still live, is served again and what
it sends arrives."""

from __future__ import annotations

import json
import os

import trio

from nodeagent.plugins import PluginManager
from nodeagent.rpc import GrpcBridge
from nodeagent.sdk import Device, DevicePlugin, ReporterPlugin, ReportItem
from tests.plugins.support import WAIT, inventory_of, plugin_status, report_of, wait_until


def _item(value: str) -> ReportItem:
    return ReportItem("g", "v1alpha1", "K", "Status", "who", value)


def _stream_state(manager: PluginManager, socket: str) -> str:
    return str({s["socket"]: s for s in manager.status()}[socket]["stream_state"])


async def test_reporter_older_registration_is_served_again_when_the_newer_goes(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    channel = manager.channel("ReporterPlugin")

    def who() -> str | None:
        data = channel.value.get("roll")
        if data is None or not data.registered:
            return None
        return str(json.loads(report_of(data).content[0].field[0].value))

    async with ReporterPlugin.serve(
        name="roll", registry_dir=os.path.join(registry, "old"), bridge=bridge
    ) as old:
        await old.report([_item("old-1")])
        with trio.fail_after(WAIT):
            await old.wait_registered()
        await wait_until(manager, lambda: who() == "old-1")
        async with ReporterPlugin.serve(
            name="roll", registry_dir=os.path.join(registry, "new"), bridge=bridge
        ) as new:
            await new.report([_item("new-1")])
            await wait_until(manager, lambda: who() == "new-1")
            assert _stream_state(manager, old.socket_path) == f"replaced by {new.socket_path}"
            await old.report([_item("old-2")])  # not served while the newer one is
        # The newer one stops: the older one's stream resumes, with what it has now.
        await wait_until(manager, lambda: who() == "old-2")
        await wait_until(manager, lambda: _stream_state(manager, old.socket_path) == "open")
        await old.report([_item("old-3")])
        await wait_until(manager, lambda: who() == "old-3")
        status = plugin_status(manager, "roll")
        assert status is not None and status["state"] == "registered"
        assert [s["socket"] for s in manager.status()] == [old.socket_path]
    await wait_until(manager, lambda: not channel.value["roll"].registered)


async def test_native_dra_older_registration_is_served_again_when_the_newer_goes(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    channel = manager.channel("DRAPlugin")

    def devices() -> list[str] | None:
        data = channel.value.get("drv.example.com")
        if data is None or not data.registered:
            return None
        return [d.name for p in inventory_of(data).pools for d in p.devices]

    async with DevicePlugin.serve(
        name="drv.example.com", registry_dir=os.path.join(registry, "a"), bridge=bridge, pool="p"
    ) as old:
        await old.publish([Device("old-0")])
        await wait_until(manager, lambda: devices() == ["old-0"])
        async with DevicePlugin.serve(
            name="drv.example.com",
            registry_dir=os.path.join(registry, "b"),
            bridge=bridge,
            pool="p",
        ) as new:
            await new.publish([Device("new-0")])
            await wait_until(manager, lambda: devices() == ["new-0"])
            await old.publish([Device("old-1")])
        await wait_until(manager, lambda: devices() == ["old-1"])
        await old.publish([Device("old-2")])
        await wait_until(manager, lambda: devices() == ["old-2"])
