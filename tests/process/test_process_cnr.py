"""The agent process standalone with a reporter plugin (the SDK, in its own process): the merged
CustomNodeResource on /v1/cnr and in `nodeagent status`, nothing written."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.process.conftest import StartAgent, nodeagent_command
from tests.support.wait import until

PLUGIN = """
import sys, trio
from nodeagent.sdk import ReporterPlugin
from nodeagent.sdk.reports import ReportItem

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
        # The plugin is listed as soon as it registers; its fields once its first report is in.
        doc: dict[str, Any] = json.loads(agent.get("/v1/cnr")[1])
        status = (doc.get("cnr") or {}).get("status") or {}
        return doc if "zones" in doc["plugins"] and "topologyPolicy" in status else None

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


# Katalyst's own reporter checkpoint (reference: katalyst.md 2.3): its Go checksum cannot be
# verified here, so the agent must set it aside and start fresh, not crash or overwrite it.
KATALYST_CHECKPOINT = (
    '{"Data":{"kubelet-reporter-plugin":{"content":[{"groupVersionKind":{"group":'
    '"node.katalyst.kubewharf.io","version":"v1alpha1","kind":"CustomNodeResource"},'
    '"field":[{"fieldType":1,"fieldName":"TopologyZone","value":"W10="}]}]}},'
    '"Checksum":2166136261}'
)


def test_a_corrupt_reporter_checkpoint_is_moved_aside_and_the_agent_starts(
    start_agent: StartAgent, tmp_path: Path, registry: str
) -> None:
    checkpoints = tmp_path / "state-0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "reporter_manager_checkpoint").write_text(KATALYST_CHECKPOINT)
    agent = start_agent("--node-name", "node-a", "--registry-dir", registry)
    assert agent.state_dir == tmp_path / "state-0"
    agent.wait_ready()

    def counted() -> str | None:
        metrics = agent.get("/metrics")[1]
        line = 'nodeagent_checkpoint_corrupt_total{name="reporter_manager_checkpoint"} 1.0'
        return metrics if line in metrics else None

    until(counted, "the corrupt checkpoint counted")
    aside = [p.name for p in checkpoints.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].startswith("reporter_manager_checkpoint.corrupt-")
    assert (checkpoints / aside[0]).read_text() == KATALYST_CHECKPOINT  # kept for inspection
    doc = json.loads(agent.get("/v1/cnr")[1])
    assert "kubelet-reporter-plugin" not in doc["plugins"]  # fresh start: nothing restored
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
