"""The dry run: what an agent would write, before it writes.

A `KubeClient` given a `DryRun` sends every write with ``dryRun=All`` (its `Transport` adds
the parameter to every non-GET request, so nothing it sends can persist), and records each
answered write here: verb, object, and a JSON diff of the would-be object (the server's
answer: defaulted, admitted, validated) against the object as the cluster holds it, with
server-managed metadata stripped.

The agent's view stays consistent although nothing reaches the watch: the caller gets the
answer as for a real write (the publisher learns the stored form, the CNR writer what it
wrote), but the client's write observers are not told (the accumulator's read-your-writes
overlay would show an object the watch never confirms, then drop it, and a dry-run create's
answer has no resourceVersion to order it by): the readers' view stays the cluster's. A
component that plans against that view again writes the same request again; a write the
server already answered (same verb, path, parameters and body) is answered from memory,
neither sent nor recorded again. So a dry run makes one recorded write per desired change,
not one per sync, and no request loop.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
from prometheus_client import Counter

from nodeagent.core.errors import ConfigError
from nodeagent.kube.resource import Resource

DRY_RUN_WRITES = Counter(
    "nodeagent_dry_run_writes_total",
    "Writes a dry-run agent would have made (sent with dryRun=All, nothing persisted), by "
    "verb and resource; a repeat answered from memory is not counted again.",
    ["verb", "resource"],
)

# Set by the server, not by the writer: a would-be object and the stored one differ in these
# for reasons that are not the write's (a dry-run create has no uid, a dry-run update keeps
# the old resourceVersion).
SERVER_MANAGED = frozenset(
    {"uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink"}
)

# (method, path, sorted parameters, the body's SHA-256): a slice's body can be large.
MemoKey = tuple[str, str, tuple[tuple[str, str], ...], bytes]


@dataclass(frozen=True, slots=True)
class WouldWrite:
    """One write the agent would have made. ``diff``: RFC 6902-style operations turning the
    cluster's object into the would-be one (``remove`` has no value); ``omitted``: operations
    left out to keep the record within the recorder's size bound."""

    seq: int
    at: float  # wall-clock time, seconds since the epoch
    verb: str
    resource: str
    api_version: str
    kind: str
    namespace: str
    name: str
    generate_name: str
    diff: tuple[dict[str, Any], ...]
    omitted: int = 0
    # A write to an object that exists only in this dry run (a would-be create): the server
    # could not check it; its answer was worked out here (see `DryRun.unstored_write`).
    unchecked: bool = False

    def view(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
        }
        if self.generate_name:
            obj["generateName"] = self.generate_name
        doc: dict[str, Any] = {
            "seq": self.seq,
            "time": datetime.fromtimestamp(self.at, UTC).isoformat(timespec="seconds"),
            "verb": self.verb,
            "resource": self.resource,
            "object": obj,
            "diff": list(self.diff),
        }
        if self.omitted:
            doc["diff_omitted"] = self.omitted
        if self.unchecked:
            doc["unchecked"] = True
        return doc


class DryRun:
    """The bounded record of would-be writes: the newest ``keep`` (older ones only counted),
    each diff within ``max_diff_bytes`` of JSON, and the last ``memo`` answers by request, at
    most ``memo_bytes`` of them (the least recently used go first)."""

    def __init__(
        self,
        *,
        keep: int = 200,
        max_diff_bytes: int = 16384,
        memo: int = 1024,
        memo_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if keep < 1:
            raise ConfigError("dry run keep", keep, "must be >= 1")
        if max_diff_bytes < 256:
            raise ConfigError("dry run max_diff_bytes", max_diff_bytes, "must be >= 256")
        if memo < 1:
            raise ConfigError("dry run memo", memo, "must be >= 1")
        self.max_diff_bytes = max_diff_bytes
        self._writes: deque[WouldWrite] = deque(maxlen=keep)
        self._memo: OrderedDict[MemoKey, bytes] = OrderedDict()
        self._memo_size = memo
        self._memo_bytes = memo_bytes
        self._memo_held = 0
        # Objects that exist only in this dry run (created by it), by (resource, ns, name):
        # what a later write to one of them applies to, as the server answered the create.
        self._unstored: OrderedDict[tuple[str, str, str], dict[str, Any]] = OrderedDict()
        self.total = 0
        self.repeated = 0

    # -- the client's side -------------------------------------------------------------------

    @staticmethod
    def key(method: str, path: str, params: Mapping[str, str] | None, body: bytes) -> MemoKey:
        digest = hashlib.sha256(body).digest()
        return (method, path, tuple(sorted((params or {}).items())), digest)

    def answered(self, key: MemoKey) -> bytes | None:
        """The server's answer to this very write, if it was made before (counted as a
        repeat)."""
        answer = self._memo.get(key)
        if answer is not None:
            self._memo.move_to_end(key)
            self.repeated += 1
        return answer

    def remember(self, key: MemoKey, answer: bytes) -> None:
        old = self._memo.pop(key, None)
        if old is not None:
            self._memo_held -= len(old)
        self._memo[key] = answer
        self._memo_held += len(answer)
        while len(self._memo) > self._memo_size or (
            self._memo_held > self._memo_bytes and len(self._memo) > 1
        ):
            _, dropped = self._memo.popitem(last=False)
            self._memo_held -= len(dropped)

    def record(
        self,
        verb: str,
        resource: Resource,
        namespace: str | None,
        name: str,
        would: bytes | None,
        current: bytes | None,
    ) -> WouldWrite:
        """Records a write the server accepted: ``would`` is its answer (None: the object
        would be gone), ``current`` the object as the cluster holds it (None: absent)."""
        new = _decode(would)
        old = _decode(current)
        meta = _meta(new) or _meta(old)
        if old is None and new is not None and verb != "delete":
            # The object would exist, but only in this dry run: later writes to it apply here.
            ns, obj_name = (
                str(meta.get("namespace") or namespace or ""),
                str(meta.get("name") or ""),
            )
            if obj_name:
                self._unstored[(resource.plural, ns, obj_name)] = new
                while len(self._unstored) > self._memo_size:
                    self._unstored.popitem(last=False)
        return self._append(verb, resource, namespace, name, new, old)

    def unstored_write(
        self,
        verb: str,
        resource: Resource,
        namespace: str | None,
        name: str,
        method: str,
        body: bytes,
        content_type: str,
    ) -> bytes | None:
        """The answer to a write the server refused as NotFound because its object exists only
        in this dry run (a real agent's create would have made it): worked out here (a PUT
        is its body; a merge, strategic-merge or apply patch merged onto the would-be object
        as a JSON merge patch, which for an object of one manager is what the server does)
        and recorded as unchecked. None when the object is not one this dry run created, or
        the write cannot be worked out (a JSON patch): the NotFound stands."""
        key = (resource.plural, namespace or "", name)
        base = self._unstored.get(key)
        if base is None:
            return None
        if method == "DELETE":
            del self._unstored[key]
            self._append("delete", resource, namespace, name, None, base, unchecked=True)
            return msgspec.json.encode({"apiVersion": "v1", "kind": "Status", "status": "Success"})
        try:
            doc = msgspec.json.decode(body)
        except msgspec.DecodeError:
            return None
        if not isinstance(doc, dict):
            return None  # a JSON patch (a list of operations)
        if method == "PUT":
            new = doc
        elif method == "PATCH" and content_type != "application/json-patch+json":
            new = merge_patch(base, doc)
        else:
            return None
        new.setdefault("metadata", {}).update(
            {k: v for k, v in _meta(base).items() if k in SERVER_MANAGED}
        )
        self._unstored[key] = new
        self._append(verb, resource, namespace, name, new, base, unchecked=True)
        return msgspec.json.encode(new)

    def _append(
        self,
        verb: str,
        resource: Resource,
        namespace: str | None,
        name: str,
        new: dict[str, Any] | None,
        old: dict[str, Any] | None,
        *,
        unchecked: bool = False,
    ) -> WouldWrite:
        meta = _meta(new) or _meta(old)
        ops = diff(_strip(old), _strip(new))
        kept, omitted = _bounded(ops, self.max_diff_bytes)
        self.total += 1
        DRY_RUN_WRITES.labels(verb, resource.plural).inc()
        entry = WouldWrite(
            seq=self.total,
            at=time.time(),
            verb=verb,
            resource=resource.plural,
            api_version=str((new or old or {}).get("apiVersion") or resource.api_version),
            kind=str((new or old or {}).get("kind") or resource.kind),
            namespace=str(meta.get("namespace") or namespace or ""),
            name=str(meta.get("name") or name),
            generate_name=str(meta.get("generateName") or ""),
            diff=tuple(kept),
            omitted=omitted,
            unchecked=unchecked,
        )
        self._writes.append(entry)
        return entry

    # -- the operator's side -----------------------------------------------------------------

    @property
    def writes(self) -> list[WouldWrite]:
        return list(self._writes)

    @property
    def older(self) -> int:
        """Writes recorded but no longer kept (only the newest ``keep`` are)."""
        return self.total - len(self._writes)

    def view(self) -> dict[str, Any]:
        """/v1/writes: the kept writes, oldest first, and the counters."""
        return {
            "dry_run": True,
            "total": self.total,
            "older": self.older,
            "repeated": self.repeated,
            "writes": [w.view() for w in self._writes],
        }


def not_dry_run_view() -> dict[str, Any]:
    """/v1/writes of an agent that writes for real."""
    return {"dry_run": False, "total": 0, "older": 0, "repeated": 0, "writes": []}


def diff(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """Operations turning ``old`` into ``new``: objects compared key by key (sorted), lists of
    one length item by item (a condition's new heartbeat is one path, not the whole list),
    any other value replaced whole; keys escaped as RFC 6901 pointers."""
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict[str, Any]] = []
        for key in sorted(old.keys() | new.keys()):
            at = f"{path}/{_escape(key)}"
            if key not in new:
                ops.append({"op": "remove", "path": at})
            elif key not in old:
                ops.append({"op": "add", "path": at, "value": new[key]})
            else:
                ops.extend(diff(old[key], new[key], at))
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [
            op
            for i, (o, n) in enumerate(zip(old, new, strict=True))
            for op in diff(o, n, f"{path}/{i}")
        ]
    if old == new and type(old) is type(new):
        return []
    return [{"op": "replace", "path": path, "value": new}]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` merged onto ``target`` (null removes a key; a non-object replaces)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _decode(data: bytes | None) -> dict[str, Any] | None:
    if data is None:
        return None
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("kind") == "Status":
        return None
    return doc


def _meta(doc: dict[str, Any] | None) -> dict[str, Any]:
    meta = (doc or {}).get("metadata")
    return meta if isinstance(meta, dict) else {}


def _strip(doc: dict[str, Any] | None) -> dict[str, Any]:
    if doc is None:
        return {}
    meta = _meta(doc)
    out = dict(doc)
    if meta:
        out["metadata"] = {k: v for k, v in meta.items() if k not in SERVER_MANAGED}
    return out


def _bounded(ops: list[dict[str, Any]], max_bytes: int) -> tuple[list[dict[str, Any]], int]:
    kept: list[dict[str, Any]] = []
    size = 0
    for i, op in enumerate(ops):
        size += len(msgspec.json.encode(op)) + 1
        if size > max_bytes:
            return kept, len(ops) - i
        kept.append(op)
    return kept, 0
