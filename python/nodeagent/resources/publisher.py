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
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import trio

from nodeagent import _native
from nodeagent.accumulator.model import Query, QueryStatus
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.kube import NODES, RESOURCESLICES
from nodeagent.kube.errors import ApiError, BadRequest, Conflict, Invalid, KubeError, NotFound
from nodeagent.log import get_logger
from nodeagent.resources import metrics
from nodeagent.resources.dropped import dropped_fields, likely_gate, present_fields
from nodeagent.resources.events import NodeEvents
from nodeagent.resources.inventory import Converted, DriverState, InventoryTracker
from nodeagent.resources.model import API_VERSION, KIND, Inventory, desired_slices
from nodeagent.resources.queue import WorkQueue
from nodeagent.resources.settings import ResourcesSettings

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

MANAGED_BY = ("app.kubernetes.io/managed-by", "nodeagent")

PoolKey = tuple[str, str]  # (driver, pool)

# Seconds between two looks at a pool held back because the observed state is not known: the
# accumulator does not announce that a Forbidden list has become readable again.
UNKNOWN_STATE_RECHECK = 1.0

# After a 409 Conflict the pool's observed state is stale (every update and delete carries the
# observed resourceVersion, so a retry planned from the same state conflicts again). The retry
# waits, on top of its backoff, until the watch shows a newer state or this many seconds have
# passed (the watch may be down: the fault matrix's reset-mid-response made 8 conflicting writes
# in 0.7 s without this wait).
CONFLICT_STALE_WAIT = 1.0


class SliceSource(Protocol):
    """The observed side: an `Accumulator` with the queries of `publisher_queries` (raw
    bytes)."""

    @property
    def bootstrapped(self) -> bool: ...

    async def changed(self) -> None: ...

    def update(self, target: object, deltas: Any = None) -> bool: ...

    def statuses(self) -> Mapping[str, QueryStatus]: ...


class SliceWriter(Protocol):
    """The write side: a `KubeClient`."""

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

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        verb: str = "",
        resource: str = "",
        idempotent: bool = True,
    ) -> bytes: ...


def slices_query_args(node_name: str) -> dict[str, Any]:
    """Keyword arguments of the accumulator `Query` of this node's slices."""
    return {
        "name": "resourceslices",
        "api_version": RESOURCESLICES.api_version,
        "kind": RESOURCESLICES,
        "field_selector": f"spec.nodeName={node_name}",
    }


def node_query_args(node_name: str) -> dict[str, Any]:
    """Keyword arguments of the accumulator `Query` of the Node (the slices' owner). The
    selector is the one the Node authorizer lets a node use on its own Node object."""
    return {
        "name": "node",
        "api_version": NODES.api_version,
        "kind": NODES,
        "field_selector": f"metadata.name={node_name}",
    }


def publisher_queries(node_name: str) -> list[Query[Any]]:
    """The queries of the publisher's accumulator (raw bytes: the publisher decodes what it
    needs)."""
    return [Query(**slices_query_args(node_name)), Query(**node_query_args(node_name))]


class _OwnerRef(msgspec.Struct):
    apiVersion: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""


class _Meta(msgspec.Struct):
    name: str = ""
    uid: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] = {}
    ownerReferences: list[_OwnerRef] = []


class _PoolRef(msgspec.Struct):
    name: str = ""


class _SpecHead(msgspec.Struct):
    driver: str = ""
    pool: _PoolRef = msgspec.field(default_factory=_PoolRef)


class _SliceHead(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _SpecHead = msgspec.field(default_factory=_SpecHead)


class _NodeHead(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_head = msgspec.json.Decoder(_SliceHead)
_node_head = msgspec.json.Decoder(_NodeHead)
_spec_only = msgspec.json.Decoder(dict[str, Any])


class _Snapshot:
    resourceslices: Mapping[Any, bytes] = {}
    node: Mapping[Any, bytes] = {}


@dataclass
class _Desired:
    specs: tuple[bytes, ...]
    prepared: list[_native.PreparedDesired]
    # The specs as JSON objects for the ops view; built when first asked for (or, for large
    # inventories, in the worker thread), reusing the objects of unchanged slices.
    views: list[dict[str, Any]] | None = None

    def slice_views(self, reuse: _Desired | None = None) -> list[dict[str, Any]]:
        if self.views is None:
            known = (
                dict(zip(reuse.specs, reuse.views, strict=True)) if reuse and reuse.views else {}
            )
            self.views = [known.get(s) or msgspec.json.decode(s) for s in self.specs]
        return self.views


@dataclass(frozen=True)
class _Seen:
    """One observed slice of this node, prepared once per (name, resourceVersion)."""

    key: PoolKey
    ours: bool
    prepared: _native.PreparedObserved
    raw: bytes
    node_owners: frozenset[str]  # UIDs of the Node owner references naming our node


class PoolRefused(Exception):
    """A pool that also holds slices nodeagent does not manage: it is not written."""


def _is_node_ref(ref: Mapping[str, Any]) -> bool:
    return ref.get("kind") == "Node" and ref.get("apiVersion") == "v1"


class Publisher:
    """Keeps this node's ResourceSlices equal to what the plugins report (the module docstring
    has the rules).

    Owns the desired state (per driver and pool, from the inventories' `LatestValue`), the
    observed state (from its `SliceSource`, an accumulator over this node's slices and Node),
    and the work queue. `run()` starts, in one nursery: the inventory watcher (desired state
    changes queue their pools), the slice watcher (observed changes queue the pools they
    touch), the worker (one pool sync at a time: plan in Rust, write through the `SliceWriter`),
    the Event recorder and the start-up grace timer. Standalone (no client): only the inventory
    watcher runs and `desired_view()` shows what would be written.
    """

    def __init__(
        self,
        *,
        node_name: str,
        inventories: LatestValue[Mapping[str, PluginData]],
        settings: ResourcesSettings | LatestValue[ResourcesSettings] | None = None,
        client: SliceWriter | None = None,
        slices: SliceSource | None = None,
    ) -> None:
        if not isinstance(settings, LatestValue):
            settings = LatestValue(settings or ResourcesSettings())
        self._live = settings
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
            lambda: self.settings.min_sync_interval,
        )
        self._started = 0.0
        self._node_uid: str | None = None  # None: no Node of our name (yet)
        self._node_raw: bytes | None = None
        self._snapshot = _Snapshot()
        self._synced_once = False
        self._synced = trio.Event()
        # Observed slices we manage, grouped by pool; prepared once per (name, resourceVersion).
        self._observed: dict[PoolKey, dict[str, _Seen]] = {}
        # Names of slices we do not manage, in pools we publish or want to publish.
        self._foreign: dict[PoolKey, tuple[str, ...]] = {}
        self._prepared: dict[tuple[str, str], _Seen | None] = {}
        self._desired: dict[PoolKey, _Desired] = {}
        self._unreadable: set[tuple[str, str]] = set()  # (name, resourceVersion), logged once
        self._failing: dict[PoolKey, str] = {}  # pool -> last error, until a sync succeeds
        # Pools whose last write conflicted: the observed versions then, and until when a
        # retry waits for newer ones.
        self._stale: dict[PoolKey, tuple[dict[str, str], float]] = {}
        self._refused: set[PoolKey] = set()  # failing because of foreign slices
        # Pools the API server refused (422/400): the desired state refused and until when an
        # unchanged desired state is not tried again.
        self._invalid: dict[PoolKey, tuple[_Desired | None, float]] = {}
        # Per pool, the fields the API server did not store (reported once each) and the
        # feature gate that likely dropped them.
        self._dropped: dict[PoolKey, dict[str, str]] = {}
        self._newly_dropped: dict[PoolKey, list[str]] = {}  # not yet reported
        self._still_invalid = False  # the running sync only waited out a refusal
        # The pool being synced and the {name: resourceVersion} its own writes lead to: a
        # snapshot showing exactly that is no reason to sync it again.
        self._syncing: PoolKey | None = None
        self._expected: dict[str, str] = {}
        # Desired spec bytes -> the spec the server stored for it, when they differ (fields
        # behind disabled feature gates are dropped): planning against what the server keeps
        # stops an endless update loop. Only for current desired specs.
        self._server_form: dict[bytes, bytes] = {}
        # Desired specs whose stored form the server has shown (by a write or a dry run).
        self._form_known: set[bytes] = set()
        self._planned: set[PoolKey] = set()  # pools planned at least once in this run
        # Per driver: the desired pools its view was built from, and that view.
        self._views: dict[str, tuple[tuple[_Desired | None, ...], dict[str, Any]]] = {}
        # Drivers whose desired slices are being rebuilt in a worker thread: their inventory
        # state is already new, their desired slices not yet.
        self._building: set[str] = set()
        self._taken_version = -1  # the newest plugins snapshot taken in
        self._taken = trio.Event()
        self.writes = 0

    # -- public ---------------------------------------------------------------------------

    @property
    def standalone(self) -> bool:
        return self._client is None

    def desired_view(self) -> dict[str, Any]:
        """The desired slices per driver and pool, and each driver's state, for the ops
        endpoint. The slices are built once per inventory, not per call."""
        out: dict[str, Any] = {}
        for driver, state in sorted(self._tracker.drivers.items()):
            out[driver] = {
                "registered": state.registered,
                "last_error": state.last_error,
                "pools": self._pools_view(driver, state.inventory),
            }
        return out

    def _pools_view(self, driver: str, inventory: Inventory | None) -> dict[str, Any]:
        if inventory is None:
            self._views.pop(driver, None)
            return {}
        desired = tuple(self._desired.get((driver, pool.name)) for pool in inventory.pools)
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

    def counts(self) -> tuple[int, int, int]:
        """(drivers, pools, slices) desired: what readiness shows, without building slices."""
        drivers = self._tracker.drivers.values()
        pools = sum(len(s.inventory.pools) for s in drivers if s.inventory is not None)
        slices = sum(len(d.specs) for d in self._desired.values())
        return len(self._tracker.drivers), pools, slices

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
        return {k: dict(v) for k, v in self._dropped.items() if v}

    def pending(self) -> int:
        """Pools waiting for a sync (including those waiting for a grace or a backoff)."""
        return len(self._queue)

    def waiting(self) -> dict[PoolKey, float]:
        """Pools with desired slices waiting for a sync, and when each one's latest sync
        started (-inf: never): what readiness bounds as changes not published."""
        return {k: t for k, t in self._queue.waiting().items() if k in self._desired}

    def blocked(self) -> str | None:
        """Why nothing is written at all right now (None: pools are synced)."""
        if self._slices is None or not self._synced_once:
            return None
        # A relist under way is not a readiness problem for the accumulator, but its frozen
        # snapshot lacks own writes: acting on it could create a pool twice.
        unknown = [s for s in self._slices.statuses().values() if not s.known]
        if unknown:
            why = "; ".join(f"{s.query}: {s.reason or s.state.value}" for s in unknown)
            return f"the observed state is not known ({why})"
        if self._node_uid is None:
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
            if self._events is not None:
                nursery.start_soon(self._events.run)
            if self._slices is not None:
                nursery.start_soon(self._watch_slices)
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

    async def _follow_settings(self, version: int) -> None:
        # Pools held for a grace wait for a deadline computed with the old value: look again.
        while True:
            version, _ = await self._live.wait_newer(version)
            for key in {*self._desired, *self._observed}:
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
                self._prune_server_forms()
                metrics.DESIRED_SLICES.set(sum(len(d.specs) for d in self._desired.values()))
            self._taken_version = version
            self._taken.set()
            self._taken = trio.Event()

    def _large(self, messages: Iterable[Message]) -> bool:
        threshold = self.settings.thread_threshold
        return sum(m.ByteSize() for m in messages) >= threshold > 0

    def _convert_all(self, messages: Mapping[str, Message]) -> dict[str, Converted]:
        return {name: self._tracker.convert(name, m) for name, m in messages.items()}

    def _build_desired(
        self, drivers: Iterable[str], views: bool = False
    ) -> dict[str, dict[PoolKey, _Desired]]:
        """Each driver's desired slices per pool, unchanged pools reusing what is prepared;
        with `views`, their ops views too (off the loop, which would otherwise build them on
        the next /v1/status)."""
        out: dict[str, dict[PoolKey, _Desired]] = {}
        for driver in drivers:
            inventory = self._tracker.drivers[driver].inventory
            pools: dict[PoolKey, _Desired] = {}
            for pool in inventory.pools if inventory is not None else []:
                key = (driver, pool.name)
                slices = desired_slices(driver, pool, self.node_name)
                specs = tuple(msgspec.json.encode(s) for s in slices)
                old = self._desired.get(key)
                if old is not None and old.specs == specs:
                    pools[key] = old
                    continue
                pools[key] = desired = self._prepare(specs)
                if views:
                    desired.slice_views(old)
            out[driver] = pools
        return out

    def _apply_desired(self, driver: str, pools: dict[PoolKey, _Desired]) -> None:
        keys = {k for k in self._desired if k[0] == driver}
        keys |= {k for k in self._observed if k[0] == driver}
        for key in keys | set(pools):
            desired = pools.get(key)
            if desired is None:
                self._desired.pop(key, None)
                self._dropped.pop(key, None)
            else:
                self._desired[key] = desired
            if not self.standalone:
                self._queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self._queue))

    def _prepare(self, specs: tuple[bytes, ...]) -> _Desired:
        planned = [self._server_form.get(s, s) for s in specs]
        return _Desired(specs, _native.prepare_desired(planned))

    def _prune_server_forms(self) -> None:
        if self._server_form or self._form_known:
            current = {s for d in self._desired.values() for s in d.specs}
            for spec in [s for s in self._server_form if s not in current]:
                del self._server_form[spec]
            self._form_known &= current

    async def _watch_slices(self) -> None:
        assert self._slices is not None
        while True:
            await self._slices.changed()
            self._refresh_observed()

    def _refresh_observed(self) -> None:
        """Takes the newest snapshot (own writes included) and queues the pools it changed."""
        assert self._slices is not None
        if not self._slices.update(self._snapshot):
            return
        syncing = self._syncing
        # A foreign slice is never the sync's own write, even when it arrives in the same
        # snapshot as the sync's writes or while they are in flight (issue 20: taken for ours,
        # its pool was published beside it).
        foreign = self._foreign.get(syncing) if syncing is not None else None
        changed = self._regroup()
        if self._refresh_node():
            changed |= set(self._desired) | set(self._observed)
        if (
            syncing in changed
            and self._observed_versions(syncing) == self._expected
            and self._foreign.get(syncing) == foreign
        ):
            changed.discard(syncing)  # only the sync's own writes: no reason to run again
        for key in changed:
            self._queue.add(key)
        if not self._synced_once:
            self._synced_once = True
            self._synced.set()
            for key in set(self._desired) | set(self._observed):
                self._queue.add(key)
        metrics.QUEUE_DEPTH.set(len(self._queue))

    def _observed_versions(self, key: PoolKey | None) -> dict[str, str]:
        group = self._observed.get(key, {}) if key is not None else {}
        return {n: s.prepared.resource_version for n, s in group.items()}

    def _refresh_node(self) -> bool:
        """Reads the Node's UID from the snapshot; returns whether it changed to a known one."""
        raws = list(self._snapshot.node.values())
        raw = raws[0] if raws else None
        if raw is self._node_raw:
            return False
        self._node_raw = raw
        uid: str | None = None
        if raw is not None:
            try:
                uid = _node_head.decode(raw).metadata.uid or None
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("observed Node not understood", node=self.node_name, error=str(exc))
                return False
        if uid == self._node_uid:
            return False
        old, self._node_uid = self._node_uid, uid
        if uid is None:
            log.warning("Node not found: nothing is written until it exists", node=self.node_name)
            return False
        if old is not None:
            log.warning(
                "Node re-created under the same name: re-owning its slices",
                node=self.node_name,
                old_uid=old,
                uid=uid,
            )
        return True

    def _regroup(self) -> set[PoolKey]:
        """Rebuilds the per-pool groups from the snapshot; returns the pools that changed (our
        slices in them, or the foreign slices beside them)."""
        seen: dict[tuple[str, str], _Seen | None] = {}
        missing: list[tuple[tuple[str, str], _SliceHead, bytes]] = []
        for raw in self._snapshot.resourceslices.values():
            try:
                head = _head.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("observed ResourceSlice not understood", error=str(exc))
                continue
            ident = (head.metadata.name, head.metadata.resourceVersion)
            if ident in self._unreadable:
                continue
            if ident in self._prepared:
                seen[ident] = self._prepared[ident]
                continue
            missing.append((ident, head, raw))
        for (ident, head, raw), prepared in self._prepare_observed(missing):
            label, value = MANAGED_BY
            seen[ident] = _Seen(
                key=(head.spec.driver, head.spec.pool.name),
                ours=head.metadata.labels.get(label) == value,
                prepared=prepared,
                raw=raw,
                node_owners=frozenset(
                    r.uid
                    for r in head.metadata.ownerReferences
                    if (r.apiVersion, r.kind, r.name) == ("v1", "Node", self.node_name)
                ),
            )
        self._prepared = seen
        groups: dict[PoolKey, dict[str, _Seen]] = {}
        foreign: dict[PoolKey, list[str]] = {}
        for s in seen.values():
            if s is None:
                continue
            if s.ours:
                groups.setdefault(s.key, {})[s.prepared.name] = s
            else:
                foreign.setdefault(s.key, []).append(s.prepared.name)
        changed = {
            k
            for k in set(groups) | set(self._observed)
            if {n: o.prepared.resource_version for n, o in groups.get(k, {}).items()}
            != self._observed_versions(k)
        }
        found = {k: tuple(sorted(v)) for k, v in foreign.items()}
        # Another driver's own slices are none of our business: only pools we publish or want
        # to publish care about foreign slices.
        ours = set(self._desired) | set(groups) | set(self._observed)
        changed |= {k for k in set(found) | set(self._foreign) if k in ours} - {
            k for k in set(found) & set(self._foreign) if found[k] == self._foreign[k]
        }
        self._observed, self._foreign = groups, found
        return changed

    def _prepare_observed(
        self, missing: list[tuple[tuple[str, str], _SliceHead, bytes]]
    ) -> list[tuple[tuple[tuple[str, str], _SliceHead, bytes], _native.PreparedObserved]]:
        if not missing:
            return []
        try:
            return list(
                zip(missing, _native.prepare_observed([m[2] for m in missing]), strict=True)
            )
        except ValueError:
            pass
        # One bad object must not hide the good ones (we would publish duplicates).
        pairs = []
        for m in missing:
            try:
                pairs.append((m, _native.prepare_observed([m[2]])[0]))
            except ValueError as exc:
                self._unreadable.add(m[0])
                log.error("observed ResourceSlice not understood", name=m[0][0], error=str(exc))
        return pairs

    async def _after_startup_grace(self) -> None:
        await trio.sleep(self.settings.startup_grace)
        for key in set(self._observed) | set(self._desired):
            self._queue.add(key)

    # -- syncing --------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            key = await self._queue.get()
            # The accumulator offers a change at most once per notification interval (1 s): a
            # slice another writer made just before is seen before this sync writes (issue 20),
            # not after.
            self._refresh_observed()
            t0 = time.perf_counter()
            failed = False
            wait: float | None = None
            self._syncing, self._expected = key, self._observed_versions(key)
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
                        self._observed_versions(key),
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
                self._syncing, self._expected = None, {}
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
        if self.blocked() is not None:
            # The Node's arrival queues every pool; a readable list is not announced.
            return True, None if self._node_uid is None else UNKNOWN_STATE_RECHECK
        foreign = self._foreign.get(key)
        ours = key in self._desired or key in self._observed
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
        if not self._foreign.get(key):
            return False
        state = self._tracker.drivers.get(key[0])
        return state is None or not state.registered

    async def _sync(self, key: PoolKey) -> float | None:
        """Plans and writes one pool; returns after how long to look again when it must wait
        for a grace period or for the observed state."""
        if self._slices is None or not self._synced_once:
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
            if self._observed.get(key):
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
            if self._observed_versions(key) == versions and now < until:
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
            if self._observed.get(key):
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

    async def _plan_and_write(self, key: PoolKey, desired: _Desired | None) -> None:
        driver, pool = key
        observed = self._observed.get(key, {})
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
            and await self._learn_forms(key, desired, updates, ordered)
        ):
            # What the server would store is what it has: plan again against that.
            desired = self._desired.get(key)
            t0 = time.perf_counter()
            generation, unchanged, updates, creates, deletes = _native.plan_prepared(
                desired.prepared if desired else [], [s.prepared for s in ordered]
            )
            metrics.PLAN_SECONDS.observe(time.perf_counter() - t0)
        uid = self._node_uid
        reown = [ordered[i] for i in unchanged if uid not in ordered[i].node_owners]
        if not (updates or creates or deletes or reown):
            metrics.SYNCS.labels("unchanged").inc()
            return
        assert desired is not None or not (updates or creates)
        count = len(desired.specs) if desired else 0
        bodies = [
            self._body(
                "update", driver, desired.specs[i], pool, generation, count, ordered[j], name, rv
            )
            for j, i, name, rv in updates
            if desired is not None
        ] + [
            self._body("create", driver, desired.specs[i], pool, generation, count)
            for i in creates
            if desired is not None
        ]
        if len(bodies) > 1 and ordered:
            # More than one write means a new generation: the pool is complete again only
            # once all of them are done. A slice the server refuses, found after the first
            # writes, would leave the pool incomplete and every device in it unallocatable;
            # found by a dry run, it leaves the last complete pool published. (A pool with no
            # slice yet has nothing to lose: its first publish is not doubled.)
            for verb, body, _ in bodies:
                await self._dry_run(verb, body)
        try:
            for _, name, uid_, rv in deletes:
                await self._delete(name, uid_, rv)
            for seen in reown:
                await self._reown(seen)
            for verb, body, spec_bytes in bodies:
                await self._write(verb, driver, pool, body, spec_bytes)
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

    def _metadata(self, observed: _Seen | None) -> dict[str, Any]:
        """Our label and owner on top of the observed metadata: what others set is kept."""
        meta: dict[str, Any] = {}
        if observed is not None:
            meta = _spec_only.decode(observed.raw).get("metadata") or {}
            # Omitted, the server keeps them; sent, they would replace its bookkeeping.
            meta.pop("managedFields", None)
        meta["labels"] = {**(meta.get("labels") or {}), MANAGED_BY[0]: MANAGED_BY[1]}
        assert self._node_uid is not None
        others = [r for r in meta.get("ownerReferences") or [] if not _is_node_ref(r)]
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node_name,
                "uid": self._node_uid,
                "controller": True,
            },
            *others,
        ]
        return meta

    def _wrote(self, answer: bytes | None, name: str) -> dict[str, Any] | None:
        """Counts a successful write and records where it leaves the pool (its own snapshot
        change is no reason to sync again)."""
        self.writes += 1
        if answer is None:
            self._expected.pop(name, None)
            return None
        doc: dict[str, Any] = msgspec.json.decode(answer)
        meta = doc.get("metadata") or {}
        if self._syncing is not None and meta.get("name"):
            self._expected[meta["name"]] = meta.get("resourceVersion", "")
        return doc

    async def _delete(self, name: str, uid: str, rv: str) -> None:
        assert self._client is not None
        try:
            answer = await self._client.delete(RESOURCESLICES, name, uid=uid, resource_version=rv)
        except NotFound:
            metrics.WRITES.labels("delete", "not_found").inc()
            return
        except ApiError as exc:
            metrics.WRITES.labels("delete", _result(exc)).inc()
            raise
        metrics.WRITES.labels("delete", "ok").inc()
        self._wrote(answer, name)

    async def _reown(self, seen: _Seen) -> None:
        """The slice is right but owned by a Node that no longer exists (same name, new UID):
        the garbage collector would delete it."""
        assert self._client is not None
        body = _spec_only.decode(seen.raw)
        body["metadata"] = self._metadata(seen)
        try:
            answer = await self._client.update(RESOURCESLICES, body)
        except ApiError as exc:
            metrics.WRITES.labels("update", _result(exc)).inc()
            raise
        metrics.WRITES.labels("update", "ok").inc()
        metrics.REOWNED.inc()
        self._wrote(answer, seen.prepared.name)

    def _body(
        self,
        verb: str,
        driver: str,
        spec_bytes: bytes,
        pool: str,
        generation: int,
        count: int,
        observed: _Seen | None = None,
        name: str = "",
        rv: str = "",
    ) -> tuple[str, dict[str, Any], bytes]:
        """(verb, the object to send, the desired spec it carries)."""
        # The full desired spec, never the server's stripped form: a write coming back whole
        # is how a feature gate turned on shows.
        spec = _spec_only.decode(spec_bytes)
        spec["pool"] = {"name": pool, "generation": generation, "resourceSliceCount": count}
        meta = self._metadata(observed)
        if verb == "create":
            meta["generateName"] = f"{self.node_name}-{driver}-"
        else:
            meta["name"] = name
            meta["resourceVersion"] = rv
        return (
            verb,
            {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec},
            spec_bytes,
        )

    async def _learn_forms(
        self,
        key: PoolKey,
        desired: _Desired,
        updates: list[Any],
        ordered: list[_Seen],
    ) -> bool:
        """For each planned update whose observed slice lacks fields the desired spec has and
        whose stored form is not known yet: a dry-run update shows what the server would store.
        A gate off on this cluster then costs no write at all (an agent restart used to rewrite
        every such slice, bumping the pool's generation). Returns whether anything was learnt."""
        driver, pool = key
        learnt = False
        for j, i, name, rv in updates:
            spec_bytes = desired.specs[i]
            if spec_bytes in self._form_known:
                continue
            sent = _spec_only.decode(spec_bytes)
            seen = _spec_only.decode(ordered[j].raw).get("spec")
            if not isinstance(seen, dict) or not dropped_fields(sent, seen):
                continue  # a plain change: the write itself shows the stored form
            verb, body, _ = self._body(
                "update", driver, spec_bytes, pool, 0, 1, ordered[j], name, rv
            )
            answer = await self._dry_run(verb, body)
            self._check_dropped(key, body["spec"], spec_bytes, msgspec.json.decode(answer))
            learnt = True
        return learnt

    async def _dry_run(self, verb: str, body: dict[str, Any]) -> bytes:
        """The write validated and admitted by the server, nothing stored (`dryRun=All`)."""
        assert self._client is not None
        name = body["metadata"].get("name")
        try:
            answer = await self._client.request(
                "POST" if verb == "create" else "PUT",
                RESOURCESLICES.path(None, name if verb != "create" else None),
                params={"dryRun": "All"},
                body=msgspec.json.encode(body),
                content_type="application/json",
                # Not a write: the API request metrics keep it apart from real ones.
                verb=f"dryrun_{verb}",
                resource=RESOURCESLICES.plural,
                idempotent=True,
            )
        except ApiError as exc:
            metrics.DRY_RUNS.labels(_result(exc)).inc()
            raise
        metrics.DRY_RUNS.labels("ok").inc()
        return answer

    async def _write(
        self, verb: str, driver: str, pool: str, body: dict[str, Any], spec_bytes: bytes
    ) -> None:
        assert self._client is not None
        spec = body["spec"]
        name = body["metadata"].get("name", "")
        try:
            if verb == "create":
                answer = await self._client.create(RESOURCESLICES, body)
            else:
                answer = await self._client.update(RESOURCESLICES, body)
        except ApiError as exc:
            metrics.WRITES.labels(verb, _result(exc)).inc()
            raise
        metrics.WRITES.labels(verb, "ok").inc()
        doc = self._wrote(answer, name)
        if doc is not None:
            self._check_dropped((driver, pool), spec, spec_bytes, doc)

    def _check_dropped(
        self, key: PoolKey, sent: dict[str, Any], spec_bytes: bytes, answer: dict[str, Any]
    ) -> None:
        try:
            stored_spec = answer["spec"]
            stored = msgspec.json.encode(stored_spec)
        except (KeyError, TypeError):
            return
        self._form_known.add(spec_bytes)
        equal = _native.slice_spec_equal(stored, spec_bytes)
        if not equal or self._dropped.get(key):
            # Walking the spec in Python only when the fast comparison finds a difference,
            # or the pool has fields reported dropped that this write may show kept.
            self._note_dropped(key, sent, stored_spec)
        known = self._server_form.get(spec_bytes)
        if equal:
            if known is None:
                return
            del self._server_form[spec_bytes]
        else:
            if known is not None and _native.slice_spec_equal(stored, known):
                return
            self._server_form[spec_bytes] = stored
        for key, d in self._desired.items():
            if spec_bytes in d.specs:
                self._desired[key] = self._prepare(d.specs)
                self._desired[key].views = d.views

    def _note_dropped(self, key: PoolKey, sent: dict[str, Any], stored: Any) -> None:
        """Reports each field of the pool the server did not store once (Event, metric, log),
        and forgets those a later write shows stored (a gate turned on)."""
        driver, pool = key
        if not isinstance(stored, dict):
            return
        missing = dropped_fields(sent, stored)
        known = self._dropped.setdefault(key, {})
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

    def _report_dropped(self, key: PoolKey) -> None:
        """One report for the fields a sync's writes found dropped."""
        driver, pool = key
        new = self._newly_dropped.pop(key, [])
        if not new:
            return
        known = self._dropped.get(key, {})
        what = ", ".join(f"{f} (feature gate {known.get(f) or 'unknown'})" for f in sorted(new))
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


def _result(exc: ApiError) -> str:
    if isinstance(exc, Conflict):
        return "conflict"
    if isinstance(exc, NotFound):
        return "not_found"
    return "error"
