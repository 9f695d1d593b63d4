"""`nodeagent run` against kube-apiserver 1.35 with its default gates, fed by an SDK plugin whose
device carries a taint (behind DRADeviceTaints, off in 1.35): the slice is published without the
taint, with no update loop, and the operator is told where they look: /v1/status,
`nodeagent status`, the metric, a Node Event."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.kube import CORE_EVENTS
from tests.integration.conftest import client_for
from tests.process.conftest import StartAgent, nodeagent_command
from tests.process.test_process_resourceslices import (
    DRIVER,
    NODE,
    metric_sum,
    node,
    node_slices,
    settled,
    start_cluster_agent,
)
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.wait import until

apiserver = apiserver_fixture(scope="module", release="1.35", gates="default")
__all__ = ["node"]  # a fixture, re-used

PLUGIN = """
import sys, trio
from nodeagent.sdk import Device, DevicePlugin, Taint

async def main(registry_dir):
    async with DevicePlugin.serve(
        name="gpu.example.com", registry_dir=registry_dir, api="native", pool="node-a"
    ) as plugin:
        await plugin.publish([
            Device("gpu-0", {"model": "A100"}, taints=[Taint("example.com/unhealthy")]),
            Device("gpu-1", {"model": "A100"}),
        ])
        await trio.sleep_forever()

trio.run(main, sys.argv[1])
"""


@pytest.fixture
def tainted_plugin(registry: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", PLUGIN, registry], text=True)
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)


def node_events(apiserver: ApiServer, reason: str) -> list[dict[str, Any]]:
    async def get() -> list[dict[str, Any]]:
        async with client_for(apiserver, "admin") as client:
            body = await client.request(
                "GET",
                CORE_EVENTS.path("default"),
                params={"fieldSelector": f"involvedObject.name={NODE},reason={reason}"},
            )
        items: list[dict[str, Any]] = msgspec.json.decode(body)["items"]
        return items

    return trio.run(get)


def test_dropped_taints_are_reported_where_the_operator_looks(
    apiserver: ApiServer,
    node: None,
    start_agent: StartAgent,
    registry: str,
    tainted_plugin: subprocess.Popen[str],
) -> None:
    agent = start_cluster_agent(start_agent, apiserver, registry)
    (obj,) = until(lambda: node_slices(apiserver) or None, "the plugin's slice")
    assert [d.get("taints") for d in obj["spec"]["devices"]] == [None, None]
    until(lambda: settled(agent), "the agent to settle")

    def row() -> dict[str, Any] | None:
        status = json.loads(agent.get("/v1/status")[1])
        rows = [r for r in status["resourceslices"] if r["driver"] == DRIVER]
        return rows[0] if rows and rows[0]["dropped_fields"] else None

    assert until(row, "the dropped field in /v1/status")["dropped_fields"] == [
        "devices.taints (DRADeviceTaints)"
    ]
    doc = json.loads(agent.get("/v1/resourceslices")[1])
    assert doc["sync"]["dropped_fields"] == [
        {
            "driver": DRIVER,
            "pool": NODE,
            "field": "devices.taints",
            "feature_gate": "DRADeviceTaints",
        }
    ]
    field = f'driver="{DRIVER}",field="devices.taints"'
    assert metric_sum(agent, "nodeagent_resourceslice_fields_dropped_total", field) == 1
    out = subprocess.run(
        nodeagent_command("status", "--ops-address", agent.ops_address),
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert f"pool {NODE} of {DRIVER}: the cluster drops devices.taints (DRADeviceTaints)" in out
    (event,) = until(lambda: node_events(apiserver, "ResourceSliceFieldsDropped"), "the Event")
    assert "devices.taints (feature gate DRADeviceTaints)" in event["message"]
    # No update loop: the one create, nothing since.
    assert metric_sum(agent, "nodeagent_resourceslice_writes_total", 'verb="update"') == 0
    assert metric_sum(agent, "nodeagent_resourceslice_writes_total", 'verb="create"') == 1
