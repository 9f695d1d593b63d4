"""/v1/cnr's ``synced`` while a report is held by cnr_min_write_interval (issue 21 s5): false
from the moment newer reports are published until they are on the server. It stayed true, so a
caller (the CNR restart test, an operator) took a CNR short of the held reports for the merge."""

from __future__ import annotations

import uuid

import trio

from nodeagent.core.latest import LatestValue
from nodeagent.kube import KubeClient
from tests.integration.test_cnr_writer import (
    METADATA,
    STATUS,
    Reports,
    get_cnr,
    publish,
    report,
    running_writer,
    settle,
)
from tests.support.crds import install_cnr_crd


async def test_synced_is_false_while_a_report_is_held(admin_client: KubeClient) -> None:
    await install_cnr_crd(admin_client)
    node = f"cnr-{uuid.uuid4().hex[:8]}"
    reports: Reports = LatestValue({})
    version = publish(reports, report("a", (METADATA, "Labels", {"example.com/a": "1"})))
    async with running_writer(admin_client, node, reports, cnr_min_write_interval=2.0) as writer:
        await settle(writer, version)
        assert writer.view()["sync"]["synced"] is True
        written, before = trio.current_time(), writer.writes
        version = publish(
            reports,
            report("a", (METADATA, "Labels", {"example.com/a": "1"})),
            report("b", (STATUS, "TopologyPolicy", "SingleNUMANodeContainerLevel")),
        )
        assert writer.view()["sync"]["synced"] is False
        # Merged, then held until the interval since the last write is over: still not synced.
        # (Yielding until the writer task has merged: no time passes, nothing is written.)
        while writer.merged is None or "status" not in writer.merged.body:
            await trio.lowlevel.checkpoint()
        assert writer.writes == before
        assert writer.view()["sync"]["synced"] is False
        await settle(writer, version)
        assert trio.current_time() - written >= 1.0  # the write was held
        assert writer.view()["sync"]["synced"] is True
        cnr = await get_cnr(admin_client, node)
        assert cnr["status"]["topologyPolicy"] == "SingleNUMANodeContainerLevel"
