"""Wire compatibility: plugins written with grpcio against protos compiled from protos/ register
with the agent and stream unchanged (grpcio runs in a subprocess: it does not run on Trio)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from nodeagent.plugins import PluginManager
from nodeagent.protos.dra.v1alpha3 import api_pb2 as dra
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from tests.plugins.support import WAIT, state_of, wait_until

REPO = Path(__file__).resolve().parents[2]
PLUGIN = Path(__file__).with_name("grpcio_plugin.py")


@pytest.fixture(scope="module")
def grpcio_modules(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("grpcio-gen")
    sources = sorted(
        p.relative_to(REPO / "protos").as_posix() for p in (REPO / "protos").rglob("*.proto")
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iprotos",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *sources,
        ],
        check=True,
        cwd=REPO,
    )
    # The generated `nodeagent` package must shadow the installed one in the plugin process: a
    # directory without __init__.py is only a namespace portion, which a regular package beats.
    for package in ("nodeagent", "nodeagent/device", "nodeagent/device/v1alpha1"):
        (out / package / "__init__.py").touch()
    return str(out)


class _Lines:
    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> str:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            if not chunk:
                raise EOFError("plugin exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()


async def _run_plugin(
    grpcio_modules: str, registry: str, kind: str, name: str, manager: PluginManager
) -> None:
    socket = os.path.join(registry, f"{name}.sock")
    plugin_type = "ReporterPlugin" if kind == "reporter" else "DRAPlugin"
    channel = manager.channel(plugin_type)
    process = await trio.lowlevel.open_process(
        [sys.executable, str(PLUGIN), grpcio_modules, kind, socket, name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    lines = _Lines(process.stdout)
    try:
        with trio.fail_after(WAIT * 2):
            assert await lines.next() == "serving"
            await process.stdin.send_all(b"value 1\n")
            assert await lines.next() == "notify True "
        await wait_until(manager, lambda: name in channel.value)

        def current() -> object:
            message = channel.value[name].message
            if kind == "reporter":
                assert isinstance(message, rep.GetReportContentResponse)
                return json.loads(message.content[0].field[0].value)
            if kind == "native":
                assert isinstance(message, device_pb2.Inventory)
                (pool,) = message.pools
                assert pool.name == "grpcio-pool"
                assert all(d.capacity["mem"].value == "1Gi" for d in pool.devices)
                return len(pool.devices)
            assert isinstance(message, dra.NodeListAndWatchResourcesResponse)
            return len(message.resources[0].namedResources.instances)

        assert current() == 1
        await process.stdin.send_all(b"value 3\n")
        await wait_until(manager, lambda: current() == 3)
        assert state_of(manager, name) == "registered"
        await process.stdin.aclose()
        with trio.fail_after(WAIT):
            assert await process.wait() == 0
        await wait_until(manager, lambda: state_of(manager, name) == "deregistered")
        assert not channel.value[name].registered
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_grpcio_reporter_plugin_registers_and_streams(
    grpcio_modules: str, registry: str, manager: PluginManager
) -> None:
    await _run_plugin(grpcio_modules, registry, "reporter", "grpcio-reporter", manager)


async def test_grpcio_dra_plugin_registers_and_streams(
    grpcio_modules: str, registry: str, manager: PluginManager
) -> None:
    await _run_plugin(grpcio_modules, registry, "dra", "grpcio-dra", manager)


async def test_grpcio_native_dra_plugin_registers_and_streams(
    grpcio_modules: str, registry: str, manager: PluginManager
) -> None:
    await _run_plugin(grpcio_modules, registry, "native", "grpcio-native", manager)
    status = next(s for s in manager.status() if s["name"] == "grpcio-native")
    assert status["api"] == "native"
    assert status["last_message"]["pools"][0]["name"] == "grpcio-pool"
