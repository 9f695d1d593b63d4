"""Issue 20 item 3, the stale poll: a reporter's GetReportContent poll that the OLD process
answers after its socket was recreated and the new process registered (same name, same path,
so the same endpoint fields) must count neither as the new registration's liveness nor as its
report. The real `PluginManager` and `ReporterHandler`, plugins answering through the fake bridge,
real socket files, the virtual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

from nodeagent.plugins.manager import PluginManager
from nodeagent.plugins.reporter_plugin import ReporterHandler
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from nodeagent.rpc.bridge import RpcError
from tests.support.fake_plugins import FakeBridge, FakeRegistration, listen, settings
from tests.support.wait import wait_until

from .test_probe_results_apply_to_their_generation import recreate

POLL_INTERVAL = 2.0


def report(value: str) -> rep.GetReportContentResponse:
    return rep.GetReportContentResponse(
        content=[
            rep.ReportContent(
                groupVersionKind={"group": "g", "version": "v1alpha1", "kind": "K"},
                field=[rep.ReportField(fieldName="from", value=f'"{value}"'.encode())],
            )
        ]
    )


@dataclass
class FakeReporter(FakeRegistration):
    """A reporter plugin process: no stream (UNIMPLEMENTED), GetReportContent answers
    `answers` in turn (an RpcError entry fails that poll); with `hold` set, polls wait for
    `poll_release` (announced by `poll_held`)."""

    answers: list[rep.GetReportContentResponse | RpcError] = field(default_factory=list)
    polls: int = 0
    hold: bool = False
    poll_held: trio.Event = field(default_factory=trio.Event)
    poll_release: trio.Event = field(default_factory=trio.Event)

    async def GetReportContent(self, request: rep.Empty) -> rep.GetReportContentResponse:
        self.polls += 1
        answer = self.answers.pop(0) if self.answers else RpcError("UNAVAILABLE", "no answer")
        if self.hold:
            self.poll_held.set()
            await self.poll_release.wait()
        if isinstance(answer, RpcError):
            raise answer
        return answer

    async def ListAndWatchReportContent(self, request: rep.Empty) -> None:
        raise AssertionError("opened through server_stream")


class ReporterBridge(FakeBridge):
    @asynccontextmanager
    async def server_stream(self, method: Any, request: Any) -> AsyncIterator[Any]:
        raise RpcError("UNIMPLEMENTED", "no stream")
        yield  # pragma: no cover - an async generator


def info() -> reg.PluginInfo:
    return reg.PluginInfo(type="ReporterPlugin", name="p", supported_versions=["v1alpha1"])


async def test_a_poll_answered_by_the_old_process_is_not_the_new_registrations(
    registry: Path, autojump_clock: trio.testing.MockClock
) -> None:
    bridge = ReporterBridge()
    plugin_settings = settings(
        registry, report_poll_interval=POLL_INTERVAL, report_poll_timeout=10.0
    )
    handler = ReporterHandler(bridge.as_bridge(), plugin_settings)
    path = registry / "p.sock"
    old = FakeReporter(info(), answers=[report("old-1"), report("old-2")])
    bridge.plugins[str(path)] = old
    manager = PluginManager(plugin_settings, bridge.as_bridge(), [handler])
    channel = manager.channel("ReporterPlugin")

    def shown() -> tuple[bool, bool, str]:
        data = channel.value["p"]
        assert isinstance(data.message, rep.GetReportContentResponse)
        value = data.message.content[0].field[0].value.decode()
        return data.registered, data.live, value

    with listen(path) as old_socket:
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            # Registered, its stream unimplemented: polled at once, live by its answer.
            await wait_until(lambda: "p" in channel.value, "the first poll answered", timeout=600)
            assert shown() == (True, True, '"old-1"')
            # The next poll reaches the old process, which answers only after it was replaced.
            old.hold = True
            await old.poll_held.wait()
            old_socket.close()
            new = FakeReporter(info(), answers=[RpcError("UNAVAILABLE", "still starting")])
            bridge.plugins[str(path)] = new
            with recreate(path):
                await wait_until(
                    lambda: len(handler.plugin_names()) == 1 and new.get_info_calls >= 1,
                    "the new socket asked for its info",
                    timeout=600,
                )
                await trio.testing.wait_all_tasks_blocked()
                # The new registration is polled at once, the old poll hanging or not.
                assert new.polls == 1
                assert shown() == (True, False, '"old-1"')  # the last report kept, not live
                old.poll_release.set()  # the old process answers "old-2"
                await trio.testing.wait_all_tasks_blocked()
                assert shown() == (True, False, '"old-1"')
            nursery.cancel_scope.cancel()
