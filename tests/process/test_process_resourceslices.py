"""`nodeagent run` publishing a real SDK device plugin's inventory as ResourceSlices: against the
real kube-apiserver with node-a's credentials (restart without writes), and standalone (the
desired slices on /v1/resourceslices and in `nodeagent status`)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import suppress
from typing import Any, TypeVar

import msgspec
import pytest
import trio

from nodeagent.kube import NODES, RESOURCESLICES, errors
from tests.integration.conftest import client_for
from tests.process.conftest import AgentProcess, StartAgent, nodeagent_command
from tests.support.apiserver import ApiServer
from tests.support.wait import until

NODE = "node-a"
DRIVER = "gpu.example.com"
T = TypeVar("T")

# A native-API DRA plugin written with the SDK, in its own process: three GPUs in pool node-a.
PLUGIN = """
import sys, trio
from nodeagent.sdk import Device, DevicePlugin

async def main(registry_dir):
    async with DevicePlugin.serve(
        name="gpu.example.com", registry_dir=registry_dir, api="native", pool="node-a"
    ) as plugin:
        await plugin.publish([
            Device(f"gpu-{i}", {"index": i, "model": "A100"}, capacity={"memory": "40Gi"})
            for i in range(3)
        ])
        await trio.sleep_forever()

trio.run(main, sys.argv[1])
"""


@pytest.fixture
def node(apiserver: ApiServer) -> Iterator[None]:
    """Node node-a (the slices' owner) exists; no slices of it before or after the test."""

    async def prepare(create: bool) -> None:
        async with client_for(apiserver, "admin") as client:
            if create:
                with suppress(errors.AlreadyExists):
                    await client.create(
                        NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
                    )
            await client.delete_collection(RESOURCESLICES, field_selector=f"spec.nodeName={NODE}")

    trio.run(prepare, True)
    yield
    trio.run(prepare, False)


@pytest.fixture
def plugin(registry: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PLUGIN, registry], stderr=subprocess.PIPE, text=True
    )
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    assert proc.stderr is not None
    proc.stderr.close()


def node_slices(apiserver: ApiServer) -> list[dict[str, Any]]:
    async def get() -> list[dict[str, Any]]:
        async with client_for(apiserver, "admin") as client:
            body = await client.request(
                "GET", RESOURCESLICES.path(None), params={"fieldSelector": f"spec.nodeName={NODE}"}
            )
        doc = msgspec.json.decode(body)
        items: list[dict[str, Any]] = doc["items"]
        for item in items:  # list items leave out what the list says for all of them
            item.setdefault("apiVersion", doc["apiVersion"])
        return sorted(items, key=lambda o: o["metadata"]["name"])

    return trio.run(get)


def metric_sum(agent: AgentProcess, name: str, labels: str = "") -> float:
    text = agent.get("/metrics")[1]
    pattern = re.compile(rf"^{name}(\{{[^}}]*\}})? (\S+)$", re.M)
    return sum(float(v) for lab, v in pattern.findall(text) if labels in lab)


def settled(agent: AgentProcess) -> dict[str, Any] | None:
    """/v1/resourceslices once the plugin is registered, the observed state read and no pool
    waits for a sync."""
    doc: dict[str, Any] = json.loads(agent.get("/v1/resourceslices")[1])
    driver = doc["drivers"].get(DRIVER)
    if driver is None or not driver["registered"] or NODE not in driver["pools"]:
        return None
    sync = doc["sync"]
    return doc if sync["synced"] and sync["pending_pools"] == 0 else None


def start_cluster_agent(start_agent: StartAgent, apiserver: ApiServer, registry: str) -> Any:
    agent = start_agent(
        "--kubeconfig",
        str(apiserver.kubeconfig(NODE)),
        "--node-name",
        NODE,
        "--registry-dir",
        registry,
        # Long enough for the plugin to re-register after a restart: nothing is deleted before.
        "--set",
        "resources.startup_grace=20",
    )
    agent.wait_ready()
    return agent


def test_cluster_publishes_and_a_restart_makes_no_writes(
    apiserver: ApiServer,
    node: None,
    start_agent: StartAgent,
    registry: str,
    plugin: subprocess.Popen[str],
) -> None:
    first = start_cluster_agent(start_agent, apiserver, registry)
    (obj,) = until(lambda: node_slices(apiserver) or None, "the plugin's slice")
    assert obj["apiVersion"] == "resource.k8s.io/v1"
    spec = obj["spec"]
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, NODE)
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    assert spec["devices"][0]["capacity"] == {"memory": {"value": "40Gi"}}
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "Node"
    until(lambda: settled(first), "the first agent to settle")
    assert metric_sum(first, "nodeagent_resourceslice_writes_total", 'verb="create"') == 1
    ready = first.get("/readyz?verbose")[1]
    assert "[+]resources ok: 1 drivers, 1 pools, 1 slices desired" in ready, ready

    first.signal(signal.SIGTERM)
    assert first.wait(timeout=15) == 0

    second = start_cluster_agent(start_agent, apiserver, registry)
    until(lambda: settled(second), "the restarted agent to settle")
    until(
        lambda: metric_sum(second, "nodeagent_resourceslice_syncs_total", 'result="unchanged"'),
        "the restarted agent to plan the pool",
    )
    assert metric_sum(second, "nodeagent_resourceslice_writes_total") == 0
    (after,) = node_slices(apiserver)
    assert after["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    assert after["metadata"]["uid"] == obj["metadata"]["uid"]
    status = json.loads(second.get("/v1/status")[1])
    assert status["resourceslices"] == [
        {
            "driver": DRIVER,
            "pool": NODE,
            "slices": 1,
            "devices": 3,
            "registered": True,
            "last_error": "",
            "dropped_fields": [],
        }
    ]
    second.signal(signal.SIGTERM)
    assert second.wait(timeout=15) == 0


def test_standalone_serves_the_desired_slices(
    start_agent: StartAgent, registry: str, plugin: subprocess.Popen[str]
) -> None:
    agent = start_agent("--node-name", NODE, "--registry-dir", registry)
    agent.wait_ready()

    def published() -> dict[str, Any] | None:
        doc: dict[str, Any] = json.loads(agent.get("/v1/resourceslices")[1])
        return doc if DRIVER in doc["drivers"] and doc["drivers"][DRIVER]["pools"] else None

    doc = until(published, "the desired slices on /v1/resourceslices")
    assert doc["mode"] == "standalone" and "sync" not in doc
    (desired,) = doc["drivers"][DRIVER]["pools"][NODE]
    assert desired["driver"] == DRIVER and desired["nodeName"] == NODE
    # The generation is the planner's, against what the cluster holds: not part of the view.
    assert desired["pool"] == {"name": NODE, "resourceSliceCount": 1}
    assert [d["name"] for d in desired["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    assert metric_sum(agent, "nodeagent_resourceslice_writes_total") == 0

    out = subprocess.run(
        nodeagent_command("status", "--ops-address", agent.ops_address),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    pools = out.stdout[out.stdout.index("DRIVER  ") :].splitlines()
    assert pools[0].split()[:4] == ["DRIVER", "POOL", "SLICES", "DEVICES"]
    assert pools[1].split() == [DRIVER, NODE, "1", "3", "yes", "-"]
    assert "resources  yes    running  0         standalone: 1 drivers, 1 pools" in out.stdout
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
