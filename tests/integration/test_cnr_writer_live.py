"""The CNR writer's cnr_min_write_interval swapped at run time (a config reload) on the real
kube-apiserver: a write held back by the old, long interval goes out once the new one allows."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import trio

from nodeagent.accumulator import Accumulator, AccumulatorSettings
from nodeagent.core.latest import LatestValue
from nodeagent.kube import EventRecorder, KubeClient
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as pb
from nodeagent.reporter.cnr import CnrWriter, cnr_query
from nodeagent.reporter.settings import ReporterSettings
from tests.integration.test_cnr_writer import (
    STATUS,
    Reports,
    get_cnr,
    publish,
    report,
    settle,
)
from tests.support.crds import install_cnr_crd


def _cpu(n: int) -> tuple[pb.FieldType, str, Any]:
    return (STATUS, "Resources", {"allocatable": {"cpu": n}})


async def test_a_shorter_write_interval_releases_a_held_write(admin_client: KubeClient) -> None:
    await install_cnr_crd(admin_client)
    node = f"cnr-{uuid.uuid4().hex[:8]}"
    reports: Reports = LatestValue({})
    live = LatestValue(ReporterSettings(cnr_min_write_interval=3600.0))
    acc = Accumulator(admin_client, [cnr_query(node)], AccumulatorSettings())
    writer = CnrWriter(
        node_name=node,
        reports=reports,
        settings=live,
        events=EventRecorder(node),  # not run: this test counts CNR writes only
        client=admin_client,
        accumulator=acc,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(acc.run)
        await nursery.start(writer.run)
        await settle(writer, publish(reports, report("p", _cpu(1))))
        writes = writer.writes
        version = publish(reports, report("p", _cpu(2)))
        await get_cnr(admin_client, node)  # a round trip: time for a write, none is allowed
        assert writer.writes == writes and writer.settled_version < version
        live.set(msgspec.structs.replace(live.value, cnr_min_write_interval=0.5))
        await settle(writer, version)  # within 30 s, not an hour
        assert writer.writes == writes + 1
        cnr = await get_cnr(admin_client, node)
        assert cnr["status"]["resources"]["allocatable"] == {"cpu": "2"}
        nursery.cancel_scope.cancel()
