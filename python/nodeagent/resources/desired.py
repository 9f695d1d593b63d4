"""The publisher's desired side: per (driver, pool), the slices of the driver's last valid
inventory, prepared for planning once per inventory, and the memory of what the server stores.

The server may store less than it is sent (fields behind a disabled feature gate are dropped):
planning against the form it keeps stops an endless update loop, and each dropped field is
reported once.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from nodeagent import _native
from nodeagent.log import get_logger
from nodeagent.resources import metrics
from nodeagent.resources.dropped import dropped_fields, likely_gate, present_fields
from nodeagent.resources.inventory import DriverState, InventoryTracker
from nodeagent.resources.model import Inventory, desired_specs
from nodeagent.resources.observed import PoolKey

log = get_logger(__name__)

__all__ = ["Desired", "DesiredSlices"]


@dataclass
class Desired:
    specs: tuple[bytes, ...]
    prepared: list[_native.PreparedDesired]
    # The specs as JSON objects for the ops view; built when first asked for (or, for large
    # inventories, in the worker thread), reusing the objects of unchanged slices.
    views: list[dict[str, Any]] | None = None

    def slice_views(self, reuse: Desired | None = None) -> list[dict[str, Any]]:
        if self.views is None:
            known = (
                dict(zip(reuse.specs, reuse.views, strict=True)) if reuse and reuse.views else {}
            )
            self.views = [known.get(s) or msgspec.json.decode(s) for s in self.specs]
        return self.views


class DesiredSlices:
    """The desired slices per pool, their ops views, the server-form memory and the fields
    the server dropped."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name
        self._pools: dict[PoolKey, Desired] = {}
        # Desired spec bytes -> the spec the server stored for it, when they differ (fields
        # behind disabled feature gates are dropped): planning against what the server keeps
        # stops an endless update loop. Only for current desired specs.
        self.server_form: dict[bytes, bytes] = {}
        # Desired specs whose stored form the server has shown (by a write or a dry run).
        self.form_known: set[bytes] = set()
        # Per driver: the desired pools its view was built from, and that view.
        self._views: dict[str, tuple[tuple[Desired | None, ...], dict[str, Any]]] = {}
        # Per pool, the fields the API server did not store (reported once each) and the
        # feature gate that likely dropped them.
        self.dropped: dict[PoolKey, dict[str, str]] = {}
        self._newly_dropped: dict[PoolKey, list[str]] = {}  # not yet reported

    def __contains__(self, key: object) -> bool:
        return key in self._pools

    def __iter__(self) -> Iterator[PoolKey]:
        return iter(self._pools)

    def get(self, key: PoolKey | None) -> Desired | None:
        return self._pools.get(key) if key is not None else None

    def slice_count(self, drivers: Container[str] | None = None) -> int:
        """The desired slices (of `drivers` only, when given)."""
        pools = self._pools.items()
        return sum(len(d.specs) for k, d in pools if drivers is None or k[0] in drivers)

    def view(self, drivers: Mapping[str, DriverState]) -> dict[str, Any]:
        """The desired slices of `drivers` per pool, and each driver's state, for the ops
        endpoint (the slices' views are built once per inventory, not per call)."""
        return {
            driver: {
                "registered": state.registered,
                "last_error": state.last_error,
                "pools": self.pools_view(driver, state.inventory),
            }
            for driver, state in sorted(drivers.items())
        }

    def build(
        self, tracker: InventoryTracker, drivers: Iterable[str], views: bool = False
    ) -> dict[str, dict[PoolKey, Desired]]:
        """Each driver's desired slices per pool, unchanged pools reusing what is prepared;
        with `views`, their ops views too (off the loop, which would otherwise build them on
        the next /v1/status)."""
        out: dict[str, dict[PoolKey, Desired]] = {}
        for driver in drivers:
            state = tracker.drivers[driver]
            inventory = state.inventory
            pools: dict[PoolKey, Desired] = {}
            if inventory is None:
                out[driver] = pools
                continue
            # Written with the inventory's conversion (else in one Rust call): the specs come
            # as the bytes the planner reads.
            written = state.specs
            if written is None:
                written = desired_specs(inventory, self.node_name)
            for pool, pool_specs in zip(inventory.pools, written, strict=True):
                key = (driver, pool.name)
                specs = tuple(pool_specs)
                old = self._pools.get(key)
                if old is not None and old.specs == specs:
                    pools[key] = old
                    continue
                pools[key] = desired = self.prepare(specs)
                if views:
                    desired.slice_views(old)
            out[driver] = pools
        return out

    def apply(
        self, driver: str, pools: dict[PoolKey, Desired], observed: Iterable[PoolKey] = ()
    ) -> set[PoolKey]:
        """Replaces the driver's pools; returns the keys of its pools, old, new and
        `observed`."""
        keys = {k for k in (*self._pools, *observed) if k[0] == driver} | set(pools)
        for key in keys:
            desired = pools.get(key)
            if desired is None:
                self._pools.pop(key, None)
                self.dropped.pop(key, None)
            else:
                self._pools[key] = desired
        return keys

    def prepare(self, specs: tuple[bytes, ...]) -> Desired:
        planned = [self.server_form.get(s, s) for s in specs]
        return Desired(specs, _native.prepare_desired(planned))

    def prune_server_forms(self) -> None:
        if self.server_form or self.form_known:
            current = {s for d in self._pools.values() for s in d.specs}
            for spec in [s for s in self.server_form if s not in current]:
                del self.server_form[spec]
            self.form_known &= current

    def pools_view(self, driver: str, inventory: Inventory | None) -> dict[str, Any]:
        """The driver's desired slices per pool, built once per inventory."""
        if inventory is None:
            self._views.pop(driver, None)
            return {}
        desired = tuple(self._pools.get((driver, pool.name)) for pool in inventory.pools)
        cached = self._views.get(driver)
        if (
            cached is not None
            and len(cached[0]) == len(desired)
            and all(a is b for a, b in zip(cached[0], desired, strict=True))
        ):
            return cached[1]
        pools = {
            pool.name: d.slice_views() if d is not None else []
            for pool, d in zip(inventory.pools, desired, strict=True)
        }
        self._views[driver] = (desired, pools)
        return pools

    def stored(
        self, key: PoolKey, sent: dict[str, Any], spec_bytes: bytes, answer: dict[str, Any]
    ) -> None:
        """What the server stored for a desired spec (a write's or a dry run's answer):
        remembers its form when it differs and notes the fields it dropped."""
        try:
            stored_spec = answer["spec"]
            stored = msgspec.json.encode(stored_spec)
        except (KeyError, TypeError):
            return
        self.form_known.add(spec_bytes)
        equal = _native.slice_spec_equal(stored, spec_bytes)
        if not equal or self.dropped.get(key):
            # Walking the spec in Python only when the fast comparison finds a difference,
            # or the pool has fields reported dropped that this write may show kept.
            self._note_dropped(key, sent, stored_spec)
        known = self.server_form.get(spec_bytes)
        if equal:
            if known is None:
                return
            del self.server_form[spec_bytes]
        else:
            if known is not None and _native.slice_spec_equal(stored, known):
                return
            self.server_form[spec_bytes] = stored
        for k, d in self._pools.items():
            if spec_bytes in d.specs:
                self._pools[k] = self.prepare(d.specs)
                self._pools[k].views = d.views

    def _note_dropped(self, key: PoolKey, sent: dict[str, Any], stored: Any) -> None:
        """Notes each field of the pool the server did not store once (metric; the report is
        `take_dropped`'s), and forgets those a later write shows stored (a gate turned on)."""
        driver, pool = key
        if not isinstance(stored, dict):
            return
        missing = dropped_fields(sent, stored)
        known = self.dropped.setdefault(key, {})
        kept = [f for f in present_fields(sent) if f in known and f not in missing]
        for field in kept:
            del known[field]
            log.info(
                "the API server stores a field it dropped before (a feature gate turned on)",
                driver=driver,
                pool=pool,
                field=field,
            )
        for field in missing:
            if field not in known:
                known[field] = likely_gate(field)
                metrics.FIELDS_DROPPED.labels(driver, field).inc()
                self._newly_dropped.setdefault(key, []).append(field)

    def take_dropped(self, key: PoolKey) -> dict[str, str]:
        """The fields of the pool found dropped since the last call, each with its likely
        feature gate ("" when none is known)."""
        known = self.dropped.get(key, {})
        return {f: known.get(f, "") for f in sorted(self._newly_dropped.pop(key, []))}
