"""What the publisher tells the operator when the API server refuses a pool (422 Invalid, not
retried like a transient failure) or drops fields of its slices (a feature gate off)."""

from __future__ import annotations

from typing import Any

import trio

from nodeagent.kube.errors import Invalid
from nodeagent.resources import metrics
from tests.support.fake_resourceslices import FakeCluster
from tests.unit.resources.test_publisher import DRIVER, Plugins, inventory, running, settle

POOL = (DRIVER, "node-a")


async def test_a_refused_pool_waits_for_a_new_inventory_or_the_slow_timer(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    cluster.reject = lambda verb, obj: Invalid(422, "Invalid", "spec.devices: Too long")
    async with running(cluster, plugins, invalid_retry_interval=300.0) as pub:
        plugins.send(inventory(3))
        await settle()
        assert len(cluster.writes()) == 1
        assert pub.invalid() == {POOL}
        assert pub.failing()[POOL] == (
            f"the API server refuses pool node-a of driver {DRIVER} (422 Invalid): "
            "spec.devices: Too long"
        )
        # A transient failure would back off from 5 ms; a refusal is not retried in a loop.
        await trio.sleep(299)
        assert len(cluster.writes()) == 1
        await trio.sleep(2)
        assert len(cluster.writes()) == 2  # the slow timer
        # Reported once, whatever the number of attempts.
        assert [e["reason"] for e in cluster.events] == ["ResourceSlicePoolInvalid"]
        # A new inventory is tried at once, and the pool recovers.
        cluster.reject = lambda verb, obj: None
        plugins.send(inventory(4))
        await settle()
        assert len(cluster.writes()) == 3
        assert pub.invalid() == set() and pub.failing() == {}


async def test_dropped_fields_are_reported_once_per_pool_and_field(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(drop_taints=True), Plugins()
    counter = metrics.FIELDS_DROPPED.labels(DRIVER, "devices.taints")
    before = counter._value.get()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(3, taints=True, pools=("a", "b")))
        await settle()
        assert pub.dropped() == {
            (DRIVER, p): {"devices.taints": "DRADeviceTaints"} for p in ("a", "b")
        }
        assert counter._value.get() == before + 2
        # Rewritten pools drop the same field: nothing new to say.
        plugins.send(inventory(3, taints=True, memory="1Gi", pools=("a", "b")))
        await settle()
        assert len(cluster.writes()) == 4
        assert counter._value.get() == before + 2
        reasons = [e["reason"] for e in cluster.events]
        assert reasons == ["ResourceSliceFieldsDropped"] * 2
        assert "devices.taints (feature gate DRADeviceTaints)" in cluster.events[0]["message"]
        # The gate turned on: the next write keeps the taints, the report is withdrawn.
        cluster.drop_taints = False
        plugins.send(inventory(3, taints=True, memory="2Gi", pools=("a",)))
        await settle()
        assert pub.dropped() == {}


async def test_a_refused_slice_of_a_new_generation_leaves_the_last_complete_pool(
    autojump_clock: Any,
) -> None:
    """Issue 20: the pool grows from 200 to 260 devices, the server refuses the new last slice.
    Writes went update, update, create: the kept slices were rewritten at generation 2, the
    create refused, the pool incomplete (and each retry bumped the generation again). The
    writes are dry-run first: nothing is written, the pool of generation 1 stays whole."""
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(200))
        await settle()
        before = {n: o["metadata"]["resourceVersion"] for n, o in cluster.objects.items()}
        assert len(before) == 2
        cluster.reject = lambda verb, obj: (
            Invalid(422, "Invalid", "Too long: may not be more than 64 bytes")
            if any(d["name"] == "gpu-259" for d in obj["spec"].get("devices", []))
            else None
        )
        writes, dry = len(cluster.writes()), len(cluster.dry_runs)
        plugins.send(inventory(260))
        await trio.sleep(60)
        assert len(cluster.writes()) == writes  # no real write at all
        assert {n: o["metadata"]["resourceVersion"] for n, o in cluster.objects.items()} == before
        assert {o["spec"]["pool"]["generation"] for o in cluster.objects.values()} == {1}
        assert pub.invalid() == {POOL}
        # Dry-run once (update, update, create: stopped at the refused create), not in a loop.
        assert [v for v, _ in cluster.dry_runs[dry:]] == ["update", "update", "create"]
        assert [e["reason"] for e in cluster.events] == ["ResourceSlicePoolInvalid"]
        cluster.reject = lambda verb, obj: None
        plugins.send(inventory(261))
        await settle()
        assert {o["spec"]["pool"]["generation"] for o in cluster.objects.values()} == {2}
        assert len(cluster.objects) == 3 and pub.failing() == {}


async def test_a_refused_shrink_deletes_nothing(autojump_clock: Any) -> None:
    """Issue 29 item 11: the pool shrinks from two slices to one, the kept slice's update
    refused. The plan is an update and a delete; only creates and updates counted for the dry
    run, so the delete went first and the pool stayed one slice of two, retried (and refused)
    every `invalid_retry_interval`. Now the plan is dry-run first, also on each retry."""
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(200))
        await settle()
        before = {n: o["metadata"]["resourceVersion"] for n, o in cluster.objects.items()}
        assert len(before) == 2
        cluster.reject = lambda verb, obj: (
            Invalid(422, "Invalid", "Too long: may not be more than 64 bytes")
            if verb == "update"
            else None
        )
        writes, dry = len(cluster.writes()), len(cluster.dry_runs)
        plugins.send(inventory(100))
        await trio.sleep(700)  # past the default invalid_retry_interval (600 s): one retry
        assert len(cluster.writes()) == writes  # no real write, no delete
        assert {n: o["metadata"]["resourceVersion"] for n, o in cluster.objects.items()} == before
        assert pub.invalid() == {POOL}
        assert [v for v, _ in cluster.dry_runs[dry:]] == ["update", "update"]


async def test_a_restart_on_a_cluster_dropping_fields_makes_no_write(autojump_clock: Any) -> None:
    """The restarted publisher does not know the stored form yet: the observed slices lack the
    taints the inventory has. A dry-run update shows the server would store what it has, so
    nothing is written (before: every such slice rewritten, and the pool's generation bumped,
    on every agent restart)."""
    cluster, plugins = FakeCluster(drop_taints=True), Plugins()
    async with running(cluster, plugins, startup_grace=1.0):
        plugins.send(inventory(200, taints=True))
        await settle()
    writes, dry = len(cluster.writes()), len(cluster.dry_runs)
    generations = {o["spec"]["pool"]["generation"] for o in cluster.objects.values()}
    async with running(cluster, plugins, startup_grace=1.0) as pub:
        await trio.sleep(5)  # past the start-up grace
        assert len(cluster.writes()) == writes
        assert [v for v, _ in cluster.dry_runs[dry:]] == ["update"] * 4
        assert {o["spec"]["pool"]["generation"] for o in cluster.objects.values()} == generations
        assert pub.dropped() == {POOL: {"devices.taints": "DRADeviceTaints"}}
        # Once known, the stored form is planned against: a re-send costs nothing at all.
        plugins.send(inventory(200, taints=True))
        await trio.sleep(1)
        assert len(cluster.dry_runs) == dry + 4 and len(cluster.writes()) == writes
