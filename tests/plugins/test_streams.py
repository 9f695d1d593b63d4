"""Streams over real unix sockets: a flooding plugin's stale messages are skipped (issue 9 item
6), and every connection a stream uses is checked for its peer's credentials (item 1)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from prometheus_client import REGISTRY

from nodeagent.plugins import PluginManager
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.rpc import GrpcBridge
from tests.plugins.conftest import fast_settings
from tests.plugins.support import (
    CrashingReporter,
    ScriptedRegistration,
    plugin_status,
    report,
    report_of,
    state_of,
    wait_until,
)


def _errors(kind: str) -> float:
    return REGISTRY.get_sample_value("nodeagent_plugin_errors_total", {"kind": kind}) or 0.0


@dataclass
class _FloodingReporter(CrashingReporter):
    """Sends `count` messages back to back on each stream, then keeps the stream open."""

    count: int = 0

    async def ListAndWatchReportContent(
        self, stream: Any
    ) -> None:  # grpclib Stream[rep.Empty, rep.GetReportContentResponse]
        await stream.recv_message()
        for i in range(1, self.count + 1):
            await stream.send_message(report("n", str(i).encode()))
        await asyncio.Event().wait()


async def test_a_flood_is_processed_newest_first_and_the_last_message_always(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    count = 500
    channel = manager.channel("ReporterPlugin")
    info = reg.PluginInfo(type="ReporterPlugin", name="flood", supported_versions=["v1alpha1"])
    flood = _FloodingReporter(crashes=0, count=count)
    interval = manager.live.value.stream_min_interval
    started = trio.current_time()
    async with bridge.serve([ScriptedRegistration(info), flood], os.path.join(registry, "f.sock")):
        await wait_until(
            manager,
            lambda: (
                "flood" in channel.value
                and report_of(channel.value["flood"]).content[0].field[0].value
                == str(count).encode()
            ),
        )
        elapsed = trio.current_time() - started
        status = plugin_status(manager, "flood")
        assert status is not None
        # Every message was read; at most one per stream_min_interval (0.1 s) was processed
        # (the first at once, the newest when the flood ends), over however long the reading
        # took: a loaded machine reads 500 messages more slowly, not a bound of its own.
        assert status["messages_received"] + status["messages_skipped"] == count
        assert status["messages_received"] <= 2 + elapsed / interval, elapsed
        assert status["stream_restarts"] == 0


# The service side of a plugin in its own process, so that stopping it closes its connections
# as a real plugin's exit does: serves ListAndWatchReportContent on argv[1] reporting argv[2].
_SERVICE = """
import os, sys, trio
from nodeagent.sdk import ReporterPlugin, ReportItem

async def main(path, value):
    name = os.path.basename(path).removesuffix(".sock")
    async with ReporterPlugin.serve(name=name, registry_dir=os.path.dirname(path)) as plugin:
        await plugin.report([ReportItem("g", "v1alpha1", "K", "Status", "who", value)])
        await trio.sleep_forever()

trio.run(main, *sys.argv[1:])
"""


@asynccontextmanager
async def _service_process(path: str, value: str) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            partial(trio.run_process, [sys.executable, "-c", _SERVICE, path, value], check=False)
        )
        try:
            yield
        finally:
            process.kill()
            await process.wait()


async def test_every_stream_connection_is_checked_for_an_allowed_peer(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    allowed = {"yes": True}
    manager = PluginManager(fast_settings(registry), bridge, uid_check=lambda uid: allowed["yes"])
    await nursery.start(manager.run)
    channel = manager.channel("ReporterPlugin")
    endpoint = os.path.join(registry, ".svc", "reporter.sock")  # hidden from the scan
    info = reg.PluginInfo(
        type="ReporterPlugin", name="swap", endpoint=endpoint, supported_versions=["v1alpha1"]
    )
    rejected_before = _errors("peer_rejected")

    def who() -> bytes:
        data = channel.value.get("swap")
        return b"" if data is None else bytes(report_of(data).content[0].field[0].value)

    def stream_error() -> str:
        return str((plugin_status(manager, "swap") or {}).get("stream_error", ""))

    async with bridge.serve([ScriptedRegistration(info)], os.path.join(registry, "swap.sock")):
        async with _service_process(endpoint, "first"):
            await wait_until(manager, lambda: who() == b'"first"', within=30)
            # The service process goes; another one takes its socket, and the agent must not
            # talk to it (here: the UID rule changes). Registration is not repeated: only the
            # check on the stream's own connection can refuse it.
            allowed["yes"] = False
        async with _service_process(endpoint, "second"):
            await wait_until(manager, lambda: "PERMISSION_DENIED" in stream_error(), within=30)
            assert "which is not an allowed plugin UID" in stream_error()
            assert _errors("peer_rejected") > rejected_before
            assert who() == b'"first"'
            assert state_of(manager, "swap") == "registered"
            # Allowed again: the stream reopens and data flows.
            allowed["yes"] = True
            await wait_until(manager, lambda: who() == b'"second"', within=30)
