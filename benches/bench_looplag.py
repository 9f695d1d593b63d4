"""Event-loop lag of the ResourceSlice publisher holding a large inventory: 8 drivers x 1,024
devices (16 attributes and one capacity each; 8 pools of 8 slices) while one plugin sends a
changed inventory at 10 Hz and /readyz and /v1/status are polled at 10 Hz each (plus the 1 s
heartbeat's readiness), as the ops endpoint would call them.

Lag: a task sleeps 1 ms in a loop and records how late it wakes up; p50, p99 and max over the
run. Everything the loop does is in the figure: converting and validating the plugin message,
splitting it into slices, readiness, the status summary. The publisher runs standalone (no API
server): the planning and writes of cluster mode are not part of this figure.

- ours: the publisher as it is (readiness from counts, views built once per inventory, large
  inventories converted in a worker thread, inventory records untracked by the cycle collector)
  in a process set up as `nodeagent run` sets itself up once its components have started
  (start-up objects frozen out of the cycle collector, a 1 ms GIL switch interval so the
  conversion thread hands the loop back quickly);
- baseline: the old behaviour side by side in the same run: every readiness and status call
  rebuilds the desired view of every driver, and inventories are converted on the loop.

Run: .venv/bin/python -m pytest benches/bench_looplag.py --benchmark-only
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import msgspec
import pytest
import trio

from benches.report import latencies, latency_line, print_uncaptured, ratio_line
from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.core.component import Readiness
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.kube import EventRecorder
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources.component import ResourcesComponent, slice_summary
from nodeagent.resources.model import desired_slices
from nodeagent.resources.publisher import Publisher
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.service.agent import LOOP_SWITCH_INTERVAL

DRIVERS = 8
DEVICES = 1024
ATTRIBUTES = 16
UPDATE_HZ = 10.0
POLL_HZ = 10.0
SECONDS = 5.0
SLEEP = 0.001

RESULTS: dict[str, dict[str, float]] = {}


def inventory(driver: int, version: int) -> device_pb2.Inventory:
    def attrs(k: int) -> dict[str, device_pb2.DeviceAttribute]:
        out = {
            f"attr{j}": device_pb2.DeviceAttribute(string=f"value-{j}-{k}-{version}")
            for j in range(ATTRIBUTES - 2)
        }
        out["index"] = device_pb2.DeviceAttribute(int=k)
        out["driverVersion"] = device_pb2.DeviceAttribute(version="1.4.2")
        return out

    return device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name=f"pool-{driver}",
                devices=[
                    device_pb2.Device(
                        name=f"dev-{k}",
                        attributes=attrs(k),
                        capacity={"memory": device_pb2.DeviceCapacity(value="80Gi")},
                    )
                    for k in range(DEVICES)
                ],
            )
        ]
    )


def plugin(driver: int, message: device_pb2.Inventory) -> PluginData:
    return PluginData(
        name=f"drv{driver}.example.com",
        plugin_type="DRAPlugin",
        endpoint="/x.sock",
        message=message,
        received_at=0.0,
        registered=True,
    )


class RebuildingPublisher(Publisher):
    """The old view: every call builds every desired slice again."""

    def desired_view(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for driver, state in sorted(self._tracker.drivers.items()):
            pools: dict[str, Any] = {}
            if state.inventory is not None:
                for pool in state.inventory.pools:
                    specs = desired_slices(driver, pool, self.node_name)
                    pools[pool.name] = [msgspec.to_builtins(s) for s in specs]
            out[driver] = {
                "registered": state.registered,
                "last_error": state.last_error,
                "pools": pools,
            }
        return out


class BaselineComponent(ResourcesComponent):
    """The old readiness: counts taken from the full desired view."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.publisher = RebuildingPublisher(
            node_name=self.node_name,
            inventories=self._inventories,
            settings=self._settings,
        )
        await self.publisher.run(task_status=task_status)

    def readiness(self) -> Readiness:
        assert self.publisher is not None
        view = self.publisher.desired_view()
        pools = [p for d in view.values() for p in d["pools"].values()]
        slices = sum(len(p) for p in pools)
        return True, f"standalone: {len(view)} drivers, {len(pools)} pools, {slices} slices"


async def run(baseline: bool) -> dict[str, float]:
    messages = [[inventory(d, v) for v in range(2)] for d in range(DRIVERS)]
    latest: LatestValue[Mapping[str, Any]] = LatestValue(MappingProxyType({}))
    plugins = {f"drv{d}.example.com": plugin(d, messages[d][0]) for d in range(DRIVERS)}
    settings = ResourcesSettings(thread_threshold=0) if baseline else ResourcesSettings()
    kind = BaselineComponent if baseline else ResourcesComponent
    comp = kind(
        node_name="node-a",
        inventories=latest,
        settings=LatestValue(settings),
        accumulator_settings=AccumulatorSettings(),
        events=EventRecorder("node-a"),
    )
    lags: list[float] = []
    calls = {"updates": 0, "polls": 0}
    switch_interval = sys.getswitchinterval()
    async with trio.open_nursery() as nursery:
        await nursery.start(comp.run)
        if not baseline:
            # As `nodeagent run` does once its components have started.
            gc.freeze()
            sys.setswitchinterval(LOOP_SWITCH_INTERVAL)
        pub = comp.publisher
        assert pub is not None
        latest.set(MappingProxyType(dict(plugins)))
        await pub.wait_inventories()
        assert pub.counts() == (DRIVERS, DRIVERS, DRIVERS * DEVICES // 128)

        async def update() -> None:
            v = 0
            while True:
                await trio.sleep(1 / UPDATE_HZ)
                v += 1
                plugins["drv0.example.com"] = plugin(0, messages[0][v % 2])
                latest.set(MappingProxyType(dict(plugins)))
                calls["updates"] += 1

        async def poll() -> None:
            while True:
                await trio.sleep(1 / POLL_HZ)
                comp.readiness()  # /readyz
                slice_summary(comp.view())  # /v1/status
                calls["polls"] += 1

        async def heartbeat() -> None:
            while True:
                await trio.sleep(1.0)
                comp.readiness()

        nursery.start_soon(update)
        nursery.start_soon(poll)
        nursery.start_soon(heartbeat)
        end = time.perf_counter() + SECONDS
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await trio.sleep(SLEEP)
            lags.append(time.perf_counter() - t0 - SLEEP)
        nursery.cancel_scope.cancel()
    gc.unfreeze()
    sys.setswitchinterval(switch_interval)
    return {
        **latencies(lags),
        "updates": float(calls["updates"]),
        "polls": float(calls["polls"]),
    }


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_uncaptured(request, print_results)


def print_results(write: Callable[[str], None]) -> None:
    ours, base = RESULTS.get("ours"), RESULTS.get("baseline")
    if not ours or not base:
        return
    write("")
    write(
        f"loop lag, {DRIVERS} drivers x {DEVICES} devices x {ATTRIBUTES} attributes, one plugin "
        f"updating at {UPDATE_HZ:.0f} Hz, /readyz + /v1/status at {POLL_HZ:.0f} Hz, {SECONDS:.0f} s"
    )
    for name, r in (("ours", ours), ("baseline", base)):
        more = f"{r['samples']:.0f} samples, {r['updates']:.0f} updates, {r['polls']:.0f} polls"
        write(latency_line(name, r, more))
    write(ratio_line(base, ours, "ours p99 < 10 ms"))


@pytest.mark.parametrize("variant", ["ours", "baseline"])
def test_loop_lag(benchmark: Any, variant: str) -> None:
    benchmark.group = "looplag"
    benchmark.pedantic(
        lambda: RESULTS.__setitem__(variant, trio.run(run, variant == "baseline")),
        rounds=1,
        iterations=1,
    )
