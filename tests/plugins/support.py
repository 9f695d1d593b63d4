"""Helpers for the end-to-end plugin tests: waiting on manager state, scripted plugins."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from grpclib import GRPCError
from grpclib.const import Status
from grpclib.server import Stream

from nodeagent.core.latest import LatestValue
from nodeagent.plugins import PluginData, PluginManager
from nodeagent.protos.dra.v1alpha3 import api_pb2 as dra
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc as rep_grpc
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from nodeagent.rpc import run_in_trio

WAIT = 10.0  # bound on every real-time wait: generous for a loaded 2-core machine


async def wait_until(
    manager: PluginManager, predicate: Callable[[], bool], *, within: float = WAIT
) -> None:
    """Wait (bounded) until `predicate()` holds, re-checking on every state change the manager
    or its handlers announce."""
    sources: list[LatestValue[Any]] = [manager.changes]
    sources += [h.changes for h in manager._handlers.values() if hasattr(h, "changes")]
    with trio.fail_after(within):
        while not predicate():
            versions = [s.version for s in sources]
            async with trio.open_nursery() as nursery:
                for source, version in zip(sources, versions, strict=True):
                    nursery.start_soon(_wait_then_cancel, source, version, nursery)


async def _wait_then_cancel(source: LatestValue[Any], version: int, nursery: trio.Nursery) -> None:
    await source.wait_newer(version)
    nursery.cancel_scope.cancel()


def plugin_status(manager: PluginManager, name: str) -> dict[str, Any] | None:
    for item in manager.status():
        if item["name"] == name:
            return item
    return None


def state_of(manager: PluginManager, name: str) -> str | None:
    item = plugin_status(manager, name)
    return None if item is None else item["state"]


def status_item(manager: PluginManager, name: str) -> dict[str, Any]:
    """`plugin_status` of a plugin the test knows is there."""
    item = plugin_status(manager, name)
    assert item is not None, f"no plugin {name!r} in the manager's status"
    return item


# PluginData holds any plugin type's message: these give a test the one it expects, typed.
def report_of(data: PluginData) -> rep.GetReportContentResponse:
    assert isinstance(data.message, rep.GetReportContentResponse), type(data.message)
    return data.message


def resources_of(data: PluginData) -> dra.NodeListAndWatchResourcesResponse:
    assert isinstance(data.message, dra.NodeListAndWatchResourcesResponse), type(data.message)
    return data.message


def inventory_of(data: PluginData) -> device_pb2.Inventory:
    assert isinstance(data.message, device_pb2.Inventory), type(data.message)
    return data.message


@dataclass
class ScriptedRegistration(reg_grpc.RegistrationBase):
    """A Registration service whose answers a test controls (asyncio side, on the bridge loop)."""

    info: reg.PluginInfo
    get_info_delay: float = 0.0
    fail_get_info: bool = False
    get_info_calls: int = 0
    statuses: list[reg.RegistrationStatus] = field(default_factory=list)
    notified: LatestValue[int] = field(default_factory=lambda: LatestValue(0))
    answered: LatestValue[int] = field(default_factory=lambda: LatestValue(0))

    async def GetInfo(self, stream: Stream[reg.InfoRequest, reg.PluginInfo]) -> None:
        await stream.recv_message()
        self.get_info_calls += 1
        if self.get_info_delay:
            await asyncio.sleep(self.get_info_delay)
        if self.fail_get_info:
            raise GRPCError(Status.UNAVAILABLE, "scripted failure")
        await stream.send_message(self.info)
        await run_in_trio(self.answered.set, self.answered.value + 1)  # a Trio object

    async def wait_answered(self, count: int) -> None:
        """Until GetInfo (registration or probe) has been answered `count` times in all."""
        with trio.fail_after(WAIT):
            while self.answered.value < count:
                await self.answered.wait_newer(self.answered.version)

    async def NotifyRegistrationStatus(
        self, stream: Stream[reg.RegistrationStatus, reg.RegistrationStatusResponse]
    ) -> None:
        status = await stream.recv_message()
        assert status is not None
        self.statuses.append(status)
        await stream.send_message(reg.RegistrationStatusResponse())
        await run_in_trio(self.notified.set, len(self.statuses))

    async def wait_notified(self, count: int = 1) -> reg.RegistrationStatus:
        with trio.fail_after(WAIT):
            while len(self.statuses) < count:
                await self.notified.wait_newer(self.notified.version)
        return self.statuses[count - 1]


def report(field_name: str, value: bytes) -> rep.GetReportContentResponse:
    return rep.GetReportContentResponse(
        content=[
            rep.ReportContent(
                groupVersionKind={"group": "g", "version": "v1alpha1", "kind": "K"},
                field=[rep.ReportField(fieldType=rep.Status, fieldName=field_name, value=value)],
            )
        ]
    )


@dataclass
class CrashingReporter(rep_grpc.ReporterPluginBase):
    """A reporter whose stream sends one message and then fails, `crashes` times, then streams
    normally (and stays open)."""

    crashes: int
    calls: int = 0

    async def GetReportContent(
        self, stream: Stream[rep.Empty, rep.GetReportContentResponse]
    ) -> None:
        raise GRPCError(Status.UNIMPLEMENTED)

    async def ListAndWatchReportContent(
        self, stream: Stream[rep.Empty, rep.GetReportContentResponse]
    ) -> None:
        await stream.recv_message()
        self.calls += 1
        await stream.send_message(report("call", str(self.calls).encode()))
        if self.calls <= self.crashes:
            raise RuntimeError("plugin crashed mid-stream")
        await asyncio.Event().wait()
