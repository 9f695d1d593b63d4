"""The example plugins, run as the README says, register with a real manager and stream."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from nodeagent.plugins import PluginManager
from nodeagent.protos.dra.v1alpha3 import api_pb2 as dra
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.rpc import GrpcBridge
from nodeagent.sdk import Claim, Device, DevicePlugin, KubeletPlugin, PreparedDevice
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


async def test_example_dra_driver_registers_with_the_agent_and_the_kubelet(
    manager: PluginManager, registry: str
) -> None:
    """examples/dra_gpu_driver.py: its pool (partitions on counter sets, a tainted GPU) reaches
    the agent, its kubelet registration and endpoint are where a kubelet looks, and SIGTERM
    removes every socket. (Prepared on a real kubelet: tests/realnode.)"""
    # Beside the registry, not in it: the agent watches its registry's subdirectories too.
    kubelet_dir = Path(registry + "-kubelet")
    process = await trio.lowlevel.open_process(
        [
            sys.executable,
            str(EXAMPLES / "dra_gpu_driver.py"),
            "--registry-dir",
            registry,
            "--kubelet-dir",
            str(kubelet_dir),
            "--cdi-dir",
            str(kubelet_dir / "cdi"),
            "--gpus",
            "2",
            "--tainted",
            "1",
        ],
        stderr=subprocess.DEVNULL,
    )
    name = "gpu.example.com"
    try:
        channel = manager.channel("DRAPlugin")
        await wait_until(manager, lambda: name in channel.value, within=WAIT * 2)
        message = channel.value[name].message
        assert isinstance(message, device_pb2.Inventory)
        (pool,) = message.pools
        assert [c.name for c in pool.shared_counters] == ["gpu-0-counters", "gpu-1-counters"]
        tainted = {d.name for d in pool.devices if d.taints}
        assert [d.name for d in pool.devices] == [
            "gpu-0",
            "gpu-0-a",
            "gpu-0-b",
            "gpu-1",
            "gpu-1-a",
            "gpu-1-b",
        ]
        assert tainted == {"gpu-1", "gpu-1-a", "gpu-1-b"}
        assert (kubelet_dir / "plugins_registry" / f"{name}-reg.sock").is_socket()
        assert (kubelet_dir / "plugins" / name / "dra.sock").is_socket()
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(WAIT):
            assert await process.wait() == 0
        assert _sockets(registry) == []
        assert _sockets(str(kubelet_dir)) == []
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        shutil.rmtree(kubelet_dir, ignore_errors=True)


async def test_a_driver_in_the_registry_the_agent_and_the_kubelet_share_registers_once(
    manager: PluginManager, registry: str, bridge: GrpcBridge
) -> None:
    """The agent set to watch the kubelet's registry (the chart's kubeletPlugins.watchRegistry):
    the SDK serves one registration for both. The kubelet picks v1.DRAPlugin (the first of its
    services listed), the agent the native service, and both reach one endpoint."""

    async def prepare(claim: Claim) -> list[PreparedDevice]:
        raise AssertionError("no claim here")

    plugins = Path(registry + "-plugins")  # beside the registry (the agent watches inside it)
    kubelet = KubeletPlugin(
        prepare=prepare,
        registry_dir=registry,
        plugin_dir=str(plugins / "gpu.example.com"),
        cdi_dir=str(plugins / "cdi"),
    )
    try:
        async with DevicePlugin.serve(
            name="gpu.example.com", registry_dir=registry, kubelet=kubelet, bridge=bridge
        ) as plugin:
            await plugin.publish([Device("gpu-0")])
            assert [p.name for p in _sockets(registry)] == ["gpu.example.com-reg.sock"]
            channel = manager.channel("DRAPlugin")
            await wait_until(manager, lambda: "gpu.example.com" in channel.value)
            message = channel.value["gpu.example.com"].message
            assert isinstance(message, device_pb2.Inventory)
            assert [d.name for d in message.pools[0].devices] == ["gpu-0"]
            with trio.fail_after(WAIT):
                await plugin.wait_registered()  # the agent's word, on the shared registration
            async with bridge.channel(plugin.socket_path) as reg_channel:
                info = await bridge.unary(
                    reg_channel.stub(reg_grpc.RegistrationStub).GetInfo,
                    reg.InfoRequest(),
                    timeout=WAIT,
                )
            assert list(info.supported_versions) == [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth",
                "nodeagent.device.v1alpha1.DevicePlugin",
            ]
            assert info.endpoint == str(plugins / "gpu.example.com" / "dra.sock")
        assert _sockets(registry) == [] and _sockets(str(plugins)) == []
    finally:
        shutil.rmtree(plugins, ignore_errors=True)
