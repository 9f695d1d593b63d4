"""An in-memory stand-in for the kube client: the test drives each query's sink directly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import trio

from nodeagent.kube import errors
from nodeagent.kube.client import WriteEvent
from nodeagent.kube.resource import CONFIGMAPS, NODES, Resource
from nodeagent.kube.watch import WatchRequest, WatchSink

WIDGETS = Resource(
    group="example.com", version="v1", plural="widgets", kind="Widget", namespaced=True
)
SECRETS = Resource(group="", version="v1", plural="secrets", kind="Secret", namespaced=True)


class FakeClient:
    def __init__(self) -> None:
        self.resources = {r.kind: r for r in (CONFIGMAPS, NODES, WIDGETS, SECRETS)}
        self.sinks: dict[str, WatchSink] = {}
        self.watch_args: dict[str, dict[str, str | None]] = {}
        self.forbidden: set[str] = set()
        self._revoked: dict[str, trio.Event] = {}
        self.observers: list[Callable[[WriteEvent], None]] = []
        self._started: dict[str, trio.Event] = {}

    async def discover(self, api_version: str, kind: str) -> Resource:
        r = self.resources.get(kind)
        if r is None or r.api_version != api_version:
            raise errors.NotFound(404, "NotFound", f"kind {kind} is not served by {api_version}")
        return r

    def started(self, plural: str) -> trio.Event:
        return self._started.setdefault(plural, trio.Event())

    async def run_watch(self, request: WatchRequest, sink: WatchSink) -> NoReturn:
        """The accumulator's ``watch=``."""
        resource = request.resource
        self.watch_args[resource.plural] = {
            "namespace": request.namespace,
            "label_selector": request.label_selector,
            "field_selector": request.field_selector,
        }
        if resource.plural in self.forbidden:
            raise errors.Forbidden(403, "Forbidden", f"cannot list {resource.plural}")
        self.sinks[resource.plural] = sink
        self.started(resource.plural).set()
        revoked = self._revoked.setdefault(resource.plural, trio.Event())
        await revoked.wait()
        raise errors.Forbidden(403, "Forbidden", f"cannot list {resource.plural} any more")

    def revoke(self, plural: str) -> None:
        """Access to ``plural`` is revoked: its running watch ends with Forbidden (as the watch
        loop's relist does), and so does every attempt until ``forbidden`` is cleared."""
        self.forbidden.add(plural)
        self._started.pop(plural, None)
        self._revoked.pop(plural, trio.Event()).set()

    @contextmanager
    def observe_writes(self, fn: Callable[[WriteEvent], None]) -> Iterator[None]:
        self.observers.append(fn)
        try:
            yield
        finally:
            self.observers.remove(fn)

    def write(self, ev: WriteEvent) -> None:
        for fn in self.observers:
            fn(ev)

    async def sink(self, plural: str) -> WatchSink:
        await self.started(plural).wait()
        return self.sinks[plural]
