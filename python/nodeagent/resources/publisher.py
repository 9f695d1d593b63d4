"""The ResourceSlice publisher: plugins' inventories -> desired slices per pool -> plan (Rust)
-> API writes, level-triggered and idempotent.

- Desired: per driver and pool, the slices of the last valid inventory (`inventory.py`,
  `model.desired_slices`).
- Observed: this node's slices (field selector ``spec.nodeName=<node>``) and the Node itself
  (``metadata.name=<node>``, for the owner UID) through the publisher's own accumulator,
  including our own writes (read-your-writes). Only slices carrying the
  ``app.kubernetes.io/managed-by=nodeagent`` label are ours to change. A slice of the same
  driver and pool without the label means someone else publishes that pool: the pool is refused
  (never written, reported) until that slice goes away.
- A work queue keyed by (driver, pool) runs the syncs: deduplicated, coalescing (a sync reads
  the newest state), with per-pool exponential backoff after a failed sync. The sync's own
  writes never queue its pool again.
- Nothing is written while the observed state is not known (a query's list Forbidden, not yet
  read) or the Node does not exist; a Node re-created under the same name gets our slices
  re-owned.
- Updates start from the observed object's metadata: labels, annotations, finalizers and owner
  references others set are kept.
- Lifecycle: a disconnected plugin's slices stay for ``disconnect_grace``; after a restart
  nothing is deleted before ``startup_grace`` has passed, and nothing is written before the
  observed state is complete, so a restart with unchanged plugins makes no writes. A registered
  plugin with no valid inventory since the start keeps what is published.
- Standalone (no client): the desired slices are only shown (`desired_view`).

This module is the loop (the worker, one pool's sync, its holds, graces and failures), in the
shape of the upstream resourceslice controller's `processNextWorkItem` / `syncPool`; the parts
it uses are the desired slices (`desired.py`), the observed slices (`observed.py`) and the
writes (`writes.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from nodeagent import _native
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.core.wake import Pulse
from nodeagent.kube import ApiError, BadRequest, Conflict, EventRecorder, Invalid, KubeError
from nodeagent.log import get_logger
from nodeagent.resources import metrics
from nodeagent.resources.desired import Desired, DesiredSlices
from nodeagent.resources.events import NodeEvents
from nodeagent.resources.inventory import Converted, DriverState, InventoryTracker
from nodeagent.resources.observed import (
    MANAGED_BY,
    ObservedSlices,
    PoolKey,
    SliceSource,
    node_query_args,
    publisher_queries,
    slices_query_args,
)
from nodeagent.resources.queue import WorkQueue
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.resources.writes import SliceWriter, SliceWrites

if TYPE_CHECKING:
    from google.protobuf.message import Message

log = get_logger(__name__)

__all__ = [
    "MANAGED_BY",
    "Publisher",
    "SliceSource",
    "SliceWriter",
    "node_query_args",
    "publisher_queries",
    "slices_query_args",
]

# Seconds between two looks at a pool held back because the observed state is not known: the
# accumulator does not announce that a Forbidden list has become readable again.
UNKNOWN_STATE_RECHECK = 1.0

# After a 409 Conflict the pool's observed state is stale (every update and delete carries the
# observed resourceVersion, so a retry planned from the same state conflicts again). The retry
# waits, on top of its backoff, until the watch shows a newer state or this many seconds have
# passed (the watch may be down: the fault matrix's reset-mid-response made 8 conflicting writes
# in 0.7 s without this wait).
CONFLICT_STALE_WAIT = 1.0


class PoolRefused(Exception):
    """A pool that also holds slices nodeagent does not manage: it is not written."""


class Publisher:
    """Keeps this node's ResourceSlices equal to what the plugins report (the module docstring
    has the rules).

    Owns the desired state (per driver and pool, from the inventories' `LatestValue`), the
    observed state (from its `SliceSource`, an accumulator over this node's slices and Node),
    the writes and the work queue. `run()` starts, in one nursery: the inventory watcher
    (desired state changes queue their pools), the slice watcher (observed changes queue the
    pools they touch), the worker (one pool sync at a time: plan in Rust, write through the
    `SliceWriter`), the Event recorder and the start-up grace timer. Standalone (no client):
    only the inventory watcher runs and `desired_view()` shows what would be written.
    """

    def __init__(
        self,
        *,
        node_name: str,
        inventories: LatestValue[Mapping[str, PluginData]],
        settings: ResourcesSettings | LatestValue[ResourcesSettings] | None = None,
        client: SliceWriter | None = None,
        slices: SliceSource | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        if not isinstance(settings, LatestValue):
            settings = LatestValue(settings or ResourcesSettings())
        self._live = settings
        self.settings.validate()
        if (client is None) != (slices is None):
            raise ValueError("client and slices go together (both None: standalone)")
        self.node_name = node_name
        self._inventories = inventories
        # The process's recorder (the process runs it), or one of our own over our client;
        # standalone, none.
        self._own_events = events is None and client is not None
        if client is None:
            events = None
        elif events is None:
            events = NodeEvents(client, node_name)
        self._events = events
        self._tracker = InventoryTracker(
            node_name, self._events.warn if self._events is not None else None
        )
        self._desired = DesiredSlices(node_name)
        self._observed = ObservedSlices(slices, node_name) if slices is not None else None
        self._writes = (
            SliceWrites(client, self._observed, self._desired)
            if client is not None and self._observed is not None
            else None
        )
        self._queue: WorkQueue[PoolKey] = WorkQueue(
            self.settings.retry_backoff_initial,
            self.settings.retry_backoff_max,
            lambda: self.settings.min_sync_interval,
        )
        self._started = 0.0
        self._synced_once = False
        self._synced = trio.Event()
        self._failing: dict[PoolKey, str] = {}  # pool -> last error, until a sync succeeds
        # Pools whose last write conflicted: the observed versions then, and until when a
        # retry waits for newer ones.
        self._stale: dict[PoolKey, tuple[dict[str, str], float]] = {}
        self._refused: set[PoolKey] = set()  # failing because of foreign slices
        # Pools the API server refused (422/400): the desired state refused and until when an
        # unchanged desired state is not tried again.
        self._invalid: dict[PoolKey, tuple[Desired | None, float]] = {}
        self._still_invalid = False  # the running sync only waited out a refusal
        # The pool being synced: a snapshot showing exactly what its own writes lead to is no
        # reason to sync it again.
        self._syncing: PoolKey | None = None
        self._planned: set[PoolKey] = set()  # pools planned at least once in this run
        # Drivers whose desired slices are being rebuilt in a worker thread: their inventory
        # state is already new, their desired slices not yet.
        self._building: set[str] = set()
        self._taken_version = -1  # the newest plugins snapshot taken in
        self._taken = Pulse()

    # -- public ---------------------------------------------------------------------------

    @property
    def standalone(self) -> bool:
        return self._writes is None

    @property
    def writes(self) -> int:
        """Successful writes (create, update, delete, re-own) in this run."""
        return self._writes.count if self._writes is not None else 0

    def desired_view(self) -> dict[str, Any]:
        """The desired slices per driver and pool, and each driver's state, for the ops
        endpoint. The slices are built once per inventory, not per call."""
        out: dict[str, Any] = {}
        for driver, state in sorted(self._shown().items()):
            out[driver] = {
                "registered": state.registered,
                "last_error": state.last_error,
                "pools": self._desired.pools_view(driver, state.inventory),
            }
        return out

    def counts(self) -> tuple[int, int, int]:
        """(drivers, pools, slices) desired: what readiness shows, without building slices."""
        shown = self._shown()
        pools = sum(len(s.inventory.pools) for s in shown.values() if s.inventory is not None)
        if len(shown) == len(self._tracker.drivers):
            return len(shown), pools, self._desired.slice_count()
        desired = (self._desired.get(k) for k in self._desired if k[0] in shown)
        return len(shown), pools, sum(len(d.specs) for d in desired if d is not None)

    def _shown(self) -> dict[str, DriverState]:
        """The drivers whose slices are desired. Standalone, nothing is written whose
        deletion would end a gone driver's grace: its slices are shown (not registered) for
        ``disconnect_grace`` after it left, then no more (a start-up grace is for slices
        published before a restart, which standalone has none of)."""
        drivers = self._tracker.drivers
        if not self.standalone:
            return drivers
        now, grace = trio.current_time(), self.settings.disconnect_grace
        return {
            d: s
            for d, s in drivers.items()
            if s.registered or s.gone_since is None or now < s.gone_since + grace
        }

    def rejected(self) -> list[str]:
        """Drivers whose latest inventory was rejected."""
        return sorted(d for d, s in self._tracker.drivers.items() if s.last_error)

    def failing(self) -> dict[PoolKey, str]:
        """Pools whose last sync failed (retrying with backoff) or that are refused, with the
        error."""
        return dict(self._failing)

    def refused(self) -> set[PoolKey]:
        """Pools not published because they hold slices nodeagent does not manage."""
        return set(self._refused)

    def invalid(self) -> set[PoolKey]:
        """Pools the API server refuses (422 Invalid or 400 BadRequest); `failing()` has its
        message."""
        return set(self._invalid)

    def dropped(self) -> dict[PoolKey, dict[str, str]]:
        """Per pool, the fields the API server did not store, each with the feature gate that
        likely dropped it ("" when none is known)."""
        return {k: dict(v) for k, v in self._desired.dropped.items() if v}

    def pending(self) -> int:
        """Pools waiting for a sync (including those waiting for a grace or a backoff)."""
        return len(self._queue)

    def waiting(self) -> dict[PoolKey, float]:
        """Pools with desired slices waiting for a sync, and when each one's latest sync
        started (-inf: never): what readiness bounds as changes not published."""
        return {k: t for k, t in self._queue.waiting().items() if k in self._desired}

    def blocked(self) -> str | None:
        """Why nothing is written at all right now (None: pools are synced)."""
        if self._observed is None or not self._synced_once:
            return None
        # A relist under way is not a readiness problem for the accumulator, but its frozen
        # snapshot lacks own writes: acting on it could create a pool twice.
        unknown = self._observed.unknown()
        if unknown:
            why = "; ".join(f"{s.query}: {s.reason or s.state.value}" for s in unknown)
            return f"the observed state is not known ({why})"
        if self._observed.node_uid is None:
            return f"waiting for Node {self.node_name}"
        return None

    @property
    def synced(self) -> bool:
        """The observed state has been read completely at least once."""
        return self._synced_once

    async def wait_inventories(self) -> None:
        """Until the plugins' snapshot that is newest now has been taken in (converted, and
        its desired slices built and queued)."""
        target = self._inventories.version
        while self._taken_version < target:
            await self._taken.wait()

    async def wait_idle(self) -> None:
        """Until the observed state has been read and no pool is queued, waiting or syncing."""
        await self._synced.wait()
        await self._queue.wait_idle()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_inventories)
            if self._events is not None and self._own_events:
                nursery.start_soon(self._events.run)
            if self._observed is not None:
                nursery.start_soon(self._watch_slices, self._observed)
                nursery.start_soon(self._worker)
                # Drivers that had slices before a restart get their deletion check once the
                # start-up grace is over.
                nursery.start_soon(self._after_startup_grace)
                nursery.start_soon(self._follow_settings, self._live.version)
            task_status.started()

    @property
    def settings(self) -> ResourcesSettings:
        """The newest settings: intervals and graces are read where they are used."""
        return self._live.value

    def _pools(self) -> set[PoolKey]:
        """The pools we want to publish or have published."""
        observed = self._observed.groups if self._observed is not None else {}
        return {*self._desired, *observed}

    async def _follow_settings(self, version: int) -> None:
        # Pools held for a grace wait for a deadline computed with the old value: look again.
        while True:
            version, _ = await self._live.wait_newer(version)
            for key in self._pools():
                self._queue.add(key)

    # -- inputs ---------------------------------------------------------------------------

    async def _watch_inventories(self) -> None:
        version = -1
        while True:
            version, plugins = await self._inventories.wait_newer(version)
            # Converting, validating and splitting a large inventory costs tens of milliseconds
            # of CPU: in a worker thread, the event loop (heartbeat, probes) stays responsive.
            # This task is the only writer of the tracker and the desired state, so the thread
            # reads them undisturbed.
            unseen = self._tracker.unseen(plugins)
            threaded = self._large(unseen.values())
            converted = None
            if threaded:
                converted = await trio.to_thread.run_sync(self._convert_all, unseen)
            changed = self._tracker.update(plugins, trio.current_time(), converted)
            if changed:
                if threaded:
                    self._building = changed
                    try:
                        built = await trio.to_thread.run_sync(self._build_desired, changed, True)
                    finally:
                        self._building = set()
                else:
                    built = self._build_desired(changed)
                for driver, pools in built.items():
                    self._apply_desired(driver, pools)
                self._desired.prune_server_forms()
                metrics.DESIRED_SLICES.set(self._desired.slice_count())
            self._taken_version = version
            self._taken.fire()

    def _large(self, messages: Iterable[Message]) -> bool:
        threshold = self.settings.thread_threshold
        return sum(m.ByteSize() for m in messages) >= threshold > 0

    def _convert_all(self, messages: Mapping[str, Message]) -> dict[str, Converted]:
        return {name: self._tracker.convert(name, m) for name, m in messages.items()}

    def _build_desired(
        self, drivers: Iterable[str], views: bool = False
    ) -> dict[str, dict[PoolKey, Desired]]:
        return self._desired.build(self._tracker, drivers, views)

    def _apply_desired(self, driver: str, pools: dict[PoolKey, Desired]) -> None:
        observed = self._observed.groups if self._observed is not None else {}
        for key in self._desired.apply(driver, pools, observed):
            if not self.standalone:
                self._queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self._queue))

    async def _watch_slices(self, observed: ObservedSlices) -> None:
        while True:
            await observed.source.changed()
            self._refresh_observed()

    def _refresh_observed(self) -> None:
        """Takes the newest snapshot (own writes included) and queues the pools it changed."""
        observed = self._observed
        assert observed is not None and self._writes is not None
        if not observed.take():
            return
        syncing = self._syncing
        # A foreign slice is never the sync's own write, even when it arrives in the same
        # snapshot as the sync's writes or while they are in flight (issue 20: taken for ours,
        # its pool was published beside it).
        foreign = observed.foreign.get(syncing) if syncing is not None else None
        changed = observed.regroup(self._desired)
        if observed.refresh_node():
            changed |= self._pools()
        if (
            syncing in changed
            and observed.versions(syncing) == self._writes.expected
            and observed.foreign.get(syncing) == foreign
        ):
            changed.discard(syncing)  # only the sync's own writes: no reason to run again
        for key in changed:
            self._queue.add(key)
        if not self._synced_once:
            self._synced_once = True
            self._synced.set()
            for key in self._pools():
                self._queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self._queue))

    async def _after_startup_grace(self) -> None:
        await trio.sleep(self.settings.startup_grace)
        for key in self._pools():
            self._queue.add(key)

    # -- syncing --------------------------------------------------------------------------

    async def _worker(self) -> None:
        """`processNextWorkItem`: one pool at a time, its outcome deciding when it runs next."""
        assert self._observed is not None and self._writes is not None
        while True:
            key = await self._queue.get()
            # The accumulator offers a change at most once per notification interval (1 s): a
            # slice another writer made just before is seen before this sync writes (issue 20),
            # not after.
            self._refresh_observed()
            t0 = time.perf_counter()
            failed = False
            wait: float | None = None
            self._syncing, self._writes.expected = key, self._observed.versions(key)
            self._still_invalid = False
            try:
                wait = await self._sync(key)
            except PoolRefused as exc:
                self._refuse(key, str(exc))
            except (Invalid, BadRequest) as exc:
                # The same request gets the same answer: no backoff loop, but a look again
                # when the inventory changes or after the slow interval.
                wait = self._refused_by_server(key, exc)
            except KubeError as exc:
                failed = True
                self._fail(key, "failed", str(exc))
                if isinstance(exc, Conflict):
                    self._stale[key] = (
                        self._observed.versions(key),
                        trio.current_time() + CONFLICT_STALE_WAIT,
                    )
            except Exception as exc:
                # A bug or bad data in one pool must not take the others (and the accumulator,
                # with its start-up grace) down with it: fail this pool and retry it.
                failed = True
                log.exception("resourceslice sync raised", driver=key[0], pool=key[1])
                self._fail(key, "error", f"unexpected error: {exc!r}")
            else:
                if key not in self._stale and not self._still_invalid:
                    self._recovered(key)
            finally:
                self._syncing, self._writes.expected = None, None
                # A retry held back for a newer observed state is still a failing pool: its
                # backoff keeps growing.
                delay = self._queue.done(key, failed=failed, keep_backoff=key in self._stale)
                if wait is not None:
                    self._queue.add(key, wait)
                metrics.SYNC_SECONDS.observe(time.perf_counter() - t0)
                metrics.QUEUE_DEPTH.set(len(self._queue))
                metrics.REFUSED_POOLS.set(len(self._refused))
                metrics.INVALID_POOLS.set(len(self._invalid))
            if delay is not None:
                log.info("resourceslice sync requeued", driver=key[0], pool=key[1], delay=delay)

    def _fail(self, key: PoolKey, result: str, error: str) -> None:
        metrics.SYNCS.labels(result).inc()
        self._refused.discard(key)
        if key not in self._failing and self._events is not None:
            # Once per failure streak: the operator looks at the Node's events.
            self._events.warn(
                "ResourceSliceSyncFailed",
                f"publishing pool {key[1]} of driver {key[0]} failed: {error}",
            )
        self._failing[key] = error
        log.warning(
            "resourceslice sync failed; retrying with backoff",
            driver=key[0],
            pool=key[1],
            error=error,
            failures=self._queue.failures(key) + 1,
        )

    def _refuse(self, key: PoolKey, error: str) -> None:
        metrics.SYNCS.labels("refused").inc()
        self._refused.add(key)
        if self._failing.get(key) != error:
            if self._events is not None:
                self._events.warn("ResourceSlicePoolConflict", error)
            log.error("resourceslice pool refused", driver=key[0], pool=key[1], error=error)
        self._failing[key] = error

    def _refused_by_server(self, key: PoolKey, exc: ApiError) -> float:
        metrics.SYNCS.labels("invalid").inc()
        self._refused.discard(key)
        retry = self.settings.invalid_retry_interval
        self._invalid[key] = (self._desired.get(key), trio.current_time() + retry)
        error = (
            f"the API server refuses pool {key[1]} of driver {key[0]} "
            f"({exc.code} {exc.reason}): {exc.message}"
        )
        if self._failing.get(key) != error:
            if self._events is not None:
                self._events.warn("ResourceSlicePoolInvalid", error)
            log.error(
                "resourceslice pool refused by the API server; tried again when the inventory "
                "changes or after resources.invalid_retry_interval",
                driver=key[0],
                pool=key[1],
                error=error,
                retry_in=retry,
            )
        self._failing[key] = error
        return retry

    def _recovered(self, key: PoolKey) -> None:
        self._refused.discard(key)
        self._invalid.pop(key, None)
        if self._failing.pop(key, None) is not None:
            log.info("resourceslice pool recovered", driver=key[0], pool=key[1])

    def _deletion_deadline(self, state: DriverState | None) -> float:
        """When a driver without a current inventory for a pool may lose its slices."""
        if state is None:
            return self._started + self.settings.startup_grace
        if state.registered:
            return -float("inf")
        gone = state.gone_since if state.gone_since is not None else self._started
        return max(
            gone + self.settings.disconnect_grace, self._started + self.settings.startup_grace
        )

    def _hold(self, key: PoolKey) -> tuple[bool, float | None]:
        """Whether the pool must not be written now, and after how long to look again."""
        observed = self._observed
        assert observed is not None
        if self.blocked() is not None:
            # The Node's arrival queues every pool; a readable list is not announced.
            return True, None if observed.node_uid is None else UNKNOWN_STATE_RECHECK
        foreign = observed.foreign.get(key)
        ours = key in self._desired or key in observed.groups
        if foreign and ours and not self._taken_over(key):
            raise PoolRefused(
                f"pool {key[1]} of driver {key[0]} on node {self.node_name} also holds "
                f"ResourceSlices not managed by nodeagent ({', '.join(foreign)}): nodeagent "
                "does not publish this pool until they are gone"
            )
        return False, None

    def _taken_over(self, key: PoolKey) -> bool:
        """Whether another publisher took over the pool of a plugin that is not registered (a
        driver upgraded to one that publishes its own slices, as the kubelet's helper does):
        the pool is not ours any more, so it is neither refused nor kept for a grace."""
        if self._observed is None or not self._observed.foreign.get(key):
            return False
        state = self._tracker.drivers.get(key[0])
        return state is None or not state.registered

    async def _sync(self, key: PoolKey) -> float | None:
        """`syncPool`: plans and writes one pool; returns after how long to look again when it
        must wait for a grace period or for the observed state."""
        observed = self._observed
        if observed is None or not self._synced_once:
            metrics.SYNCS.labels("deferred").inc()
            return None  # the first snapshot queues every pool
        if key[0] in self._building:
            # Its new inventory without its new slices would look like pools to delete; the
            # rebuilt slices queue the pool again.
            metrics.SYNCS.labels("deferred").inc()
            return None
        try:
            held, again = self._hold(key)
        except PoolRefused:
            if observed.groups.get(key):
                # Two publishers of one pool: each slice claims a count the other breaks, and
                # a scheduler reading it sees devices that may not exist. Theirs stay; ours go
                # now (no grace: our plugin is still there, the pool is just not ours to write).
                await self._plan_and_write(key, None)
            raise
        if held:
            metrics.SYNCS.labels("deferred").inc()
            return again
        stale = self._stale.pop(key, None)
        if stale is not None:
            versions, until = stale
            now = trio.current_time()
            if observed.versions(key) == versions and now < until:
                # A newer observed state queues the pool at once; else look again at `until`.
                self._stale[key] = stale
                metrics.SYNCS.labels("deferred").inc()
                return until - now
        invalid = self._invalid.get(key)
        if invalid is not None:
            refused, until = invalid
            now = trio.current_time()
            if refused is self._desired.get(key) and now < until:
                metrics.SYNCS.labels("deferred").inc()
                self._still_invalid = True
                return until - now
        state = self._tracker.drivers.get(key[0])
        if state is not None and state.registered and state.inventory is None:
            # Registered, but nothing valid received since the start: what is published is
            # the last valid inventory there is.
            metrics.SYNCS.labels("deferred").inc()
            return None
        desired = self._desired.get(key)
        if self._taken_over(key):
            # What we wrote describes the plugin that left, beside its successor's slices: it
            # goes now (a grace is for a plugin that may come back, not for a handed-over pool).
            # After a restart the plugin is not known to have left: the start-up grace holds.
            if state is None and trio.current_time() < self._deletion_deadline(None):
                metrics.SYNCS.labels("deferred").inc()
                return self._deletion_deadline(None) - trio.current_time()
            if observed.groups.get(key):
                log.info(
                    "resourceslice pool taken over by another publisher; deleting ours",
                    driver=key[0],
                    pool=key[1],
                )
            await self._plan_and_write(key, None)
            return None
        if desired is not None and state is not None and not state.registered:
            # A disconnected plugin's inventory stays published for the grace period only.
            deadline = self._deletion_deadline(state)
            now = trio.current_time()
            if now < deadline:
                metrics.SYNCS.labels("deferred").inc()
                return deadline - now
            desired = None
        if desired is None and (state is None or not state.registered):
            deadline = self._deletion_deadline(state)
            now = trio.current_time()
            if now < deadline:
                metrics.SYNCS.labels("deferred").inc()
                return deadline - now
        await self._plan_and_write(key, desired)
        return None

    async def _plan_and_write(self, key: PoolKey, desired: Desired | None) -> None:
        assert self._observed is not None and self._writes is not None
        writes = self._writes
        driver, pool = key
        observed = self._observed.groups.get(key, {})
        ordered = [observed[n] for n in sorted(observed)]
        t0 = time.perf_counter()
        generation, unchanged, updates, creates, deletes = _native.plan_prepared(
            desired.prepared if desired else [], [s.prepared for s in ordered]
        )
        metrics.PLAN_SECONDS.observe(time.perf_counter() - t0)
        # Only a pool's first plan in this run can meet slices an earlier run wrote against a
        # server that dropped fields; later ones learn the stored form from their own writes.
        first = key not in self._planned
        self._planned.add(key)
        if (
            first
            and desired is not None
            and updates
            and await writes.learn_forms(key, desired, updates, ordered)
        ):
            # What the server would store is what it has: plan again against that.
            desired = self._desired.get(key)
            t0 = time.perf_counter()
            generation, unchanged, updates, creates, deletes = _native.plan_prepared(
                desired.prepared if desired else [], [s.prepared for s in ordered]
            )
            metrics.PLAN_SECONDS.observe(time.perf_counter() - t0)
        uid = self._observed.node_uid
        reown = [ordered[i] for i in unchanged if uid not in ordered[i].node_owners]
        if not (updates or creates or deletes or reown):
            metrics.SYNCS.labels("unchanged").inc()
            return
        assert desired is not None or not (updates or creates)
        count = len(desired.specs) if desired else 0
        bodies = [
            writes.body(
                "update", driver, desired.specs[i], pool, generation, count, ordered[j], name, rv
            )
            for j, i, name, rv in updates
            if desired is not None
        ] + [
            writes.body("create", driver, desired.specs[i], pool, generation, count)
            for i in creates
            if desired is not None
        ]
        if len(bodies) + len(deletes) > 1 and ordered:
            # More than one change means a new generation: the pool is complete again only
            # once all of them are done. A slice the server refuses, found after the first
            # changes, would leave the pool incomplete and every device in it unallocatable;
            # found by a dry run, it leaves the last complete pool published. Deletes count:
            # a shrinking pool deletes before it updates what it keeps (issue 29 item 11).
            # (A pool with no slice yet has nothing to lose: its first publish is not doubled.)
            for verb, body, _ in bodies:
                await writes.dry_run(verb, body)
        try:
            for _, name, uid_, rv in deletes:
                await writes.delete(name, uid_, rv)
            for seen in reown:
                await writes.reown(seen)
            for verb, body, spec_bytes in bodies:
                await writes.write(verb, key, body, spec_bytes)
        finally:
            self._report_dropped(key)
            # Plan the next sync of any pool against our own writes, never a stale snapshot.
            self._refresh_observed()
        metrics.SYNCS.labels("written").inc()
        log.info(
            "resourceslices written",
            driver=driver,
            pool=pool,
            generation=generation,
            created=len(creates),
            updated=len(updates),
            deleted=len(deletes),
            reowned=len(reown),
        )

    def _report_dropped(self, key: PoolKey) -> None:
        """One report for the fields a sync's writes found dropped."""
        driver, pool = key
        new = self._desired.take_dropped(key)
        if not new:
            return
        what = ", ".join(f"{f} (feature gate {gate or 'unknown'})" for f, gate in new.items())
        message = (
            f"the API server did not store {what} of pool {pool} of driver {driver}: the "
            "gate is off on this cluster; the pool is published without them"
        )
        if self._events is not None:
            self._events.warn("ResourceSliceFieldsDropped", message)
        log.warning(
            "the API server did not store every field sent (a feature gate is off?); planning "
            "against what it stored",
            driver=driver,
            pool=pool,
            fields=sorted(new),
        )
