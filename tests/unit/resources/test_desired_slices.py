"""`DesiredSlices` on its own: unchanged pools keep what is prepared, a driver's pools replaced
as a whole, the form the server stores planned against (and forgotten when it stores the whole
spec again), dropped fields reported once, the ops view built once per inventory."""

from __future__ import annotations

import msgspec

from nodeagent.resources.desired import Desired, DesiredSlices
from nodeagent.resources.inventory import DriverState, InventoryTracker
from nodeagent.resources.model import Device, DeviceTaint, Inventory, Pool

NODE = "node-a"
DRIVER = "gpu.example.com"


def track(tracker: InventoryTracker, pools: dict[str, int], *, taints: bool = False) -> None:
    taint = [DeviceTaint(key="example.com/t", effect="NoSchedule")] if taints else []
    tracker.drivers[DRIVER] = DriverState(
        inventory=Inventory(
            driver=DRIVER,
            pools=[
                Pool(name=p, devices=[Device(name=f"d{i}", taints=taint) for i in range(n)])
                for p, n in pools.items()
            ],
        ),
        registered=True,
    )


def built(desired: DesiredSlices, tracker: InventoryTracker) -> set[tuple[str, str]]:
    pools = desired.build(tracker, [DRIVER])[DRIVER]
    return desired.apply(DRIVER, pools)


def test_unchanged_pools_keep_what_is_prepared() -> None:
    tracker, desired = InventoryTracker(NODE), DesiredSlices(NODE)
    track(tracker, {"p0": 2, "p1": 1})
    assert built(desired, tracker) == {(DRIVER, "p0"), (DRIVER, "p1")}
    p0, p1 = desired.get((DRIVER, "p0")), desired.get((DRIVER, "p1"))
    assert p0 is not None and p1 is not None
    assert desired.slice_count() == 2
    track(tracker, {"p0": 2, "p1": 3})
    built(desired, tracker)
    assert desired.get((DRIVER, "p0")) is p0
    new = desired.get((DRIVER, "p1"))
    assert new is not None and new is not p1
    assert [len(msgspec.json.decode(s)["devices"]) for s in new.specs] == [3]


def test_a_drivers_pools_are_replaced_as_a_whole() -> None:
    tracker, desired = InventoryTracker(NODE), DesiredSlices(NODE)
    track(tracker, {"p0": 1, "p1": 1})
    built(desired, tracker)
    track(tracker, {"p1": 1})
    pools = desired.build(tracker, [DRIVER])[DRIVER]
    # Old, new and observed pools of the driver come back (each may need a sync); another
    # driver's do not.
    observed = [(DRIVER, "published-before"), ("other.example.com", "x")]
    assert desired.apply(DRIVER, pools, observed) == {
        (DRIVER, "p0"),
        (DRIVER, "p1"),
        (DRIVER, "published-before"),
    }
    assert list(desired) == [(DRIVER, "p1")]
    assert (DRIVER, "p0") not in desired and desired.get((DRIVER, "p0")) is None


KEY = (DRIVER, "p0")


def store(desired: DesiredSlices, spec: bytes, *, drop_taints: bool) -> None:
    """The server's answer to a write of `spec`, with the taints dropped or not."""
    stored = msgspec.json.decode(spec)
    if drop_taints:
        for d in stored["devices"]:
            d.pop("taints", None)
    answer = {"metadata": {"name": "s"}, "spec": stored}
    desired.stored(KEY, msgspec.json.decode(spec), spec, answer)


def tainted(tracker: InventoryTracker, desired: DesiredSlices, devices: int) -> Desired:
    track(tracker, {KEY[1]: devices}, taints=True)
    built(desired, tracker)
    pool = desired.get(KEY)
    assert pool is not None
    return pool


def test_the_stored_form_is_planned_against_until_the_server_stores_it_whole() -> None:
    tracker, desired = InventoryTracker(NODE), DesiredSlices(NODE)
    before = tainted(tracker, desired, 2)
    [spec] = before.specs
    store(desired, spec, drop_taints=True)
    assert spec in desired.server_form and spec in desired.form_known
    after = desired.get(KEY)
    assert after is not None and after is not before and after.specs == before.specs
    # Reported once, with the gate that likely dropped it.
    assert desired.take_dropped(KEY) == {"devices.taints": "DRADeviceTaints"}
    assert desired.take_dropped(KEY) == {}
    store(desired, spec, drop_taints=True)
    assert desired.take_dropped(KEY) == {}
    assert desired.dropped == {KEY: {"devices.taints": "DRADeviceTaints"}}
    # The gate turned on: the whole spec is stored, the memory goes.
    store(desired, spec, drop_taints=False)
    assert desired.server_form == {}
    assert not desired.dropped.get(KEY)


def test_server_forms_are_pruned_to_the_current_specs() -> None:
    tracker, desired = InventoryTracker(NODE), DesiredSlices(NODE)
    [spec] = tainted(tracker, desired, 1).specs
    store(desired, spec, drop_taints=True)
    tainted(tracker, desired, 2)
    desired.prune_server_forms()
    assert desired.server_form == {} and desired.form_known == set()


def test_the_ops_view_is_built_once_per_inventory() -> None:
    tracker, desired = InventoryTracker(NODE), DesiredSlices(NODE)
    track(tracker, {"p0": 1})
    built(desired, tracker)
    inventory = tracker.drivers[DRIVER].inventory
    view = desired.pools_view(DRIVER, inventory)
    assert [d["name"] for d in view["p0"][0]["devices"]] == ["d0"]
    assert desired.pools_view(DRIVER, inventory) is view
    track(tracker, {"p0": 2})
    built(desired, tracker)
    changed = desired.pools_view(DRIVER, tracker.drivers[DRIVER].inventory)
    assert changed is not view and len(changed["p0"][0]["devices"]) == 2
    assert desired.pools_view(DRIVER, None) == {}


def test_the_view_and_the_count_cover_the_drivers_asked_for() -> None:
    tracker, desired = InventoryTracker(NODE), DesiredSlices(NODE)
    track(tracker, {"p0": 200})  # two slices
    built(desired, tracker)
    tracker.drivers["other.example.com"] = DriverState(last_error="rejected")
    assert desired.slice_count() == 2
    assert desired.slice_count({DRIVER}) == 2 and desired.slice_count(set()) == 0
    view = desired.view(tracker.drivers)
    assert list(view) == [DRIVER, "other.example.com"]
    assert view["other.example.com"] == {"registered": False, "last_error": "rejected", "pools": {}}
    assert view[DRIVER]["registered"] and len(view[DRIVER]["pools"]["p0"]) == 2
