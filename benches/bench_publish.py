"""End to end publishing against a real kube-apiserver (tests/support/apiserver.py): a plugin
update -> the ResourceSlice change visible to a watcher, with node-a's credentials.

- latency, 1 and 50 plugins updating continuously: each plugin (the SDK, native API, served over
  a unix socket through the gRPC bridge and the plugin manager) publishes its next inventory as
  soon as the previous one is visible to an admin watch of the node's slices; p50 and p99 of
  publish -> watch event, and API writes per plugin update. Baseline side by side: the same
  closed loop with no agent at all, each writer PUTting its slice straight to the API server
  (the floor: one API write plus the watch fan-out);
- flapping: a grpcio plugin in a subprocess alternates between two inventories at 100
  updates/s for 5 s; API writes per update (1.0 would be one write each) and the CPU time of
  this process (the whole agent side: bridge, manager, publisher, accumulator, clients, plus
  the small watcher), against the same process idle for as long.

Run: .venv/bin/python -m pytest benches/bench_publish.py --benchmark-only -s
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from benches.report import client_for, percentile, print_uncaptured
from nodeagent.accumulator import Accumulator
from nodeagent.kube import (
    NODES,
    RESOURCESLICES,
    KubeClient,
    WatchRequest,
    errors,
    run_watch,
)
from nodeagent.plugins import PluginManager
from nodeagent.resources.publisher import Publisher, publisher_queries
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.rpc import open_grpc_bridge
from nodeagent.sdk import Device, DevicePlugin
from tests.plugins.conftest import fast_settings
from tests.plugins.test_grpcio_wire import PLUGIN as GRPCIO_PLUGIN
from tests.plugins.test_grpcio_wire import grpcio_modules
from tests.support.api_requests import api_writes
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.watch import EventSink

NODE = "node-a"
DEVICES = 8  # per plugin: one slice each
UPDATES = {1: 200, 50: 20}  # closed-loop updates per plugin
FLAP_RATE = 100.0  # updates/s
FLAP_SECONDS = 5.0
TIMEOUT = 60.0

__all__ = ["grpcio_modules"]  # the fixture, re-used
apiserver = apiserver_fixture(scope="module", name="apiserver")
RESULTS: dict[str, dict[str, float]] = {}


class Visible(EventSink):
    """Watch sink: the newest `seq` attribute seen per driver, and when it arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.seq: dict[str, int] = {}
        self.devices: dict[str, int] = {}
        self.at: dict[str, float] = {}

    def on_event(self, type: str, obj: dict[str, Any]) -> None:
        if type not in ("ADDED", "MODIFIED"):
            return
        driver, devices = obj["spec"]["driver"], obj["spec"].get("devices") or []
        self.devices[driver] = len(devices)
        seq = (devices[0].get("attributes") or {}).get("seq", {}).get("int") if devices else None
        if seq is not None and seq > self.seq.get(driver, -1):
            self.seq[driver], self.at[driver] = seq, self.received_at

    async def until(self, check: Callable[[], bool]) -> None:
        with trio.fail_after(TIMEOUT):
            while not check():
                await self.arrived.wait()


async def prepare(admin: KubeClient) -> None:
    with suppress(errors.AlreadyExists):
        await admin.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    await admin.delete_collection(RESOURCESLICES, field_selector=f"spec.nodeName={NODE}")


@contextlib.asynccontextmanager
async def watching(admin: KubeClient) -> Any:
    visible = Visible()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: run_watch(
                admin, WatchRequest(RESOURCESLICES, field_selector=f"spec.nodeName={NODE}"), visible
            )
        )
        with trio.fail_after(TIMEOUT):
            await visible.listed.wait()
        yield visible
        nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def agent(srv: ApiServer, registry: str) -> Any:
    """The agent's publishing side: bridge, plugin manager, accumulator, publisher (node-a)."""
    async with (
        open_grpc_bridge() as bridge,
        client_for(srv, NODE) as client,
        trio.open_nursery() as nursery,
    ):
        # Probing as patient as the defaults: 50 busy plugins on 2 cores can miss a fast probe.
        manager = PluginManager(
            fast_settings(registry, probe_interval=2.0, probe_failures=3), bridge
        )
        acc = Accumulator(client, publisher_queries(NODE))
        pub = Publisher(
            node_name=NODE,
            inventories=manager.channel("DRAPlugin"),
            settings=ResourcesSettings(startup_grace=0.2),
            client=client,
            slices=acc,
        )
        await nursery.start(manager.run)
        await nursery.start(acc.run)
        await nursery.start(pub.run)
        yield bridge, pub
        nursery.cancel_scope.cancel()


def devices(seq: int) -> list[Device]:
    return [
        Device(name=f"dev-{j}", attributes={"seq": seq, "index": j}, capacity={"mem": "1Gi"})
        for j in range(DEVICES)
    ]


async def run_agent(srv: ApiServer, plugins: int, registry: str) -> dict[str, float]:
    latencies: list[float] = []
    async with client_for(srv, "admin") as admin:
        await prepare(admin)
        async with (
            watching(admin) as visible,
            agent(srv, registry) as (bridge, _),
            contextlib.AsyncExitStack() as stack,
        ):
            served = [
                await stack.enter_async_context(
                    DevicePlugin.serve(
                        name=f"bench-{i}.example.com", registry_dir=registry, bridge=bridge
                    )
                )
                for i in range(plugins)
            ]
            for plugin in served:
                await plugin.publish(devices(0))
            await visible.until(lambda: all(p.name in visible.seq for p in served))
            writes, cpu, t0 = api_writes(), time.process_time(), time.perf_counter()

            async def loop(plugin: DevicePlugin) -> None:
                for seq in range(1, UPDATES[plugins] + 1):
                    start = time.perf_counter()
                    await plugin.publish(devices(seq))
                    await visible.until(lambda s=seq: visible.seq.get(plugin.name, -1) >= s)
                    latencies.append(visible.at[plugin.name] - start)

            async with trio.open_nursery() as loops:
                for plugin in served:
                    loops.start_soon(loop, plugin)
            elapsed = time.perf_counter() - t0
            cpu = time.process_time() - cpu
            writes = api_writes() - writes
        await prepare(admin)
    updates = plugins * UPDATES[plugins]
    return {
        "p50": statistics.median(latencies) * 1e3,
        "p99": percentile(latencies, 0.99) * 1e3,
        "writes_per_update": writes / updates,
        "updates_per_s": updates / elapsed,
        "cpu_ms_per_update": cpu / updates * 1e3,
    }


async def run_direct(srv: ApiServer, writers: int) -> dict[str, float]:
    """The floor: each writer PUTs its own slice and waits for the watch to show it."""
    latencies: list[float] = []
    async with client_for(srv, "admin") as admin, client_for(srv, NODE) as node:
        await prepare(admin)
        async with watching(admin) as visible:

            def body(i: int, seq: int) -> dict[str, Any]:
                return {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"direct-{i}"},
                    "spec": {
                        "driver": f"direct-{i}.example.com",
                        "nodeName": NODE,
                        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                        "devices": [
                            {
                                "name": f"dev-{j}",
                                "attributes": {"seq": {"int": seq}, "index": {"int": j}},
                                "capacity": {"mem": {"value": "1Gi"}},
                            }
                            for j in range(DEVICES)
                        ],
                    },
                }

            rvs = {}
            for i in range(writers):
                made = msgspec.json.decode(await node.create(RESOURCESLICES, body(i, 0)))
                rvs[i] = made["metadata"]["resourceVersion"]

            async def loop(i: int) -> None:
                driver = f"direct-{i}.example.com"
                for seq in range(1, UPDATES[writers] + 1):
                    start = time.perf_counter()
                    obj = body(i, seq)
                    obj["metadata"]["resourceVersion"] = rvs[i]
                    answer = msgspec.json.decode(await node.update(RESOURCESLICES, obj))
                    rvs[i] = answer["metadata"]["resourceVersion"]
                    await visible.until(lambda s=seq: visible.seq.get(driver, -1) >= s)
                    latencies.append(visible.at[driver] - start)

            t0 = time.perf_counter()
            async with trio.open_nursery() as loops:
                for i in range(writers):
                    loops.start_soon(loop, i)
            elapsed = time.perf_counter() - t0
        await prepare(admin)
    updates = writers * UPDATES[writers]
    return {
        "p50": statistics.median(latencies) * 1e3,
        "p99": percentile(latencies, 0.99) * 1e3,
        "writes_per_update": 1.0,
        "updates_per_s": updates / elapsed,
    }


async def run_flap(srv: ApiServer, registry: str, modules: str) -> dict[str, float]:
    driver = "flap.example.com"
    async with client_for(srv, "admin") as admin:
        await prepare(admin)
        # The idle baseline: the same process, watcher open, nothing to publish.
        async with watching(admin), agent(srv, registry):
            await trio.sleep(1.0)  # past start-up (a bench: no synchronisation to stand in for)
            idle = time.process_time()
            await trio.sleep(FLAP_SECONDS)
            idle = time.process_time() - idle
        async with watching(admin) as visible, agent(srv, registry) as (_, pub):
            process = await trio.lowlevel.open_process(
                [
                    sys.executable,
                    str(GRPCIO_PLUGIN),
                    modules,
                    "native",
                    os.path.join(registry, "flap.sock"),
                    driver,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
            )
            assert process.stdin is not None
            try:
                await process.stdin.send_all(b"value 8\n")
                await visible.until(lambda: visible.devices.get(driver) == 8)
                with trio.fail_after(TIMEOUT):
                    await pub.wait_idle()
                writes, cpu = api_writes(), time.process_time()
                start = trio.current_time()
                sent = 0
                while sent < FLAP_RATE * FLAP_SECONDS:
                    sent += 1
                    await process.stdin.send_all(f"value {8 + sent % 2}\n".encode())
                    await trio.sleep_until(start + sent / FLAP_RATE)
                last = 8 + sent % 2
                await visible.until(lambda: visible.devices.get(driver) == last)
                with trio.fail_after(TIMEOUT):
                    await pub.wait_idle()
                cpu = time.process_time() - cpu
                wall = trio.current_time() - start
                writes = api_writes() - writes
                await process.stdin.aclose()
                with trio.fail_after(TIMEOUT):
                    await process.wait()
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
        await prepare(admin)
    return {
        "updates": float(sent),
        "writes": writes,
        "writes_per_update": writes / sent,
        "cpu_s": cpu,
        "cpu_pct": cpu / wall * 100,
        "idle_cpu_s": idle,
        "idle_cpu_pct": idle / FLAP_SECONDS * 100,
        "cpu_ms_per_update": cpu / sent * 1e3,
    }


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_uncaptured(request, print_results)


def print_results(write: Callable[[str], None]) -> None:
    write("")
    for n in UPDATES:
        ours, base = RESULTS.get(f"agent-{n}"), RESULTS.get(f"direct-{n}")
        if not ours or not base:
            continue
        write(
            f"plugins={n:<3} agent: p50 {ours['p50']:6.1f} ms p99 {ours['p99']:6.1f} ms, "
            f"{ours['updates_per_s']:6.0f} updates/s, {ours['writes_per_update']:.2f} writes "
            f"and {ours['cpu_ms_per_update']:.2f} ms CPU per update | direct PUT: p50 "
            f"{base['p50']:6.1f} ms p99 {base['p99']:6.1f} ms, {base['updates_per_s']:6.0f} "
            f"updates/s | ratio: p50 {ours['p50'] / base['p50']:.2f}x, p99 "
            f"{ours['p99'] / base['p99']:.2f}x, writes/update {ours['writes_per_update']:.2f} vs 1"
        )
    flap = RESULTS.get("flap")
    if flap:
        write(
            f"flap {FLAP_RATE:.0f} updates/s for {FLAP_SECONDS:.0f} s: {flap['updates']:.0f} "
            f"updates -> {flap['writes']:.0f} writes ({flap['writes_per_update']:.3f} per update "
            f"vs 1 without coalescing); agent CPU {flap['cpu_s']:.2f} s ({flap['cpu_pct']:.1f}% "
            f"of a core, {flap['cpu_ms_per_update']:.2f} ms per update) vs idle "
            f"{flap['idle_cpu_s']:.2f} s ({flap['idle_cpu_pct']:.1f}%)"
        )


@pytest.mark.parametrize("plugins", list(UPDATES))
def test_agent_update_to_visible(
    benchmark: Any, apiserver: ApiServer, registry: str, plugins: int
) -> None:
    benchmark.group = f"publish-{plugins}"
    benchmark.pedantic(
        lambda: RESULTS.__setitem__(
            f"agent-{plugins}", trio.run(run_agent, apiserver, plugins, registry)
        ),
        rounds=1,
        iterations=1,
    )


@pytest.mark.parametrize("writers", list(UPDATES))
def test_direct_put_to_visible(benchmark: Any, apiserver: ApiServer, writers: int) -> None:
    benchmark.group = f"publish-{writers}"
    benchmark.pedantic(
        lambda: RESULTS.__setitem__(f"direct-{writers}", trio.run(run_direct, apiserver, writers)),
        rounds=1,
        iterations=1,
    )


def test_flapping_plugin_is_coalesced(
    benchmark: Any, apiserver: ApiServer, registry: str, grpcio_modules: str
) -> None:
    benchmark.group = "flap"
    benchmark.pedantic(
        lambda: RESULTS.__setitem__(
            "flap", trio.run(run_flap, apiserver, registry, grpcio_modules)
        ),
        rounds=1,
        iterations=1,
    )
