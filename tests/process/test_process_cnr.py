"""The agent process standalone with a reporter plugin (the SDK, in its own process): the merged
CustomNodeResource on /v1/cnr and in `nodeagent status`, nothing written."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.process.conftest import StartAgent, nodeagent_command
from tests.process.test_process_resourceslices import until

PLUGIN = """
import sys, trio
from nodeagent.sdk import ReporterPlugin
from nodeagent.sdk.reporter import ReportItem

GVK = ("node.katalyst.kubewharf.io", "v1alpha1", "CustomNodeResource")

async def main(registry_dir):
    async with ReporterPlugin.serve(name="zones", registry_dir=registry_dir) as plugin:
        await plugin.report([
            ReportItem(*GVK, "Status", "TopologyPolicy", "SingleNUMANodeContainerLevel"),
            ReportItem(*GVK, "Status", "Bogus", 1),
        ])
        await trio.sleep_forever()

trio.run(main, sys.argv[1])
"""


@pytest.fixture
def registry() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="na-pc-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plugin(registry: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", PLUGIN, registry], text=True)
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)


def test_standalone_serves_the_merged_cnr(
    start_agent: StartAgent, registry: str, plugin: subprocess.Popen[str]
) -> None:
    agent = start_agent("--node-name", "node-a", "--registry-dir", registry)
    agent.wait_ready()

    def merged() -> dict[str, Any] | None:
        doc: dict[str, Any] = json.loads(agent.get("/v1/cnr")[1])
        return doc if "zones" in doc["plugins"] else None

    doc = until(merged, "the plugin's report on /v1/cnr")
    assert doc["mode"] == "standalone" and "sync" not in doc
    cnr = doc["cnr"]
    assert cnr["kind"] == "CustomNodeResource" and cnr["metadata"]["name"] == "node-a"
    assert cnr["status"]["topologyPolicy"] == "SingleNUMANodeContainerLevel"
    # The in-tree system reporter (on by default) reports this machine's properties and zones.
    assert "system-reporter-plugin" in doc["plugins"] and cnr["spec"]["nodeResourceProperties"]
    assert doc["bad_fields"] == [
        {"plugin": "zones", "field": "Status/Bogus", "reason": "unknown field"}
    ]

    out = subprocess.run(
        nodeagent_command("status", "--ops-address", agent.ops_address),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "from 2 reporters, standalone" in out.stdout
    assert "status.topologyPolicy" in out.stdout
    assert "skipped Status/Bogus from zones: unknown field" in out.stdout
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
