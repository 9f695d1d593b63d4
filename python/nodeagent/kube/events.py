"""The process's Event recorder, in the shape of client-go's ``tools/record`` EventRecorder (one
per process, shared by every component that reports to the operator through Events). The agent's
Events are on this node's Node object; a record may name another object (`Involved`: the rollout
controller's Events on NodeAgentConfigs), whose Events live in its namespace, or in "default"
for a cluster-scoped one, as client-go puts them.

- Non-blocking: `record` (`warn`, `normal`) only queues; `run` posts, one request at a time,
  through the process's one client.
- Buffered until the client exists: the dynamic-config controller boots (and may roll a config
  back) before the apiserver is reachable; what it records is posted once `attach` gives the
  client.
- Aggregated as client-go's EventCorrelator does: an occurrence of the same (object, type,
  reason, message) within `window` seconds of the last one is not a new Event but a higher ``count``
  and a newer ``lastTimestamp`` on the Event already posted (a PATCH, at most one per
  `update_interval` per Event: a plugin repeating the same bad field on every message costs
  one request a minute, not one per message). An Event the apiserver already dropped (its
  events TTL) is created again.
- Bounded: at most `backlog` Events wait to be created; more are dropped and counted. A failed
  post is logged and counted, never retried into a storm (its repeats in the window are only
  counted).
- One metric, by result: ``nodeagent_node_events_total{result}`` unless the process gives its
  own counter (the rollout controller's ``nodeagent_rollout_events_total{result}``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import msgspec
import trio
from prometheus_client import Counter

from nodeagent.core.wake import Deadlines, Wake
from nodeagent.kube.errors import KubeError, NotFound
from nodeagent.kube.resource import CORE_EVENTS, Resource
from nodeagent.log import get_logger

log = get_logger(__name__)

__all__ = ["NODE_EVENTS", "EventClient", "EventRecorder", "EventSink", "Involved"]

NODE_EVENTS = Counter(
    "nodeagent_node_events_total",
    "Events on the Node by result: created, updated (a repeat counted on an Event already "
    "posted), aggregated (a repeat folded into an Event), failed, dropped (backlog full).",
    ["result"],
)

# Series remembered for aggregation, as client-go's LRU cache (maxLruCacheEntries).
MAX_SERIES = 4096
MESSAGE_LIMIT = 1024


@dataclass(frozen=True, slots=True)
class Involved:
    """The object an Event is about (its ``involvedObject``). Two records about the same object
    (kind, namespace, name, uid, apiVersion, as client-go's aggregation key) are one series,
    whatever ``resource_version`` each saw."""

    kind: str
    name: str
    uid: str = ""
    api_version: str = ""
    namespace: str = ""  # "": cluster-scoped, its Events live in "default"
    resource_version: str = field(default="", compare=False)

    @classmethod
    def of(cls, resource: Resource, obj: Mapping[str, Any]) -> Involved:
        """The object ``obj`` of ``resource``, as decoded from the API (its metadata)."""
        meta = obj.get("metadata") or {}
        return cls(
            kind=resource.kind,
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            api_version=resource.api_version,
            namespace=str(meta.get("namespace", "")) if resource.namespaced else "",
            resource_version=str(meta.get("resourceVersion", "")),
        )

    @property
    def event_namespace(self) -> str:
        return self.namespace or "default"

    def reference(self) -> dict[str, str]:
        """The Event's ``involvedObject``: the fields known, by their API names."""
        fields = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "resourceVersion": self.resource_version,
        }
        return {k: v for k, v in fields.items() if v}


# (object, type, reason, message); object None: this node's Node (named at attach, maybe later).
Key = tuple[Involved | None, str, str, str]


class EventSink(Protocol):
    """What the recorder needs of a `KubeClient` to post Events."""

    async def create(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes: ...


@runtime_checkable
class EventClient(EventSink, Protocol):
    """What it needs to update their counts too. A sink without `patch` (a test double) gets
    no updates: the repeats are only counted."""

    async def patch(
        self, resource: Any, name: str, patch: Any, namespace: str | None = None
    ) -> bytes: ...


@dataclass
class _Series:
    """The occurrences of one (object, type, reason, message) within the window."""

    about: Involved | None  # as first recorded (its resourceVersion then)
    count: int
    first: float  # wall clock, for the Event's timestamps
    last: float
    seen: float  # Trio clock of the latest occurrence
    name: str | None = None  # the Event posted for it
    posted: int = 0  # the count the server has
    last_post: float = -math.inf  # Trio clock


def _now() -> float:
    """The Trio clock; before the event loop runs (a rollback at boot is recorded then),
    -inf: such an occurrence is older than any window."""
    try:
        return trio.current_time()
    except RuntimeError:
        return -math.inf


def _timestamp(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


class EventRecorder:
    def __init__(
        self,
        node_name: str | None = None,
        *,
        client: EventSink | None = None,
        backlog: int = 100,
        window: float = 600.0,
        update_interval: float = 60.0,
        component: str = "nodeagent",
        host: str | None = None,
        counter: Counter = NODE_EVENTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_name = node_name
        self._host = host  # the Event's source host; None: the node's name
        self._counter = counter  # by result
        self._client = client
        self.backlog = backlog
        self.window = window
        self.update_interval = update_interval
        self.component = component
        self._clock = clock
        self._series: dict[Key, _Series] = {}
        self._creates: dict[Key, None] = {}  # waiting to be created, oldest first
        self._updates: Deadlines[Key] = Deadlines()  # counts to post, and from when
        self._wake = Wake()
        # Events posted (created or updated) per reason: what a component shows as its own.
        self.posted: dict[str, int] = {}
        self._off = False

    def off(self) -> None:
        """No cluster (standalone): what was and will be recorded is not kept (the log has
        it), instead of filling the backlog and counting drops."""
        self._off = True
        self._series.clear()
        self._creates.clear()
        self._updates.clear()

    @property
    def _patches(self) -> bool:
        return isinstance(self._client, EventClient)

    @property
    def attached(self) -> bool:
        return self._client is not None

    def attach(self, client: EventSink, node_name: str | None = None) -> None:
        """The client to post through (and the node, if not given at construction): what was
        recorded meanwhile is posted."""
        self._client = client
        if node_name is not None:
            self.node_name = node_name
        self._wake.set()

    # On the Node (the agent's components); `record` names another object.
    def warn(self, reason: str, message: str) -> None:
        self.record("Warning", reason, message)

    def normal(self, reason: str, message: str) -> None:
        self.record("Normal", reason, message)

    def record(
        self, event_type: str, reason: str, message: str, *, about: Involved | None = None
    ) -> None:
        """Queues an Event on ``about``, by default the Node (never blocks, never raises; also
        before the event loop runs)."""
        if self._off:
            return
        key = (about, event_type, reason, message[:MESSAGE_LIMIT])
        now, wall = _now(), self._clock()
        series = self._series.get(key)
        if series is not None and (now - series.seen < self.window or key in self._creates):
            series.count += 1
            series.seen, series.last = now, wall
            self._counter.labels("aggregated").inc()
            if series.name is not None and key not in self._updates and self._patches:
                self._updates.set(key, max(now, series.last_post + self.update_interval))
                self._wake.set()  # the poster re-plans its sleep
            return
        if len(self._creates) >= self.backlog:
            self._counter.labels("dropped").inc()
            log.warning("event dropped: backlog full", reason=reason, backlog=self.backlog)
            return
        self._updates.discard(key)
        self._series[key] = _Series(about=about, count=1, first=wall, last=wall, seen=now)
        self._creates[key] = None
        self._wake.set()
        if len(self._series) > MAX_SERIES:
            self._forget(now)

    def _forget(self, now: float) -> None:
        """Drops the series past their window, then the oldest ones, never one waiting."""
        waiting = {*self._creates, *self._updates}
        idle = sorted((s.seen, k) for k, s in self._series.items() if k not in waiting)
        excess = len(self._series) - MAX_SERIES
        for seen, key in idle:
            if excess <= 0 and now - seen < self.window:
                break
            del self._series[key]
            excess -= 1

    async def run(self) -> None:
        """Posts what is recorded, once attached; restartable (the queue is the object's)."""
        while True:
            if self._client is None:
                await self._wake.wait()
                continue
            if self._creates:
                key = next(iter(self._creates))
                series = self._series.get(key)
                about = series.about if series is not None else key[0]
                if about is None:
                    if self.node_name is None:  # the Node's, not named yet
                        await self._wake.wait()
                        continue
                    # As the kubelet does: the node's UID is its name.
                    about = Involved("Node", self.node_name, self.node_name)
                del self._creates[key]
                await self._create(self._client, about, key)
                continue
            due = self._updates.pop_due()
            for key in due:
                await self._update(self._client, key)
            if not due:
                await self._wake.wait_until(self._updates.next())

    async def _create(self, client: EventSink, about: Involved, key: Key) -> None:
        _, type_, reason, message = key
        series = self._series.get(key)
        if series is None:
            return
        count = series.count
        host = self._host if self._host is not None else (self.node_name or "")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{about.name}."},
            "involvedObject": about.reference(),
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": self.component, "host": host},
            "reportingComponent": self.component,
            "reportingInstance": host,
            "count": count,
            "firstTimestamp": _timestamp(series.first),
            "lastTimestamp": _timestamp(series.last),
        }
        try:
            answer = await client.create(CORE_EVENTS, body, about.event_namespace)
        except KubeError as exc:
            self._counter.labels("failed").inc()
            log.warning("event not recorded", reason=reason, on=about.name, error=str(exc))
            return
        self._counter.labels("created").inc()
        self._posted(key, series, count, _name_of(answer))

    async def _update(self, client: EventSink, key: Key) -> None:
        series = self._series.get(key)
        if series is None or series.name is None or series.count <= series.posted:
            return
        if not isinstance(client, EventClient):
            return
        count = series.count
        patch = {"count": count, "lastTimestamp": _timestamp(series.last)}
        try:
            namespace = key[0].event_namespace if key[0] is not None else "default"
            await client.patch(CORE_EVENTS, series.name, patch, namespace)
        except NotFound:
            # Gone (the apiserver keeps Events for its --event-ttl, 1 h by default): the
            # series starts a new Event.
            series.name = None
            if len(self._creates) < self.backlog:
                self._creates[key] = None
            return
        except KubeError as exc:
            self._counter.labels("failed").inc()
            log.warning("event count not updated", reason=key[2], error=str(exc))
            return
        self._counter.labels("updated").inc()
        self._posted(key, series, count, series.name)

    def _posted(self, key: Key, series: _Series, count: int, name: str | None) -> None:
        now = trio.current_time()
        series.name, series.posted, series.last_post = name, count, now
        self.posted[key[2]] = self.posted.get(key[2], 0) + 1
        if name is not None and series.count > count and self._patches:
            # Repeats while the request was under way.
            self._updates.set(key, now + self.update_interval)


class _Meta(msgspec.Struct):
    name: str = ""


class _Named(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


def _name_of(answer: bytes) -> str | None:
    try:
        return msgspec.json.decode(answer, type=_Named).metadata.name or None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
