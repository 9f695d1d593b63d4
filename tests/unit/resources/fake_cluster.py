"""An in-memory stand-in for the API server's ResourceSlice and Node endpoints plus the
accumulator's read-your-writes snapshot, with fault injection, for fast publisher tests. The
real thing is exercised in tests/integration/test_resourceslices.py."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import msgspec
import trio

from nodeagent.kube import CORE_EVENTS
from nodeagent.kube.errors import ApiError, Conflict, NotFound
from nodeagent.kube.models import Node, ObjectMeta


class FakeCluster:
    def __init__(self, node_name: str = "node-a", *, drop_taints: bool = False) -> None:
        self.node_name = node_name
        self.objects: dict[str, dict[str, Any]] = {}
        self.drop_taints = drop_taints
        self.bootstrapped = True
        self.calls: list[tuple[str, str]] = []  # (verb, name)
        self.faults: list[ApiError] = []  # raised by the next writes, in order
        self.events: list[dict[str, Any]] = []  # core/v1 Events created, with their namespace
        self.raw: dict[str, bytes] = {}  # objects shown verbatim in snapshots
        self._rv = itertools.count(100)
        self._names = itertools.count(1)
        self._version = 0
        self._changed = trio.Event()

    # -- cluster side ----------------------------------------------------------------------

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = trio.Event()

    def put_external(self, obj: dict[str, Any]) -> dict[str, Any]:
        """An object written by someone else (or before a restart)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("name", f"ext-{next(self._names)}")
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta["resourceVersion"] = str(next(self._rv))
        self.objects[meta["name"]] = obj
        self._bump()
        return obj

    def put_raw(self, name: str, raw: bytes) -> None:
        self.raw[name] = raw
        self._bump()

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] != "get"]

    def _fault(self) -> None:
        if self.faults:
            raise self.faults.pop(0)

    # -- SliceWriter -----------------------------------------------------------------------

    async def get(
        self, resource: Any, name: str, namespace: str | None = None, *, into: Any
    ) -> Any:
        self.calls.append(("get", name))
        return Node(metadata=ObjectMeta(name=name, uid="node-uid-1"))

    def _store(self, obj: dict[str, Any]) -> bytes:
        if self.drop_taints:
            for d in obj["spec"].get("devices", []):
                d.pop("taints", None)
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[obj["metadata"]["name"]] = obj
        self._bump()
        return msgspec.json.encode(obj)

    async def create(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes:
        obj = copy.deepcopy(obj)
        if resource is CORE_EVENTS:
            self.events.append({"namespace": namespace, **obj})
            return msgspec.json.encode(obj)
        self.calls.append(("create", obj["metadata"].get("generateName", "")))
        self._fault()
        meta = obj["metadata"]
        meta["name"] = f"{meta.pop('generateName')}{next(self._names):05d}"
        meta["uid"] = f"uid-{meta['name']}"
        return self._store(obj)

    async def update(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes:
        obj = copy.deepcopy(obj)
        name = obj["metadata"]["name"]
        self.calls.append(("update", name))
        self._fault()
        old = self.objects.get(name)
        if old is None:
            raise NotFound(404, "NotFound", name)
        if old["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", f"{name} was modified")
        obj["metadata"]["uid"] = old["metadata"]["uid"]
        return self._store(obj)

    async def delete(
        self,
        resource: Any,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> bytes | None:
        self.calls.append(("delete", name))
        self._fault()
        old = self.objects.get(name)
        if old is None:
            raise NotFound(404, "NotFound", name)
        if uid and old["metadata"]["uid"] != uid:
            raise Conflict(409, "Conflict", "uid precondition failed")
        if resource_version and old["metadata"]["resourceVersion"] != resource_version:
            raise Conflict(409, "Conflict", "resourceVersion precondition failed")
        del self.objects[name]
        self._bump()
        return None

    # -- SliceSource -----------------------------------------------------------------------

    @property
    def source(self) -> FakeSource:
        """A new accumulator (each starts from a fresh list)."""
        return FakeSource(self)


class FakeSource:
    """The accumulator side of `FakeCluster`: snapshots that include every write at once."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.c = cluster
        self._taken = -1

    @property
    def bootstrapped(self) -> bool:
        return self.c.bootstrapped

    async def changed(self) -> None:
        while self._taken == self.c._version or not self.c.bootstrapped:
            await self.c._changed.wait()

    def update(self, target: object, deltas: Any = None) -> bool:
        c = self.c
        if not c.bootstrapped or self._taken == c._version:
            return False
        self._taken = c._version
        shown = {n: msgspec.json.encode(o) for n, o in c.objects.items()} | c.raw
        target.resourceslices = dict(sorted(shown.items()))  # type: ignore[attr-defined]
        return True
