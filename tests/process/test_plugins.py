"""A standalone agent with a real plugin process: /v1/plugins and `nodeagent status` show it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.process.conftest import AgentProcess, StartAgent, nodeagent_command

# A reporter plugin written with the SDK, in its own process.
PLUGIN = """
import sys, trio
from nodeagent.sdk import ReporterPlugin, ReportItem

async def main(registry_dir):
    async with ReporterPlugin.serve(name="cpu-reporter", registry_dir=registry_dir) as plugin:
        await plugin.report([ReportItem(group="node.katalyst.kubewharf.io", version="v1alpha1",
                                        kind="CustomNodeResource", field_type="Status",
                                        field_name="resources", value={"cpu": "4"})])
        await trio.sleep_forever()

trio.run(main, sys.argv[1])
"""


def wait_plugin(agent: AgentProcess, name: str, timeout: float = 30) -> dict[str, Any]:
    """Poll the real process's /v1/plugins until `name` is registered and has sent data."""
    deadline = time.monotonic() + timeout
    plugins: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        plugins = json.loads(agent.get("/v1/plugins")[1])
        for plugin in plugins:
            registered = plugin["name"] == name and plugin["state"] == "registered"
            if registered and plugin["messages_received"] > 0:
                return plugin
        time.sleep(0.2)
    raise AssertionError(f"{name} never registered with data; last: {plugins}")


def test_standalone_agent_serves_a_plugins_reports(start_agent: StartAgent, tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    agent = start_agent("--registry-dir", str(registry))
    agent.wait_ready()
    plugin_proc = subprocess.Popen(
        [sys.executable, "-c", PLUGIN, str(registry)], stderr=subprocess.PIPE, text=True
    )
    try:
        plugin = wait_plugin(agent, "cpu-reporter")
        assert plugin["type"] == "ReporterPlugin"
        assert plugin["socket"] == str(registry / "cpu-reporter.sock")
        assert "resources" in json.dumps(plugin["last_message"])

        out = subprocess.run(
            nodeagent_command("status", "--ops-address", agent.ops_address),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        row = next(line for line in out.stdout.splitlines() if line.startswith("cpu-reporter"))
        assert row.split()[1:3] == ["ReporterPlugin", "registered"]
        assert "plugins    yes    running  0         1 plugins registered" in out.stdout
    finally:
        plugin_proc.send_signal(signal.SIGTERM)
        plugin_proc.wait(10)
        assert plugin_proc.stderr is not None
        plugin_proc.stderr.close()
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=10) == 0


# A modern DRA driver as the upstream helper (kubelet 1.32+) registers one: registration socket
# in the registry, service socket in <root>/plugins/<driver>/dra.sock, versions v1.DRAPlugin /
# v1beta1.DRAPlugin; it publishes its own ResourceSlices, so the agent only registers it.
MODERN = """
import os, sys, trio
from nodeagent.rpc.bridge import open_grpc_bridge
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.sdk._server import RegistrationServicer

async def main(registry_dir, plugins_dir):
    endpoint = os.path.join(plugins_dir, "m.example.com", "dra.sock")
    os.makedirs(os.path.dirname(endpoint), exist_ok=True)
    info = reg.PluginInfo(type="DRAPlugin", name="m.example.com", endpoint=endpoint,
                          supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"])
    async with open_grpc_bridge() as bridge:
        async with bridge.serve([], endpoint), bridge.serve(
            [RegistrationServicer(info)], os.path.join(registry_dir, "m.example.com-reg.sock")
        ):
            await trio.sleep_forever()

trio.run(main, *sys.argv[1:])
"""


def test_a_modern_self_publishing_driver_is_shown_as_such(
    start_agent: StartAgent, tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    agent = start_agent("--registry-dir", str(registry))
    agent.wait_ready()
    plugin_proc = subprocess.Popen(
        [sys.executable, "-c", MODERN, str(registry), str(tmp_path / "plugins")],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        row: dict[str, Any] = {}
        while time.monotonic() < deadline:
            rows = json.loads(agent.get("/v1/plugins")[1])
            row = next((p for p in rows if p["name"] == "m.example.com"), {})
            if row.get("state") == "registered":
                break
            time.sleep(0.2)
        assert row.get("state") == "registered", row
        assert (row["type"], row["api"], row["stream_state"]) == (
            "DRAPlugin",
            "kubelet-v1",
            "self-publishing",
        )
        assert row["endpoint"] == str(tmp_path / "plugins" / "m.example.com" / "dra.sock")
        out = subprocess.run(
            nodeagent_command("status", "--ops-address", agent.ops_address),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        line = next(line for line in out.stdout.splitlines() if line.startswith("m.example.com"))
        assert line.split()[1:4] == ["DRAPlugin", "registered", "self-publishing"]
    finally:
        plugin_proc.send_signal(signal.SIGTERM)
        plugin_proc.wait(10)
        assert plugin_proc.stderr is not None
        plugin_proc.stderr.close()
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=10) == 0
