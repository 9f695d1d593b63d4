"""The ResourceSlice publisher: plugins' inventories -> desired slices per pool -> plan (Rust)
-> API writes, level-triggered and idempotent.

- Desired: per driver and pool, the slices of the last valid inventory (`inventory.py`,
  `model.desired_slices`).
- Observed: this node's slices (field selector ``spec.nodeName=<node>``) through the
  accumulator, including our own writes (read-your-writes). Only slices carrying the
  ``app.kubernetes.io/managed-by=nodeagent`` label are ours to change: a driver that publishes
  its own slices on this node is left alone.
- A work queue keyed by (driver, pool) runs the syncs: deduplicated, coalescing (a sync reads
  the newest state), with per-pool exponential backoff after a failed write.
- Lifecycle: a disconnected plugin's slices stay for ``disconnect_grace``; after a restart
  nothing is deleted before ``startup_grace`` has passed, and nothing is written before the
  observed state is complete, so a restart with unchanged plugins makes no writes.
- Standalone (no client): the desired slices are only shown (`desired_view`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import trio

from nodeagent import _native
from nodeagent.kube import NODES, RESOURCESLICES
from nodeagent.kube.errors import ApiError, Conflict, KubeError, NotFound
from nodeagent.kube.models import Node
from nodeagent.log import get_logger
from nodeagent.plugins.latest import LatestValue
from nodeagent.resources import metrics
from nodeagent.resources.events import NodeEvents
from nodeagent.resources.inventory import DriverState, InventoryTracker
from nodeagent.resources.model import API_VERSION, KIND, desired_slices
from nodeagent.resources.queue import WorkQueue
from nodeagent.resources.settings import ResourcesSettings

log = get_logger(__name__)

__all__ = ["MANAGED_BY", "Publisher", "SliceSource", "SliceWriter", "slices_query_args"]

MANAGED_BY = ("app.kubernetes.io/managed-by", "nodeagent")

PoolKey = tuple[str, str]  # (driver, pool)


class SliceSource(Protocol):
    """The observed side: an `Accumulator` with one query named ``resourceslices`` (raw bytes)."""

    @property
    def bootstrapped(self) -> bool: ...

    async def changed(self) -> None: ...

    def update(self, target: object, deltas: Any = None) -> bool: ...


class SliceWriter(Protocol):
    """The write side: a `KubeClient`."""

    async def get(
        self, resource: Any, name: str, namespace: str | None = None, *, into: Any
    ) -> Any: ...

    async def create(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes: ...

    async def update(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes: ...

    async def delete(
        self,
        resource: Any,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> bytes | None: ...


def slices_query_args(node_name: str) -> dict[str, Any]:
    """Keyword arguments of the accumulator `Query` the publisher reads."""
    return {
        "name": "resourceslices",
        "api_version": RESOURCESLICES.api_version,
        "kind": RESOURCESLICES,
        "field_selector": f"spec.nodeName={node_name}",
    }


class _Meta(msgspec.Struct):
    name: str = ""
    uid: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] = {}


class _PoolRef(msgspec.Struct):
    name: str = ""


class _SpecHead(msgspec.Struct):
    driver: str = ""
    pool: _PoolRef = msgspec.field(default_factory=_PoolRef)


class _SliceHead(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _SpecHead = msgspec.field(default_factory=_SpecHead)


_head = msgspec.json.Decoder(_SliceHead)
_spec_only = msgspec.json.Decoder(dict[str, Any])


class _Snapshot:
    resourceslices: Mapping[Any, bytes] = {}


@dataclass
class _Desired:
    specs: tuple[bytes, ...]
    prepared: list[_native.PreparedDesired]


class Publisher:
    def __init__(
        self,
        *,
        node_name: str,
        inventories: LatestValue[Mapping[str, Any]],
        settings: ResourcesSettings | None = None,
        client: SliceWriter | None = None,
        slices: SliceSource | None = None,
    ) -> None:
        self.settings = settings or ResourcesSettings()
        self.settings.validate()
        if (client is None) != (slices is None):
            raise ValueError("client and slices go together (both None: standalone)")
        self.node_name = node_name
        self._inventories = inventories
        self._client = client
        self._slices = slices
        self._events = NodeEvents(client, node_name) if client is not None else None
        self._tracker = InventoryTracker(
            node_name, self._events.warn if self._events is not None else None
        )
        self._queue: WorkQueue[PoolKey] = WorkQueue(
            self.settings.retry_backoff_initial,
            self.settings.retry_backoff_max,
            self.settings.min_sync_interval,
        )
        self._started = 0.0
        self._node_uid = ""
        self._snapshot = _Snapshot()
        self._synced_once = False
        self._synced = trio.Event()
        # Observed slices we manage, grouped by pool; prepared once per (name, resourceVersion).
        self._observed: dict[PoolKey, dict[str, _native.PreparedObserved]] = {}
        self._prepared: dict[tuple[str, str], tuple[PoolKey | None, _native.PreparedObserved]] = {}
        self._desired: dict[PoolKey, _Desired] = {}
        self._unreadable: set[tuple[str, str]] = set()  # (name, resourceVersion), logged once
        self._failing: dict[PoolKey, str] = {}  # pool -> last error, until a sync succeeds
        # Desired spec bytes -> the spec the server stored for it, when they differ (fields
        # behind disabled feature gates are dropped): planning against what the server keeps
        # stops an endless update loop.
        self._server_form: dict[bytes, bytes] = {}
        self.writes = 0

    # -- public ---------------------------------------------------------------------------

    @property
    def standalone(self) -> bool:
        return self._client is None

    def desired_view(self) -> dict[str, Any]:
        """The desired slices per driver and pool, and each driver's state, for the ops
        endpoint."""
        out: dict[str, Any] = {}
        for driver, state in sorted(self._tracker.drivers.items()):
            pools: dict[str, Any] = {}
            if state.inventory is not None:
                for pool in state.inventory.pools:
                    specs = desired_slices(driver, pool, self.node_name)
                    pools[pool.name] = [msgspec.to_builtins(s) for s in specs]
            out[driver] = {
                "registered": state.registered,
                "last_error": state.last_error,
                "pools": pools,
            }
        return out

    def failing(self) -> dict[PoolKey, str]:
        """Pools whose last sync failed (retrying with backoff), with the error."""
        return dict(self._failing)

    def pending(self) -> int:
        """Pools waiting for a sync (including those waiting for a grace or a backoff)."""
        return len(self._queue)

    @property
    def synced(self) -> bool:
        """The observed state has been read completely at least once."""
        return self._synced_once

    async def wait_idle(self) -> None:
        """Until the observed state has been read and no pool is queued, waiting or syncing."""
        await self._synced.wait()
        await self._queue.wait_idle()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_inventories)
            if self._events is not None:
                nursery.start_soon(self._events.run)
            if self._slices is not None:
                nursery.start_soon(self._watch_slices)
                nursery.start_soon(self._worker)
                # Drivers that had slices before a restart get their deletion check once the
                # start-up grace is over.
                nursery.start_soon(self._after_startup_grace)
            task_status.started()

    # -- inputs ---------------------------------------------------------------------------

    async def _watch_inventories(self) -> None:
        version = -1
        while True:
            version, plugins = await self._inventories.wait_newer(version)
            changed = self._tracker.update(plugins, trio.current_time())
            for driver in changed:
                self._refresh_desired(driver)
            metrics.DESIRED_SLICES.set(sum(len(d.specs) for d in self._desired.values()))

    def _refresh_desired(self, driver: str) -> None:
        state = self._tracker.drivers[driver]
        keys = {k for k in self._desired if k[0] == driver}
        keys |= {k for k in self._observed if k[0] == driver}
        new: dict[PoolKey, tuple[bytes, ...]] = {}
        if state.inventory is not None:
            for pool in state.inventory.pools:
                slices = desired_slices(driver, pool, self.node_name)
                new[(driver, pool.name)] = tuple(msgspec.json.encode(s) for s in slices)
        for key in keys | set(new):
            specs = new.get(key)
            old = self._desired.get(key)
            if specs is None:
                self._desired.pop(key, None)
            elif old is None or old.specs != specs:
                planned = [self._server_form.get(s, s) for s in specs]
                self._desired[key] = _Desired(specs, _native.prepare_desired(planned))
            if not self.standalone:
                self._queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self._queue))

    async def _watch_slices(self) -> None:
        assert self._slices is not None
        while True:
            await self._slices.changed()
            self._refresh_observed()

    def _refresh_observed(self) -> None:
        """Takes the newest snapshot (own writes included) and queues the pools it changed."""
        assert self._slices is not None
        if self._slices.update(self._snapshot):
            for key in self._regroup():
                self._queue.add(key)
            if not self._synced_once:
                self._synced_once = True
                self._synced.set()
                for key in set(self._desired) | set(self._observed):
                    self._queue.add(key)
            metrics.QUEUE_DEPTH.set(len(self._queue))

    def _regroup(self) -> set[PoolKey]:
        """Rebuilds the per-pool groups from the snapshot; returns the pools that changed."""
        label, value = MANAGED_BY
        seen: dict[tuple[str, str], tuple[PoolKey | None, _native.PreparedObserved]] = {}
        missing: list[tuple[tuple[str, str], PoolKey | None, bytes]] = []
        for raw in self._snapshot.resourceslices.values():
            try:
                head = _head.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("observed ResourceSlice not understood", error=str(exc))
                continue
            ident = (head.metadata.name, head.metadata.resourceVersion)
            if ident in self._unreadable:
                continue
            known = self._prepared.get(ident)
            if known is not None:
                seen[ident] = known
                continue
            ours = head.metadata.labels.get(label) == value
            key = (head.spec.driver, head.spec.pool.name) if ours else None
            missing.append((ident, key, raw))
        if missing:
            try:
                prepared = _native.prepare_observed([m[2] for m in missing])
                pairs = list(zip(missing, prepared, strict=True))
            except ValueError:
                # One bad object must not hide the good ones (we would publish duplicates).
                pairs = []
                for m in missing:
                    try:
                        pairs.append((m, _native.prepare_observed([m[2]])[0]))
                    except ValueError as exc:
                        self._unreadable.add(m[0])
                        log.error(
                            "observed ResourceSlice not understood", name=m[0][0], error=str(exc)
                        )
            for (ident, key, _), p in pairs:
                seen[ident] = (key, p)
        self._prepared = seen
        groups: dict[PoolKey, dict[str, _native.PreparedObserved]] = {}
        for key, p in seen.values():
            if key is not None:
                groups.setdefault(key, {})[p.name] = p
        changed = {
            k
            for k in set(groups) | set(self._observed)
            if {n: o.resource_version for n, o in groups.get(k, {}).items()}
            != {n: o.resource_version for n, o in self._observed.get(k, {}).items()}
        }
        self._observed = groups
        return changed

    async def _after_startup_grace(self) -> None:
        await trio.sleep(self.settings.startup_grace)
        for key in set(self._observed) | set(self._desired):
            self._queue.add(key)

    # -- syncing --------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            t0 = time.perf_counter()
            failed = False
            wait: float | None = None
            try:
                wait = await self._sync(key)
            except KubeError as exc:
                failed = True
                metrics.SYNCS.labels("failed").inc()
                if key not in self._failing and self._events is not None:
                    # Once per failure streak: the operator looks at the Node's events.
                    self._events.warn(
                        "ResourceSliceSyncFailed",
                        f"publishing pool {key[1]} of driver {key[0]} failed: {exc}",
                    )
                self._failing[key] = str(exc)
                log.warning(
                    "resourceslice sync failed; retrying with backoff",
                    driver=key[0],
                    pool=key[1],
                    error=str(exc),
                    failures=self._queue.failures(key) + 1,
                )
            else:
                self._failing.pop(key, None)
            finally:
                delay = self._queue.done(key, failed=failed)
                if wait is not None:
                    self._queue.add(key, wait)
                metrics.SYNC_SECONDS.observe(time.perf_counter() - t0)
                metrics.QUEUE_DEPTH.set(len(self._queue))
            if delay is not None:
                log.info("resourceslice sync requeued", driver=key[0], pool=key[1], delay=delay)

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

    async def _sync(self, key: PoolKey) -> float | None:
        """Plans and writes one pool; returns after how long to look again when it must wait
        for a grace period."""
        if self._slices is None or not self._synced_once:
            metrics.SYNCS.labels("deferred").inc()
            return None  # the first snapshot queues every pool
        driver, pool = key
        state = self._tracker.drivers.get(driver)
        desired = self._desired.get(key)
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
        observed = self._observed.get(key, {})
        ordered = [observed[n] for n in sorted(observed)]
        t0 = time.perf_counter()
        generation, _, updates, creates, deletes = _native.plan_prepared(
            desired.prepared if desired else [], ordered
        )
        metrics.PLAN_SECONDS.observe(time.perf_counter() - t0)
        if not (updates or creates or deletes):
            metrics.SYNCS.labels("unchanged").inc()
            return None
        assert desired is not None or not (updates or creates)
        count = len(desired.specs) if desired else 0
        try:
            for _, name, uid, rv in deletes:
                await self._delete(name, uid, rv)
            for _, i, name, rv in updates:
                assert desired is not None
                spec = desired.specs[i]
                await self._write("update", driver, spec, pool, generation, count, name, rv)
            for i in creates:
                assert desired is not None
                await self._write("create", driver, desired.specs[i], pool, generation, count)
        finally:
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
        )
        return None

    async def _node_uid_once(self) -> str:
        if not self._node_uid:
            assert self._client is not None
            node = await self._client.get(NODES, self.node_name, into=Node)
            self._node_uid = node.metadata.uid
        return self._node_uid

    async def _delete(self, name: str, uid: str, rv: str) -> None:
        assert self._client is not None
        try:
            await self._client.delete(RESOURCESLICES, name, uid=uid, resource_version=rv)
        except NotFound:
            metrics.WRITES.labels("delete", "not_found").inc()
            return
        except ApiError as exc:
            metrics.WRITES.labels("delete", _result(exc)).inc()
            raise
        self.writes += 1
        metrics.WRITES.labels("delete", "ok").inc()

    async def _write(
        self,
        verb: str,
        driver: str,
        spec_bytes: bytes,
        pool: str,
        generation: int,
        count: int,
        name: str = "",
        rv: str = "",
    ) -> None:
        assert self._client is not None
        spec = _spec_only.decode(self._server_form.get(spec_bytes, spec_bytes))
        spec["pool"] = {"name": pool, "generation": generation, "resourceSliceCount": count}
        meta: dict[str, Any] = {
            "labels": {MANAGED_BY[0]: MANAGED_BY[1]},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": self.node_name,
                    "uid": await self._node_uid_once(),
                    "controller": True,
                }
            ],
        }
        if verb == "create":
            meta["generateName"] = f"{self.node_name}-{driver}-"
        else:
            meta["name"] = name
            meta["resourceVersion"] = rv
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}
        try:
            if verb == "create":
                answer = await self._client.create(RESOURCESLICES, body)
            else:
                answer = await self._client.update(RESOURCESLICES, body)
        except ApiError as exc:
            metrics.WRITES.labels(verb, _result(exc)).inc()
            raise
        self.writes += 1
        metrics.WRITES.labels(verb, "ok").inc()
        self._check_dropped(driver, spec_bytes, answer)

    def _check_dropped(self, driver: str, spec_bytes: bytes, answer: bytes) -> None:
        try:
            stored = msgspec.json.encode(msgspec.json.decode(answer)["spec"])
        except (msgspec.DecodeError, KeyError, TypeError):
            return
        if _native.slice_spec_equal(stored, self._server_form.get(spec_bytes, spec_bytes)):
            return
        metrics.DROPPED_FIELDS.labels(driver).inc()
        log.warning(
            "the API server did not store every field sent (a feature gate is off?); "
            "planning against what it stored",
            driver=driver,
        )
        self._server_form[spec_bytes] = stored
        for key, d in self._desired.items():
            if spec_bytes in d.specs:
                planned = [self._server_form.get(s, s) for s in d.specs]
                self._desired[key] = _Desired(d.specs, _native.prepare_desired(planned))


def _result(exc: ApiError) -> str:
    if isinstance(exc, Conflict):
        return "conflict"
    if isinstance(exc, NotFound):
        return "not_found"
    return "error"
