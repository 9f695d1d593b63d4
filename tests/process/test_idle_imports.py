"""An idle `nodeagent run` with no plugins loads no gRPC stack.

grpclib (with h2, hpack, multidict), asyncio and the plugin-only generated protobuf modules are
imported on the first plugin registration or first use (`nodeagent.rpc` starts its asyncio loop
on the first call); protobuf itself only for a plugin's message (the in-tree system reporter,
on by default, builds and checkpoints its report without it, and a restart restores it without
it). That is what keeps the idle footprint down (docs/performance/index.md: idle RSS).

The agent runs as a real subprocess (standalone, READY=1 on a test notify socket, then SIGTERM);
a wrapper around the `nodeagent` entry point writes `sys.modules` at exit, so whatever start-up,
idling or shutdown imported is seen.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.plugins.versions import NATIVE_DRA_SERVICE

WRAPPER = """
import atexit, json, runpy, sys
dump = sys.argv.pop(1)
atexit.register(lambda: open(dump, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "nodeagent"
runpy.run_module("nodeagent", run_name="__main__")
"""

GRPC_STACK = ("grpclib", "h2", "hpack", "hyperframe", "multidict", "asyncio")
PLUGIN_PROTOS = (
    "nodeagent.protos.dra",
    "nodeagent.protos.nodeagent",
    "nodeagent.protos.pluginregistration",
    "nodeagent.protos.k8s.api.resource",
)


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="na-idle-", dir="/tmp") as d:
        yield Path(d)


def idle_modules(workdir: Path, *sets: str, dump_name: str = "modules.json") -> set[str]:
    """The modules an agent with no plugins had loaded from start to exit."""
    notify_path = workdir / f"notify-{dump_name}"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(60)
    dump = workdir / dump_name
    command = [sys.executable, "-c", WRAPPER, str(dump), "run"]
    command += ["--state-dir", str(workdir / "state"), "--ops-address", "127.0.0.1:0"]
    command += ["--registry-dir", str(workdir / "registry"), "--log-level", "warning"]
    for item in sets:
        command += ["--set", item]
    proc = subprocess.Popen(
        command,
        env={**os.environ, "NOTIFY_SOCKET": str(notify_path)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while True:
            fields = dict(
                line.split("=", 1)
                for line in notify.recv(65536).decode().split("\n")
                if "=" in line
            )
            if fields.get("READY") == "1":
                break
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.close()
    assert proc.returncode == 0, stderr
    return set(json.loads(dump.read_text()))


def loaded(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages))


def test_an_idle_agent_loads_no_grpc_stack(workdir: Path) -> None:
    modules = idle_modules(workdir)
    # The dump is the agent's: its plugin manager and bridge ran.
    assert {"nodeagent.plugins.manager", "nodeagent.rpc.bridge", "trio"} <= modules
    assert loaded(modules, GRPC_STACK) == []
    assert loaded(modules, PLUGIN_PROTOS) == []
    # The in-tree system reporter (on by default) ran, and needed no protobuf.
    assert "nodeagent.reporter.system" in modules
    assert loaded(modules, ("google", "nodeagent.protos")) == []


def test_a_restart_restoring_the_system_reporters_checkpoint_loads_no_protobuf(
    workdir: Path,
) -> None:
    idle_modules(workdir)
    checkpoints = list((workdir / "state").rglob("reporter_manager_checkpoint*"))
    assert checkpoints, "the first run wrote no reporter checkpoint"
    modules = idle_modules(workdir, dump_name="modules-restart.json")
    assert "nodeagent.reporter.store" in modules
    assert loaded(modules, (*GRPC_STACK, "google", "nodeagent.protos")) == []


def test_without_the_system_reporter_an_idle_agent_loads_no_protobuf(workdir: Path) -> None:
    modules = idle_modules(workdir, "reporter.system_reporter=false")
    assert "nodeagent.plugins.manager" in modules
    assert loaded(modules, (*GRPC_STACK, "google", "nodeagent.protos")) == []


def test_the_native_service_name_is_the_compiled_protos() -> None:
    # Spelt out in nodeagent.plugins.versions so that checking a registration loads no protobuf.
    from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2

    compiled = device_pb2.DESCRIPTOR.services_by_name["DevicePlugin"].full_name
    assert compiled == NATIVE_DRA_SERVICE
