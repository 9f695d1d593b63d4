"""The CNR writer on the real kube-apiserver: the merged reports land on the node's CNR with
server-side apply, nothing is written when nothing changed, a bad field does not block the
others, fields no longer reported are removed, and another writer's fields survive."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.accumulator import Accumulator, AccumulatorSettings
from nodeagent.core.latest import LatestValue
from nodeagent.kube import CORE_EVENTS, EventRecorder, KubeClient, errors
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as pb
from nodeagent.reporter.cnr import CNR_RESOURCE, CnrWriter, cnr_query
from nodeagent.reporter.merge import CNR_GROUP, CNR_KIND, CNR_VERSION
from nodeagent.reporter.model import PluginReport
from nodeagent.reporter.settings import ReporterSettings
from tests.support.crds import install_cnr_crd, install_cnr_node_access

pytestmark = pytest.mark.releases

SPEC, STATUS, METADATA = pb.Spec, pb.Status, pb.Metadata
WAIT = 30

Reports = LatestValue[Mapping[str, PluginReport]]


def report(plugin: str, *fields: tuple[pb.FieldType, str, Any]) -> PluginReport:
    content = pb.ReportContent(
        field=[
            pb.ReportField(
                fieldType=ft,
                fieldName=name,
                value=v if isinstance(v, bytes) else json.dumps(v).encode(),
            )
            for ft, name, v in fields
        ]
    )
    gvk = content.groupVersionKind
    gvk.group, gvk.version, gvk.kind = CNR_GROUP, CNR_VERSION, CNR_KIND
    return PluginReport(plugin, pb.GetReportContentResponse(content=[content]), True, None)


def publish(reports: Reports, *items: PluginReport) -> int:
    reports.set({r.plugin: r for r in items})
    return reports.version


@asynccontextmanager
async def running_writer(
    client: KubeClient, node: str, reports: Reports, **settings: Any
) -> AsyncIterator[CnrWriter]:
    acc = Accumulator(client, [cnr_query(node)], AccumulatorSettings())
    events = EventRecorder(node, client=client)
    writer = CnrWriter(
        node_name=node,
        reports=reports,
        settings=LatestValue(ReporterSettings(**{"cnr_min_write_interval": 0.0, **settings})),
        events=events,
        client=client,
        accumulator=acc,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(events.run)
        await nursery.start(acc.run)
        await nursery.start(writer.run)
        yield writer
        nursery.cancel_scope.cancel()


async def settle(writer: CnrWriter, version: int) -> None:
    try:
        with trio.fail_after(WAIT):
            await writer.wait_settled(version)
    except trio.TooSlowError:
        raise AssertionError(f"not settled: {writer.view()}, observed {writer.observed}") from None


async def get_cnr(client: KubeClient, node: str) -> dict[str, Any]:
    got: dict[str, Any] = msgspec.json.decode(await client.get(CNR_RESOURCE, node))
    return got


ZONES_A = [
    {
        "type": "Socket",
        "name": "0",
        "children": [
            {"type": "Numa", "name": "0", "resources": {"allocatable": {"cpu": "4"}}},
        ],
    }
]
ZONES_B = [
    {
        "type": "Socket",
        "name": "0",
        "children": [
            {"type": "Numa", "name": "1", "resources": {"allocatable": {"cpu": "2"}}},
            {"type": "Numa", "name": "0", "resources": {"allocatable": {"cpu": "8"}}},
        ],
    }
]


async def test_cnr_created_with_every_field_and_no_write_when_unchanged(
    admin_client: KubeClient,
) -> None:
    await install_cnr_crd(admin_client)
    node = f"cnr-{uuid.uuid4().hex[:8]}"
    reports: Reports = LatestValue({})
    a = report(
        "a",
        (METADATA, "Labels", {"example.com/a": "1"}),
        (SPEC, "NodeResourceProperties", [{"propertyName": "cpu", "propertyQuantity": "8000m"}]),
        (STATUS, "TopologyZone", ZONES_A),
        (STATUS, "Resources", {"allocatable": {"cpu": "4"}}),
        (STATUS, "TopologyPolicy", "SingleNUMANodeContainerLevel"),
    )
    b = report(
        "b",
        (METADATA, "Annotations", {"example.com/b": "x"}),
        (
            SPEC,
            "Taints",
            [
                {
                    "key": "node.katalyst.kubewharf.io/p",
                    "effect": "NoSchedule",
                    "qosLevel": "reclaimed_cores",
                }
            ],
        ),
        (STATUS, "TopologyZone", ZONES_B),
    )
    version = publish(reports, a, b)
    async with running_writer(
        admin_client, node, reports, cnr_default_labels={"katalyst.kubewharf.io/default": "y"}
    ) as writer:
        await settle(writer, version)
        cnr = await get_cnr(admin_client, node)
        meta = cnr["metadata"]
        assert meta["labels"] == {"example.com/a": "1", "katalyst.kubewharf.io/default": "y"}
        assert meta["annotations"] == {"example.com/b": "x"}
        assert cnr["spec"]["nodeResourceProperties"] == [
            {"propertyName": "cpu", "propertyQuantity": "8"}
        ]
        assert cnr["spec"]["taints"][0]["key"] == "node.katalyst.kubewharf.io/p"
        status = cnr["status"]
        assert status["topologyPolicy"] == "SingleNUMANodeContainerLevel"
        assert status["resources"] == {"allocatable": {"cpu": "4"}}
        # Overlapping zones: one Socket 0, its NUMA children deduplicated and sorted; NUMA 0's
        # cpu from the field sorting first (a's: '[{"type":"Socket","name":"0","children":[{"t'
        # ties with b's up to the first child's name "0" vs "1"... a's child has "name":"0"
        # after "type":"Numa", b's first child "1": a sorts first and wins).
        assert status["topologyZone"] == [
            {
                "type": "Socket",
                "name": "0",
                "children": [
                    {"type": "Numa", "name": "0", "resources": {"allocatable": {"cpu": "4"}}},
                    {"type": "Numa", "name": "1", "resources": {"allocatable": {"cpu": "2"}}},
                ],
            }
        ]
        writes = writer.writes
        assert writes == 3  # create, apply, status apply
        # The same reports again: merged, compared, nothing written.
        version = publish(reports, a, b)
        await settle(writer, version)
        assert writer.writes == writes


async def test_bad_field_skipped_others_land_and_event_names_it(admin_client: KubeClient) -> None:
    await install_cnr_crd(admin_client)
    node = f"cnr-{uuid.uuid4().hex[:8]}"
    reports: Reports = LatestValue({})
    version = publish(
        reports,
        report("good", (STATUS, "TopologyPolicy", "None")),
        report("evil", (STATUS, "Resources", {"allocatable": {"cpu": "lots"}})),
    )
    async with running_writer(admin_client, node, reports) as writer:
        await settle(writer, version)
        cnr = await get_cnr(admin_client, node)
        assert cnr["status"]["topologyPolicy"] == "None"
        assert "allocatable" not in (cnr["status"].get("resources") or {})
        with trio.fail_after(WAIT):
            while True:
                events = await admin_client.list(CORE_EVENTS, "default", into=dict[str, Any])
                msgs = [
                    e["message"]
                    for e in events.items
                    if e["involvedObject"].get("name") == node
                    and e["reason"] == "ReporterFieldSkipped"
                ]
                if msgs:
                    break
                await trio.sleep(0.05)
        assert "plugin evil" in msgs[0] and "Status/Resources" in msgs[0]


async def test_unreported_fields_removed_other_writers_kept(admin_client: KubeClient) -> None:
    await install_cnr_crd(admin_client)
    node = f"cnr-{uuid.uuid4().hex[:8]}"
    reports: Reports = LatestValue({})
    version = publish(
        reports,
        report(
            "a",
            (METADATA, "Labels", {"example.com/mine": "1"}),
            (STATUS, "TopologyZone", ZONES_A),
            (STATUS, "Resources", {"allocatable": {"cpu": "4"}}),
        ),
    )
    async with running_writer(admin_client, node, reports) as writer:
        await settle(writer, version)
        # A controller owns another label and a status field the agent does not report.
        await admin_client.apply(
            CNR_RESOURCE,
            {
                "apiVersion": f"{CNR_GROUP}/{CNR_VERSION}",
                "kind": CNR_KIND,
                "metadata": {"name": node, "labels": {"example.com/theirs": "2"}},
            },
            field_manager="controller",
        )
        await admin_client.apply(
            CNR_RESOURCE,
            {
                "apiVersion": f"{CNR_GROUP}/{CNR_VERSION}",
                "kind": CNR_KIND,
                "metadata": {"name": node},
                "status": {
                    "conditions": [
                        {
                            "type": "AgentReady",
                            "status": "True",
                            "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                        }
                    ]
                },
            },
            field_manager="scheduler",
            subresource="status",
        )
        # The plugin stops reporting its label and the zones (gone after the grace: absent).
        version = publish(
            reports, report("a", (STATUS, "Resources", {"allocatable": {"cpu": "4"}}))
        )
        await settle(writer, version)
        cnr = await get_cnr(admin_client, node)
        assert cnr["metadata"]["labels"] == {"example.com/theirs": "2"}
        assert "topologyZone" not in cnr["status"]
        assert cnr["status"]["resources"] == {"allocatable": {"cpu": "4"}}
        assert cnr["status"]["conditions"][0]["type"] == "AgentReady"


async def test_node_credentials_write_own_cnr_refused_on_another(
    admin_client: KubeClient, node_client: KubeClient
) -> None:
    """node-a, with the RBAC and admission policy shipped in deploy/, keeps its own CNR; the
    same writer pointed at node-b's is refused, backs off and says so in its state."""
    await install_cnr_crd(admin_client)
    await install_cnr_node_access(admin_client, node_client, "node-a")
    with contextlib.suppress(errors.NotFound):
        await admin_client.delete(CNR_RESOURCE, "node-a")
    reports: Reports = LatestValue({})
    version = publish(reports, report("a", (STATUS, "TopologyPolicy", "None")))
    async with running_writer(node_client, "node-a", reports) as writer:
        await settle(writer, version)
        assert (await get_cnr(admin_client, "node-a"))["status"]["topologyPolicy"] == "None"
    async with running_writer(node_client, "node-b", reports, cnr_retry_initial=0.05) as writer:
        with trio.fail_after(WAIT):
            while writer.error is None:
                await writer.changed()
        assert "Forbidden" in writer.error and not writer.synced


async def test_flapping_plugin_coalesced_latest_wins(admin_client: KubeClient) -> None:
    await install_cnr_crd(admin_client)
    node = f"cnr-{uuid.uuid4().hex[:8]}"
    reports: Reports = LatestValue({})
    version = publish(reports, report("flap", (STATUS, "Resources", {"allocatable": {"cpu": 0}})))
    async with running_writer(admin_client, node, reports, cnr_min_write_interval=0.5) as writer:
        await settle(writer, version)
        before, start = writer.writes, trio.current_time()
        for i in range(1, 51):
            version = publish(
                reports, report("flap", (STATUS, "Resources", {"allocatable": {"cpu": i}}))
            )
            # Paced by a round trip to the apiserver, as long as a write takes: an uncoalesced
            # writer would write after (nearly) every report.
            await get_cnr(admin_client, node)
        await settle(writer, version)
        # One write per interval at most (the 50 round trips take about a second here), the
        # last one carrying the last report.
        elapsed = trio.current_time() - start
        assert writer.writes - before <= elapsed / 0.5 + 2
        cnr = await get_cnr(admin_client, node)
        assert cnr["status"]["resources"]["allocatable"] == {"cpu": "50"}
