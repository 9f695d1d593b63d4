"""The CNR writer: the merged reports (`nodeagent.reporter.merge`) on this node's
CustomNodeResource.

The CNR (cluster-scoped, name = node) is watched through an accumulator query, so every decision
is taken against the observed object, and nothing is written while the query is not `known`.
Missing: created with `ReporterSettings.cnr_default_labels`. Then server-side apply (field manager
`nodeagent`, never forced) of the object (labels, annotations, spec) and of the status
subresource: a field this agent applied and no longer reports is removed by the apiserver, and a
field another manager owns (a controller's labels, the scheduler's status fields) is never
touched. Zero writes when what would be applied is already on the server (values compared
semantically, quantities by value) and every field the agent owns is still reported; a storm of
reports is coalesced into at most one write per `cnr_min_write_interval`, the latest merge
winning. Failed writes back off and show in readiness, the log and the metrics.

Standalone (no client) the merge alone runs, for /v1/cnr and ``nodeagent status``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import trio

from nodeagent._native import quantity_cmp
from nodeagent.accumulator import Accumulator, ObjectMap, Query
from nodeagent.core.backoff import Backoff, Jitter
from nodeagent.core.latest import LatestValue
from nodeagent.core.wake import Pulse, Wake
from nodeagent.kube import EventRecorder, KubeClient, KubeError, Resource
from nodeagent.log import get_logger
from nodeagent.reporter import cnr_metrics as metrics
from nodeagent.reporter.merge import (
    CNR_API_VERSION,
    CNR_GROUP,
    CNR_KIND,
    CNR_VERSION,
    BadField,
    MergeResult,
    fields_of,
    merge_fields,
)
from nodeagent.reporter.model import PluginReport
from nodeagent.reporter.settings import ReporterSettings

log = get_logger(__name__)

__all__ = ["CNR_RESOURCE", "FIELD_MANAGER", "CnrWriter", "cnr_query", "write_plan"]

FIELD_MANAGER = "nodeagent"
CNR_RESOURCE = Resource(
    group=CNR_GROUP,
    version=CNR_VERSION,
    plural="customnoderesources",
    kind=CNR_KIND,
    namespaced=False,
)
QUERY = "cnr"


def cnr_query(node_name: str) -> Query[dict[str, Any]]:
    return Query(
        QUERY,
        CNR_API_VERSION,
        CNR_RESOURCE,
        field_selector=f"metadata.name={node_name}",
        into=dict[str, Any],
    )


class _Snap:
    cnr: ObjectMap[dict[str, Any]]


# --- what to write ---


def _empty(v: Any) -> bool:
    return v is None or v == "" or v == [] or v == {}


def _same_scalar(a: Any, b: Any, by_value: bool) -> bool:
    if a == b:
        return True
    if by_value and isinstance(a, str | int) and isinstance(b, str | int):
        if isinstance(a, bool) or isinstance(b, bool):
            return False
        try:
            return quantity_cmp(str(a), str(b)) == 0
        except ValueError:
            return False
    return False


def _covered(want: Any, have: Any, *, by_value: bool = True, top: bool = False) -> bool:
    """``want`` is on the server as ``have``: objects key by key (the server may add defaults),
    lists element by element, empty equal to absent; with ``by_value`` (spec and status, not
    labels and annotations) quantities by value ("1" is "1000m"). ``top``: ``want`` is an object
    of which only the keys given are compared (metadata: nothing to compare is covered)."""
    if _empty(want) and not top:
        return _empty(have)
    if isinstance(want, dict):
        return isinstance(have, dict) and all(
            _covered(v, have.get(k), by_value=by_value) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(_covered(w, h, by_value=by_value) for w, h in zip(want, have, strict=True))
        )
    return _same_scalar(want, have, by_value)


def _owned(observed: Mapping[str, Any], subresource: str) -> set[tuple[str, ...]]:
    """The fields the agent's applies own on the observed object: label and annotation keys,
    first-level spec or status fields."""
    out: set[tuple[str, ...]] = set()
    for entry in observed.get("metadata", {}).get("managedFields") or ():
        if entry.get("manager") != FIELD_MANAGER or entry.get("operation") != "Apply":
            continue
        if entry.get("subresource", "") != subresource:
            continue
        fields = entry.get("fieldsV1") or {}
        meta = fields.get("f:metadata") or {}
        for kind in ("labels", "annotations"):
            for key in meta.get(f"f:{kind}") or {}:
                if key.startswith("f:"):
                    out.add(("metadata", kind, key[2:]))
        for section in ("spec", "status"):
            for key in fields.get(f"f:{section}") or {}:
                if key.startswith("f:"):
                    out.add((section, key[2:]))
    return out


def _applied(body: Mapping[str, Any]) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    meta = body.get("metadata", {})
    for kind in ("labels", "annotations"):
        out.update(("metadata", kind, k) for k in meta.get(kind) or {})
    for section in ("spec", "status"):
        out.update((section, k) for k in body.get(section) or {})
    return out


def write_plan(
    node_name: str, merged: MergeResult, observed: Mapping[str, Any] | None
) -> list[tuple[str, dict[str, Any]]]:
    """The writes that bring the observed CNR to the merge: ("create", body) when it is missing,
    then ("apply", object body) and/or ("status", status body) when they would change
    something. An empty list: nothing to write."""
    meta: dict[str, Any] = {"name": node_name}
    meta.update(merged.body.get("metadata", {}))
    obj: dict[str, Any] = {"apiVersion": CNR_API_VERSION, "kind": CNR_KIND, "metadata": meta}
    if "spec" in merged.body:
        obj["spec"] = merged.body["spec"]
    status: dict[str, Any] = {
        "apiVersion": CNR_API_VERSION,
        "kind": CNR_KIND,
        "metadata": {"name": node_name},
    }
    if "status" in merged.body:
        status["status"] = merged.body["status"]
    plan: list[tuple[str, dict[str, Any]]] = []
    if observed is None:
        plan.append(("create", {}))
        observed = {}
    for verb, body, sub in (("apply", obj, ""), ("status", status, "status")):
        applied = _applied(body)
        if applied or _owned(observed, sub):
            stale = _owned(observed, sub) - applied
            keys = {k: v for k, v in body["metadata"].items() if k != "name"}
            same = all(
                _covered(body[k], observed.get(k)) for k in ("spec", "status") if k in body
            ) and _covered(keys, observed.get("metadata") or {}, by_value=False, top=True)
            if stale or not same:
                plan.append((verb, body))
    return plan


# --- the writer ---


class CnrWriter:
    """Merges the reports on every change and, with a client, keeps the CNR in step."""

    def __init__(
        self,
        *,
        node_name: str,
        reports: LatestValue[Mapping[str, PluginReport]],
        settings: LatestValue[ReporterSettings],
        events: EventRecorder,
        client: KubeClient | None = None,
        accumulator: Accumulator | None = None,
    ) -> None:
        if (client is None) != (accumulator is None):
            raise ValueError("CnrWriter: a client needs the CNR accumulator and vice versa")
        self.node_name = node_name
        self._reports = reports
        self._live = settings
        self._client = client
        self._acc = accumulator
        self._snap = _Snap()
        self._dirty = Wake()
        self.merged: MergeResult | None = None
        self.observed: dict[str, Any] | None = None
        self.synced = False  # the observed CNR matches the merge
        self.error: str | None = None  # why the last write failed
        self.synced_at: float | None = None  # when the CNR was last in sync (Trio time)
        self.writes = 0
        self._reported_bad: set[BadField] = set()
        self._backoff = Backoff(
            settings.value.cnr_retry_initial,
            settings.value.cnr_retry_max,
            jitter=Jitter.below(0.5),
        )
        # The process's recorder (the process attaches and runs it); standalone, no Events.
        self._events = events if client is not None else None
        # The reports version last merged, and the last one found on the server (or merged, when
        # standalone) with nothing left to write.
        self._merged_version = -1
        self.settled_version = -1
        self._settled = Pulse()
        self._state_changed = Pulse()

    @property
    def standalone(self) -> bool:
        return self._client is None

    @property
    def _settings(self) -> ReporterSettings:
        return self._live.value  # the newest: cnr_min_write_interval is live

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_reports)
            if self._acc is not None:
                nursery.start_soon(self._follow_cnr)
            task_status.started()
            await self._loop()

    def poke(self) -> None:
        self._dirty.set()

    async def _follow_reports(self) -> None:
        version = -1
        while True:
            version, _ = await self._reports.wait_newer(version)
            self.poke()

    async def _follow_cnr(self) -> None:
        assert self._acc is not None
        while True:
            await self._acc.changed()
            if self._acc.update(self._snap):
                self.poke()

    async def _loop(self) -> None:
        last_write = -math.inf
        while True:
            await self._dirty.wait()
            self.merge()
            if self.standalone:
                self._settle()
                continue
            if await self._hold_until(last_write):
                # Coalescing: whatever arrived meanwhile is merged before the write.
                self.merge()
            try:
                wrote = await self.sync()
            except KubeError as exc:
                self._failed(exc)
                await trio.sleep(self._backoff.next())
                self.poke()
                continue
            self._backoff.reset()
            if wrote:
                last_write = trio.current_time()

    async def _hold_until(self, last_write: float) -> bool:
        """Wait out cnr_min_write_interval since the last write; a new interval (a reload)
        counts at once. Whether it waited at all."""
        waited = False
        while (
            wait := last_write + self._settings.cnr_min_write_interval - trio.current_time()
        ) > 0:
            waited = True
            with trio.move_on_after(wait):
                await self._live.wait_newer(self._live.version)
        return waited

    def merge(self) -> MergeResult:
        """Merge the current reports (the observed taints feed Katalyst's taint revision)."""
        t0 = time.perf_counter()
        observed = self._observed()
        taints = ((observed or {}).get("spec") or {}).get("taints") or ()
        self._merged_version = self._reports.version
        reports = {name: r.response for name, r in self._reports.value.items()}
        merged = merge_fields(fields_of(reports), observed_taints=taints)
        metrics.MERGES.inc()
        metrics.MERGE_SECONDS.observe(time.perf_counter() - t0)
        self.merged = merged
        self._report_bad(merged.bad)
        return merged

    def _settle(self) -> None:
        self.settled_version = self._merged_version
        self._settled.fire()
        self._announce()

    def _announce(self) -> None:
        self._state_changed.fire()

    async def changed(self) -> None:
        """Until the writer's state (synced, error, writes) next changes."""
        await self._state_changed.wait()

    async def wait_settled(self, version: int) -> None:
        """Until reports of at least ``version`` are merged and on the server (merged alone,
        standalone) with nothing left to write."""
        while self.settled_version < version:
            await self._settled.wait()

    def _report_bad(self, bad: tuple[BadField, ...]) -> None:
        now = set(bad)
        for b in now - self._reported_bad:
            metrics.BAD_FIELDS.labels(b.plugin).inc()
            log.warning(
                "reporter field skipped",
                plugin=b.plugin,
                field=f"{b.field_type}/{b.field_name}",
                reason=b.reason,
            )
            if self._events is not None:
                self._events.warn("ReporterFieldSkipped", b.describe())
        self._reported_bad = now

    def _observed(self) -> dict[str, Any] | None:
        cnrs = getattr(self._snap, QUERY, None)
        return None if cnrs is None else cnrs.lookup("", self.node_name)

    async def sync(self) -> bool:
        """One step towards the merge: returns whether anything was written."""
        assert self._acc is not None and self._client is not None
        if not self._acc.status(QUERY).known:
            return False
        # The newest observed state, our own last writes included (read-your-writes), rather
        # than whatever the follower task last took.
        self._acc.update(self._snap)
        merged = self.merged if self.merged is not None else self.merge()
        observed = self._observed()
        self.observed = observed
        plan = write_plan(self.node_name, merged, observed)
        if not plan:
            metrics.WRITES.labels("none", "unchanged").inc()
            self.synced, self.error, self.synced_at = True, None, trio.current_time()
            self._settle()
            return False
        for verb, body in plan:
            await self._write(verb, body)
        self.synced, self.error, self.synced_at = True, None, trio.current_time()
        # Our writes are in the snapshot at once (read-your-writes), and this update takes the
        # news of them, so no later change may come to wake the loop: check here, once.
        self._acc.update(self._snap)
        self.observed = self._observed()
        if not write_plan(self.node_name, merged, self.observed):
            self._settle()
        return True

    async def _write(self, verb: str, body: dict[str, Any]) -> None:
        assert self._client is not None
        try:
            if verb == "create":
                labels = dict(self._settings.cnr_default_labels)
                meta: dict[str, Any] = {"name": self.node_name}
                if labels:
                    meta["labels"] = labels
                await self._client.create(
                    CNR_RESOURCE,
                    {"apiVersion": CNR_API_VERSION, "kind": CNR_KIND, "metadata": meta},
                )
            else:
                await self._client.apply(
                    CNR_RESOURCE,
                    body,
                    field_manager=FIELD_MANAGER,
                    subresource="status" if verb == "status" else None,
                )
        except KubeError as exc:
            metrics.WRITES.labels(verb, type(exc).__name__).inc()
            raise
        metrics.WRITES.labels(verb, "ok").inc()
        self.writes += 1
        self._announce()

    def _failed(self, exc: KubeError) -> None:
        self.synced = False
        self.error = f"{type(exc).__name__}: {exc}"
        log.warning("writing the CNR failed", node=self.node_name, error=self.error)
        self._announce()

    def view(self) -> dict[str, Any]:
        """What /v1/cnr shows."""
        merged = self.merged
        doc: dict[str, Any] = {
            "node": self.node_name,
            "mode": "standalone" if self.standalone else "cluster",
            "cnr": _render(self.node_name, merged),
            "plugins": sorted(self._reports.value),
            "bad_fields": [
                {"plugin": b.plugin, "field": f"{b.field_type}/{b.field_name}", "reason": b.reason}
                for b in (merged.bad if merged is not None else ())
            ],
        }
        if not self.standalone:
            acc = self._acc
            doc["sync"] = {
                "observed_known": acc is not None and acc.status(QUERY).known,
                # Not while newer reports wait to be merged and compared or written (held by
                # cnr_min_write_interval): "synced" then would claim a CNR the server lacks.
                "synced": self.synced and self.settled_version >= self._reports.version,
                "writes": self.writes,
                "error": self.error,
            }
        return doc


def _render(node_name: str, merged: MergeResult | None) -> dict[str, Any]:
    body = merged.body if merged is not None else {}
    out: dict[str, Any] = {
        "apiVersion": CNR_API_VERSION,
        "kind": CNR_KIND,
        "metadata": {"name": node_name, **body.get("metadata", {})},
    }
    for section in ("spec", "status"):
        if section in body:
            out[section] = body[section]
    return out
