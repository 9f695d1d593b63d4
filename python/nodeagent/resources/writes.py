"""The publisher's writes: the metadata of a slice we write (our label and Node owner on top of
what others set), create / update / delete, re-owning a slice of a re-created Node, and dry
runs that show what the server would store.

Every write's answer tells where it leaves the pool (`expected`): the sync's own snapshot change
is no reason to sync again. Every answer's spec goes to the desired side's server-form memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec

from nodeagent import _native
from nodeagent.kube import RESOURCESLICES, ApiError, Conflict, NotFound
from nodeagent.resources import metrics
from nodeagent.resources.desired import Desired, DesiredSlices
from nodeagent.resources.dropped import dropped_fields
from nodeagent.resources.model import API_VERSION, KIND
from nodeagent.resources.observed import MANAGED_BY, ObservedSlices, PoolKey, Seen

__all__ = ["SliceWriter", "SliceWrites"]

_spec_only = msgspec.json.Decoder(dict[str, Any])


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
    ) -> tuple[str, dict[str, Any], bytes]:
        """(verb, the object to send, the desired spec it carries)."""
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
        for j, i, name, rv in updates:
            spec_bytes = desired.specs[i]
            if spec_bytes in self._desired.form_known:
                continue
            sent = _spec_only.decode(spec_bytes)
            seen = _spec_only.decode(ordered[j].raw).get("spec")
            if not isinstance(seen, dict) or not dropped_fields(sent, seen):
                continue  # a plain change: the write itself shows the stored form
            verb, body, _ = self.body(
                "update", driver, spec_bytes, pool, 0, 1, ordered[j], name, rv
            )
            answer = await self.dry_run(verb, body)
            self._desired.stored(key, body["spec"], spec_bytes, msgspec.json.decode(answer))
            learnt = True
        return learnt
