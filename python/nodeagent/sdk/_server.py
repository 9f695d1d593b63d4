"""What every SDK plugin shares: its socket, the Registration service and a latest value."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import AsyncIterator, Sequence
from typing import Any, Generic, TypeVar

import trio
from google.protobuf.message import Message
from grpclib.server import Stream

from nodeagent.core.latest import LatestValue
from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.rpc.bridge import GrpcBridge, open_grpc_bridge, run_in_trio

M = TypeVar("M", bound=Message)


def remove_stale_socket(path: str) -> None:
    """Remove a socket left by an earlier run; refuse to delete anything that is not a socket."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(f"{path} exists and is not a socket")
    os.unlink(path)


class RegistrationServicer(reg_grpc.RegistrationBase):
    """pluginregistration.Registration: answers GetInfo, records the agent's verdict."""

    def __init__(self, info: reg.PluginInfo) -> None:
        self.info = info
        self.status: LatestValue[reg.RegistrationStatus | None] = LatestValue(None)

    async def GetInfo(self, stream: Stream[reg.InfoRequest, reg.PluginInfo]) -> None:
        await stream.recv_message()
        await stream.send_message(self.info)

    async def NotifyRegistrationStatus(
        self, stream: Stream[reg.RegistrationStatus, reg.RegistrationStatusResponse]
    ) -> None:
        status = await stream.recv_message()
        assert status is not None  # grpclib delivers the one request of a unary call
        # A Trio object: set from the Trio thread (this handler runs on the bridge's loop).
        await run_in_trio(self.status.set, status)
        await stream.send_message(reg.RegistrationStatusResponse())


class PluginServer(Generic[M]):
    """A running plugin: `latest` is what its list-and-watch stream sends."""

    plugin_type: str = ""

    def __init__(self, name: str, socket_path: str, endpoint: str, versions: Sequence[str]) -> None:
        self.name = name
        self.socket_path = socket_path
        self.endpoint = endpoint
        self.latest: LatestValue[M | None] = LatestValue(None)
        self.registration = RegistrationServicer(
            reg.PluginInfo(
                type=self.plugin_type,
                name=name,
                endpoint=endpoint,
                supported_versions=list(versions),
            )
        )

    @property
    def registered(self) -> bool:
        """Whether the agent's last NotifyRegistrationStatus said the plugin is registered."""
        status = self.registration.status.value
        return status is not None and status.plugin_registered

    async def wait_registration(self) -> reg.RegistrationStatus:
        """Wait for the agent's next NotifyRegistrationStatus and return it."""
        _, status = await self.registration.status.wait_newer(self.registration.status.version)
        assert status is not None
        return status

    async def wait_registered(self) -> None:
        """Wait until the agent has told this plugin it is registered."""
        while not self.registered:
            await self.registration.status.wait_newer(self.registration.status.version)

    async def publish_message(self, message: M) -> None:
        """Send `message` as the plugin's whole state on every open stream (newest wins)."""
        self.latest.set(message)
        await trio.lowlevel.checkpoint()

    async def _stream_updates(self, stream: Stream[Any, Any]) -> None:
        """The body of a list-and-watch handler: send every new state until the agent leaves."""
        await stream.recv_message()
        version = 0
        while True:
            version, message = await run_in_trio(self.latest.wait_newer, version)
            assert message is not None  # version > 0 means something was published
            await stream.send_message(message)

    def services(self) -> list[Any]:
        raise NotImplementedError


@contextlib.asynccontextmanager
async def serving(
    plugin: PluginServer[Any], bridge: GrpcBridge | None, *, separate_endpoint: bool
) -> AsyncIterator[None]:
    """Serve `plugin` until the block exits, then remove its socket(s)."""
    if bridge is None:
        async with open_grpc_bridge() as own, _serving(plugin, own, separate_endpoint):
            yield
    else:
        async with _serving(plugin, bridge, separate_endpoint):
            yield


@contextlib.asynccontextmanager
async def _serving(
    plugin: PluginServer[Any], bridge: GrpcBridge, separate_endpoint: bool
) -> AsyncIterator[None]:
    paths = [plugin.socket_path] + ([plugin.endpoint] if separate_endpoint else [])
    for path in paths:
        _make_dir(os.path.dirname(path))
        remove_stale_socket(path)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if separate_endpoint:
                # The service socket first: the agent may dial it as soon as it sees the other.
                await stack.enter_async_context(bridge.serve(plugin.services(), plugin.endpoint))
                services = [plugin.registration]
            else:
                services = [plugin.registration, *plugin.services()]
            await stack.enter_async_context(bridge.serve(services, plugin.socket_path))
            yield
    finally:
        for path in paths:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(path)  # already gone, possibly with its directory


@contextlib.asynccontextmanager
async def socket_served(bridge: GrpcBridge, services: list[Any], path: str) -> AsyncIterator[None]:
    """Serve `services` on unix socket `path` (a stale socket replaced) until the block exits,
    then remove the socket."""
    _make_dir(os.path.dirname(path))
    remove_stale_socket(path)
    try:
        async with bridge.serve(services, path):
            yield
    finally:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.unlink(path)


def _make_dir(path: str) -> None:
    os.makedirs(path, mode=0o750, exist_ok=True)
