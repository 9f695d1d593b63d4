"""A plugin announcing a message far over `plugins.max_message_bytes` is refused from the gRPC
length prefix, before the body is buffered: on a stream, a reporter poll and registration's
GetInfo. The hostile plugin is its own process (tests/plugins/hostile_plugin.py), so the memory
measured here is the agent side's alone."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from grpclib.protocol import Buffer
from h2.errors import ErrorCodes
from prometheus_client import REGISTRY

from nodeagent.plugins import PluginManager
from nodeagent.rpc import GrpcBridge, MessageTooLarge
from nodeagent.rpc._grpc import limit_reads as _limit_reads
from nodeagent.sdk import ReporterPlugin
from tests.plugins.conftest import fast_settings
from tests.plugins.support import WAIT, report, report_of, status_item, wait_until

PLUGIN = Path(__file__).with_name("hostile_plugin.py")
REPO = Path(__file__).resolve().parents[2]
ANNOUNCED = 400 * 1024 * 1024
LIMIT = 4 * 1024 * 1024
# grpclib's HTTP/2 windows (stream and connection) are 4 MiB: the most a refused message can
# have sent before the agent stops granting window.
WINDOW = 4 * 1024 * 1024
# The agent side's resident memory may grow by at most this much while 400 MB are announced
# (one window of buffered data plus allocator noise); the old code grew by the whole message.
RSS_BOUND = 48 * 1024 * 1024


def _errors(kind: str) -> float:
    value = REGISTRY.get_sample_value("nodeagent_plugin_errors_total", {"kind": kind})
    return value or 0.0


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class _PeakRss:
    """The highest resident set size seen, sampled every 5 ms, above a baseline."""

    def __init__(self) -> None:
        self.baseline = _rss()
        self.peak = self.baseline

    async def run(self) -> None:
        while True:
            self.peak = max(self.peak, _rss())
            await trio.sleep(0.005)

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


class _Hostile:
    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = b""

    async def line(self, prefix: str) -> str:
        """The next stdout line starting with `prefix` (bounded wait)."""
        assert self.process.stdout is not None
        with trio.fail_after(WAIT * 3):
            while True:
                while b"\n" in self._buffer:
                    raw, self._buffer = self._buffer.split(b"\n", 1)
                    text = raw.decode()
                    if text.startswith(prefix):
                        return text
                chunk = await self.process.stdout.receive_some()
                assert chunk, f"hostile plugin exited before printing {prefix!r}"
                self._buffer += chunk

    async def sent(self) -> int:
        """Body bytes the plugin could write before the agent stopped it."""
        return int((await self.line("sent ")).split()[1])


@asynccontextmanager
async def _hostile(registry: str, name: str, mode: str) -> AsyncIterator[_Hostile]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = await trio.lowlevel.open_process(
        [sys.executable, str(PLUGIN), registry, name, mode, str(ANNOUNCED)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    hostile = _Hostile(process)
    try:
        await hostile.line("ready")
        yield hostile
    finally:
        assert process.stdin is not None
        await process.stdin.aclose()
        with trio.move_on_after(WAIT):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_oversized_stream_message_is_refused_before_its_body_is_buffered(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    manager = PluginManager(fast_settings(registry, max_message_bytes=LIMIT), bridge)
    await nursery.start(manager.run)
    channel = manager.channel("ReporterPlugin")
    too_large = _errors("message_too_large")
    async with ReporterPlugin.serve(name="polite", registry_dir=registry, bridge=bridge) as polite:
        await polite.publish_message(report("before", b"1"))
        await wait_until(manager, lambda: "polite" in channel.value)
        rss = _PeakRss()
        nursery.start_soon(rss.run)
        async with _hostile(registry, "hostile", "stream") as hostile:
            sent = await hostile.sent()
            # The stream was reset and reopened; the reopened stream is served.
            await wait_until(
                manager,
                lambda: (
                    "hostile" in channel.value
                    and report_of(channel.value["hostile"]).content[0].field[0].fieldName == "after"
                ),
            )
            item = status_item(manager, "hostile")
            assert item["messages_rejected"] == 1
            assert item["stream_restarts"] >= 1
            assert _errors("message_too_large") == too_large + 1
            # Flow control: no window was granted for the refused body beyond the first.
            assert sent <= WINDOW, sent
            # The other plugin is served throughout.
            await polite.publish_message(report("during", b"2"))
            await wait_until(
                manager,
                lambda: (
                    report_of(channel.value["polite"]).content[0].field[0].fieldName == "during"
                ),
            )
        assert rss.growth < RSS_BOUND, f"agent RSS grew by {rss.growth / 2**20:.1f} MiB"


async def test_oversized_poll_reply_is_refused_and_the_last_report_kept(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    manager = PluginManager(
        fast_settings(registry, max_message_bytes=LIMIT, report_poll_interval=0.2), bridge
    )
    await nursery.start(manager.run)
    channel = manager.channel("ReporterPlugin")
    too_large = _errors("message_too_large")
    rss = _PeakRss()
    nursery.start_soon(rss.run)
    async with _hostile(registry, "poller", "poll") as hostile:
        sent = await hostile.sent()
        await wait_until(manager, lambda: _errors("message_too_large") > too_large)
        assert sent <= WINDOW, sent
        await wait_until(manager, lambda: "poller" in channel.value)
        assert report_of(channel.value["poller"]).content[0].field[0].fieldName == "good"
        assert status_item(manager, "poller")["messages_rejected"] >= 1
    assert rss.growth < RSS_BOUND, f"agent RSS grew by {rss.growth / 2**20:.1f} MiB"


async def test_oversized_get_info_reply_fails_registration_without_buffering_it(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    manager = PluginManager(fast_settings(registry, max_message_bytes=LIMIT), bridge)
    await nursery.start(manager.run)
    get_info = _errors("get_info")
    rss = _PeakRss()
    nursery.start_soon(rss.run)
    async with _hostile(registry, "liar", "getinfo") as hostile:
        sent = await hostile.sent()
        await wait_until(manager, lambda: _errors("get_info") > get_info)
        assert sent <= WINDOW, sent
    assert rss.growth < RSS_BOUND, f"agent RSS grew by {rss.growth / 2**20:.1f} MiB"


class _FakeConnection:
    def __init__(self) -> None:
        self.acked: list[tuple[int, int]] = []

    def ack(self, stream_id: int, size: int) -> None:
        self.acked.append((stream_id, size))


class _FakeH2Stream:
    """grpclib's protocol Stream as `_limit_reads` uses it: a real Buffer, a reset, an ack."""

    def __init__(self) -> None:
        self.id = 7
        self.connection = _FakeConnection()
        self.buffer = Buffer(lambda size: self.connection.ack(self.id, size))
        self.closable = True
        self.resets: list[ErrorCodes] = []

    def reset_nowait(self, error_code: ErrorCodes = ErrorCodes.NO_ERROR) -> None:
        self.resets.append(error_code)
        self.closable = False

    async def recv_data(self, size: int) -> bytes:
        return await self.buffer.read(size)


async def test_a_refused_body_is_reset_and_its_buffered_bytes_credited_to_the_connection() -> None:
    # Deterministic: what the peer had already sent of the refused message when its prefix was
    # read must be handed back to the connection window, or every refusal would shrink the
    # window the plugin's next streams share, until the connection stalls.
    stream = _FakeH2Stream()
    _limit_reads(stream, 1024)  # type: ignore[arg-type]
    stream.buffer.add(b"\x00" + (5000).to_bytes(4, "big") + b"x" * 995, 1000)
    stream.buffer.add(b"y" * 3000, 3000)
    assert await stream.recv_data(5) == b"\x00" + (5000).to_bytes(4, "big")
    assert stream.connection.acked == [(7, 1000)]  # the prefix's frame, consumed normally
    with pytest.raises(MessageTooLarge) as info:
        await stream.recv_data(5000)
    assert (info.value.size, info.value.limit, info.value.status) == (
        5000,
        1024,
        "RESOURCE_EXHAUSTED",
    )
    assert stream.resets == [ErrorCodes.CANCEL]
    # The 3000 bytes still queued: credited at once (the 995 after the prefix were credited
    # with their frame); nothing more is read from the stream.
    assert stream.connection.acked == [(7, 1000), (7, 3000)]
    assert stream.buffer.unacked_size() == 0
    # A message within the limit on another stream is read as before.
    ok = _FakeH2Stream()
    _limit_reads(ok, 1024)  # type: ignore[arg-type]
    ok.buffer.add(b"z" * 1024, 1024)
    assert await ok.recv_data(1024) == b"z" * 1024
    assert ok.resets == []
