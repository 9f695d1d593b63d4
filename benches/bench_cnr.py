"""The CNR reporter: merge cost, and plugin push -> CustomNodeResource on a real kube-apiserver.

- merge, 50 plugins x 100 fields (zones, resources, properties, conditions, policy): ours
  (`nodeagent.reporter.merge`, from the protobuf reports) against the plain-Python Katalyst
  algorithm (tests/support/katalyst_reference.py), side by side, ratio printed;
- push -> visible: an SDK reporter plugin over a unix socket, the plugin manager, the report
  store and the CNR writer (admin credentials); the plugin pushes its next report as soon as an
  admin watch of the CNR shows the previous one; p50 and p99, and API writes per push (target
  <= 1), then the same report pushed again (target: 0 writes). Baseline side by side: the same
  closed loop with no agent, a direct server-side apply of the status;
- load: 10 plugins pushing at 50 Hz each for 3 s, with the default reporter.cnr_min_write_interval
  (1 s); writes and CPU time of this process (the whole agent side and the 10 SDK plugins), against
  the same process idle for as long.

Run: .venv/bin/python -m pytest benches/bench_cnr.py --benchmark-only -s
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import trio

from benches.report import Rounds, client_for, percentile, print_uncaptured
from nodeagent.accumulator import AccumulatorSettings
from nodeagent.core.latest import LatestValue
from nodeagent.kube import EventRecorder, KubeClient, WatchRequest, run_watch
from nodeagent.plugins import PluginManager
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as pb
from nodeagent.reporter.cnr import CNR_RESOURCE, FIELD_MANAGER
from nodeagent.reporter.component import ReporterComponent
from nodeagent.reporter.merge import (
    CNR_API_VERSION,
    CNR_GROUP,
    CNR_KIND,
    CNR_VERSION,
    fields_of,
    merge_fields,
)
from nodeagent.reporter.settings import ReporterSettings
from nodeagent.rpc import open_grpc_bridge
from nodeagent.sdk import ReporterPlugin
from nodeagent.sdk.reports import ReportItem
from tests.plugins.conftest import fast_settings
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.crds import install_cnr_crd
from tests.support.katalyst_reference import katalyst_merge
from tests.support.wait import wait_until
from tests.support.watch import EventSink

PLUGINS, FIELDS = 50, 100
PUSHES, SAME_PUSHES = 200, 20
LOAD_PLUGINS, LOAD_HZ, LOAD_SECONDS = 10, 50.0, 3.0
TIMEOUT = 60.0

apiserver = apiserver_fixture(scope="module", name="apiserver")
RESULTS: dict[str, dict[str, float]] = {}


# --- merge ---


def plugin_fields(p: int) -> list[tuple[pb.FieldType, str, Any]]:
    """100 fields of one plugin: a zone per field (overlapping across plugins), resources,
    properties, conditions, the policy."""
    out: list[tuple[pb.FieldType, str, Any]] = []
    for f in range(FIELDS):
        kind = f % 5
        if kind == 0:
            value: Any = [
                {
                    "type": "Socket",
                    "name": str(f % 2),
                    "children": [
                        {
                            "type": "Numa",
                            "name": str((p + f) % 8),
                            "resources": {"allocatable": {"cpu": str(p % 7 + 1), "memory": "4Gi"}},
                            "attributes": [{"name": "cpu_lists", "value": f"{p}-{f}"}],
                        }
                    ],
                }
            ]
            out.append((pb.Status, "TopologyZone", value))
        elif kind == 1:
            res = {"allocatable": {f"example.com/r{p}-{f}": "1"}, "capacity": {"cpu": str(f)}}
            out.append((pb.Status, "Resources", res))
        elif kind == 2:
            prop = [{"propertyName": f"p{p}-{f}", "propertyQuantity": f"{f}m"}]
            out.append((pb.Spec, "NodeResourceProperties", prop))
        elif kind == 3:
            out.append((pb.Status, "Conditions", [{"type": "AgentReady", "status": "True"}]))
        else:
            out.append((pb.Status, "TopologyPolicy", "None" if f % 2 else "SingleNUMANodePodLevel"))
    return out


def build_reports() -> dict[str, pb.GetReportContentResponse]:
    reports = {}
    for p in range(PLUGINS):
        content = pb.ReportContent(
            field=[
                pb.ReportField(fieldType=t, fieldName=n, value=json.dumps(v).encode())
                for t, n, v in plugin_fields(p)
            ]
        )
        gvk = content.groupVersionKind
        gvk.group, gvk.version, gvk.kind = CNR_GROUP, CNR_VERSION, CNR_KIND
        reports[f"plugin-{p}"] = pb.GetReportContentResponse(content=[content])
    return reports


REPORTS = build_reports()


def ours() -> Any:
    return merge_fields(fields_of(REPORTS)).body


def katalyst() -> Any:
    fields = [
        (int(f.fieldType), f.fieldName, bytes(f.value))
        for r in REPORTS.values()
        for c in r.content
        for f in c.field
    ]
    return katalyst_merge({}, fields)


def test_merge_ours(benchmark: Any) -> None:
    benchmark.group = "merge"
    merge = Rounds(ours)
    benchmark(merge)
    RESULTS["merge-ours"] = {"mean": statistics.mean(merge.seconds)}


def test_merge_katalyst(benchmark: Any) -> None:
    benchmark.group = "merge"
    merge = Rounds(katalyst)
    benchmark(merge)
    RESULTS["merge-katalyst"] = {"mean": statistics.mean(merge.seconds)}


# --- push -> visible ---


class Visible(EventSink):
    """The newest `seq` (status.resources.capacity["example.com/seq"]) seen, and when."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = -1
        self.at = 0.0

    def on_event(self, type: str, obj: dict[str, Any]) -> None:
        cap = ((obj.get("status") or {}).get("resources") or {}).get("capacity") or {}
        seq = int(cap.get("example.com/seq", "-1"))
        if seq > self.seq:
            self.seq, self.at = seq, self.received_at

    async def until(self, check: Callable[[], bool]) -> None:
        with trio.fail_after(TIMEOUT):
            while not check():
                await self.arrived.wait()


@contextlib.asynccontextmanager
async def watching(admin: KubeClient, node: str) -> AsyncIterator[Visible]:
    visible = Visible()
    request = WatchRequest(CNR_RESOURCE, field_selector=f"metadata.name={node}")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_watch, admin, request, visible)
        with trio.fail_after(TIMEOUT):
            await visible.listed.wait()
        yield visible
        nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def agent(
    client: KubeClient, registry: str, node: str, *, min_write_interval: float = 0.0
) -> AsyncIterator[tuple[PluginManager, ReporterComponent]]:
    async with open_grpc_bridge() as bridge, trio.open_nursery() as nursery:
        # No stream rate limit (plugins.stream_min_interval, 0.1 s by default): the closed loop
        # would measure that limit, not the CNR path.
        manager = PluginManager(
            fast_settings(registry, probe_interval=2.0, stream_min_interval=0.0), bridge
        )
        await nursery.start(manager.run)
        events = EventRecorder(node, client=client)
        component = ReporterComponent(
            node_name=node,
            plugins=manager.channel("ReporterPlugin"),
            settings=LatestValue(ReporterSettings(cnr_min_write_interval=min_write_interval)),
            accumulator_settings=AccumulatorSettings(),
            state_dir=None,
            client=client,
            in_tree=[],
            events=events,
        )
        nursery.start_soon(events.run)
        await nursery.start(component.run)
        yield manager, component
        nursery.cancel_scope.cancel()


def seq_items(seq: int, plugin: int = 0) -> list[ReportItem]:
    return [
        ReportItem(
            CNR_GROUP,
            CNR_VERSION,
            CNR_KIND,
            "Status",
            "Resources",
            {"capacity": {f"example.com/seq{'' if plugin == 0 else plugin}": str(seq)}},
        ),
        ReportItem(CNR_GROUP, CNR_VERSION, CNR_KIND, "Status", "TopologyPolicy", "None"),
    ]


def messages_received(manager: PluginManager) -> int:
    """The bench plugin's messages as the agent counts them (its status)."""
    (item,) = [i for i in manager.status() if i["name"] == "bench"]
    count = item["messages_received"]
    assert isinstance(count, int)
    return count


async def run_agent(srv: ApiServer, registry: str) -> dict[str, float]:
    node = f"bench-{time.monotonic_ns() % 10**8}"
    async with client_for(srv, "admin") as admin:
        await install_cnr_crd(admin)
        async with (
            watching(admin, node) as visible,
            agent(admin, registry, node) as (manager, component),
            ReporterPlugin.serve(name="bench", registry_dir=registry) as plugin,
        ):
            await plugin.report(seq_items(0))
            await visible.until(lambda: visible.seq == 0)
            writer = component.writer
            assert writer is not None
            writes0 = writer.writes
            latencies = []
            for seq in range(1, PUSHES + 1):
                t0 = time.perf_counter()
                await plugin.report(seq_items(seq))
                await visible.until(lambda s=seq: visible.seq >= s)  # type: ignore[misc]
                latencies.append((visible.at - t0) * 1e3)
            assert component.store is not None
            with trio.fail_after(TIMEOUT):
                await writer.wait_settled(component.store.latest.version)
            writes = writer.writes - writes0
            # The same report again: counted by the handler (identical bytes go no further
            # since issue 29 item 13b: nothing published, merged or written).
            before = writer.writes
            with trio.fail_after(TIMEOUT):
                for _ in range(SAME_PUSHES):
                    received = messages_received(manager)
                    await plugin.report(seq_items(PUSHES))
                    await wait_until(
                        lambda n=received: messages_received(manager) > n,  # type: ignore[misc]
                        "the unchanged report received",
                        timeout=TIMEOUT,
                        interval=0.005,
                    )
                await writer.wait_settled(component.store.latest.version)
            same = writer.writes - before
    return {
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
        "writes_per_push": writes / PUSHES,
        "writes_same": same,
    }


async def run_direct(srv: ApiServer) -> dict[str, float]:
    node = f"bench-direct-{time.monotonic_ns() % 10**8}"
    async with client_for(srv, "admin") as admin:
        await install_cnr_crd(admin)
        await admin.create(
            CNR_RESOURCE,
            {"apiVersion": CNR_API_VERSION, "kind": CNR_KIND, "metadata": {"name": node}},
        )
        async with watching(admin, node) as visible:
            latencies = []
            for seq in range(1, PUSHES + 1):
                t0 = time.perf_counter()
                body = {
                    "apiVersion": CNR_API_VERSION,
                    "kind": CNR_KIND,
                    "metadata": {"name": node},
                    "status": {"resources": {"capacity": {"example.com/seq": str(seq)}}},
                }
                await admin.apply(
                    CNR_RESOURCE, body, field_manager=FIELD_MANAGER, subresource="status"
                )
                await visible.until(lambda s=seq: visible.seq >= s)  # type: ignore[misc]
                latencies.append((visible.at - t0) * 1e3)
    return {"p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99)}


async def run_load(srv: ApiServer, registry: str) -> dict[str, float]:
    node = f"bench-load-{time.monotonic_ns() % 10**8}"
    async with client_for(srv, "admin") as admin:
        await install_cnr_crd(admin)
        idle = time.process_time()
        await trio.sleep(LOAD_SECONDS)
        idle = time.process_time() - idle
        async with (
            # The default write interval (1 s): the deployed coalescing.
            agent(admin, registry, node, min_write_interval=1.0) as (_, component),
            contextlib.AsyncExitStack() as stack,
        ):
            plugins = [
                await stack.enter_async_context(
                    ReporterPlugin.serve(name=f"load-{i}", registry_dir=registry)
                )
                for i in range(LOAD_PLUGINS)
            ]
            for i, p in enumerate(plugins):
                await p.report(seq_items(0, i + 1))
            with trio.fail_after(TIMEOUT):
                while component.store is None or len(component.store.latest.value) < LOAD_PLUGINS:
                    assert component.store is not None
                    await component.store.latest.wait_newer(component.store.latest.version)
            writer = component.writer
            assert writer is not None
            writes, cpu, t0 = writer.writes, time.process_time(), trio.current_time()
            pushes = 0
            period = 1.0 / LOAD_HZ
            tick = 0
            while trio.current_time() - t0 < LOAD_SECONDS:
                tick += 1
                for i, p in enumerate(plugins):
                    await p.report(seq_items(tick, i + 1))
                    pushes += 1
                await trio.sleep_until(t0 + tick * period)
            wall = trio.current_time() - t0
            cpu = time.process_time() - cpu
            writes = writer.writes - writes
    return {
        "pushes": pushes,
        "writes": writes,
        "cpu_s": cpu,
        "cpu_pct": cpu / wall * 100,
        "idle_cpu_s": idle,
        "idle_cpu_pct": idle / LOAD_SECONDS * 100,
    }


def test_agent_push_to_visible(benchmark: Any, apiserver: ApiServer, registry: str) -> None:
    benchmark.group = "push"
    benchmark.pedantic(
        lambda: RESULTS.__setitem__("agent", trio.run(run_agent, apiserver, registry)),
        rounds=1,
        iterations=1,
    )


def test_direct_apply_to_visible(benchmark: Any, apiserver: ApiServer) -> None:
    benchmark.group = "push"
    benchmark.pedantic(
        lambda: RESULTS.__setitem__("direct", trio.run(run_direct, apiserver)),
        rounds=1,
        iterations=1,
    )


def test_load_10_plugins_50hz(benchmark: Any, apiserver: ApiServer, registry: str) -> None:
    benchmark.group = "load"
    benchmark.pedantic(
        lambda: RESULTS.__setitem__("load", trio.run(run_load, apiserver, registry)),
        rounds=1,
        iterations=1,
    )


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_uncaptured(request, print_results)


def print_results(write: Callable[[str], None]) -> None:
    write("")
    m_ours, m_kat = RESULTS.get("merge-ours"), RESULTS.get("merge-katalyst")
    if m_ours and m_kat:
        write(
            f"merge {PLUGINS} plugins x {FIELDS} fields: ours {m_ours['mean'] * 1e3:.1f} ms | "
            f"Katalyst algorithm (plain Python) {m_kat['mean'] * 1e3:.1f} ms | ratio "
            f"{m_ours['mean'] / m_kat['mean']:.2f}x"
        )
    ours, base = RESULTS.get("agent"), RESULTS.get("direct")
    if ours and base:
        write(
            f"push -> visible ({PUSHES} pushes): agent p50 {ours['p50']:.1f} ms p99 "
            f"{ours['p99']:.1f} ms, {ours['writes_per_push']:.2f} writes per push, "
            f"{ours['writes_same']:.0f} writes for {SAME_PUSHES} unchanged pushes | direct apply "
            f"p50 {base['p50']:.1f} ms p99 {base['p99']:.1f} ms | ratio p50 "
            f"{ours['p50'] / base['p50']:.2f}x, p99 {ours['p99'] / base['p99']:.2f}x"
        )
    load = RESULTS.get("load")
    if load:
        write(
            f"load {LOAD_PLUGINS} plugins x {LOAD_HZ:.0f} Hz for {LOAD_SECONDS:.0f} s: "
            f"{load['pushes']:.0f} pushes -> {load['writes']:.0f} writes; agent CPU "
            f"{load['cpu_s']:.2f} s ({load['cpu_pct']:.1f}% of a core) vs idle "
            f"{load['idle_cpu_s']:.2f} s ({load['idle_cpu_pct']:.1f}%)"
        )
