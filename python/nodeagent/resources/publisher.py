"""The ResourceSlice publisher: plugins' inventories -> desired slices per pool -> plan (Rust)
-> API writes, level-triggered and idempotent. The rules (ownership, foreign slices, what waits
for what, graces, refusals) are in docs/architecture/resourceslices.md.

This module is the loop, in the shape of the upstream resourceslice controller: the inputs (the
plugins' inventories, this node's slices and Node, the settings) queue the pools they touch; the
worker (`_process_next_work_item`) takes one pool off the work queue (`queue.py`); `_sync_pool`
writes it or says why it waits (a `Deferred`); and the outcome (`PoolOutcomes`: failure streaks,
refusals, recovery) decides when it runs next. Its parts: the desired slices (`desired.py`), the
observed slices (`observed.py`), the writes (`writes.py`) and the outcomes (`outcomes.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import trio

from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.core.wake import Pulse
from nodeagent.kube import BadRequest, Conflict, EventRecorder, Invalid, KubeError
from nodeagent.log import get_logger
from nodeagent.resources import metrics
from nodeagent.resources.desired import Desired, DesiredSlices
from nodeagent.resources.events import NodeEvents
from nodeagent.resources.inventory import DriverState, InventoryTracker, deletion_deadline
from nodeagent.resources.observed import (
    MANAGED_BY,
    ObservedSlices,
    PoolKey,
    SliceSource,
    node_query_args,
    publisher_queries,
    slices_query_args,
)
from nodeagent.resources.outcomes import CONFLICT_STALE_WAIT, Deferral, Deferred, PoolOutcomes
from nodeagent.resources.queue import WorkQueue
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.resources.writes import SliceWriter, SliceWrites

log = get_logger(__name__)

__all__ = [
    "CONFLICT_STALE_WAIT",
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


class PoolRefused(Exception):
    """A pool that also holds slices nodeagent does not manage: it is not written."""


class Publisher:
    """Keeps this node's ResourceSlices equal to what the plugins report.

    `run()` starts, in one nursery: the inventory watcher (desired state changes queue their
    pools), the slice watcher (observed changes queue the pools they touch; `slices` is an
    accumulator over this node's slices and Node), the worker (one pool sync at a time, writing
    through `client`), the Event recorder and the start-up grace timer. Standalone (no client):
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
        self._outcomes = PoolOutcomes(self._events)
        # What readiness and /v1/status show, as their owners keep it: drivers whose latest
        # inventory was rejected; pools failing (with the error), refused for foreign slices,
        # or refused by the API server (422/400).
        self.rejected = self._tracker.rejected
        self.failing, self.refused = self._outcomes.failing, self._outcomes.refused
        self.invalid = self._outcomes.invalid
        # The pool being synced: a snapshot showing exactly what its own writes lead to is no
        # reason to sync it again.
        self._syncing: PoolKey | None = None
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
        endpoint."""
        return self._desired.view(self._shown())

    def counts(self) -> tuple[int, int, int]:
        """(drivers, pools, slices) desired: what readiness shows, without building slices."""
        shown = self._shown()
        pools = sum(len(s.inventory.pools) for s in shown.values() if s.inventory is not None)
        return len(shown), pools, self._desired.slice_count(shown)

    def _shown(self) -> dict[str, DriverState]:
        """The drivers whose slices are desired: a gone driver's (not registered) until they
        go, then no more, in both modes (`InventoryTracker.shown` standalone, `kept` else)."""
        now, settings = trio.current_time(), self.settings
        if self.standalone:
            return self._tracker.shown(now, settings.disconnect_grace)
        graces = settings.startup_grace, settings.disconnect_grace
        return self._tracker.kept(now, self._started, *graces)

    def dropped(self) -> dict[PoolKey, dict[str, str]]:
        """Per pool, the fields the API server did not store, each with the feature gate that
        likely dropped it ("" when none is known)."""
        return {k: dict(v) for k, v in self._desired.dropped.items() if v}

    def pending(self) -> int:
        """Pools not yet as this agent will leave them: being synced, waiting for a sync
        (including those waiting for a grace or a backoff), or held for their plugin's first
        valid inventory."""
        queued = {*self._queue.waiting(), *self._tracker.held(self._pools())}
        if self._syncing is not None:
            queued.add(self._syncing)  # its writes in flight: the pool is not as it will stay
        return len(queued)

    def waiting(self) -> dict[PoolKey, float]:
        """Pools with desired slices waiting for a sync, and when each one's latest sync
        started (-inf: never): what readiness bounds as changes not published."""
        return {k: t for k, t in self._queue.waiting().items() if k in self._desired}

    def blocked(self) -> str | None:
        """Why nothing is written at all right now (None: pools are synced)."""
        if self._observed is None or not self._synced_once:
            return None
        return self._observed.blocked()

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
        # Pools held for a grace (or an interval, a backoff) wait in the queue for a time
        # computed with the old values: look again. Only those: a pool not queued waits for
        # no time (a deferral without one is queued by a change of state), and queueing it
        # would only hold it behind its min_sync_interval, counted by readiness as "not
        # written yet" although its slices are what it wants. The pool being synced computes
        # its deferral and queues it with no checkpoint in between, under the newest values.
        while True:
            version, _ = await self._live.wait_newer(version)
            self._queue_pools(self._queue.waiting())

    # -- inputs ---------------------------------------------------------------------------

    async def _watch_inventories(self) -> None:
        version = -1
        while True:
            version, plugins = await self._inventories.wait_newer(version)
            threshold = self.settings.thread_threshold
            changed, threaded = await self._tracker.take(plugins, threshold)
            if changed:
                # A large inventory's slices are built in a worker thread too (this task is
                # the only writer of the desired state, so the thread reads it undisturbed).
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
        assert self._observed is not None and self._writes is not None
        changed = self._observed.refresh(self._desired, self._syncing, self._writes.expected)
        if changed is None:
            return
        self._queue_pools(changed)
        if not self._synced_once:
            self._synced_once = True
            self._synced.set()
            self._queue_pools(self._pools())

    async def _after_startup_grace(self) -> None:
        await trio.sleep(self.settings.startup_grace)
        self._queue_pools(self._pools())

    def _queue_pools(self, keys: Iterable[PoolKey]) -> None:
        for key in keys:
            self._queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self._queue))

    # -- syncing --------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            await self._process_next_work_item()

    async def _process_next_work_item(self) -> None:
        """`processNextWorkItem`: one pool's sync, its outcome deciding when it runs next."""
        assert self._observed is not None and self._writes is not None
        key = await self._queue.get()
        # The accumulator offers a change at most once per notification interval (1 s): a
        # slice another writer made just before is seen before this sync writes (issue 20),
        # not after.
        self._refresh_observed()
        t0 = time.perf_counter()
        failed = False
        deferred: Deferred | None = None
        self._syncing, self._writes.expected = key, self._observed.versions(key)
        try:
            deferred = await self._sync_pool(key)
        except PoolRefused as exc:
            self._outcomes.refuse(key, str(exc))
        except (Invalid, BadRequest) as exc:
            # The same request gets the same answer: no backoff loop, but a look again when
            # the inventory changes or after the slow interval.
            retry = self.settings.invalid_retry_interval
            desired = self._desired.get(key)
            deferred = self._outcomes.refused_by_server(
                key, exc, desired, trio.current_time(), retry
            )
        except KubeError as exc:
            failed = True
            self._outcomes.failed(key, "failed", str(exc), self._queue.failures(key) + 1)
            if isinstance(exc, Conflict):
                versions = self._observed.versions(key)
                self._outcomes.conflicted(key, versions, trio.current_time())
        except Exception as exc:
            # A bug or bad data in one pool must not take the others (and the accumulator,
            # with its start-up grace) down with it: fail this pool and retry it.
            failed = True
            log.exception("resourceslice sync raised", driver=key[0], pool=key[1])
            self._outcomes.failed(
                key, "error", f"unexpected error: {exc!r}", self._queue.failures(key) + 1
            )
        else:
            if deferred is not None:
                metrics.SYNCS.labels("deferred").inc()
            self._outcomes.succeeded(key, deferred)
        finally:
            self._syncing, self._writes.expected = None, None
            # A retry held back for a newer observed state is still a failing pool: its
            # backoff keeps growing.
            stale = self._outcomes.stale(key)
            delay = self._queue.done(key, failed=failed, keep_backoff=stale)
            if deferred is not None and deferred.again is not None:
                self._queue.add(key, deferred.again)
            metrics.SYNC_SECONDS.observe(time.perf_counter() - t0)
            metrics.QUEUE_DEPTH.set(len(self._queue))
            self._outcomes.show()
        if delay is not None:
            log.info("resourceslice sync requeued", driver=key[0], pool=key[1], delay=delay)

    async def _sync_pool(self, key: PoolKey) -> Deferred | None:
        """`syncPool`: plans and writes one pool, or says why it must wait (a sync that waits
        for a change of state is queued again by that change; one that waits for a grace or
        for the observed state, after `again` seconds)."""
        observed = self._observed
        assert observed is not None
        if not self._synced_once:
            return Deferred(Deferral.NOT_SYNCED)  # the first snapshot queues every pool
        if key[0] in self._building:
            # Its new inventory without its new slices would look like pools to delete; the
            # rebuilt slices queue the pool again.
            return Deferred(Deferral.BUILDING)
        # Nothing is written while the observed state is not known or the Node is missing
        # (`blocked`).
        if observed.unknown():
            # The Node's arrival queues every pool; a readable list is not announced.
            again = None if observed.node_uid is None else UNKNOWN_STATE_RECHECK
            return Deferred(Deferral.STATE_UNKNOWN, again)
        if observed.node_uid is None:
            return Deferred(Deferral.NO_NODE)
        state = self._tracker.drivers.get(key[0])
        registered = state is not None and state.registered
        refusal = observed.refusal(key, key in self._desired or key in observed.groups, registered)
        if refusal is not None:
            if observed.groups.get(key):
                # Two publishers of one pool: each slice claims a count the other breaks, and
                # a scheduler reading it sees devices that may not exist. Theirs stay; ours go
                # now (no grace: our plugin is still there, the pool is just not ours to write).
                await self._plan_and_write(key, None)
            raise PoolRefused(refusal)
        now = trio.current_time()
        desired = self._desired.get(key)
        held = self._outcomes.held(key, observed.versions(key), desired, now)
        if held is not None:
            return held
        if state is not None and state.registered and state.inventory is None:
            # Registered, but nothing valid received since the start: what is published is
            # the last valid inventory there is.
            return Deferred(Deferral.NO_INVENTORY)
        graces = self.settings.startup_grace, self.settings.disconnect_grace
        deadline = deletion_deadline(state, self._started, *graces)
        if observed.taken_over(key, registered):
            # What we wrote describes the plugin that left, beside its successor's slices: it
            # goes now (a grace is for a plugin that may come back, not for a handed-over pool).
            # After a restart the plugin is not known to have left: the start-up grace holds.
            if state is None and now < deadline:
                return Deferred(Deferral.TAKEN_OVER_GRACE, deadline - now)
            if observed.groups.get(key):
                log.info(
                    "resourceslice pool taken over by another publisher; deleting ours",
                    driver=key[0],
                    pool=key[1],
                )
            desired = None
        elif state is None or not state.registered:
            # A disconnected plugin's inventory stays published for the grace period only;
            # after a restart, nothing is deleted before the start-up grace has passed.
            if now < deadline:
                return Deferred(Deferral.GRACE, deadline - now)
            desired = None
        await self._plan_and_write(key, desired)
        return None

    async def _plan_and_write(self, key: PoolKey, desired: Desired | None) -> None:
        """The pool's plan (in Rust) against its observed slices, and its writes."""
        assert self._writes is not None
        todo = await self._writes.plan(key, desired)
        if todo is None:
            metrics.SYNCS.labels("unchanged").inc()
            return
        try:
            await self._writes.apply(todo)
        finally:
            self._outcomes.dropped(key, self._desired.take_dropped(key))
            # Plan the next sync of any pool against our own writes, never a stale snapshot.
            self._refresh_observed()
        metrics.SYNCS.labels("written").inc()
        log.info("resourceslices written", driver=key[0], pool=key[1], **todo.summary())
