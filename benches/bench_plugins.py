"""Plugin message throughput and latency: the gRPC bridge + PluginManager (what nodeagent does)
against plain asyncio grpclib clients without the bridge, side by side, for 1, 10 and 100
plugins streaming at once.

Two bridge designs run the same PluginManager code:

- thread (what `nodeagent.rpc` is): asyncio in a thread of its own, Trio in the main thread
  (`trio.run`), hops by `loop.call_soon_threadsafe` / `TrioToken.run_sync_soon`, streams pumped
  in batches;
- guest (the prototype of the other design, `_GuestBridge` below): Trio as a guest of the
  asyncio loop (`trio.lowlevel.start_guest_run`), one thread, hops by plain callbacks.

Each plugin is a grpclib ReporterPlugin server on its own unix socket. Two phases per run:

- burst (throughput): on "go" every plugin sends its share of BURST messages as fast as flow
  control allows; throughput = messages / time from "go" to the last message consumed;
- paced (latency): then every plugin sends its share of PACED messages spread out so that all
  plugins together send PACED_RATE messages/s (no queueing); latency = plugin send -> consumer.
  For nodeagent the consumer is a reader of the ReporterPlugin latest-value channel; for the
  baseline it is the client loop right after validating the message.

Every run has the GIL switch interval `nodeagent run` sets once started (1 ms: the bridge's loop
thread and Trio's hand the GIL to each other sooner than with CPython's 5 ms).

Run: .venv/bin/python -m pytest benches/bench_plugins.py --benchmark-only
Messages/s, p50/p99 latency of each and the ratios are printed at the end of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import trio
from grpclib.client import Channel
from grpclib.server import Server, Stream

from benches.report import print_uncaptured
from nodeagent.plugins import PluginManager, PluginSettings
from nodeagent.plugins.reporter_plugin import validate_report
from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc as rep_grpc
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from nodeagent.rpc import GrpcBridge, open_grpc_bridge
from nodeagent.rpc import bridge as bridge_module
from nodeagent.service.agent import LOOP_SWITCH_INTERVAL

BURST = 6000  # messages per run, split across the plugins
PACED = 600
PACED_RATE = 400.0  # messages/s, all plugins together
PLUGIN_COUNTS = (1, 10, 100)


def _message(phase: str, seq: int) -> rep.GetReportContentResponse:
    # The value is the send time in ns: an int is valid JSON, so validation passes.
    stamp = str(time.perf_counter_ns()).encode()
    return rep.GetReportContentResponse(
        content=[
            rep.ReportContent(
                groupVersionKind={"group": "g", "version": "v1alpha1", "kind": "K"},
                field=[
                    rep.ReportField(fieldType=rep.Status, fieldName=f"{phase}{seq}", value=stamp),
                    rep.ReportField(fieldType=rep.Status, fieldName="load", value=b'{"l":1}'),
                ],
            )
        ]
    )


def _latency_ms(message: Any, now_ns: int) -> float | None:
    """Send -> now for a paced-phase message, None for a burst one."""
    if not message.content:
        return None  # the manager's GetReportContent poll, answered empty here
    field = message.content[0].field[0]
    if not field.fieldName.startswith("p"):
        return None
    return (now_ns - int(field.value)) / 1e6


class _Plugin(reg_grpc.RegistrationBase, rep_grpc.ReporterPluginBase):
    """Registration + ReporterPlugin streaming the two phases when told to."""

    def __init__(self, name: str, plugins: int, burst: asyncio.Event, paced: asyncio.Event) -> None:
        self.name = name
        self.burst_count = BURST // plugins
        self.paced_count = PACED // plugins
        self.interval = plugins / PACED_RATE
        self.burst = burst
        self.paced = paced

    def __mapping__(self) -> dict[str, Any]:
        return {
            **reg_grpc.RegistrationBase.__mapping__(self),
            **rep_grpc.ReporterPluginBase.__mapping__(self),
        }

    async def GetInfo(self, stream: Stream[reg.InfoRequest, reg.PluginInfo]) -> None:
        await stream.recv_message()
        await stream.send_message(
            reg.PluginInfo(type="ReporterPlugin", name=self.name, supported_versions=["v1alpha1"])
        )

    async def NotifyRegistrationStatus(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        await stream.send_message(reg.RegistrationStatusResponse())

    async def GetReportContent(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        await stream.send_message(rep.GetReportContentResponse())

    async def ListAndWatchReportContent(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        await self.burst.wait()
        for seq in range(self.burst_count):
            await stream.send_message(_message("b", seq))
        await self.paced.wait()
        # Spread the plugins over one interval so they do not all send at the same instant.
        await asyncio.sleep(self.interval * (hash(self.name) % 1000) / 1000)
        for seq in range(self.paced_count):
            await stream.send_message(_message("p", seq))
            await asyncio.sleep(self.interval)
        await asyncio.Event().wait()  # a watch stays open


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


Result = tuple[float, list[float]]  # burst seconds, paced latencies (ms)


# -- nodeagent: PluginManager on the bridge ----------------------------------------------------


class _GuestBridge(GrpcBridge):
    """Design (a), prototyped for this bench: Trio runs as a guest of the asyncio loop, in its
    thread, so both hops are plain callbacks (Trio objects can be touched from asyncio callbacks:
    Trio's run context belongs to the thread)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken, nursery: trio.Nursery
    ) -> None:
        super().__init__(token, nursery)
        bridge_module._import_asyncio()
        self._loop = loop  # the host loop, already running: `_started` starts no thread
        bridge_module._BRIDGES[loop] = self

    def _to_loop(self, fn: Callable[..., object], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon(fn, *args)

    def _to_trio(self, fn: Callable[..., object], *args: Any) -> None:
        fn(*args)

    def _inbox(self) -> bridge_module._Inbox:
        return _CallbackInbox(self)


class _CallbackInbox(bridge_module._Inbox):
    """The guest prototype's stream hand-over: the consumer parks on a Trio Event that the pump
    sets through `_to_trio` (a plain call here: one thread), not on the thread bridge's eventfd
    (which in guest mode would go through Trio's I/O thread and back)."""

    def __init__(self, bridge: GrpcBridge) -> None:
        super().__init__(bridge)
        self._waiter: trio.Event | None = None

    def push(self, item: Any, *, last: bool = False) -> asyncio.Future[None] | None:
        self._items.append(item)
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._bridge._to_trio(waiter.set)
        if not last and len(self._items) >= bridge_module._STREAM_BUFFER:
            room = self._room = asyncio.get_running_loop().create_future()
            return room
        return None

    async def get(self) -> Any:
        while not self._items:
            waiter = self._waiter = trio.Event()
            await waiter.wait()
        item = self._items.popleft()
        if self._room is not None and len(self._items) <= bridge_module._STREAM_BUFFER // 2:
            room, self._room = self._room, None
            self._bridge._to_loop(bridge_module._resolve, room)
        return item


@contextlib.asynccontextmanager
async def _open_guest_bridge() -> AsyncIterator[GrpcBridge]:
    loop = asyncio.get_running_loop()  # the host loop: a guest tick runs inside its callbacks
    async with trio.open_nursery() as nursery:
        yield _GuestBridge(loop, trio.lowlevel.current_trio_token(), nursery)
        nursery.cancel_scope.cancel()


def _run_guest(plugins: int, directory: str) -> Result:
    async def host() -> Result:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(
            _run_bridge,
            plugins,
            directory,
            _open_guest_bridge,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=done.set_result,
            host_uses_signal_set_wakeup_fd=True,
        )
        result: Result = (await done).unwrap()
        return result

    return asyncio.run(host())


async def _new_event() -> asyncio.Event:
    return asyncio.Event()


async def _set(event: asyncio.Event) -> None:
    event.set()


async def _run_bridge(
    plugins: int,
    directory: str,
    opener: Callable[[], contextlib.AbstractAsyncContextManager[GrpcBridge]] = open_grpc_bridge,
) -> Result:
    # No rate limit on processing: the burst measures how fast messages are taken in (a message
    # superseded before it was processed counts as taken: the newest wins).
    settings = PluginSettings(
        registry_dir=directory, scan_interval=0.05, probe_interval=60.0, stream_min_interval=0.0
    )
    burst_total = (BURST // plugins) * plugins
    total = burst_total + (PACED // plugins) * plugins
    latencies: list[float] = []
    async with opener() as bridge, trio.open_nursery() as nursery:
        burst = await bridge.run_asyncio(_new_event)
        paced = await bridge.run_asyncio(_new_event)
        async with contextlib.AsyncExitStack() as servers:
            for i in range(plugins):
                plugin = _Plugin(f"p{i}", plugins, burst, paced)
                path = os.path.join(directory, f"p{i}.sock")
                await servers.enter_async_context(bridge.serve([plugin], path))
            manager = PluginManager(settings, bridge)
            await nursery.start(manager.run)
            handler: Any = manager._handlers["ReporterPlugin"]

            def streams_open() -> int:
                names = handler.plugin_names()
                return sum(handler._entries[n].stream.state == "open" for n in names)

            while streams_open() < plugins:
                await handler.changes.wait_newer(handler.changes.version)
            channel = manager.channel("ReporterPlugin")
            start = time.perf_counter()
            await bridge.run_asyncio(_set, burst)
            version = channel.version
            while handler.messages_received + handler.messages_skipped < burst_total:
                version, _ = await channel.wait_newer(version)
            elapsed = time.perf_counter() - start
            await bridge.run_asyncio(_set, paced)
            seen: dict[str, Any] = {}
            while handler.messages_received + handler.messages_skipped < total:
                version, value = await channel.wait_newer(version)
                now = time.perf_counter_ns()
                for name, data in value.items():
                    if seen.get(name) is not data.message:
                        seen[name] = data.message
                        latency = _latency_ms(data.message, now)
                        if latency is not None:
                            latencies.append(latency)
            nursery.cancel_scope.cancel()
    return elapsed, latencies


# -- baseline: plain asyncio grpclib clients, no bridge ------------------------------------------


async def _run_asyncio(plugins: int, directory: str) -> Result:
    burst, paced = asyncio.Event(), asyncio.Event()
    servers = []
    for i in range(plugins):
        server = Server([_Plugin(f"p{i}", plugins, burst, paced)])
        await server.start(path=os.path.join(directory, f"p{i}.sock"))
        servers.append(server)
    latencies: list[float] = []
    opened = 0
    all_open = asyncio.Event()
    burst_left = (BURST // plugins) * plugins
    burst_done = asyncio.Event()

    async def consume(i: int) -> None:
        nonlocal opened, burst_left
        channel = Channel(path=os.path.join(directory, f"p{i}.sock"))
        stub = rep_grpc.ReporterPluginStub(channel)
        last: dict[str, Any] = {}
        try:
            async with stub.ListAndWatchReportContent.open() as stream:
                await stream.send_message(rep.Empty(), end=True)
                opened += 1
                if opened == plugins:
                    all_open.set()
                for _ in range(BURST // plugins + PACED // plugins):
                    message = await stream.recv_message()
                    assert message is not None, "stream ended early"
                    validate_report(message)
                    last[f"p{i}"] = message
                    latency = _latency_ms(message, time.perf_counter_ns())
                    if latency is None:
                        burst_left -= 1
                        if burst_left == 0:
                            burst_done.set()
                    else:
                        latencies.append(latency)
                await stream.cancel()
        finally:
            channel.close()

    tasks = [asyncio.ensure_future(consume(i)) for i in range(plugins)]
    await all_open.wait()
    start = time.perf_counter()
    burst.set()
    await burst_done.wait()
    elapsed = time.perf_counter() - start
    paced.set()
    await asyncio.gather(*tasks)
    for server in servers:
        server.close()
        await server.wait_closed()
    return elapsed, latencies


# -- pytest-benchmark plumbing ------------------------------------------------------------------

results: dict[str, tuple[float, float, float]] = {}


@pytest.fixture(autouse=True)
def _switch_interval() -> Iterator[None]:
    default = sys.getswitchinterval()
    sys.setswitchinterval(LOOP_SWITCH_INTERVAL)
    yield
    sys.setswitchinterval(default)


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_uncaptured(request, _print_ratios)


def _print_ratios(write: Callable[[str], None]) -> None:
    write("")
    for n in PLUGIN_COUNTS:
        base = results.get(f"asyncio-{n}")
        if not base:
            continue
        write(
            f"plugins={n:<3} plain asyncio grpclib {base[0]:>8,.0f} msg/s "
            f"p50 {base[1]:6.2f} ms p99 {base[2]:7.2f} ms"
        )
        for design in ("thread", "guest"):
            ours = results.get(f"{design}-{n}")
            if not ours:
                continue
            write(
                f"            {design:<6} bridge+manager {ours[0]:>8,.0f} msg/s "
                f"p50 {ours[1]:6.2f} ms p99 {ours[2]:7.2f} ms | vs plain: throughput "
                f"{ours[0] / base[0]:.2f}x, p50 latency {ours[1] / base[1]:.2f}x"
            )


def _record(key: str, elapsed: float, latencies: list[float], plugins: int) -> None:
    total = (BURST // plugins) * plugins
    results[key] = (
        total / elapsed,
        statistics.median(latencies),
        _percentile(latencies, 0.99),
    )


@pytest.mark.parametrize("plugins", PLUGIN_COUNTS)
def test_bridge_manager_stream_throughput(benchmark: Any, registry: str, plugins: int) -> None:
    runs: list[Result] = []

    def run() -> None:
        for name in os.listdir(registry):
            os.unlink(os.path.join(registry, name))
        runs.append(trio.run(_run_bridge, plugins, registry))

    benchmark.group = f"plugin-stream-{plugins}"
    benchmark.pedantic(run, rounds=1, iterations=1)
    elapsed, latencies = runs[-1]
    assert latencies
    _record(f"thread-{plugins}", elapsed, latencies, plugins)


@pytest.mark.parametrize("plugins", PLUGIN_COUNTS)
def test_guest_bridge_manager_stream_throughput(
    benchmark: Any, registry: str, plugins: int
) -> None:
    runs: list[Result] = []

    def run() -> None:
        for name in os.listdir(registry):
            os.unlink(os.path.join(registry, name))
        runs.append(_run_guest(plugins, registry))

    benchmark.group = f"plugin-stream-{plugins}"
    benchmark.pedantic(run, rounds=1, iterations=1)
    elapsed, latencies = runs[-1]
    assert latencies
    _record(f"guest-{plugins}", elapsed, latencies, plugins)


@pytest.mark.parametrize("plugins", PLUGIN_COUNTS)
def test_plain_asyncio_grpclib_stream_throughput(
    benchmark: Any, registry: str, plugins: int
) -> None:
    runs: list[Result] = []

    def run() -> None:
        for name in os.listdir(registry):
            os.unlink(os.path.join(registry, name))
        runs.append(asyncio.run(_run_asyncio(plugins, registry)))

    benchmark.group = f"plugin-stream-{plugins}"
    benchmark.pedantic(run, rounds=1, iterations=1)
    elapsed, latencies = runs[-1]
    assert len(latencies) == (PACED // plugins) * plugins
    _record(f"asyncio-{plugins}", elapsed, latencies, plugins)
