"""`SliceWrites` on its own, against the in-memory cluster: a pool's plan and its writes (ours
only, nothing when unchanged), the metadata others set kept, a re-created Node's slices
re-owned, a new generation admitted by a dry run before anything is written, and where the
writes leave the pool (`expected`)."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from nodeagent.kube.errors import Invalid
from nodeagent.resources import metrics
from nodeagent.resources.desired import DesiredSlices
from nodeagent.resources.inventory import DriverState, InventoryTracker
from nodeagent.resources.model import Device, Inventory, Pool
from nodeagent.resources.observed import MANAGED_BY, ObservedSlices
from nodeagent.resources.writes import SliceWrites
from tests.support.fake_resourceslices import FakeCluster

NODE = "node-a"
DRIVER = "gpu.example.com"
KEY = (DRIVER, "p0")


class Parts:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.tracker = InventoryTracker(NODE)
        self.desired = DesiredSlices(NODE)
        self.observed = ObservedSlices(cluster.source, NODE)
        self.writes = SliceWrites(cluster, self.observed, self.desired)
        self.refresh()

    def want(self, devices: int) -> None:
        pool = Pool(name=KEY[1], devices=[Device(name=f"d{i}") for i in range(devices)])
        self.tracker.drivers[DRIVER] = DriverState(
            inventory=Inventory(driver=DRIVER, pools=[pool]), registered=True
        )
        self.desired.apply(DRIVER, self.desired.build(self.tracker, [DRIVER])[DRIVER])

    def refresh(self) -> None:
        self.observed.refresh(self.desired)

    async def sync(self) -> bool:
        """Plans and writes the pool; whether anything was written."""
        todo = await self.writes.plan(KEY, self.desired.get(KEY))
        if todo is not None:
            await self.writes.apply(todo)
        self.refresh()
        return todo is not None


def ours(cluster: FakeCluster) -> list[dict[str, Any]]:
    return sorted(cluster.objects.values(), key=lambda o: o["metadata"]["name"])


async def test_a_pool_is_created_once_and_then_left_alone() -> None:
    cluster = FakeCluster(NODE)
    parts = Parts(cluster)
    parts.want(200)
    parts.writes.expected = {}
    assert await parts.sync()
    assert [c[0] for c in cluster.writes()] == ["create", "create"]
    objs = ours(cluster)
    assert parts.writes.count == 2
    # Where the writes leave the pool: the sync's own snapshot change is known.
    assert parts.writes.expected == {
        o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in objs
    }
    for o in objs:
        assert o["metadata"]["labels"] == {MANAGED_BY[0]: MANAGED_BY[1]}
        assert o["spec"]["pool"] == {"name": "p0", "generation": 1, "resourceSliceCount": 2}
    assert not await parts.sync()
    assert len(cluster.writes()) == 2


async def test_the_metadata_others_set_is_kept_and_a_stale_node_owner_replaced() -> None:
    cluster = FakeCluster(NODE)
    parts = Parts(cluster)
    parts.want(1)
    assert await parts.sync()
    [obj] = ours(cluster)
    # Someone annotates our slice and adds an owner; then the Node is re-created.
    theirs = copy.deepcopy(obj)
    theirs["metadata"]["annotations"] = {"example.com/note": "kept"}
    theirs["metadata"]["labels"]["example.com/team"] = "a"
    other = {"apiVersion": "example.com/v1", "kind": "Thing", "name": "t", "uid": "t-1"}
    theirs["metadata"]["ownerReferences"].append(other)
    theirs["metadata"]["managedFields"] = [{"manager": "someone"}]
    cluster.put_external(theirs)
    cluster.set_node("node-uid-2")
    parts.refresh()
    before = metrics.REOWNED._value.get()
    todo = await parts.writes.plan(KEY, parts.desired.get(KEY))
    assert todo is not None and todo.bodies == [] and len(todo.reown) == 1
    await parts.writes.apply(todo)
    assert metrics.REOWNED._value.get() == before + 1
    [stored] = ours(cluster)
    meta = stored["metadata"]
    assert meta["annotations"] == {"example.com/note": "kept"}
    assert meta["labels"] == {MANAGED_BY[0]: MANAGED_BY[1], "example.com/team": "a"}
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-2", "controller": True},
        other,
    ]
    assert "managedFields" not in meta
    assert stored["spec"] == obj["spec"]


async def test_a_new_generation_is_admitted_by_a_dry_run_before_any_write() -> None:
    cluster = FakeCluster(NODE)
    parts = Parts(cluster)
    parts.want(200)
    assert await parts.sync()
    published = ours(cluster)
    calls = len(cluster.writes())
    # The pool shrinks to one slice: an update and a delete, refused by the server's admission.
    parts.want(3)
    cluster.reject = lambda verb, obj: Invalid(422, "Invalid", "no") if verb == "update" else None
    with pytest.raises(Invalid):
        await parts.writes.plan(KEY, parts.desired.get(KEY))
    assert cluster.dry_runs and cluster.writes()[calls:] == []
    assert ours(cluster) == published
    # Admitted: the delete goes first, then the update.
    cluster.reject = lambda verb, obj: None
    assert await parts.sync()
    assert [c[0] for c in cluster.writes()[calls:]] == ["delete", "update"]
    [obj] = ours(cluster)
    assert obj["spec"]["pool"]["resourceSliceCount"] == 1
    assert len(obj["spec"]["devices"]) == 3


async def test_a_slice_already_gone_is_not_an_error() -> None:
    cluster = FakeCluster(NODE)
    parts = Parts(cluster)
    before = metrics.WRITES.labels("delete", "not_found")._value.get()
    await parts.writes.delete("gone", "uid-gone", "1")
    assert metrics.WRITES.labels("delete", "not_found")._value.get() == before + 1
    assert parts.writes.count == 0


def test_a_body_carries_the_full_desired_spec_and_the_pool() -> None:
    cluster = FakeCluster(NODE)
    parts = Parts(cluster)
    spec = msgspec.json.encode({"driver": DRIVER, "nodeName": NODE, "devices": [{"name": "x"}]})
    verb, body, sent = parts.writes.body("create", DRIVER, spec, "p0", 3, 2)
    assert (verb, sent) == ("create", spec)
    assert body["metadata"]["generateName"] == f"{NODE}-{DRIVER}-"
    assert body["spec"]["pool"] == {"name": "p0", "generation": 3, "resourceSliceCount": 2}
    assert body["spec"]["devices"] == [{"name": "x"}]
