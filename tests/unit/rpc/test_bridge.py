"""The bridge's promises, against real grpclib peers on real unix sockets.

Trio owns every call: cancelling it resets the stream and closes the channel on the asyncio side
within the shutdown deadline, and leaves no asyncio task or file descriptor behind; Trio code sees
only RpcError (an asyncio.CancelledError of the asyncio side included); the message limit is
enforced from the length prefix; every connection is checked; asyncio handlers reach Trio objects
through `run_in_trio`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import struct
import sys
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import trio
from grpclib.server import Stream

from nodeagent.core.latest import LatestValue
from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc as rep_grpc
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from nodeagent.rpc import (
    GrpcBridge,
    MessageTooLarge,
    RpcError,
    open_grpc_bridge,
    run_in_trio,
)
from nodeagent.rpc.bridge import _CLOSE_TIMEOUT, _STREAM_BUFFER, _grpc_module
from nodeagent.sdk import ReporterPlugin, ReportItem

STREAMS = 200


def report(field: str) -> rep.GetReportContentResponse:
    return rep.GetReportContentResponse(
        content=[
            rep.ReportContent(
                groupVersionKind={"group": "g", "version": "v1alpha1", "kind": "K"},
                field=[rep.ReportField(fieldType=rep.Status, fieldName=field, value=b"1")],
            )
        ]
    )


class Reporter(rep_grpc.ReporterPluginBase):
    """Streams `count` reports then stays open; records (in Trio) each stream it sees end."""

    def __init__(self, count: int = 1) -> None:
        self.count = count
        self.open = LatestValue(0)
        self.cancelled = LatestValue(0)
        self.huge_prefix = 0  # >0: announce a message of this size, send 16 bytes of it

    async def GetReportContent(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        await stream.send_message(report("poll"))

    async def ListAndWatchReportContent(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        if self.huge_prefix:
            await stream.send_initial_metadata()
            prefix = b"\x00" + struct.pack(">I", self.huge_prefix)
            await stream._stream.send_data(prefix + bytes(16))
            await asyncio.Event().wait()
        for i in range(self.count):
            await stream.send_message(report(f"m{i}"))
        await run_in_trio(increment, self.open)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await run_in_trio(increment, self.cancelled)
            raise


def increment(value: LatestValue[int]) -> None:
    # In the Trio thread: concurrent handlers each add one (read and set in one place).
    value.set(value.value + 1)


class Registration(reg_grpc.RegistrationBase):
    async def GetInfo(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        await stream.send_message(reg.PluginInfo(type="ReporterPlugin", name="x"))

    async def NotifyRegistrationStatus(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        await stream.send_message(reg.RegistrationStatusResponse())


@pytest.fixture
async def bridge() -> AsyncIterator[GrpcBridge]:
    async with open_grpc_bridge() as opened:
        # Started (the loop and its thread start on the first call), so that the descriptors
        # and tasks counted before a test's work are the loop's own.
        await asyncio_tasks(opened)
        yield opened


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


async def asyncio_tasks(bridge: GrpcBridge) -> int:
    async def count() -> int:
        return len(asyncio.all_tasks()) - 1  # not this one

    return await bridge.run_asyncio(count)


async def wait_value(value: LatestValue[int], at_least: int) -> None:
    while value.value < at_least:
        await value.wait_newer(value.version)


async def test_cancelling_a_stream_resets_it_and_closing_the_channel_closes_the_socket(
    bridge: GrpcBridge, registry: str
) -> None:
    plugin = Reporter()
    path = os.path.join(registry, "p.sock")
    fds_before = open_fds()
    async with bridge.serve([plugin], path):
        tasks_before = await asyncio_tasks(bridge)
        with trio.fail_after(_CLOSE_TIMEOUT):
            async with bridge.channel(path) as channel:
                stub = channel.stub(rep_grpc.ReporterPluginStub)
                with trio.CancelScope() as scope:
                    method = stub.ListAndWatchReportContent
                    async with bridge.server_stream(method, rep.Empty()) as replies:
                        async for message in replies:
                            assert message.content[0].field[0].fieldName == "m0"
                            scope.cancel()
                assert scope.cancelled_caught
                # The plugin saw its stream end (RST_STREAM), not just the agent stop reading.
                await wait_value(plugin.cancelled, 1)
                connected = open_fds()
            # The channel's socket is closed when its owner has left the block (the server's
            # end of the connection follows when it reads EOF).
            assert connected - open_fds()
        assert await asyncio_tasks(bridge) == tasks_before
    assert open_fds() == fds_before


async def test_200_cancelled_streams_leave_no_asyncio_task_or_descriptor(
    bridge: GrpcBridge, registry: str
) -> None:
    # Four plugins, 50 streams each (an HTTP/2 connection carries 100 concurrent streams).
    plugins = [Reporter() for _ in range(4)]
    paths = [os.path.join(registry, f"p{i}.sock") for i in range(len(plugins))]
    fds_before = open_fds()
    async with contextlib.AsyncExitStack() as servers:
        for plugin, path in zip(plugins, paths, strict=True):
            await servers.enter_async_context(bridge.serve([plugin], path))
        tasks_before = await asyncio_tasks(bridge)
        async with contextlib.AsyncExitStack() as channels:
            stubs = [
                (await channels.enter_async_context(bridge.channel(path))).stub(
                    rep_grpc.ReporterPluginStub
                )
                for path in paths
            ]

            async def consume(stub: Any, task_status: trio.TaskStatus[None]) -> None:
                async with bridge.server_stream(stub.ListAndWatchReportContent, rep.Empty()) as s:
                    await s.__anext__()
                    task_status.started()
                    await trio.sleep_forever()

            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    for i in range(STREAMS):
                        await nursery.start(consume, stubs[i % len(stubs)])
                    for plugin in plugins:
                        await wait_value(plugin.open, STREAMS // len(plugins))
                    # Every stream's pump and the plugin's handler are live on the loop now.
                    assert await asyncio_tasks(bridge) >= tasks_before + 2 * STREAMS
                    nursery.cancel_scope.cancel()
                # Each plugin saw each of its streams reset.
                for plugin in plugins:
                    await wait_value(plugin.cancelled, STREAMS // len(plugins))
            assert await asyncio_tasks(bridge) == tasks_before
    assert await asyncio_tasks(bridge) == 0
    assert open_fds() == fds_before


async def test_closing_the_bridge_stops_its_loop_and_thread() -> None:
    threads = threading.active_count()
    fds_before = open_fds()

    left: list[asyncio.Task[None]] = []

    async def left_behind() -> None:
        # A task its creator never stopped, holding sockets: the bridge's exit cancels it.
        ours, theirs = socket.socketpair()

        async def hold() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                ours.close()
                theirs.close()

        left.append(asyncio.ensure_future(hold()))

    async with open_grpc_bridge() as bridge:
        assert threading.active_count() == threads  # nothing started until the first call
        await bridge.run_asyncio(left_behind)
        assert threading.active_count() == threads + 1
        assert await asyncio_tasks(bridge) == 1
    assert threading.active_count() == threads
    assert open_fds() == fds_before


async def test_a_bridge_never_called_starts_no_loop_and_is_closed_after() -> None:
    threads = threading.active_count()
    fds_before = open_fds()
    async with open_grpc_bridge() as bridge:
        assert threading.active_count() == threads
        assert open_fds() == fds_before
    # Closed: a late call fails as every bridge failure does, with RpcError.
    with pytest.raises(RpcError, match="UNAVAILABLE"):
        await bridge.run_asyncio(_loop_turns, 1)
    assert threading.active_count() == threads


async def test_a_cancelled_error_of_the_asyncio_side_is_an_rpc_error(bridge: GrpcBridge) -> None:
    # asyncio.CancelledError is a BaseException: let through, it would cancel the caller's whole
    # task group (every plugin). Raised by the callee or by cancelling its task, it is an
    # RpcError, and the Trio caller's nursery goes on.
    async def raises() -> None:
        raise asyncio.CancelledError

    async def cancelled_under_it() -> None:
        asyncio.current_task().cancel()  # type: ignore[union-attr]
        await asyncio.sleep(0)

    async with trio.open_nursery():
        for fn in (raises, cancelled_under_it):
            with pytest.raises(RpcError) as info:
                await bridge.run_asyncio(fn)
            assert info.value.status == "CANCELLED"


async def test_a_stream_cancelled_on_the_asyncio_side_ends_with_an_rpc_error(
    bridge: GrpcBridge, registry: str
) -> None:
    plugin = Reporter()
    path = os.path.join(registry, "p.sock")

    async def cancel_pumps() -> int:
        pumps = [
            t
            for t in asyncio.all_tasks()
            if getattr(t.get_coro(), "__qualname__", "").endswith(".pump")
        ]
        for task in pumps:
            task.cancel()
        return len(pumps)

    async with bridge.serve([plugin], path), bridge.channel(path) as channel:
        stub = channel.stub(rep_grpc.ReporterPluginStub)
        async with bridge.server_stream(stub.ListAndWatchReportContent, rep.Empty()) as replies:
            await replies.__anext__()
            assert await bridge.run_asyncio(cancel_pumps) == 1
            with trio.fail_after(_CLOSE_TIMEOUT), pytest.raises(RpcError) as info:
                await replies.__anext__()
            assert info.value.status == "CANCELLED"
            # Over: the same answer again, never a hang.
            with pytest.raises(RpcError):
                await replies.__anext__()


async def test_grpc_failures_are_rpc_errors(bridge: GrpcBridge, registry: str) -> None:
    path = os.path.join(registry, "p.sock")
    async with bridge.channel(path) as channel:  # nothing listens
        stub = channel.stub(rep_grpc.ReporterPluginStub)
        with pytest.raises(RpcError) as info:
            await bridge.unary(stub.GetReportContent, rep.Empty(), timeout=1.0)
        assert info.value.status == "UNAVAILABLE"
    async with bridge.serve([Registration()], path), bridge.channel(path) as channel:
        stub = channel.stub(rep_grpc.ReporterPluginStub)
        with pytest.raises(RpcError):  # grpclib's answer has no content-type: UNKNOWN
            await bridge.unary(stub.GetReportContent, rep.Empty(), timeout=1.0)
        with pytest.raises(RpcError) as info:
            async with bridge.server_stream(stub.ListAndWatchReportContent, rep.Empty()) as s:
                await s.__anext__()
        assert info.value.status == "UNIMPLEMENTED"


async def test_the_limit_is_enforced_from_the_length_prefix(
    bridge: GrpcBridge, registry: str
) -> None:
    # The plugin announces 400 MB and sends 16 bytes of it, then nothing: a bridge that waited
    # for the body would wait forever; this one refuses the prefix.
    plugin = Reporter()
    plugin.huge_prefix = 400 * 1024 * 1024
    path = os.path.join(registry, "p.sock")
    async with bridge.serve([plugin], path), bridge.channel(path, max_message_bytes=1024) as ch:
        stub = ch.stub(rep_grpc.ReporterPluginStub)
        async with bridge.server_stream(stub.ListAndWatchReportContent, rep.Empty()) as replies:
            with trio.fail_after(_CLOSE_TIMEOUT), pytest.raises(MessageTooLarge) as info:
                await replies.__anext__()
    assert (info.value.size, info.value.limit) == (400 * 1024 * 1024, 1024)


async def test_every_connection_is_checked_before_use(bridge: GrpcBridge, registry: str) -> None:
    path = os.path.join(registry, "p.sock")
    checked: list[tuple[int, str]] = []
    refuse = False

    def check(sock: socket.socket, where: str) -> None:
        # The real peer's credentials of the very socket the calls will use.
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        checked.append((struct.unpack("3i", creds)[0], where))
        if refuse:
            raise RpcError("PERMISSION_DENIED", "peer refused")

    async with bridge.serve([Registration()], path):
        for _ in range(2):  # each channel is a new connection: checked again
            async with bridge.channel(path, check=check) as channel:
                stub = channel.stub(reg_grpc.RegistrationStub)
                await bridge.unary(stub.GetInfo, reg.InfoRequest(), timeout=1.0)
                await bridge.unary(stub.GetInfo, reg.InfoRequest(), timeout=1.0)
        assert checked == [(os.getpid(), path)] * 2
        refuse = True
        async with bridge.channel(path, check=check) as channel:
            stub = channel.stub(reg_grpc.RegistrationStub)
            with pytest.raises(RpcError) as info:
                await bridge.unary(stub.GetInfo, reg.InfoRequest(), timeout=1.0)
        assert info.value.status == "PERMISSION_DENIED"
        assert len(checked) == 3


async def test_run_in_trio_returns_raises_and_is_cancelled_with_its_caller(
    bridge: GrpcBridge,
) -> None:
    started, finished = trio.Event(), trio.Event()

    async def forever() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            finished.set()

    def fails() -> None:
        raise ValueError("bad")

    async def from_asyncio() -> tuple[int, str]:
        value: int = await run_in_trio(lambda: 41 + 1)
        try:
            await run_in_trio(fails)
        except ValueError as exc:
            error = str(exc)
        task = asyncio.ensure_future(run_in_trio(forever))
        await run_in_trio(started.wait)
        task.cancel()
        await asyncio.wait([task])
        await run_in_trio(finished.wait)
        return value, error

    with trio.fail_after(_CLOSE_TIMEOUT):
        assert await bridge.run_asyncio(from_asyncio) == (42, "bad")


async def test_run_in_trio_needs_a_bridge_loop() -> None:
    async def outside() -> None:
        await run_in_trio(lambda: None)

    with pytest.raises(RuntimeError, match="bridge"):
        await trio.to_thread.run_sync(asyncio.run, outside())


class Flood(rep_grpc.ReporterPluginBase):
    async def GetReportContent(self, stream: Stream[Any, Any]) -> None:
        raise NotImplementedError

    async def ListAndWatchReportContent(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        for i in range(FLOOD):
            await stream.send_message(report(f"m{i}"))


FLOOD = 1000


async def test_a_flood_is_read_ahead_a_bounded_batch_at_a_time_in_order(
    bridge: GrpcBridge, registry: str
) -> None:
    path = os.path.join(registry, "p.sock")
    async with bridge.serve([Flood()], path), bridge.channel(path) as channel:
        stub = channel.stub(rep_grpc.ReporterPluginStub)
        async with bridge.server_stream(stub.ListAndWatchReportContent, rep.Empty()) as replies:
            seen: list[str] = []
            most = 0
            async for message in replies:
                seen.append(message.content[0].field[0].fieldName)
                most = max(most, len(replies._inbox._items))
                if len(seen) % 100 == 0:
                    # A slow consumer: the pump fills its buffer and waits (flow control then
                    # holds the plugin back) rather than reading the whole flood into memory.
                    await bridge.run_asyncio(_loop_turns, 50)
    assert seen == [f"m{i}" for i in range(FLOOD)]
    assert most <= _STREAM_BUFFER


async def _loop_turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_an_sdk_plugin_serves_on_a_bridge_of_its_own(registry: str) -> None:
    # The SDK's serving side (its own bridge when none is given) against the agent's side.
    threads = threading.active_count()
    item = ReportItem(
        group="g", version="v1alpha1", kind="K", field_type="Status", field_name="f", value=1
    )
    with trio.fail_after(10):
        async with (
            open_grpc_bridge() as agent,
            ReporterPlugin.serve(name="sdk", registry_dir=registry) as plugin,
            agent.channel(plugin.socket_path) as channel,
        ):
            assert threading.active_count() == threads + 2  # two bridges, two loop threads
            registration = channel.stub(reg_grpc.RegistrationStub)
            info = await agent.unary(registration.GetInfo, reg.InfoRequest(), timeout=5)
            assert (info.type, info.name) == ("ReporterPlugin", "sdk")
            await agent.unary(
                registration.NotifyRegistrationStatus,
                reg.RegistrationStatus(plugin_registered=True),
                timeout=5,
            )
            assert plugin.registered  # set in Trio before the reply was sent
            await plugin.report([item])
            method = channel.stub(rep_grpc.ReporterPluginStub).ListAndWatchReportContent
            async with agent.server_stream(method, rep.Empty()) as replies:
                async for message in replies:
                    assert message.content[0].field[0].fieldName == "f"
                    break
    assert threading.active_count() == threads
    assert not await trio.Path(plugin.socket_path).exists()


def drain(sock: socket.socket) -> bool:
    """Read what `sock` has without waiting: True if the peer closed its end (EOF or reset)."""
    sock.setblocking(False)
    try:
        while sock.recv(1 << 16):
            pass
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    return True


@contextlib.contextmanager
def unraisable_and_resource_warnings() -> Iterator[list[str]]:
    """What a garbage collection inside the block reports: unraisable errors (a deallocator's)
    and ResourceWarnings (an unclosed socket or transport)."""
    reported: list[str] = []
    hook = sys.unraisablehook

    def record(info: Any) -> None:
        reported.append(f"{info.exc_type.__name__}: {info.exc_value}")

    sys.unraisablehook = record
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            yield reported
            gc.collect()
        reported.extend(str(w.message) for w in caught if w.category is ResourceWarning)
    finally:
        sys.unraisablehook = hook


async def test_leaving_serve_closes_every_connection_the_server_accepted(
    bridge: GrpcBridge, registry: str
) -> None:
    # grpclib's close() leaves accepted connections open: on 3.12+ asyncio then waited for the
    # agent to hang up (never, while it keeps its channel: serve's exit hung 5 s, then gave up),
    # and on 3.11 their sockets outlived the server until the garbage collector found them.
    path = os.path.join(registry, "p.sock")
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        async with bridge.channel(path) as channel:
            stub = channel.stub(reg_grpc.RegistrationStub)
            async with bridge.serve([Registration()], path):
                await bridge.unary(stub.GetInfo, reg.InfoRequest(), timeout=1.0)
                raw.connect(path)
                await bridge.run_asyncio(_loop_turns, 5)  # accepted: the server wrote SETTINGS
                assert not drain(raw)
            # The server's end of both connections is closed by the time serve() returns.
            assert drain(raw)
            with pytest.raises(RpcError) as info:
                await bridge.unary(stub.GetInfo, reg.InfoRequest(), timeout=1.0)
            assert info.value.status == "UNAVAILABLE"
    finally:
        raw.close()


async def test_a_connection_accepted_as_the_server_stops_is_closed_with_it(
    bridge: GrpcBridge, registry: str
) -> None:
    # The race behind test_upstream_layout's failures on CPython 3.15 (a plugin's server closing
    # while the agent's scan dials it): asyncio accepts a connection in one callback and makes
    # its transport in a task that runs a loop pass later. Had the server closed in between,
    # that transport failed to attach to it and was left, socket open, to the garbage
    # collector, which on 3.12+ woke the closed server a second time (an unraisable TypeError
    # in Server._wakeup) and on 3.11 reported an unclosed transport.
    grpc = _grpc_module()
    path = os.path.join(registry, "p.sock")
    clients: list[socket.socket] = []

    async def race() -> None:
        server = grpc.Server([Registration()])
        await server.start(path=path)
        for _ in range(2):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            clients.append(client)
            client.connect(path)  # queued in the listening socket's backlog
        # Pass 1: the loop sees the listening socket readable; pass 2: its callback accepts
        # both and creates their transport tasks, which would run after this one's next step.
        await _loop_turns(2)
        await server.stop()  # what serve() does on exit

    try:
        with unraisable_and_resource_warnings() as reported:
            with trio.fail_after(_CLOSE_TIMEOUT):
                await bridge.run_asyncio(race)
            assert [drain(client) for client in clients] == [True, True]
        assert reported == []
    finally:
        for client in clients:
            client.close()
