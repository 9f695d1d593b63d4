"""The ResourceSlice publisher as a supervised component.

Cluster mode: a dedicated accumulator over this node's slices and its Node (`update()` drains
deltas, so no other consumer may share it) and a publisher writing through the process's one
client.
Standalone: a publisher without a client, whose desired slices the ops endpoint shows.

Each run builds a fresh accumulator and publisher: a restarted component starts from a clean
observed state and, thanks to the start-up grace, deletes nothing up front. The accumulator
observes the client's writes only while it runs, so restarts do not pile up observers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from nodeagent.accumulator import Accumulator, AccumulatorSettings
from nodeagent.core.component import Readiness
from nodeagent.core.health import Lapses, describe, overdue
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.kube import EventRecorder, KubeClient
from nodeagent.resources.publisher import Publisher, publisher_queries
from nodeagent.resources.settings import ResourcesSettings

__all__ = ["ResourcesComponent", "slice_summary"]


class ResourcesComponent:
    name = "resources"

    def __init__(
        self,
        *,
        node_name: str,
        inventories: LatestValue[Mapping[str, PluginData]],
        settings: LatestValue[ResourcesSettings],
        accumulator_settings: AccumulatorSettings,
        events: EventRecorder,
        client: KubeClient | None = None,
    ) -> None:
        self.node_name = node_name
        self._events = events  # the process's recorder
        self._inventories = inventories
        self._settings = settings
        self._accumulator_settings = accumulator_settings
        self._client = client
        self.accumulator: Accumulator | None = None
        self.publisher: Publisher | None = None
        # Pools not published (writes failing, changes held back), bounded by
        # resources.publish_failure_bound.
        self._unpublished: Lapses[tuple[str, str]] = Lapses(self.name, "unpublished_pools")

    @property
    def _bound(self) -> float:
        return self._settings.value.publish_failure_bound

    @property
    def standalone(self) -> bool:
        return self._client is None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._client is None:
            # The settings too: the view follows the configured disconnect_grace.
            self.publisher = Publisher(
                node_name=self.node_name, inventories=self._inventories, settings=self._settings
            )
            await self.publisher.run(task_status=task_status)
            return
        acc = Accumulator(
            self._client, publisher_queries(self.node_name), self._accumulator_settings
        )
        pub = Publisher(
            node_name=self.node_name,
            inventories=self._inventories,
            settings=self._settings,
            client=self._client,
            slices=acc,
            events=self._events,
        )
        self.accumulator, self.publisher = acc, pub
        async with trio.open_nursery() as nursery:
            await nursery.start(acc.run)
            await nursery.start(pub.run)
            task_status.started()

    def readiness(self) -> Readiness:
        pub, acc = self.publisher, self.accumulator
        if pub is None:
            return False, "starting"
        # Counts only: readiness runs on every heartbeat and /readyz, whatever the inventory size.
        drivers, pools, slices = pub.counts()
        counts = f"{drivers} drivers, {pools} pools, {slices} slices"
        rejected = pub.rejected()
        problems = f"; rejected inventory from {', '.join(rejected)}" if rejected else ""
        if pub.standalone:
            return True, f"standalone: {counts} desired, not written{problems}"
        if acc is not None and not acc.bootstrapped:
            return False, f"reading this node's slices ({acc.not_ready_reason()})"
        if not pub.synced:
            return False, "waiting for the first snapshot of this node's slices"
        now, bound = trio.current_time(), self._bound
        blocked = pub.blocked()
        held = ""
        if blocked is not None:
            # A relist under way holds writes back; it is not a readiness failure until the
            # watch cannot be kept for accumulator.unknown_bound (a brief control-plane
            # restart). A Forbidden list or a missing Node is one at once.
            unready = acc.unready_reason() if acc is not None else None
            if unready is not None or not blocked.startswith("the observed state is not known"):
                return False, f"nothing is written: {blocked}"
            held = f"; writes held back: {blocked}"
        failing = pub.failing()
        # Refused pools (foreign slices) and pools the API server rejects as invalid do not
        # heal with time: reported at once.
        lasting = {k: e for k, e in failing.items() if k in pub.refused() or k in pub.invalid()}
        if lasting:
            _key, error = sorted(lasting.items())[0]
            more = f" (+{len(failing) - 1} more pools)" if len(failing) > 1 else ""
            return False, f"{error}{more}"
        transient = {k: f"writing it fails: {e}" for k, e in failing.items() if k not in lasting}
        waiting = {k: t for k, t in pub.waiting().items() if k not in transient}
        for key in waiting:
            transient[key] = "its changes are not written yet (held back or retried later)"
        lapses = self._unpublished.observe(transient, now, waiting)
        worst = overdue(lapses, now, bound)
        if worst is not None:
            driver, pool = worst.key
            what = f"pool {pool} of driver {driver} not published"
            return False, describe(what, worst, now, bound, len(lapses) - 1)
        if lapses and failing:
            (driver, pool), error = sorted(failing.items())[0]
            held += f"; writing pool {pool} of driver {driver} fails (retrying): {error}"
        return True, f"{counts} desired, {pub.pending()} pools pending{problems}{held}"

    def view(self) -> dict[str, Any]:
        """What /v1/resourceslices shows: the desired slices, plus the sync state in cluster
        mode."""
        pub = self.publisher
        doc: dict[str, Any] = {
            "node": self.node_name,
            "mode": "standalone" if self.standalone else "cluster",
            "drivers": pub.desired_view() if pub is not None else {},
        }
        if not self.standalone:
            acc = self.accumulator
            doc["sync"] = {
                "observed_complete": acc is not None and acc.bootstrapped,
                "synced": pub is not None and pub.synced,
                "pending_pools": pub.pending() if pub is not None else 0,
                "blocked": pub.blocked() if pub is not None else None,
                "failing_pools": [
                    {"driver": d, "pool": p, "error": e}
                    for (d, p), e in sorted((pub.failing() if pub is not None else {}).items())
                ],
                "not_ready_reason": acc.not_ready_reason() if acc is not None else "starting",
                # Fields of the slices the cluster does not store (a feature gate off) and the
                # gate that likely drops each.
                "dropped_fields": [
                    {"driver": d, "pool": p, "field": f, "feature_gate": g}
                    for (d, p), fields in sorted((pub.dropped() if pub is not None else {}).items())
                    for f, g in sorted(fields.items())
                ],
                "invalid_pools": [
                    {"driver": d, "pool": p}
                    for d, p in sorted(pub.invalid() if pub is not None else set())
                ],
            }
        return doc


def slice_summary(view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per driver and pool of a `ResourcesComponent.view()`, for `nodeagent status`."""
    rows: list[dict[str, Any]] = []
    sync = view.get("sync") or {}
    dropped: dict[tuple[str, str], list[str]] = {}
    for d in sync.get("dropped_fields") or []:
        gate = f" ({d['feature_gate']})" if d.get("feature_gate") else ""
        dropped.setdefault((d["driver"], d["pool"]), []).append(f"{d['field']}{gate}")
    errors = {(f["driver"], f["pool"]): f["error"] for f in sync.get("failing_pools") or []}
    for driver, state in sorted(view.get("drivers", {}).items()):
        for pool, slices in sorted(state["pools"].items()):
            rows.append(
                {
                    "driver": driver,
                    "pool": pool,
                    "slices": len(slices),
                    "devices": sum(len(s.get("devices") or []) for s in slices),
                    "registered": state["registered"],
                    # The inventory's error, else the pool's (a refused or failing write).
                    "last_error": state["last_error"] or errors.get((driver, pool), ""),
                    "dropped_fields": dropped.get((driver, pool), []),
                }
            )
    return rows
