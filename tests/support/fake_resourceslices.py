"""An in-memory stand-in for the API server's ResourceSlice endpoints, the Node, and the
accumulator's read-your-writes snapshot (both queries), with fault injection, for fast publisher
tests. The real thing is exercised in tests/integration/test_resourceslices*.py."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from nodeagent.accumulator.model import QueryStatus
from nodeagent.kube import CORE_EVENTS
from nodeagent.kube.errors import Conflict, NotFound


class FakeCluster:
    def __init__(self, node_name: str = "node-a", *, drop_taints: bool = False) -> None:
        self.node_name = node_name
        self.objects: dict[str, dict[str, Any]] = {}
        self.drop_taints = drop_taints
        self.bootstrapped = True
        self.calls: list[tuple[str, str]] = []  # (verb, name)
        self.faults: list[Exception] = []  # raised by the next writes, in order
        # Asked about every write (verb, body or name): an exception to raise, or None.
        self.reject: Callable[[str, Any], Exception | None] = lambda verb, obj: None
        self.node_uid: str | None = "node-uid-1"  # None: the Node does not exist
        # Queries whose state is not known (the accumulator's statuses(), known ones left out).
        self.unknown: dict[str, QueryStatus] = {}
        self.events: list[dict[str, Any]] = []  # core/v1 Events created, with their namespace
        self.dry_runs: list[tuple[str, str]] = []  # (verb, name) of dryRun=All writes
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

    def remove_external(self, name: str) -> None:
        """Someone else deletes an object."""
        del self.objects[name]
        self._bump()

    def put_raw(self, name: str, raw: bytes) -> None:
        self.raw[name] = raw
        self._bump()

    def set_node(self, uid: str | None) -> None:
        """The Node (re-)created with `uid`, or deleted (None)."""
        self.node_uid = uid
        self._bump()

    def writes(self) -> list[tuple[str, str]]:
        return list(self.calls)

    def _fault(self, verb: str, obj: Any) -> None:
        if self.faults:
            raise self.faults.pop(0)
        exc = self.reject(verb, obj)
        if exc is not None:
            raise exc

    # -- SliceWriter -----------------------------------------------------------------------

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
        self._fault("create", obj)
        meta = obj["metadata"]
        meta["name"] = f"{meta.pop('generateName')}{next(self._names):05d}"
        meta["uid"] = f"uid-{meta['name']}"
        return self._store(obj)

    async def update(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes:
        obj = copy.deepcopy(obj)
        name = obj["metadata"]["name"]
        self.calls.append(("update", name))
        self._fault("update", obj)
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
        self._fault("delete", name)
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

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        body: bytes | None = None,
        content_type: str | None = None,
        verb: str = "",
        resource: str = "",
        idempotent: bool = True,
    ) -> bytes:
        """Dry-run writes only (the publisher's other calls use create/update/delete): the
        `reject` hook decides, nothing is stored."""
        assert params == {"dryRun": "All"} and body is not None, (method, path, params)
        obj = msgspec.json.decode(body)
        verb = verb.removeprefix("dryrun_")
        self.dry_runs.append((verb, obj["metadata"].get("name", "")))
        exc = self.reject(verb, obj)
        if exc is not None:
            raise exc
        if self.drop_taints:
            for d in obj["spec"].get("devices", []):
                d.pop("taints", None)
        return msgspec.json.encode(obj)

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

    def statuses(self) -> dict[str, QueryStatus]:
        return dict(self.c.unknown)

    def update(self, target: object, deltas: Any = None) -> bool:
        c = self.c
        if not c.bootstrapped or self._taken == c._version:
            return False
        self._taken = c._version
        shown = {n: msgspec.json.encode(o) for n, o in c.objects.items()} | c.raw
        target.resourceslices = dict(sorted(shown.items()))  # type: ignore[attr-defined]
        node = {"metadata": {"name": c.node_name, "uid": c.node_uid}}
        target.node = (  # type: ignore[attr-defined]
            {("", c.node_name): msgspec.json.encode(node)} if c.node_uid is not None else {}
        )
        return True
