"""The partitioned-GPU pool of issue 19 (one counter set, four partitions consuming it, one of
them tainted) against real kube-apiservers: with the DRA feature gates on, every field survives
the write and the pool makes no write while unchanged; with 1.35's default gates the server
drops the fields, the pool is still published without churn, and the operator is told once per
pool and field (Event, metric, /v1/status). A slice the server refuses (422) is reported and
not retried in a loop.

The servers are 1.35 (the harness's oldest release) started by this module: one with the gates
of every field the agent writes turned on, one with the release's defaults."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import suppress
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from nodeagent.kube import CORE_EVENTS, NODES, RESOURCESLICES, KubeClient, errors
from nodeagent.kube.metrics import WATCH_EVENTS
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources import metrics, model
from tests.integration.conftest import client_for
from tests.integration.test_resourceslices import (
    DRIVER,
    NODE,
    Plugins,
    node_slices,
    publisher,
    quiet,
    settle,
    versions,
)
from tests.support.apiserver import ApiServer, start_apiserver
from tests.support.wait import NotYet, wait_until

pytestmark = pytest.mark.integration

# What the agent can write and 1.35 gates: taints, counters, consumable capacity, binding
# conditions (which need DRAResourceClaimDeviceStatus too).
DRA_GATES = (
    "DRADeviceTaints=true,DRAPartitionableDevices=true,DRAConsumableCapacity=true,"
    "DRADeviceBindingConditions=true,DRAResourceClaimDeviceStatus=true"
)


def _start(workdir: Any, gates: bool) -> ApiServer:
    # 1.35 with its default gates (the release whose defaults drop these fields), plus
    # DRA_GATES when asked: whatever gate lane the run selects ($NODEAGENT_KUBE_GATES).
    extra = [f"--feature-gates={DRA_GATES}"] if gates else []
    return start_apiserver(workdir, extra_args=extra, release="1.35", gates="default")


@pytest.fixture(scope="module")
def gates_on(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    srv = _start(tmp_path_factory.mktemp("gates-on"), True)
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def gates_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    srv = _start(tmp_path_factory.mktemp("gates-off"), False)
    try:
        yield srv
    finally:
        srv.close()


async def _admin(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with client_for(apiserver, "admin") as client:
        with suppress(errors.AlreadyExists):
            await client.create(
                NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
            )
        await client.delete_collection(RESOURCESLICES, field_selector=f"spec.nodeName={NODE}")
        yield client
        await client.delete_collection(RESOURCESLICES, field_selector=f"spec.nodeName={NODE}")


@pytest.fixture
async def admin_on(gates_on: ApiServer) -> AsyncIterator[KubeClient]:
    async for client in _admin(gates_on):
        yield client


@pytest.fixture
async def admin_off(gates_off: ApiServer) -> AsyncIterator[KubeClient]:
    async for client in _admin(gates_off):
        yield client


def partitioned_gpu() -> device_pb2.Inventory:
    """One GPU's counter set and four partitions consuming it, the last one tainted."""
    partitions = []
    for i in range(4):
        partitions.append(
            device_pb2.Device(
                name=f"gpu-0-part-{i}",
                attributes={"profile": device_pb2.DeviceAttribute(string="1g.10gb")},
                capacity={"memory": device_pb2.DeviceCapacity(value="10Gi")},
                consumes_counters=[
                    device_pb2.DeviceCounterConsumption(
                        counter_set="gpu-0",
                        counters={
                            "memory": device_pb2.Counter(value="10Gi"),
                            "slices": device_pb2.Counter(value="1"),
                        },
                    )
                ],
                taints=[device_pb2.DeviceTaint(key="example.com/unhealthy", effect="NoSchedule")]
                if i == 3
                else [],
            )
        )
    return device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name=NODE,
                devices=partitions,
                shared_counters=[
                    device_pb2.CounterSet(
                        name="gpu-0",
                        counters={
                            "memory": device_pb2.Counter(value="40Gi"),
                            "slices": device_pb2.Counter(value="4"),
                        },
                    )
                ],
            )
        ]
    )


def _events() -> float:
    return float(WATCH_EVENTS.labels("resourceslices")._value.get())


async def _settled(pub: Any, admin: KubeClient, count: int) -> list[dict[str, Any]]:
    """Until the pool's `count` slices are stored, their watch echoes seen and planned
    against; returns them."""

    async def stored() -> list[dict[str, Any]] | None:
        items = await node_slices(admin)
        return items if len(items) == count else None

    watched = _events()
    items: list[dict[str, Any]] = await wait_until(stored, f"{count} slices")
    await quiet(pub)

    async def echoed() -> bool:
        return _events() >= watched + count

    await wait_until(echoed, "the watch echoes of the writes")
    await trio.testing.wait_all_tasks_blocked(0.05)
    await quiet(pub)
    return items


async def _node_events(admin: KubeClient, reason: str) -> list[dict[str, Any]]:
    body = await admin.request(
        "GET",
        CORE_EVENTS.path("default"),
        params={"fieldSelector": f"involvedObject.name={NODE},reason={reason}"},
    )
    items: list[dict[str, Any]] = msgspec.json.decode(body)["items"]
    return items


async def test_partitioned_pool_publishes_with_the_gates_on_and_rests(
    gates_on: ApiServer, admin_on: KubeClient
) -> None:
    plugins = Plugins()
    plugins.send(partitioned_gpu())
    async with publisher(gates_on, plugins) as pub:
        items = await _settled(pub, admin_on, 2)
        assert pub.writes == 2
        assert pub.failing() == {} and pub.dropped() == {}
        counters = [o for o in items if o["spec"].get("sharedCounters")]
        devices = [o for o in items if o["spec"].get("devices")]
        assert len(counters) == 1 and len(devices) == 1
        # Every field survived the write.
        assert counters[0]["spec"]["sharedCounters"] == [
            {
                "name": "gpu-0",
                "counters": {"memory": {"value": "40Gi"}, "slices": {"value": "4"}},
            }
        ]
        assert "devices" not in counters[0]["spec"]
        stored = devices[0]["spec"]["devices"]
        assert [d["consumesCounters"][0]["counterSet"] for d in stored] == ["gpu-0"] * 4
        assert [bool(d.get("taints")) for d in stored] == [False, False, False, True]
        # resourceSliceCount counts the counter slice.
        assert {o["spec"]["pool"]["resourceSliceCount"] for o in items} == {2}
        assert {o["spec"]["pool"]["generation"] for o in items} == {1}
        before = versions(items)
        # Unchanged: the same inventory again makes no write either.
        plugins.send(partitioned_gpu())
        await settle(pub)
        assert pub.writes == 2

    # A restart with the same inventory makes no write at all.
    async with publisher(gates_on, plugins, startup_grace=1.0) as pub2:
        started = trio.current_time()
        await quiet(pub2)
        await trio.sleep_until(started + 1.0)
        await trio.testing.wait_all_tasks_blocked(0.05)
        await quiet(pub2)
        assert pub2.writes == 0
    assert versions(await node_slices(admin_on)) == before


async def test_a_changed_counter_set_is_one_update(
    gates_on: ApiServer, admin_on: KubeClient
) -> None:
    """The planner matches the counter-only slice to its desired spec: a new counter value is
    one in-place update of that slice, no new generation."""
    plugins = Plugins()
    plugins.send(partitioned_gpu())
    async with publisher(gates_on, plugins) as pub:
        items = await _settled(pub, admin_on, 2)
        names = sorted(versions(items))
        bigger = partitioned_gpu()
        bigger.pools[0].shared_counters[0].counters["memory"].value = "80Gi"
        plugins.send(bigger)

        async def updated() -> list[dict[str, Any]] | None:
            got = await node_slices(admin_on)
            values = [
                o["spec"]["sharedCounters"][0]["counters"]["memory"]["value"]
                for o in got
                if o["spec"].get("sharedCounters")
            ]
            return got if values == ["80Gi"] else None

        got = await wait_until(updated, "the counter set updated")
        await quiet(pub)
        assert pub.writes == 3
        assert sorted(versions(got)) == names
        assert {o["spec"]["pool"]["generation"] for o in got} == {1}


async def test_default_gates_drop_fields_and_say_so_once(
    gates_off: ApiServer, admin_off: KubeClient
) -> None:
    """1.35's defaults drop taints, sharedCounters and consumesCounters (201, fields gone).
    The pool is published with what the server keeps, without churn, and each field is
    reported once: an Event, the metric, the status."""
    dropped = {
        "devices.consumesCounters": "DRAPartitionableDevices",
        "devices.taints": "DRADeviceTaints",
        "sharedCounters": "DRAPartitionableDevices",
    }
    counted = {f: metrics.FIELDS_DROPPED.labels(DRIVER, f)._value.get() for f in dropped}
    plugins = Plugins()
    plugins.send(partitioned_gpu())
    async with publisher(gates_off, plugins) as pub:
        items = await _settled(pub, admin_off, 2)
        assert pub.writes == 2
        assert pub.dropped() == {(DRIVER, NODE): dropped}
        for f in dropped:
            assert metrics.FIELDS_DROPPED.labels(DRIVER, f)._value.get() == counted[f] + 1
        # What the server kept: an empty slice where the counters were, the devices bare.
        assert sorted(bool(o["spec"].get("devices")) for o in items) == [False, True]
        for o in items:
            assert "sharedCounters" not in o["spec"]
            for d in o["spec"].get("devices", []):
                assert "taints" not in d and "consumesCounters" not in d

        async def warned() -> list[dict[str, Any]] | None:
            return await _node_events(admin_off, "ResourceSliceFieldsDropped") or None

        (event,) = await wait_until(warned, "the Event")
        for f, gate in dropped.items():
            assert f"{f} (feature gate {gate})" in event["message"]
        before = versions(items)
        # A device added: the pool is rewritten, the same fields dropped again: no new report.
        more = partitioned_gpu()
        more.pools[0].devices.append(device_pb2.Device(name="gpu-1"))
        plugins.send(more)

        async def grown() -> bool:
            got = await node_slices(admin_off)
            return sum(len(o["spec"].get("devices", [])) for o in got) == 5

        await wait_until(grown, "the new device")
        await quiet(pub)
        assert versions(await node_slices(admin_off)) != before
        for f in dropped:
            assert metrics.FIELDS_DROPPED.labels(DRIVER, f)._value.get() == counted[f] + 1
        await trio.sleep(0.5)  # the Event sender is a background task: let a second one show
        assert len(await warned() or []) == 1
        writes = pub.writes
        await trio.testing.wait_all_tasks_blocked(0.05)
        await quiet(pub)
        assert pub.writes == writes


async def test_gates_on_report_nothing_dropped(gates_on: ApiServer, admin_on: KubeClient) -> None:
    plugins = Plugins()
    plugins.send(partitioned_gpu())
    async with publisher(gates_on, plugins) as pub:
        await _settled(pub, admin_on, 2)
        assert pub.dropped() == {}
        assert await _node_events(admin_on, "ResourceSliceFieldsDropped") == []


async def test_a_slice_the_server_refuses_is_reported_and_not_retried_in_a_loop(
    gates_on: ApiServer, admin_on: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rule the agent does not know (simulated: its string limit lifted) lets a slice through
    that the server refuses with 422: the pool is reported with the server's message, tried
    once, then again only when the inventory changes (or after the slow interval)."""
    monkeypatch.setattr(model, "MAX_ATTRIBUTE_STRING", 1000)
    bad = partitioned_gpu()
    bad.pools[0].devices[0].attributes["profile"].string = "é" * 40  # 80 bytes
    plugins = Plugins()
    plugins.send(bad)
    async with publisher(gates_on, plugins, invalid_retry_interval=3600.0) as pub:

        async def refused() -> bool:
            return (DRIVER, NODE) in pub.invalid()

        await wait_until(refused, "the pool refused")
        (error,) = pub.failing().values()
        assert "422 Invalid" in error and "64 bytes" in error
        refusals = metrics.WRITES.labels("create", "error")._value.get()
        # The pool waits for a new inventory (or the hour): no write in the meantime, where
        # the backoff of a transient failure would have retried a dozen times.
        await trio.sleep(1.0)
        await trio.testing.wait_all_tasks_blocked(0.05)
        assert metrics.WRITES.labels("create", "error")._value.get() == refusals
        assert pub.pending() == 1

        async def warned() -> list[dict[str, Any]] | None:
            return await _node_events(admin_on, "ResourceSlicePoolInvalid") or None

        (event,) = await wait_until(warned, "the Event")
        assert "64 bytes" in event["message"]
        # A new inventory is tried at once, and publishes.
        plugins.send(partitioned_gpu())

        async def published() -> bool:
            return len(await node_slices(admin_on)) == 2

        await wait_until(published, "the valid pool")
        await quiet(pub)
        assert pub.invalid() == set() and pub.failing() == {}


def _gpus(n: int, bad: int | None = None) -> device_pb2.Inventory:
    return device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name=NODE,
                devices=[
                    device_pb2.Device(
                        name=f"gpu-{i}",
                        attributes={
                            "model": device_pb2.DeviceAttribute(
                                string="é" * 40 if i == bad else "x100"
                            )
                        },
                    )
                    for i in range(n)
                ],
            )
        ]
    )


async def test_a_refused_new_generation_leaves_the_complete_pool_published(
    gates_on: ApiServer, admin_on: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20 item 2 on the real server: 200 devices published (two slices), then 260 with
    the last one refused by the server (80 bytes of text; the agent's limit lifted to let it
    through). Before, the kept slices were rewritten at generation 2 and the create refused:
    an incomplete pool, retried with a new generation each time. Now the new generation is
    dry-run first: the pool of generation 1 stays as it was, the refusal is reported once."""
    monkeypatch.setattr(model, "MAX_ATTRIBUTE_STRING", 1000)
    plugins = Plugins()
    plugins.send(_gpus(200))
    async with publisher(gates_on, plugins, invalid_retry_interval=3600.0) as pub:
        before = versions(await _settled(pub, admin_on, 2))
        writes, dry = pub.writes, metrics.DRY_RUNS.labels("error")._value.get()
        plugins.send(_gpus(260, bad=259))

        async def refused() -> bool:
            return (DRIVER, NODE) in pub.invalid()

        await wait_until(refused, "the new generation refused")
        await trio.sleep(1.0)
        await trio.testing.wait_all_tasks_blocked(0.05)
        assert pub.writes == writes
        assert metrics.DRY_RUNS.labels("error")._value.get() == dry + 1
        items = await node_slices(admin_on)
        assert versions(items) == before
        assert {
            (o["spec"]["pool"]["generation"], o["spec"]["pool"]["resourceSliceCount"])
            for o in items
        } == {(1, 2)}
        assert "64 bytes" in pub.failing()[(DRIVER, NODE)]
        # Fixed: the new generation is written whole.
        plugins.send(_gpus(260))

        async def grown() -> list[dict[str, Any]] | None:
            got = await node_slices(admin_on)
            return got if len(got) == 3 else None

        got = await wait_until(grown, "three slices")
        await quiet(pub)
        assert {o["spec"]["pool"]["generation"] for o in got} == {2}
        assert pub.failing() == {}


async def test_a_restart_on_default_gates_makes_no_write(
    gates_off: ApiServer, admin_off: KubeClient
) -> None:
    """The restarted agent sees slices without the fields its inventory has: a dry-run update
    per such slice shows the server would store them as they are, so nothing is written and
    the pool keeps its generation (before: both slices rewritten, generation 1 -> 2, on every
    restart)."""
    plugins = Plugins()
    plugins.send(partitioned_gpu())
    async with publisher(gates_off, plugins) as pub:
        before = versions(await _settled(pub, admin_off, 2))
    dry = metrics.DRY_RUNS.labels("ok")._value.get()
    async with publisher(gates_off, plugins, startup_grace=1.0) as pub2:
        started = trio.current_time()
        await quiet(pub2)
        await trio.sleep_until(started + 1.0)
        await trio.testing.wait_all_tasks_blocked(0.05)
        await quiet(pub2)
        assert pub2.writes == 0
        assert metrics.DRY_RUNS.labels("ok")._value.get() == dry + 2
        assert set(pub2.dropped()[(DRIVER, NODE)]) == {
            "devices.consumesCounters",
            "devices.taints",
            "sharedCounters",
        }
    items = await node_slices(admin_off)
    assert versions(items) == before
    assert {o["spec"]["pool"]["generation"] for o in items} == {1}


async def test_a_refused_shrink_leaves_the_complete_pool_published(
    gates_on: ApiServer, admin_on: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 item 11, with node credentials: the pool shrinks from two slices (200 devices)
    to one (100), the kept slice holding a value the server refuses (80 bytes of text; the
    agent's limit lifted to let it through). The plan is one update and one delete; before,
    only creates and updates counted for the dry run, the delete went first and the update was
    refused: one slice of a pool of two left, until the inventory changed. Now the plan is
    dry-run first: nothing is written, the pool of generation 1 stays whole."""
    monkeypatch.setattr(model, "MAX_ATTRIBUTE_STRING", 1000)
    plugins = Plugins()
    plugins.send(_gpus(200))
    async with publisher(gates_on, plugins, invalid_retry_interval=3600.0) as pub:
        before = versions(await _settled(pub, admin_on, 2))
        writes, dry = pub.writes, metrics.DRY_RUNS.labels("error")._value.get()
        plugins.send(_gpus(100, bad=99))

        def refused() -> bool | NotYet:
            return (DRIVER, NODE) in pub.invalid() or NotYet(pub.failing())

        await wait_until(refused, "the shrunk pool refused")
        items = await node_slices(admin_on)
        assert versions(items) == before, "the refused plan wrote (or deleted) a slice"
        assert {
            (o["spec"]["pool"]["generation"], o["spec"]["pool"]["resourceSliceCount"])
            for o in items
        } == {(1, 2)}
        assert pub.writes == writes
        assert metrics.DRY_RUNS.labels("error")._value.get() == dry + 1
        assert "64 bytes" in pub.failing()[(DRIVER, NODE)]
        # Fixed: the pool shrinks to one slice of a new generation.
        plugins.send(_gpus(100))

        async def shrunk() -> list[dict[str, Any]] | NotYet:
            # (One slice still counting two is the window between the delete and the update.)
            got = await node_slices(admin_on)
            counts = [o["spec"]["pool"]["resourceSliceCount"] for o in got]
            return got if counts == [1] else NotYet(counts)

        got: list[dict[str, Any]] = await wait_until(shrunk, "one slice counting one")
        assert len(got[0]["spec"]["devices"]) == 100
        await quiet(pub)
        assert pub.failing() == {}


async def test_a_time_the_server_respells_is_published_once(
    gates_on: ApiServer, admin_on: KubeClient
) -> None:
    """Issue 29 item 12: taint times Go's parser takes and the server stores respelled (10
    fraction digits, a ',' before the fraction, a one-digit hour; stored as whole seconds in
    UTC) are published and the pool rests: the planner compares them by their instant. Before,
    the agent refused the first; had it taken them, compared as text, they would have been
    rewritten on every sync."""
    times = ["2024-01-01T00:00:00.1234567891Z", "2024-01-01T00:00:00,5Z", "2024-01-01T1:00:00Z"]
    inventory = device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name=NODE,
                devices=[
                    device_pb2.Device(
                        name=f"gpu-{i}",
                        taints=[device_pb2.DeviceTaint(key="k", effect="NoSchedule", time_added=t)],
                    )
                    for i, t in enumerate(times)
                ],
            )
        ]
    )
    plugins = Plugins()
    plugins.send(inventory)
    async with publisher(gates_on, plugins) as pub:
        (item,) = await _settled(pub, admin_on, 1)
        assert [d["taints"][0]["timeAdded"] for d in item["spec"]["devices"]] == [
            "2024-01-01T00:00:00Z",
            "2024-01-01T00:00:00Z",
            "2024-01-01T01:00:00Z",
        ]
        assert pub.writes == 1 and pub.failing() == {}
        plugins.send(inventory)
        await settle(pub)
        assert pub.writes == 1
    assert versions(await node_slices(admin_on)) == versions([item])
