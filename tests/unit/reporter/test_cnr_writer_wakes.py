"""A consumer that held back while its query was not known runs again when the query is known
again, even if the relist changed no object (issue 21 section 3): the CNR writer skips its
write while the CNR query relists (after a 410); the plugins' reports change meanwhile; the
relist then lists the same CNR. Before, nothing woke the writer (no object changed), and the
changed report stayed unwritten until some unrelated change."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
import trio
import trio.testing

from nodeagent.accumulator import Accumulator, AccumulatorSettings
from nodeagent.core.latest import LatestValue
from nodeagent.kube import EventRecorder
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as pb
from nodeagent.reporter.cnr import CnrWriter, cnr_query
from nodeagent.reporter.merge import CNR_GROUP, CNR_KIND, CNR_VERSION
from nodeagent.reporter.model import PluginReport
from nodeagent.reporter.settings import ReporterSettings
from tests.support.fake_http_apiserver import mock_client
from tests.support.fake_watch import FakeClient
from tests.unit.accumulator.helpers import page

NODE = "node-a"


def report(value: str) -> Mapping[str, PluginReport]:
    c = pb.ReportContent(
        field=[
            pb.ReportField(
                fieldType=pb.Metadata,
                fieldName="Labels",
                value=json.dumps({"rev": value}).encode(),
            )
        ]
    )
    c.groupVersionKind.group, c.groupVersionKind.version = CNR_GROUP, CNR_VERSION
    c.groupVersionKind.kind = CNR_KIND
    response = pb.GetReportContentResponse(content=[c])
    return {"p": PluginReport("p", response, True, None)}


async def test_cnr_writer_writes_a_change_held_back_by_a_relist_that_changed_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    writes: list[dict[str, Any]] = []
    stored: dict[str, Any] = {}
    wrote = trio.Event()

    async def server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        writes.append({"method": request.method, "body": body})
        obj = stored or {
            "apiVersion": f"{CNR_GROUP}/{CNR_VERSION}",
            "kind": CNR_KIND,
            "metadata": {"name": NODE, "uid": "u1"},
        }
        if request.method != "GET":
            labels = (body.get("metadata") or {}).get("labels")
            if labels is not None:
                obj.setdefault("metadata", {})["labels"] = labels
            rv = str(int(obj["metadata"].get("resourceVersion", "1")) + 1)
            obj["metadata"]["resourceVersion"] = rv
            stored.update(obj)
        wrote.set()
        return httpx.Response(200 if stored else 201, json=obj)

    watches = FakeClient()
    reports = LatestValue(report("1"))
    async with mock_client(server) as client, trio.open_nursery() as nursery:
        acc = Accumulator(client, [cnr_query(NODE)], AccumulatorSettings(), watch=watches.run_watch)
        writer = CnrWriter(
            node_name=NODE,
            reports=reports,
            settings=LatestValue(ReporterSettings(cnr_min_write_interval=0)),
            events=EventRecorder(NODE),  # not run: this test counts CNR writes only
            client=client,
            accumulator=acc,
        )
        await nursery.start(acc.run)
        await nursery.start(writer.run)
        sink = await watches.sink("customnoderesources")
        await sink.begin_list()
        await sink.list_page(page([], 1, kind="CustomNodeResourceList"))
        await sink.end_list("1")
        with trio.fail_after(60):
            await wrote.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert writer.synced
        cnr = dict(stored)
        first = len(writes)
        assert first >= 1 and cnr["metadata"]["labels"]["rev"] == "1"

        # A 410: the query is not known; the report changes meanwhile: nothing is written.
        sink.events_missing("gone")  # type: ignore[attr-defined]
        await sink.begin_list()
        wrote = trio.Event()
        reports.set(report("2"))
        await trio.sleep(10)
        assert len(writes) == first
        # The relist lists exactly the CNR as it was: no object changes, the query known again.
        await sink.list_page(page([cnr], 1, kind="CustomNodeResourceList"))
        await sink.end_list(cnr["metadata"]["resourceVersion"])
        with trio.fail_after(600):
            await wrote.wait()
        assert stored["metadata"]["labels"]["rev"] == "2"
        nursery.cancel_scope.cancel()
