"""Whose a pool is, decided where its data lives (issue 30 item 2): `ObservedSlices` holds the
foreign slices, so it says whether a pool is refused (it also holds slices nodeagent does not
manage) or taken over (another publisher's, its plugin gone); `InventoryTracker` holds the
plugins, so it says which pools wait for their plugin's first valid inventory and which gone
drivers' slices are kept. The publisher asks them, and keeps to its worker."""

from __future__ import annotations

from nodeagent.resources.inventory import DriverState, InventoryTracker
from nodeagent.resources.model import Inventory
from nodeagent.resources.observed import ObservedSlices
from tests.unit.resources.test_observed_slices import Source

NODE = "node-a"
KEY = ("gpu.example.com", "p0")


def observed_with_foreign() -> ObservedSlices:
    observed = ObservedSlices(Source(), NODE)
    observed.foreign[KEY] = ("theirs-1",)
    return observed


def test_a_pool_holding_foreign_slices_is_refused_while_its_plugin_is_registered() -> None:
    observed = observed_with_foreign()
    refusal = observed.refusal(KEY, ours=True, registered=True)
    assert refusal is not None and "theirs-1" in refusal and NODE in refusal
    assert not observed.taken_over(KEY, registered=True)


def test_a_pool_of_a_gone_plugin_with_foreign_slices_is_taken_over_not_refused() -> None:
    observed = observed_with_foreign()
    assert observed.taken_over(KEY, registered=False)
    assert observed.refusal(KEY, ours=True, registered=False) is None


def test_a_pool_that_is_not_ours_or_has_no_foreign_slices_is_not_refused() -> None:
    assert observed_with_foreign().refusal(KEY, ours=False, registered=True) is None
    clean = ObservedSlices(Source(), NODE)
    assert clean.refusal(KEY, ours=True, registered=True) is None
    assert not clean.taken_over(KEY, registered=False)


def test_the_tracker_holds_the_pools_of_plugins_without_a_valid_inventory() -> None:
    tracker = InventoryTracker(NODE)
    tracker.drivers["gpu.example.com"] = DriverState(registered=True)
    tracker.drivers["nic.example.com"] = DriverState(
        inventory=Inventory(driver="nic"), registered=True
    )
    tracker.drivers["gone.example.com"] = DriverState(registered=False, gone_since=5.0)
    pools = [KEY, ("nic.example.com", "p"), ("gone.example.com", "p")]
    assert tracker.held(pools) == {KEY}
    # A gone driver's slices are kept until its deletion deadline (here the disconnect grace).
    assert set(tracker.kept(14.0, 0.0, 1.0, 10.0)) == set(tracker.drivers)
    assert set(tracker.kept(15.0, 0.0, 1.0, 10.0)) == {"gpu.example.com", "nic.example.com"}
