"""With `stream_min_interval = 0`, over real unix sockets: a message that arrives alone is
processed by the stream's reader at once (every one of them, none skipped), and a flood still
ends with the newest message processed, every message counted once."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

import trio

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
    wait_until,
)

COUNT = 200


@dataclass
class _PacedReporter(CrashingReporter):
    """Sends message i only once the test acknowledged message i - 1 (`acks`, asyncio side)."""

    acks: asyncio.Queue[int] | None = None
    flood: bool = False
    sent: list[int] = field(default_factory=list)

    async def ListAndWatchReportContent(self, stream: Any) -> None:
        await stream.recv_message()
        for i in range(1, COUNT + 1):
            await stream.send_message(report("n", str(i).encode()))
            self.sent.append(i)
            if not self.flood:
                assert self.acks is not None
                assert await self.acks.get() == i
        await asyncio.Event().wait()


async def _new_queue() -> asyncio.Queue[int]:
    return asyncio.Queue()


async def _put(queue: asyncio.Queue[int], value: int) -> None:
    queue.put_nowait(value)


async def _serve(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery, *, flood: bool
) -> tuple[PluginManager, dict[str, Any]]:
    manager = PluginManager(fast_settings(registry, stream_min_interval=0.0), bridge)
    await nursery.start(manager.run)
    acks = await bridge.run_asyncio(_new_queue)
    info = reg.PluginInfo(type="ReporterPlugin", name="paced", supported_versions=["v1alpha1"])
    plugin = _PacedReporter(crashes=0, acks=acks, flood=flood)
    channel = manager.channel("ReporterPlugin")
    last = 0
    async with bridge.serve([ScriptedRegistration(info), plugin], os.path.join(registry, "p.sock")):
        version = channel.version
        while last < COUNT:
            version, value = await channel.wait_newer(version)
            if "paced" not in value:
                continue
            got = int(report_of(value["paced"]).content[0].field[0].value)
            if not flood:
                # One at a time: each published value is the message just sent.
                assert got == last + 1
                await bridge.run_asyncio(_put, acks, got)
            last = got
        await wait_until(manager, lambda: plugin_status(manager, "paced") is not None)
        status = plugin_status(manager, "paced")
        assert status is not None
        return manager, status


async def test_messages_arriving_alone_are_each_processed(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    _, status = await _serve(bridge, registry, nursery, flood=False)
    assert (status["messages_received"], status["messages_skipped"]) == (COUNT, 0)
    assert status["stream_restarts"] == 0


async def test_a_flood_with_no_min_interval_ends_with_the_newest_every_message_counted(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    _, status = await _serve(bridge, registry, nursery, flood=True)
    assert status["messages_received"] + status["messages_skipped"] == COUNT
    assert status["stream_restarts"] == 0
