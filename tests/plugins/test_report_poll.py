"""The reporter handler's periodic unary GetReportContent poll, against real plugins over unix
sockets: a grpcio plugin that only answers the poll, an SDK plugin whose stream ends but whose
poll answers, and a poll that times out (the last report kept, the plugin no longer live)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from grpclib.server import Stream
from prometheus_client import REGISTRY

from nodeagent.plugins import PluginData, PluginManager
from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc as rep_grpc
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from nodeagent.rpc import GrpcBridge
from nodeagent.sdk import ReporterPlugin, ReportItem
from tests.plugins.conftest import fast_settings
from tests.plugins.support import (
    WAIT,
    report_of,
    status_item,
    wait_until,
)
from tests.plugins.test_grpcio_wire import _Lines, grpcio_modules  # noqa: F401 - the fixture

UNARY_PLUGIN = Path(__file__).with_name("grpcio_unary_reporter.py")


@pytest.fixture
async def manager(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> AsyncIterator[PluginManager]:
    settings = fast_settings(registry, report_poll_interval=0.2, report_poll_timeout=0.5)
    started = PluginManager(settings, bridge)
    await nursery.start(started.run)
    yield started


def _item(value: int) -> ReportItem:
    return ReportItem("g", "v1alpha1", "K", "Status", "value", value)


def _value(data: PluginData) -> object:
    return json.loads(report_of(data).content[0].field[0].value)


def _poll_errors() -> float:
    return (
        REGISTRY.get_sample_value("nodeagent_plugin_errors_total", {"kind": "report_poll"}) or 0.0
    )


async def test_grpcio_plugin_that_only_answers_the_poll_reports(
    grpcio_modules: str,  # noqa: F811 - the imported fixture
    registry: str,
    manager: PluginManager,
) -> None:
    name = "unary-only"
    channel = manager.channel("ReporterPlugin")
    process = await trio.lowlevel.open_process(
        [
            sys.executable,
            str(UNARY_PLUGIN),
            grpcio_modules,
            os.path.join(registry, f"{name}.sock"),
            name,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    lines = _Lines(process.stdout)
    try:
        with trio.fail_after(WAIT * 2):
            assert await lines.next() == "serving"
            await process.stdin.send_all(b"value 1\n")
            assert await lines.next() == "set 1"
            assert await lines.next() == "notify True "
        await wait_until(
            manager, lambda: name in channel.value and _value(channel.value[name]) == 1
        )
        assert channel.value[name].live and channel.value[name].registered
        assert status_item(manager, name)["stream_state"] == "unimplemented"
        # Each poll takes the plugin's current report.
        await process.stdin.send_all(b"value 7\n")
        await wait_until(manager, lambda: _value(channel.value[name]) == 7)
        assert channel.value[name].live
        await process.stdin.aclose()
        with trio.fail_after(WAIT):
            assert await process.wait() == 0
        await wait_until(manager, lambda: not channel.value[name].registered)
        assert not channel.value[name].live
        assert _value(channel.value[name]) == 7  # kept for the grace
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


class _EndingService(rep_grpc.ReporterPluginBase):
    """The SDK's service, but the stream sends the current report once and ends."""

    def __init__(self, plugin: ReporterPlugin, hang_poll: bool) -> None:
        self._plugin = plugin
        self.hang_poll = hang_poll
        self.polls = 0

    async def GetReportContent(
        self, stream: Stream[rep.Empty, rep.GetReportContentResponse]
    ) -> None:
        await stream.recv_message()
        self.polls += 1
        if self.hang_poll:
            await asyncio.Event().wait()
        await stream.send_message(self._plugin.latest.value or rep.GetReportContentResponse())

    async def ListAndWatchReportContent(
        self, stream: Stream[rep.Empty, rep.GetReportContentResponse]
    ) -> None:
        await stream.recv_message()
        await stream.send_message(self._plugin.latest.value or rep.GetReportContentResponse())


class _EndingReporter(ReporterPlugin):
    hang_poll = False

    def services(self) -> list[Any]:
        self.service = _EndingService(self, self.hang_poll)
        return [self.service]


class _HangingReporter(_EndingReporter):
    hang_poll = True


class _StreamingService(_EndingService):
    """A stream that stays open (the SDK's), a poll that may hang."""

    async def ListAndWatchReportContent(
        self, stream: Stream[rep.Empty, rep.GetReportContentResponse]
    ) -> None:
        await self._plugin._stream_updates(stream)


class _StreamingHangingReporter(ReporterPlugin):
    def services(self) -> list[Any]:
        self.service = _StreamingService(self, hang_poll=True)
        return [self.service]


async def test_sdk_plugin_whose_stream_ends_still_reports_through_the_poll(
    bridge: GrpcBridge, registry: str, manager: PluginManager
) -> None:
    channel = manager.channel("ReporterPlugin")
    async with _EndingReporter.serve(name="ending", registry_dir=registry, bridge=bridge) as plugin:
        assert isinstance(plugin, _EndingReporter)
        await plugin.report([_item(1)])
        await wait_until(manager, lambda: "ending" in channel.value)
        await wait_until(manager, lambda: status_item(manager, "ending")["stream_state"] == "ended")
        assert channel.value["ending"].live
        await plugin.report([_item(2)])
        await wait_until(manager, lambda: _value(channel.value["ending"]) == 2)
        assert channel.value["ending"].live and channel.value["ending"].registered
        assert plugin.service.polls >= 1


async def test_a_poll_that_times_out_keeps_the_last_report_and_the_plugin_stops_being_live(
    bridge: GrpcBridge, registry: str, manager: PluginManager
) -> None:
    channel = manager.channel("ReporterPlugin")
    errors = _poll_errors()
    async with _HangingReporter.serve(name="hang", registry_dir=registry, bridge=bridge) as plugin:
        assert isinstance(plugin, _HangingReporter)
        await plugin.report([_item(5)])
        await wait_until(manager, lambda: "hang" in channel.value)
        # The stream delivered once and ended; the poll right after it never answers.
        await wait_until(manager, lambda: not channel.value["hang"].live)
        data = channel.value["hang"]
        assert data.registered and _value(data) == 5
        assert _poll_errors() >= errors + 1
        assert status_item(manager, "hang")["state"] == "registered"


async def test_a_plugin_streaming_and_polled_is_published_once_per_change(
    bridge: GrpcBridge, registry: str, manager: PluginManager
) -> None:
    """The poll of a streaming plugin that answers what it streamed publishes nothing new."""
    channel = manager.channel("ReporterPlugin")
    handler: Any = manager._handlers["ReporterPlugin"]
    async with ReporterPlugin.serve(name="both", registry_dir=registry, bridge=bridge) as plugin:
        await plugin.report([_item(3)])
        await wait_until(manager, lambda: "both" in channel.value)
        polls = handler.polls
        version = channel.version
        with trio.fail_after(WAIT):
            while handler.polls < polls + 3:
                await handler.changes.wait_newer(handler.changes.version)
        assert channel.version == version


async def test_a_hanging_plugin_does_not_hold_up_the_polls_of_the_others(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    # A streaming plugin whose poll hangs 8 s (a round of polls reaches it); the other plugin's
    # polls (every 0.2 s) must go on meanwhile.
    settings = fast_settings(registry, report_poll_interval=0.2, report_poll_timeout=8.0)
    manager = PluginManager(settings, bridge)
    await nursery.start(manager.run)
    channel = manager.channel("ReporterPlugin")
    async with (
        _StreamingHangingReporter.serve(
            name="hang", registry_dir=registry, bridge=bridge
        ) as hanging,
        _EndingReporter.serve(name="quick", registry_dir=registry, bridge=bridge) as quick,
    ):
        assert isinstance(hanging, _StreamingHangingReporter)
        assert isinstance(quick, _EndingReporter)
        await hanging.report([_item(1)])
        await quick.report([_item(1)])
        await wait_until(manager, lambda: {"hang", "quick"} <= set(channel.value))
        await wait_until(manager, lambda: hanging.service.polls >= 1)
        await quick.report([_item(2)])
        await wait_until(manager, lambda: _value(channel.value["quick"]) == 2, within=3.0)
        assert hanging.service.polls == 1  # still the first, hanging poll: not polled twice
