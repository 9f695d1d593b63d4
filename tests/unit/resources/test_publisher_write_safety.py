"""The publisher's write safety against the in-memory cluster: no write storm after a partly
failed sync (8), a rejected first inventory keeps what is published (9), the Node's UID followed
(10), others' metadata kept (11), foreign slices refuse their pool (12), no writes while the
observed state is unknown (13), an unexpected error fails one pool only (14), views built once
per inventory (15), server-stripped forms pruned and forgotten (16)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import trio

from nodeagent.accumulator.model import QueryState, QueryStatus
from nodeagent.kube.errors import InternalError
from nodeagent.resources import metrics
from tests.support.fake_resourceslices import FakeCluster
from tests.unit.resources.test_publisher import (
    DRIVER,
    Plugins,
    inventory,
    running,
    settle,
    slices,
)

POOL = (DRIVER, "node-a")


def value(counter: Any) -> float:
    return float(counter._value.get())


# -- 8 ----------------------------------------------------------------------------------------


async def test_a_partly_failed_sync_backs_off_instead_of_storming(autojump_clock: Any) -> None:
    """The pool grows from one slice to two: the update of the first slice (a new generation)
    succeeds, every create fails (a transient 500). The update must not re-queue the pool at
    once."""
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, min_sync_interval=0.1) as pub:
        plugins.send(inventory(100))
        await settle()
        assert len(cluster.writes()) == 1
        cluster.reject = lambda verb, obj: (
            InternalError(500, "InternalError", "rejected") if verb == "create" else None
        )
        plugins.send(inventory(200))
        await trio.sleep(60)
        writes = cluster.writes()[1:]
        # Backoff 5 ms doubling: 14 attempts fit in 60 s, each one update and one create.
        # (Before the fix: one attempt per min_sync_interval, ~1,200 writes.)
        assert len(writes) <= 30, len(writes)
        (obj,) = slices(cluster)
        assert obj["spec"]["pool"]["generation"] <= 16
        assert pub.failing() == {POOL: "500 InternalError: rejected"}
        cluster.reject = lambda verb, obj: None
        await trio.sleep(60)
        assert pub.failing() == {}
        assert len(cluster.objects) == 2


async def test_own_writes_do_not_queue_their_pool_again(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(300))
        await settle()
        before = value(metrics.SYNCS.labels("unchanged"))
        plugins.send(inventory(300, memory="1Gi"))
        await settle()
        assert [c[0] for c in cluster.writes()[3:]] == ["update"] * 3
        # The three updates were the sync's own: no second sync of the pool to find nothing.
        assert value(metrics.SYNCS.labels("unchanged")) == before
        assert pub.pending() == 0


# -- 9 ----------------------------------------------------------------------------------------


def bad_inventory() -> Any:
    bad = inventory(3)
    bad.pools[0].devices[1].name = "Not_A_Label"
    return bad


async def test_a_rejected_first_inventory_after_a_restart_keeps_the_slices(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(3))
        await settle()
    published = slices(cluster)
    writes = len(cluster.writes())
    plugins2 = Plugins()
    caplog.set_level(logging.ERROR)
    async with running(cluster, plugins2, startup_grace=30.0, disconnect_grace=10.0) as pub:
        plugins2.send(bad_inventory())
        await trio.sleep(100)  # well past the start-up grace
        assert slices(cluster) == published
        assert len(cluster.writes()) == writes
        assert pub.rejected() == [DRIVER]
        assert "no valid inventory since the agent started" in caplog.text
        assert "the last valid inventory stays published" not in caplog.text
        # The plugin goes away: the disconnect grace applies as usual.
        plugins2.disconnect()
        await trio.sleep(9)
        assert slices(cluster) == published
        await trio.sleep(2)
        await settle()
        assert cluster.objects == {}


async def test_a_valid_inventory_after_a_rejected_one_is_published(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(3))
        await settle()
    plugins2 = Plugins()
    async with running(cluster, plugins2):
        plugins2.send(bad_inventory())
        await trio.sleep(40)
        plugins2.send(inventory(3, memory="1Gi"))
        await settle()
        assert [c[0] for c in cluster.writes()] == ["create", "update"]


# -- 10 ---------------------------------------------------------------------------------------


async def test_nothing_is_written_before_the_node_exists(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    cluster.node_uid = None
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(3))
        await trio.sleep(600)
        assert cluster.writes() == []
        assert pub.blocked() == "waiting for Node node-a"
        t0 = trio.current_time()
        cluster.set_node("uid-late")
        await settle()
        # At once, not after a backoff grown while waiting.
        assert trio.current_time() == t0
        assert pub.blocked() is None
        (obj,) = slices(cluster)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-late"


async def test_a_recreated_node_gets_the_slices_reowned_once(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(200))
        await settle()
        assert len(cluster.writes()) == 2
        first = slices(cluster)[0]
        first["metadata"]["ownerReferences"].append(
            {"apiVersion": "example.com/v1", "kind": "Keeper", "name": "k", "uid": "k-1"}
        )
        cluster.put_external(first)
        await settle()
        before = value(metrics.REOWNED)
        cluster.set_node(None)
        await trio.sleep(5)
        assert pub.blocked() == "waiting for Node node-a"
        assert len(cluster.writes()) == 2
        cluster.set_node("node-uid-2")
        await settle()
        assert [c[0] for c in cluster.writes()[2:]] == ["update", "update"]
        assert value(metrics.REOWNED) == before + 2
        for obj in slices(cluster):
            assert obj["metadata"]["ownerReferences"][0] == {
                "apiVersion": "v1",
                "kind": "Node",
                "name": "node-a",
                "uid": "node-uid-2",
                "controller": True,
            }
            assert obj["spec"]["pool"]["generation"] == 1
        # Someone else's owner reference stays.
        assert slices(cluster)[0]["metadata"]["ownerReferences"][1]["kind"] == "Keeper"
        await trio.sleep(60)
        assert len(cluster.writes()) == 4


# -- 11 ---------------------------------------------------------------------------------------


async def test_updates_keep_what_others_set_on_the_slice(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(3))
        await settle()
        (obj,) = slices(cluster)
        meta = obj["metadata"]
        meta["labels"]["team"] = "gpu"
        meta["annotations"] = {"example.com/note": "keep me"}
        meta["finalizers"] = ["example.com/hold"]
        cluster.put_external(obj)
        await settle()
        assert len(cluster.writes()) == 1  # metadata only: nothing to repair
        plugins.send(inventory(3, memory="1Gi"))
        await settle()
        assert [c[0] for c in cluster.writes()] == ["create", "update"]
        (obj,) = slices(cluster)
        meta = obj["metadata"]
        assert meta["labels"] == {"app.kubernetes.io/managed-by": "nodeagent", "team": "gpu"}
        assert meta["annotations"] == {"example.com/note": "keep me"}
        assert meta["finalizers"] == ["example.com/hold"]
        assert obj["spec"]["devices"][0]["capacity"]["memory"]["value"] == "1Gi"


# -- 12 ---------------------------------------------------------------------------------------


def foreign_slice(pool: str = "node-a") -> dict[str, Any]:
    return {
        "metadata": {"name": "someone-elses-slice"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "node-a",
            "pool": {"name": pool, "generation": 7, "resourceSliceCount": 1},
            "devices": [{"name": "x"}],
        },
    }


async def test_a_pool_with_foreign_slices_is_refused_and_reported(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    foreign = cluster.put_external(foreign_slice())
    cluster.put_external(foreign_slice("elsewhere") | {"metadata": {"name": "other-pool"}})
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(3))
        await trio.sleep(60)
        assert cluster.writes() == []  # no parallel pool, the foreign slice untouched
        assert cluster.objects["someone-elses-slice"] == foreign
        (error,) = pub.failing().values()
        assert "not managed by nodeagent (someone-elses-slice)" in error
        assert value(metrics.REFUSED_POOLS) == 1
        (event,) = [e for e in cluster.events if e["reason"] == "ResourceSlicePoolConflict"]
        assert event["type"] == "Warning" and "pool node-a of driver" in event["message"]
        # The foreign slice goes: the pool is published by itself.
        cluster.remove_external("someone-elses-slice")
        await settle()
        assert [c[0] for c in cluster.writes()] == ["create"]
        assert pub.failing() == {}
        assert value(metrics.REFUSED_POOLS) == 0


async def test_a_foreign_slice_appearing_later_stops_writes_to_the_pool(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(3))
        await settle()
        cluster.put_external(foreign_slice())
        await settle()
        plugins.send(inventory(3, memory="1Gi"))
        await trio.sleep(10)
        # Issue 20: nodeagent's own slice goes (two publishers' slices in one pool), no update.
        assert [c[0] for c in cluster.writes()] == ["create", "delete"]
        assert POOL in pub.failing()


# -- 13 ---------------------------------------------------------------------------------------


async def test_nothing_is_written_while_the_observed_state_is_unknown(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    cluster.unknown = {
        "resourceslices": QueryStatus("resourceslices", QueryState.FORBIDDEN, "list forbidden: no")
    }
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(3))
        await trio.sleep(300)
        assert cluster.writes() == []
        assert pub.blocked() == (
            "the observed state is not known (resourceslices: list forbidden: no)"
        )
        cluster.unknown = {}
        await trio.sleep(1.5)
        assert [c[0] for c in cluster.writes()] == ["create"]
        assert pub.blocked() is None


async def test_nothing_is_written_while_a_query_relists(autojump_clock: Any) -> None:
    # A relist under way is no readiness problem, but its frozen snapshot lacks own writes.
    cluster, plugins = FakeCluster(), Plugins()
    cluster.unknown = {"node": QueryStatus("node", QueryState.RELISTING, None)}
    async with running(cluster, plugins, startup_grace=0.0) as pub:
        plugins.send(inventory(3))
        await trio.sleep(10)
        assert cluster.writes() == []
        assert pub.blocked() == "the observed state is not known (node: relisting)"
        cluster.unknown = {}
        await trio.sleep(1.5)
        assert [c[0] for c in cluster.writes()] == ["create"]


# -- 14 ---------------------------------------------------------------------------------------


async def test_an_unexpected_error_fails_one_pool_and_is_retried(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    errors = value(metrics.SYNCS.labels("error"))
    async with running(cluster, plugins, retry_backoff_initial=1.0) as pub:
        raised: list[str] = []

        def boom_once_in_a(verb: str, obj: Any) -> Exception | None:
            if verb == "create" and obj["spec"]["pool"]["name"] == "a" and not raised:
                raised.append("a")
                return RuntimeError("boom")
            return None

        cluster.reject = boom_once_in_a
        plugins.send(inventory(3, pools=("a", "b")))
        await settle()
        assert pub.failing() == {(DRIVER, "a"): "unexpected error: RuntimeError('boom')"}
        assert value(metrics.SYNCS.labels("error")) == errors + 1
        (event,) = [e for e in cluster.events if e["reason"] == "ResourceSliceSyncFailed"]
        assert "boom" in event["message"]
        assert [o["spec"]["pool"]["name"] for o in slices(cluster)] == ["b"]
        await trio.sleep(1.5)  # the retry, in the same publisher
        assert pub.failing() == {}
        assert sorted(o["spec"]["pool"]["name"] for o in slices(cluster)) == ["a", "b"]


# -- 15 ---------------------------------------------------------------------------------------


async def test_the_view_is_built_once_per_inventory(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(200))
        await settle()
        first = pub.desired_view()[DRIVER]["pools"]
        assert pub.desired_view()[DRIVER]["pools"] is first
        assert pub.counts() == (1, 1, 2)
        plugins.send(inventory(300))
        await settle()
        assert pub.desired_view()[DRIVER]["pools"] is not first
        assert pub.counts() == (1, 1, 3)


# -- 16 ---------------------------------------------------------------------------------------


async def test_server_forms_are_pruned_to_the_desired_specs(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(drop_taints=True), Plugins()
    async with running(cluster, plugins) as pub:
        for i in range(10):
            plugins.send(inventory(3, memory=f"{i + 1}Gi", taints=True))
            await settle()
        assert len(pub._desired.server_form) == 1
        plugins.send(inventory(3))
        await settle()
        assert pub._desired.server_form == {}


async def test_a_write_stored_whole_forgets_the_server_form(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(drop_taints=True), Plugins()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(3, taints=True))
        await settle()
        assert len(pub._desired.server_form) == 1
        # The feature gate is turned on; the slice is deleted and must be created again.
        cluster.drop_taints = False
        (obj,) = slices(cluster)
        cluster.remove_external(obj["metadata"]["name"])
        await settle()
        (obj,) = slices(cluster)
        assert obj["spec"]["devices"][0]["taints"] == [
            {"key": "example.com/t", "effect": "NoSchedule"}
        ]
        assert pub._desired.server_form == {}
        await trio.sleep(10)
        assert [c[0] for c in cluster.writes()] == ["create", "create"]


async def test_large_inventories_are_converted_in_a_worker_thread(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, thread_threshold=1) as pub:
        plugins.send(inventory(200))
        await pub.wait_inventories()
        await settle()
        assert [len(o["spec"]["devices"]) for o in slices(cluster)] == [128, 72]
        bad = inventory(200)
        bad.pools[0].devices[1].name = "Not_A_Label"
        plugins.send(bad)
        await pub.wait_inventories()
        await settle()
        assert pub.rejected() == [DRIVER]
        assert len(cluster.writes()) == 2


async def test_a_sync_during_a_threaded_rebuild_deletes_nothing() -> None:
    """After a restart, the plugin's (large) inventory is taken in while its slices are still
    being built in the worker thread: a sync of its pool in that window must not take the
    missing desired slices for a pool to delete. (Real clock: a virtual one would jump past the
    start-up grace while the test waits on the thread.)"""
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(3))
        await settle()
    plugins2 = Plugins()
    async with running(cluster, plugins2, thread_threshold=1) as pub:
        building, release = trio.Event(), threading.Event()
        build = pub._build_desired

        def held_build(drivers: Any, views: bool = False) -> Any:
            trio.from_thread.run_sync(building.set)
            release.wait()
            return build(drivers, views)

        pub._build_desired = held_build  # type: ignore[method-assign]
        plugins2.send(inventory(3))
        await building.wait()
        pub._queue.add(POOL)
        await settle()
        release.set()
        await pub.wait_inventories()
        await settle()
        assert [c[0] for c in cluster.writes()] == ["create"]
