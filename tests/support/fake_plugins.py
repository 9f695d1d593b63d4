"""Fakes for the plugin manager's pieces: a bridge whose plugins answer from memory, a handler
that records its calls. Real unix sockets stand in for plugin sockets where the code dials them
(the path and peer checks)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import trio

from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.plugins.handler import PluginEndpoint, PluginValidationError
from nodeagent.plugins.settings import PluginSettings
from nodeagent.plugins.state import (
    ActualPlugin,
    Caches,
    DesiredPlugin,
    PluginRecord,
    SocketIdentity,
)
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.rpc.bridge import GrpcBridge, RpcError

PLUGIN_TYPE = "FakePlugin"


def settings(registry: Path, **overrides: Any) -> PluginSettings:
    values: dict[str, Any] = {
        "registry_dir": str(registry),
        "scan_interval": 1.0,
        "probe_interval": 5.0,
        "probe_failures": 2,
        "registration_backoff_initial": 0.5,
        "registration_backoff_max": 4.0,
    }
    values.update(overrides)
    result = PluginSettings(**values)
    result.validate()
    return result


def listen(path: Path) -> socket.socket:
    """A real listening unix socket: the peer check connects to it (backlog, no accept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    return sock


def identity(n: int) -> SocketIdentity:
    return SocketIdentity(device=1, inode=n, ctime_ns=n)


@dataclass
class FakeRegistration:
    """A plugin's Registration service: GetInfo answers `info` (or raises `error`).

    GetInfo call number `hold_from` (1-based) and later ones wait for `release` (a probe in
    flight while the test changes the world); `held` is set when the first of them waits.
    `calls` announces every call, so a test can wait for the n-th."""

    info: reg.PluginInfo
    error: RpcError | None = None
    notified: list[reg.RegistrationStatus] = field(default_factory=list)
    get_info_calls: int = 0
    hold_from: int = 0
    release: trio.Event = field(default_factory=trio.Event)
    held: trio.Event = field(default_factory=trio.Event)
    calls: LatestValue[int] = field(default_factory=lambda: LatestValue(0))

    async def GetInfo(self, request: reg.InfoRequest) -> reg.PluginInfo:
        self.get_info_calls += 1
        self.calls.set(self.get_info_calls)
        if self.hold_from and self.get_info_calls >= self.hold_from:
            self.held.set()
            await self.release.wait()
        if self.error is not None:
            raise self.error
        return self.info

    async def wait_calls(self, count: int) -> None:
        """Until GetInfo has been called `count` times in all (registrations and probes)."""
        with trio.fail_after(600):  # virtual seconds under the autojump clock
            while self.calls.value < count:
                await self.calls.wait_newer(self.calls.version)

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus
    ) -> reg.RegistrationStatusResponse:
        self.notified.append(request)
        return reg.RegistrationStatusResponse()


_GONE = FakeRegistration(reg.PluginInfo(), RpcError("UNAVAILABLE", "no such plugin"))


class _Channel:
    def __init__(self, plugin: FakeRegistration) -> None:
        self._plugin = plugin

    def stub(self, stub_type: type[Any]) -> FakeRegistration:
        return self._plugin


class FakeBridge:
    """`plugins` by socket path; a socket without one fails every call (UNAVAILABLE)."""

    def __init__(self) -> None:
        self.plugins: dict[str, FakeRegistration] = {}
        self.connects: list[str] = []

    @asynccontextmanager
    async def channel(self, path: str, **_: Any) -> AsyncIterator[_Channel]:
        yield _Channel(self.plugins.get(path, _GONE))

    async def connect(self, channel: _Channel, *, within: float) -> None:
        plugin = channel.stub(object)
        if plugin is _GONE:
            raise RpcError("UNAVAILABLE", "cannot dial")

    async def unary(self, method: Any, request: Any, *, timeout: float) -> Any:  # noqa: ASYNC109 -- the bridge's signature
        return await method(request)

    def as_bridge(self) -> GrpcBridge:
        return cast(GrpcBridge, self)


class FakeHandler:
    """A handler of PLUGIN_TYPE recording its calls; `register_gate` holds Register open."""

    plugin_type = PLUGIN_TYPE

    def __init__(self) -> None:
        self.latest: LatestValue[Mapping[str, PluginData]] = LatestValue({})
        self.registered: list[PluginEndpoint] = []
        self.deregistered: list[PluginEndpoint] = []
        self.validate_error = ""
        self.register_error: Exception | None = None
        self.deregister_error: Exception | None = None
        self.register_gate: trio.Event | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    def validate(self, plugin: PluginEndpoint) -> None:
        if self.validate_error:
            raise PluginValidationError(self.validate_error)

    async def register(self, plugin: PluginEndpoint) -> None:
        if self.register_gate is not None:
            await self.register_gate.wait()
        if self.register_error is not None:
            raise self.register_error
        self.registered.append(plugin)

    async def deregister(self, plugin: PluginEndpoint) -> None:
        self.deregistered.append(plugin)
        if self.deregister_error is not None:
            raise self.deregister_error

    def plugin_status(self, name: str, *, message: bool = True) -> dict[str, Any] | None:
        return None

    def plugin_names(self) -> list[str]:
        return []


class Kicks:
    """Counts the callbacks the pieces make."""

    def __init__(self) -> None:
        self.kicks = 0
        self.changes = 0

    def kick(self) -> None:
        self.kicks += 1

    def changed(self) -> None:
        self.changes += 1


def record(caches: Caches, socket_path: str, generation: int, **fields: Any) -> PluginRecord:
    entry = caches.records[socket_path] = PluginRecord(socket_path, generation, **fields)
    return entry


class FakeExecutor:
    """Records the operations started; they never finish unless a test says so."""

    def __init__(self) -> None:
        self.registers: list[DesiredPlugin] = []
        self.unregisters: list[ActualPlugin] = []
        self.busy_sockets: set[str] = set()

    def busy(self, socket: str) -> bool:
        return socket in self.busy_sockets

    def start_register(self, nursery: trio.Nursery, wanted: DesiredPlugin) -> None:
        self.busy_sockets.add(wanted.socket)
        self.registers.append(wanted)

    def start_unregister(self, nursery: trio.Nursery, registered: ActualPlugin) -> None:
        self.busy_sockets.add(registered.socket)
        self.unregisters.append(registered)
