"""The reporter component standalone: the merged CNR on /v1/cnr's view and in `nodeagent status`,
bad fields in readiness, nothing written."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import cast

import trio
import trio.testing

from nodeagent.accumulator import AccumulatorSettings
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.kube import EventRecorder, KubeClient, errors
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as pb
from nodeagent.reporter.component import ReporterComponent, cnr_summary
from nodeagent.reporter.merge import CNR_GROUP, CNR_KIND, CNR_VERSION
from nodeagent.reporter.settings import ReporterSettings
from nodeagent.service.cli_view import render


def response(*fields: tuple[pb.FieldType, str, object]) -> pb.GetReportContentResponse:
    content = pb.ReportContent(
        field=[
            pb.ReportField(fieldType=t, fieldName=n, value=json.dumps(v).encode())
            for t, n, v in fields
        ]
    )
    gvk = content.groupVersionKind
    gvk.group, gvk.version, gvk.kind = CNR_GROUP, CNR_VERSION, CNR_KIND
    return pb.GetReportContentResponse(content=[content])


class InTree:
    name = "system"

    def collect(self) -> pb.GetReportContentResponse:
        return response(
            (pb.Spec, "NodeResourceProperties", [{"propertyName": "cpu", "propertyQuantity": "4"}])
        )


async def test_standalone_serves_the_merged_cnr(tmp_path: Path) -> None:
    plugin = PluginData(
        name="rep",
        plugin_type="ReporterPlugin",
        endpoint="/x.sock",
        message=response((pb.Status, "TopologyPolicy", "None"), (pb.Status, "Nope", 1)),
        received_at=0.0,
        registered=True,
    )
    plugins: LatestValue[Mapping[str, PluginData]] = LatestValue({"rep": plugin})
    component = ReporterComponent(
        node_name="n1",
        plugins=plugins,
        settings=LatestValue(ReporterSettings()),
        accumulator_settings=AccumulatorSettings(),
        events=EventRecorder("n1"),
        state_dir=str(tmp_path),
        in_tree=[InTree()],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(component.run)
        assert component.store is not None and component.writer is not None
        with trio.fail_after(5):
            await component.writer.wait_settled(component.store.latest.version)
        view = component.view()
        assert view["mode"] == "standalone"
        assert view["cnr"]["status"] == {"topologyPolicy": "None"}
        assert view["cnr"]["spec"]["nodeResourceProperties"][0]["propertyName"] == "cpu"
        assert view["bad_fields"] == [
            {"plugin": "rep", "field": "Status/Nope", "reason": "unknown field"}
        ]
        ready, why = component.readiness()
        assert ready and why.startswith("standalone: 2 CNR fields merged, not written")
        assert "Status/Nope" in why
        summary = cnr_summary(view)
        assert summary["fields"] == ["spec.nodeResourceProperties", "status.topologyPolicy"]
        text = render({"node": "n1", "components": [], "cnr": summary}, [])
        assert "CNR: 2 fields from 2 reporters, standalone" in text
        assert "skipped Status/Nope from rep: unknown field" in text
        nursery.cancel_scope.cancel()


class NoCrdClient:
    """Discovery answers that the CNR kind is not served."""

    def __init__(self) -> None:
        self.discoveries = 0

    async def discover(self, api_version: str, kind: str) -> object:
        self.discoveries += 1
        raise errors.NotFound(404, "NotFound", f"kind {kind} is not served by {api_version}")


async def test_connected_without_the_crd_is_ready_and_looks_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    client = NoCrdClient()
    plugins: LatestValue[Mapping[str, PluginData]] = LatestValue({})
    component = ReporterComponent(
        node_name="n1",
        plugins=plugins,
        settings=LatestValue(ReporterSettings(cnr_retry_max=30.0)),
        accumulator_settings=AccumulatorSettings(),
        events=EventRecorder("n1"),
        state_dir=str(tmp_path),
        client=cast(KubeClient, client),
        in_tree=[InTree()],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(component.run)
        assert component.store is not None and component.writer is not None
        await component.writer.wait_settled(component.store.latest.version)
        ready, why = component.readiness()
        assert ready and why.startswith("the CustomNodeResource CRD is not installed")
        view = component.view()
        assert view["mode"] == "cluster" and "not served" in view["sync"]["crd_missing"]
        assert view["cnr"]["spec"]["nodeResourceProperties"][0]["propertyName"] == "cpu"
        await trio.sleep(65)
        assert client.discoveries == 3  # at start, then every cnr_retry_max
        nursery.cancel_scope.cancel()


class UnreachableClient:
    """An apiserver that does not answer yet (a node booted before its control plane)."""

    def __init__(self) -> None:
        self.discoveries = 0
        self.component_started = False

    async def discover(self, api_version: str, kind: str) -> None:
        self.discoveries += 1
        assert self.component_started or self.discoveries == 1, "discovery retried in the start"
        raise errors.TransportError("connect: connection refused", sent=False)


async def test_unreachable_apiserver_does_not_hold_the_start_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Regression: discovery was retried inside the start, so the component never started and
    # the agent never sent READY=1 (systemd's start timeout then kills a node booted offline).
    client = UnreachableClient()
    component = ReporterComponent(
        node_name="n1",
        plugins=LatestValue({}),
        settings=LatestValue(ReporterSettings(cnr_retry_initial=1.0, cnr_retry_max=30.0)),
        accumulator_settings=AccumulatorSettings(),
        events=EventRecorder("n1"),
        state_dir=str(tmp_path),
        client=cast(KubeClient, client),
        in_tree=[InTree()],
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(component.run)
        client.component_started = True
        assert component.store is not None and component.writer is not None
        await component.writer.wait_settled(component.store.latest.version)
        ready, why = component.readiness()
        assert not ready and "looking for the CustomNodeResource kind fails" in why
        assert "connection refused" in why
        assert component.view()["cnr"]["spec"]["nodeResourceProperties"][0]["propertyName"] == "cpu"
        await trio.sleep(60)
        # Looked for again with backoff (1, 2, 4, 8, 16, 30 s, jittered), not every 60 s.
        assert 4 <= client.discoveries <= 9
        nursery.cancel_scope.cancel()
