"""The reporter end to end: reporter plugins over real unix sockets (the SDK in process, a grpcio
plugin in a subprocess), the plugin manager, the report store with its checkpoint and the CNR
writer against the real kube-apiserver."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio

from nodeagent.accumulator import AccumulatorSettings
from nodeagent.core.latest import LatestValue
from nodeagent.kube import EventRecorder, KubeClient
from nodeagent.plugins import PluginManager
from nodeagent.reporter.cnr import CNR_RESOURCE, CnrWriter
from nodeagent.reporter.component import ReporterComponent
from nodeagent.reporter.merge import CNR_GROUP, CNR_KIND, CNR_VERSION
from nodeagent.reporter.model import PluginReport
from nodeagent.reporter.settings import ReporterSettings
from nodeagent.rpc import open_grpc_bridge
from nodeagent.sdk import ReporterPlugin
from nodeagent.sdk.reports import FieldType, ReportItem
from tests.plugins.conftest import fast_settings
from tests.plugins.test_grpcio_wire import PLUGIN
from tests.plugins.test_grpcio_wire import grpcio_modules as grpcio_modules
from tests.support.crds import install_cnr_crd

WAIT = 30.0

ZONES_A = [
    {
        "type": "Socket",
        "name": "0",
        "children": [{"type": "Numa", "name": "0", "resources": {"allocatable": {"cpu": "4"}}}],
    }
]
ZONES_B = [
    {"type": "Socket", "name": "1"},
    {
        "type": "Socket",
        "name": "0",
        "children": [
            {"type": "Numa", "name": "1", "resources": {"allocatable": {"cpu": "2"}}},
            {"type": "Numa", "name": "0", "resources": {"allocatable": {"cpu": "8"}}},
        ],
    },
]
TAINT = {"key": "node.katalyst.kubewharf.io/p", "effect": "NoSchedule", "qosLevel": "shared_cores"}


def item(field_type: FieldType, name: str, value: Any) -> ReportItem:
    return ReportItem(CNR_GROUP, CNR_VERSION, CNR_KIND, field_type, name, value)


@asynccontextmanager
async def agent(
    client: KubeClient, registry: str, state_dir: str, node: str, **settings: Any
) -> AsyncIterator[tuple[PluginManager, ReporterComponent]]:
    """The agent's plugin manager and reporter component (what service/agent.py wires)."""
    async with open_grpc_bridge() as bridge, trio.open_nursery() as nursery:
        manager = PluginManager(fast_settings(registry), bridge)
        await nursery.start(manager.run)
        events = EventRecorder(node, client=client)
        component = ReporterComponent(
            node_name=node,
            plugins=manager.channel("ReporterPlugin"),
            settings=LatestValue(ReporterSettings(cnr_min_write_interval=0.0, **settings)),
            accumulator_settings=AccumulatorSettings(),
            state_dir=state_dir,
            client=client,
            in_tree=[],
            events=events,
        )
        nursery.start_soon(events.run)
        await nursery.start(component.run)
        yield manager, component
        nursery.cancel_scope.cancel()


def writer_of(component: ReporterComponent) -> CnrWriter:
    assert component.writer is not None
    return component.writer


async def reports_until(
    component: ReporterComponent, predicate: Callable[[Mapping[str, PluginReport]], bool]
) -> int:
    """The first version of the store's reports that satisfies ``predicate``."""
    assert component.store is not None
    latest = component.store.latest
    version = latest.version
    with trio.fail_after(WAIT):
        while not predicate(latest.value):
            version, _ = await latest.wait_newer(version)
    return latest.version


async def settled(component: ReporterComponent, version: int) -> None:
    with trio.fail_after(WAIT):
        await writer_of(component).wait_settled(version)


async def get_cnr(client: KubeClient, node: str) -> dict[str, Any]:
    got: dict[str, Any] = msgspec.json.decode(await client.get(CNR_RESOURCE, node))
    return got


@asynccontextmanager
async def grpcio_plugin(modules: str, registry: str, name: str) -> AsyncIterator[None]:
    """The grpcio reporter (tests/plugins/grpcio_plugin.py): its field is Status "value", which
    the CNR does not have."""
    socket = os.path.join(registry, f"{name}.sock")
    process = await trio.lowlevel.open_process(
        [sys.executable, str(PLUGIN), modules, "reporter", socket, name],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    assert process.stdin is not None
    try:
        await process.stdin.send_all(b"value 3\n")
        yield
    finally:
        await process.stdin.aclose()
        with trio.fail_after(WAIT):
            await process.wait()


async def test_plugins_to_cnr_bad_field_and_removal(
    admin_client: KubeClient,
    registry: str,
    tmp_path: Path,
    grpcio_modules: str,
) -> None:
    await install_cnr_crd(admin_client)
    node = f"cnr-{uuid.uuid4().hex[:8]}"
    async with (
        agent(admin_client, registry, str(tmp_path), node, grace=0.5) as (_, component),
        ReporterPlugin.serve(name="rep-a", registry_dir=registry) as a,
        grpcio_plugin(grpcio_modules, registry, "rep-grpcio"),
    ):
        await a.report(
            [
                item("Metadata", "Labels", {"example.com/a": "1"}),
                item(
                    "Spec",
                    "NodeResourceProperties",
                    [{"propertyName": "cpu", "propertyQuantity": 8}],
                ),
                item("Status", "TopologyZone", ZONES_A),
                item("Status", "TopologyPolicy", "SingleNUMANodeContainerLevel"),
            ]
        )
        async with ReporterPlugin.serve(name="rep-b", registry_dir=registry) as b:
            await b.report(
                [item("Status", "TopologyZone", ZONES_B), item("Spec", "Taints", [TAINT])]
            )
            version = await reports_until(
                component, lambda r: {"rep-a", "rep-b", "rep-grpcio"} <= set(r)
            )
            await settled(component, version)
            cnr = await get_cnr(admin_client, node)
            assert cnr["metadata"]["labels"] == {"example.com/a": "1"}
            assert cnr["spec"]["nodeResourceProperties"] == [
                {"propertyName": "cpu", "propertyQuantity": "8"}
            ]
            assert cnr["spec"]["taints"] == [TAINT]
            assert cnr["status"]["topologyPolicy"] == "SingleNUMANodeContainerLevel"
            # Two plugins' overlapping zones: one Socket 0 whose NUMA children merge, first
            # occurrence winning (rep-a's value sorts first: '[{"type":"Socket","name":"0"'
            # vs rep-b's '[{"type":"Socket","name":"1"'), sorted by (type, name).
            assert cnr["status"]["topologyZone"] == [
                {
                    "type": "Socket",
                    "name": "0",
                    "children": [
                        {"type": "Numa", "name": "0", "resources": {"allocatable": {"cpu": "4"}}},
                        {"type": "Numa", "name": "1", "resources": {"allocatable": {"cpu": "2"}}},
                    ],
                },
                {"type": "Socket", "name": "1"},
            ]
            view = writer_of(component).view()
            assert view["bad_fields"] == [
                {"plugin": "rep-grpcio", "field": "Status/value", "reason": "unknown field"}
            ]
            ready, why = component.readiness()
            assert ready and "rep-grpcio" in why
        # rep-b is gone: after the grace its zones and taints leave the CNR.
        version = await reports_until(component, lambda r: "rep-b" not in r)
        await settled(component, version)
        cnr = await get_cnr(admin_client, node)
        assert "taints" not in cnr.get("spec", {})
        assert [z["name"] for z in cnr["status"]["topologyZone"]] == ["0"]
        assert [c["name"] for c in cnr["status"]["topologyZone"][0]["children"]] == ["0"]
        assert cnr["metadata"]["labels"] == {"example.com/a": "1"}


async def test_restart_restores_reports_from_checkpoint_with_zero_writes(
    admin_client: KubeClient, registry: str, tmp_path: Path
) -> None:
    await install_cnr_crd(admin_client)
    node = f"cnr-{uuid.uuid4().hex[:8]}"
    async with agent(admin_client, registry, str(tmp_path), node) as (_, component):
        async with ReporterPlugin.serve(name="rep-a", registry_dir=registry) as a:
            await a.report(
                [item("Status", "TopologyZone", ZONES_A), item("Metadata", "Labels", {"x": "1"})]
            )
            version = await reports_until(component, lambda r: "rep-a" in r)
            await settled(component, version)
            assert component.store is not None
            await component.store.checkpoint_synced()
        first = await get_cnr(admin_client, node)
    # The agent restarts without the plugin: the checkpoint brings its report back as a stopped
    # entry (within the grace), the merge equals the CNR, and nothing is written.
    async with agent(admin_client, registry, str(tmp_path), node) as (_, component):
        version = await reports_until(component, lambda r: "rep-a" in r)
        assert not component.store.latest.value["rep-a"].running  # type: ignore[union-attr]
        await settled(component, version)
        assert writer_of(component).writes == 0
    again = await get_cnr(admin_client, node)
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
