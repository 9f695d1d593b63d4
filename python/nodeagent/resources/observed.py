"""The publisher's observed side: this node's ResourceSlices and its Node, as its accumulator
shows them (own writes included), decoded once per (name, resourceVersion) and grouped per
(driver, pool).

Only slices carrying the ``app.kubernetes.io/managed-by=nodeagent`` label are ours; the names of
the others are kept per pool (a pool that also holds them is refused by the publisher).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from nodeagent import _native
from nodeagent.accumulator import Query, QueryStatus
from nodeagent.kube import NODES, RESOURCESLICES
from nodeagent.log import get_logger

log = get_logger(__name__)

__all__ = [
    "MANAGED_BY",
    "ObservedSlices",
    "PoolKey",
    "Seen",
    "SliceSource",
    "node_query_args",
    "publisher_queries",
    "slices_query_args",
]

MANAGED_BY = ("app.kubernetes.io/managed-by", "nodeagent")

PoolKey = tuple[str, str]  # (driver, pool)


class SliceSource(Protocol):
    """The observed side: an `Accumulator` with the queries of `publisher_queries` (raw
    bytes)."""

    @property
    def bootstrapped(self) -> bool: ...

    async def changed(self) -> None: ...

    def update(self, target: object, deltas: Any = None) -> bool: ...

    def statuses(self) -> Mapping[str, QueryStatus]: ...


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


class _Snapshot:
    resourceslices: Mapping[Any, bytes] = {}
    node: Mapping[Any, bytes] = {}


@dataclass(frozen=True)
class Seen:
    """One observed slice of this node, prepared once per (name, resourceVersion)."""

    key: PoolKey
    ours: bool
    prepared: _native.PreparedObserved
    raw: bytes
    node_owners: frozenset[str]  # UIDs of the Node owner references naming our node


_Missing = tuple[tuple[str, str], _SliceHead, bytes]


class ObservedSlices:
    """The newest snapshot of the publisher's accumulator, decoded and grouped per pool."""

    def __init__(self, source: SliceSource, node_name: str) -> None:
        self.source = source
        self.node_name = node_name
        self.node_uid: str | None = None  # None: no Node of our name (yet)
        self._node_raw: bytes | None = None
        self._snapshot = _Snapshot()
        # Slices we manage, grouped by pool; prepared once per (name, resourceVersion).
        self.groups: dict[PoolKey, dict[str, Seen]] = {}
        # Names of slices we do not manage, in pools we publish or want to publish.
        self.foreign: dict[PoolKey, tuple[str, ...]] = {}
        self._prepared: dict[tuple[str, str], Seen | None] = {}
        self._unreadable: set[tuple[str, str]] = set()  # (name, resourceVersion), logged once

    def take(self) -> bool:
        """Takes the newest snapshot in; returns whether it changed."""
        return self.source.update(self._snapshot)

    def versions(self, key: PoolKey | None) -> dict[str, str]:
        """{name: resourceVersion} of our slices of the pool."""
        group = self.groups.get(key, {}) if key is not None else {}
        return {n: s.prepared.resource_version for n, s in group.items()}

    def taken_over(self, key: PoolKey, registered: bool) -> bool:
        """Whether another publisher took over the pool of a plugin that is not `registered` (a
        driver upgraded to one that publishes its own slices, as the kubelet's helper does):
        the pool is not ours any more, so it is neither refused nor kept for a grace."""
        return bool(self.foreign.get(key)) and not registered

    def refusal(self, key: PoolKey, ours: bool, registered: bool) -> str | None:
        """Why the pool is not ours to write (None: it is): it is `ours` (desired or
        published) but also holds slices nodeagent does not manage, and it is not a pool taken
        over from a plugin that left."""
        foreign = self.foreign.get(key)
        if not (foreign and ours) or self.taken_over(key, registered):
            return None
        return (
            f"pool {key[1]} of driver {key[0]} on node {self.node_name} also holds "
            f"ResourceSlices not managed by nodeagent ({', '.join(foreign)}): nodeagent "
            "does not publish this pool until they are gone"
        )

    def unknown(self) -> list[QueryStatus]:
        """The queries whose state is not known (a relist under way, a Forbidden list)."""
        return [s for s in self.source.statuses().values() if not s.known]

    def blocked(self) -> str | None:
        """Why nothing may be written (None: writes may go ahead)."""
        # A relist under way is not a readiness problem for the accumulator, but its frozen
        # snapshot lacks own writes: acting on it could create a pool twice.
        unknown = self.unknown()
        if unknown:
            why = "; ".join(f"{s.query}: {s.reason or s.state.value}" for s in unknown)
            return f"the observed state is not known ({why})"
        if self.node_uid is None:
            return f"waiting for Node {self.node_name}"
        return None

    def refresh_node(self) -> bool:
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
        if uid == self.node_uid:
            return False
        old, self.node_uid = self.node_uid, uid
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

    def refresh(
        self,
        desired: Iterable[PoolKey],
        syncing: PoolKey | None = None,
        expected: Mapping[str, str] | None = None,
    ) -> set[PoolKey] | None:
        """Takes the newest snapshot in; returns the pools it changed (None: no new snapshot):
        every pool when the Node turned up (or came back with a new UID), but not the pool
        being synced (`syncing`) when all that changed in it is its own writes (`expected`:
        {name: resourceVersion} they lead to)."""
        if not self.take():
            return None
        # A foreign slice is never the sync's own write, even when it arrives in the same
        # snapshot as the sync's writes or while they are in flight (issue 20: taken for ours,
        # its pool was published beside it).
        foreign = self.foreign.get(syncing) if syncing is not None else None
        desired = set(desired)
        changed = self.regroup(desired)
        if self.refresh_node():
            changed |= desired | set(self.groups)
        if (
            syncing in changed
            and self.versions(syncing) == expected
            and self.foreign.get(syncing) == foreign
        ):
            changed.discard(syncing)  # only the sync's own writes: no reason to run again
        return changed

    def regroup(self, desired: Iterable[PoolKey]) -> set[PoolKey]:
        """Rebuilds the per-pool groups from the snapshot; returns the pools that changed (our
        slices in them, or the foreign slices beside them). `desired`: the pools we want to
        publish."""
        seen: dict[tuple[str, str], Seen | None] = {}
        missing: list[_Missing] = []
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
            seen[ident] = Seen(
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
        groups: dict[PoolKey, dict[str, Seen]] = {}
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
            for k in set(groups) | set(self.groups)
            if {n: o.prepared.resource_version for n, o in groups.get(k, {}).items()}
            != self.versions(k)
        }
        found = {k: tuple(sorted(v)) for k, v in foreign.items()}
        # Another driver's own slices are none of our business: only pools we publish or want
        # to publish care about foreign slices.
        ours = set(desired) | set(groups) | set(self.groups)
        changed |= {k for k in set(found) | set(self.foreign) if k in ours} - {
            k for k in set(found) & set(self.foreign) if found[k] == self.foreign[k]
        }
        self.groups, self.foreign = groups, found
        return changed

    def _prepare_observed(
        self, missing: list[_Missing]
    ) -> list[tuple[_Missing, _native.PreparedObserved]]:
        if not missing:
            return []
        try:
            return list(
                zip(missing, _native.prepare_observed([m[2] for m in missing]), strict=True)
            )
        except _native.SliceError as exc:
            errors = exc.errors
        # One bad object must not hide the good ones (we would publish duplicates): the error
        # names every bad one, the rest are prepared in one more call.
        for i, message in errors:
            self._unreadable.add(missing[i][0])
            log.error("observed ResourceSlice not understood", name=missing[i][0][0], error=message)
        bad = {i for i, _ in errors}
        good = [m for i, m in enumerate(missing) if i not in bad]
        return list(zip(good, _native.prepare_observed([m[2] for m in good]), strict=True))
