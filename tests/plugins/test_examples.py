"""The example plugins, run as the README says, register with a real manager and stream."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from nodeagent.plugins import PluginManager
from nodeagent.protos.dra.v1alpha3 import api_pb2 as dra
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from tests.plugins.support import WAIT, state_of, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _sockets(directory: str) -> list[Path]:
    return [p for p in Path(directory).rglob("*") if p.is_socket()]


@pytest.mark.parametrize(
    ("script", "args", "plugin_type", "name"),
    [
        ("cpu_reporter.py", ["--interval", "0.1"], "ReporterPlugin", "cpu-reporter"),
        ("dra_device_plugin.py", ["--separate-endpoint"], "DRAPlugin", "accel.example.com"),
        ("dra_device_plugin.py", ["--seed"], "DRAPlugin", "accel.example.com"),
        ("dra_device_plugin.py", ["--consumable"], "DRAPlugin", "accel.example.com"),
    ],
)
async def test_example_plugin_runs_registers_and_stops_cleanly(
    manager: PluginManager,
    registry: str,
    script: str,
    args: list[str],
    plugin_type: str,
    name: str,
) -> None:
    process = await trio.lowlevel.open_process(
        [sys.executable, str(EXAMPLES / script), "--registry-dir", registry, *args],
        stderr=subprocess.DEVNULL,
    )
    try:
        channel = manager.channel(plugin_type)
        await wait_until(manager, lambda: name in channel.value, within=WAIT * 2)
        assert state_of(manager, name) == "registered"
        json.dumps(manager.status())
        if plugin_type == "ReporterPlugin":
            version = channel.version
            with trio.fail_after(WAIT):  # it refreshes every 0.1 s
                await channel.wait_newer(version)
        elif "--seed" in args:
            message = channel.value[name].message
            assert isinstance(message, dra.NodeListAndWatchResourcesResponse)
            assert len(message.resources[0].namedResources.instances) == 4
        else:
            message = channel.value[name].message
            assert isinstance(message, device_pb2.Inventory)
            (pool,) = message.pools
            assert [d.name for d in pool.devices] == [f"accel-{i}" for i in range(4)]
            assert pool.devices[0].capacity["memory"].value == "16Gi"
            if "--consumable" in args:
                assert pool.devices[0].allow_multiple_allocations
                policy = pool.devices[0].capacity["memory"].request_policy
                assert (policy.default, policy.valid_range.step) == ("1Gi", "1Gi")
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(WAIT):
            assert await process.wait() == 0
        assert _sockets(registry) == []
        await wait_until(manager, lambda: state_of(manager, name) == "deregistered")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
