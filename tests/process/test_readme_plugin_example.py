"""The README's plugin example ("A first plugin"), copied from the README into its own process,
against a real standalone `nodeagent run`: it registers, reports, and SIGTERM stops it cleanly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.process.conftest import StartAgent
from tests.process.test_plugins import wait_plugin
from tests.support.readme import python_block


def test_the_readme_plugin_examples_register_and_report(
    start_agent: StartAgent, tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    agent = start_agent("--registry-dir", str(registry))
    agent.wait_ready()
    source = python_block("## A first plugin")  # a whole program: `python -c` runs its main
    plugins = subprocess.Popen(
        [sys.executable, "-c", source, str(registry)], stderr=subprocess.PIPE, text=True
    )
    try:
        reporter = wait_plugin(agent, "cpu-reporter")
        (field,) = reporter["last_message"]["content"][0]["field"]
        assert field["fieldName"] == "resources"
        assert field["value"] == {"cpu": "8"}  # shown as the JSON it is, not base64
        wait_plugin(agent, "accel.example.com")
        deadline = time.monotonic() + 30
        while True:
            drivers = json.loads(agent.get("/v1/resourceslices")[1])["drivers"]
            pools = drivers.get("accel.example.com", {}).get("pools", {})
            if pools or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        devices = [d for slices in pools.values() for s in slices for d in s["devices"]]
        assert devices == [
            {
                "name": "accel-0",
                "attributes": {"index": {"int": 0}},
                "capacity": {"memory": {"value": "40Gi"}},
            }
        ]
    finally:
        plugins.send_signal(signal.SIGTERM)
        code = plugins.wait(10)
        assert plugins.stderr is not None
        stderr = plugins.stderr.read()
        plugins.stderr.close()
    # A clean stop: both sockets removed, none left for the agent to find dead.
    assert code == 0, stderr
    assert [p for p in registry.rglob("*") if p.is_socket()] == []
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=10) == 0
