"""The publisher's writes: a pool's plan (`plan`: the Rust planner's, the slices to re-own and
the objects to send, a new generation admitted by a dry run) and its writes (`apply`); the
metadata of a slice we write (our label and Node owner on top of what others set), create /
update / delete, re-owning a slice of a re-created Node, and dry runs that show what the server
would store.

Every write's answer tells where it leaves the pool (`expected`): the sync's own snapshot change
is no reason to sync again. Every answer's spec goes to the desired side's server-form memory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from nodeagent import _native
from nodeagent.kube import RESOURCESLICES, ApiError, Conflict, NotFound
from nodeagent.resources import metrics
from nodeagent.resources.desired import Desired, DesiredSlices
from nodeagent.resources.dropped import dropped_fields
from nodeagent.resources.model import API_VERSION, KIND
from nodeagent.resources.observed import MANAGED_BY, ObservedSlices, PoolKey, Seen

__all__ = ["Body", "PoolWrites", "SliceWriter", "SliceWrites"]

_spec_only = msgspec.json.Decoder(dict[str, Any])

Body = tuple[str, dict[str, Any], bytes]  # (verb, the object to send, the desired spec it carries)


@dataclass(frozen=True)
class PoolWrites:
    """One pool's writes, planned and admitted: `SliceWrites.apply` carries them out."""

    key: PoolKey
    plan: _native.PoolPlan
    reown: list[Seen]  # unchanged slices owned by a Node of our name that no longer exists
    bodies: list[Body]  # the updates, then the creates

    def summary(self) -> dict[str, int]:
        """What the writes do, for the log."""
        plan = self.plan
        return {
            "generation": plan.generation,
            "created": len(plan.creates),
            "updated": len(plan.updates),
            "deleted": len(plan.deletes),
            "reowned": len(self.reown),
        }


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


def _plan(desired: Desired | None, ordered: list[Seen]) -> _native.PoolPlan:
    t0 = time.perf_counter()
    plan = _native.plan_prepared(desired.prepared if desired else [], [s.prepared for s in ordered])
    metrics.PLAN_SECONDS.observe(time.perf_counter() - t0)
    return plan


def _is_node_ref(ref: Mapping[str, Any]) -> bool:
    return ref.get("kind") == "Node" and ref.get("apiVersion") == "v1"


def _result(exc: ApiError) -> str:
    if isinstance(exc, Conflict):
        return "conflict"
    if isinstance(exc, NotFound):
        return "not_found"
    return "error"


class SliceWrites:
    """Writes of this node's slices through the `SliceWriter`."""

    def __init__(
        self, client: SliceWriter, observed: ObservedSlices, desired: DesiredSlices
    ) -> None:
        self._client = client
        self._observed = observed
        self._desired = desired
        self.node_name = observed.node_name
        self.count = 0  # successful writes
        # While a sync runs: the {name: resourceVersion} its own writes lead to.
        self.expected: dict[str, str] | None = None
        self._planned: set[PoolKey] = set()  # pools planned at least once in this run

    def metadata(self, observed: Seen | None) -> dict[str, Any]:
        """Our label and owner on top of the observed metadata: what others set is kept."""
        meta: dict[str, Any] = {}
        if observed is not None:
            meta = _spec_only.decode(observed.raw).get("metadata") or {}
            # Omitted, the server keeps them; sent, they would replace its bookkeeping.
            meta.pop("managedFields", None)
        meta["labels"] = {**(meta.get("labels") or {}), MANAGED_BY[0]: MANAGED_BY[1]}
        uid = self._observed.node_uid
        assert uid is not None
        others = [r for r in meta.get("ownerReferences") or [] if not _is_node_ref(r)]
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node_name,
                "uid": uid,
                "controller": True,
            },
            *others,
        ]
        return meta

    def body(
        self,
        verb: str,
        driver: str,
        spec_bytes: bytes,
        pool: str,
        generation: int,
        count: int,
        observed: Seen | None = None,
        name: str = "",
        rv: str = "",
    ) -> Body:
        """One slice to create or update."""
        # The full desired spec, never the server's stripped form: a write coming back whole
        # is how a feature gate turned on shows.
        spec = _spec_only.decode(spec_bytes)
        spec["pool"] = {"name": pool, "generation": generation, "resourceSliceCount": count}
        meta = self.metadata(observed)
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

    def _wrote(self, answer: bytes | None, name: str) -> dict[str, Any] | None:
        """Counts a successful write and records where it leaves the pool."""
        self.count += 1
        if answer is None:
            if self.expected is not None:
                self.expected.pop(name, None)
            return None
        doc: dict[str, Any] = msgspec.json.decode(answer)
        meta = doc.get("metadata") or {}
        if self.expected is not None and meta.get("name"):
            self.expected[meta["name"]] = meta.get("resourceVersion", "")
        return doc

    async def delete(self, name: str, uid: str, rv: str) -> None:
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

    async def reown(self, seen: Seen) -> None:
        """The slice is right but owned by a Node that no longer exists (same name, new UID):
        the garbage collector would delete it."""
        body = _spec_only.decode(seen.raw)
        body["metadata"] = self.metadata(seen)
        try:
            answer = await self._client.update(RESOURCESLICES, body)
        except ApiError as exc:
            metrics.WRITES.labels("update", _result(exc)).inc()
            raise
        metrics.WRITES.labels("update", "ok").inc()
        metrics.REOWNED.inc()
        self._wrote(answer, seen.prepared.name)

    async def write(self, verb: str, key: PoolKey, body: dict[str, Any], spec_bytes: bytes) -> None:
        """Creates or updates one slice of the pool; what the server stored goes to the
        desired side."""
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
            self._desired.stored(key, body["spec"], spec_bytes, doc)

    async def dry_run(self, verb: str, body: dict[str, Any]) -> bytes:
        """The write validated and admitted by the server, nothing stored (`dryRun=All`)."""
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

    async def plan(self, key: PoolKey, desired: Desired | None) -> PoolWrites | None:
        """The pool's writes (None: nothing to write): its plan (in Rust) against the
        observed slices, the slices to re-own, and the updates and creates to send, those of
        a new generation admitted by a dry run first."""
        group = self._observed.groups.get(key, {})
        ordered = [group[n] for n in sorted(group)]
        plan = _plan(desired, ordered)
        # Only a pool's first plan in this run can meet slices an earlier run wrote against a
        # server that dropped fields; later ones learn the stored form from their own writes.
        first = key not in self._planned
        self._planned.add(key)
        if (
            first
            and desired is not None
            and plan.updates
            and await self.learn_forms(key, desired, plan.updates, ordered)
        ):
            # What the server would store is what it has: plan again against that.
            desired = self._desired.get(key)
            plan = _plan(desired, ordered)
        uid = self._observed.node_uid
        reown = [ordered[j] for j in plan.unchanged if uid not in ordered[j].node_owners]
        if not (plan.updates or plan.creates or plan.deletes or reown):
            return None
        return PoolWrites(key, plan, reown, await self._admitted(key, plan, desired, ordered))

    async def _admitted(
        self, key: PoolKey, plan: _native.PoolPlan, desired: Desired | None, ordered: list[Seen]
    ) -> list[Body]:
        """The plan's updates and creates as objects to send; those of a new generation are
        first admitted by a dry run."""
        driver, pool = key
        assert desired is not None or not (plan.updates or plan.creates)
        specs = desired.specs if desired is not None else ()
        generation, count = plan.generation, len(specs)
        bodies = [
            self.body(
                "update",
                driver,
                specs[u.desired],
                pool,
                generation,
                count,
                ordered[u.observed],
                u.name,
                u.resource_version,
            )
            for u in plan.updates
        ] + [self.body("create", driver, specs[i], pool, generation, count) for i in plan.creates]
        if len(bodies) + len(plan.deletes) > 1 and ordered:
            # More than one change means a new generation: the pool is complete again only
            # once all of them are done. A slice the server refuses, found after the first
            # changes, would leave the pool incomplete and every device in it unallocatable;
            # found by a dry run, it leaves the last complete pool published. Deletes count:
            # a shrinking pool deletes before it updates what it keeps (issue 29 item 11).
            # (A pool with no slice yet has nothing to lose: its first publish is not doubled.)
            for verb, body, _ in bodies:
                await self.dry_run(verb, body)
        return bodies

    async def apply(self, writes: PoolWrites) -> None:
        """A pool's writes: deletes, re-owns, then the updates and creates."""
        for d in writes.plan.deletes:
            await self.delete(d.name, d.uid, d.resource_version)
        for seen in writes.reown:
            await self.reown(seen)
        for verb, body, spec_bytes in writes.bodies:
            await self.write(verb, writes.key, body, spec_bytes)

    async def learn_forms(
        self,
        key: PoolKey,
        desired: Desired,
        updates: Sequence[_native.PlanUpdate],
        ordered: list[Seen],
    ) -> bool:
        """For each planned update whose observed slice lacks fields the desired spec has and
        whose stored form is not known yet: a dry-run update shows what the server would store.
        A gate off on this cluster then costs no write at all (an agent restart used to rewrite
        every such slice, bumping the pool's generation). Returns whether anything was learnt."""
        driver, pool = key
        learnt = False
        for u in updates:
            spec_bytes = desired.specs[u.desired]
            if spec_bytes in self._desired.form_known:
                continue
            sent = _spec_only.decode(spec_bytes)
            observed = ordered[u.observed]
            seen = _spec_only.decode(observed.raw).get("spec")
            if not isinstance(seen, dict) or not dropped_fields(sent, seen):
                continue  # a plain change: the write itself shows the stored form
            verb, body, _ = self.body(
                "update", driver, spec_bytes, pool, 0, 1, observed, u.name, u.resource_version
            )
            answer = await self.dry_run(verb, body)
            self._desired.stored(key, body["spec"], spec_bytes, msgspec.json.decode(answer))
            learnt = True
        return learnt
