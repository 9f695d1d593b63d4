"""A plain-Python watch sink and a decoded-event API on it, for tests of the watch loop.

The agent never touches a watch event object in Python (the Rust store ingests the raw bytes,
see `nodeagent.accumulator`); these serve tests that want to see individual events.

`ObjectCache` keeps what the Rust store keeps (namespace/name -> resourceVersion + raw object)
and turns list pages and watch lines into ADDED / MODIFIED / DELETED events: an event whose
resourceVersion equals the known one is dropped, and a relist reports exactly its difference
(`relist_diff`). `Informer` runs a watch into a cache and hands out decoded events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgspec
import trio
from prometheus_client import Counter

from nodeagent.kube.client import KubeClient
from nodeagent.kube.errors import BadResponse
from nodeagent.kube.models import ObjectHead, Status, WatchEvent
from nodeagent.kube.watch import FeedResult, WatchError, WatchRequest, run_watch
from nodeagent.log import get_logger

log = get_logger(__name__)

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
Key = tuple[str, str]
EventType = Literal["ADDED", "MODIFIED", "DELETED"]

# Process-wide like a real metric, so that tests read it as an operator would; named apart
# from the agent's metrics (the docs test lists every nodeagent_* family in the registry).
BAD_EVENTS = Counter(
    "tests_informer_bad_events_total",
    "Watch lines or list items that could not be decoded (skipped), by resource.",
    ["resource"],
)


@dataclass(frozen=True, slots=True)
class RelistDiff(Generic[K]):
    added: list[K]
    modified: list[K]
    deleted: list[K]


def relist_diff(known: Mapping[K, str], listed: Mapping[K, str]) -> RelistDiff[K]:
    """What changed between the objects known before a relist and those it returned, both as
    key -> resourceVersion. Unchanged resourceVersions are no change at all."""
    added = [k for k in listed if k not in known]
    modified = [k for k, rv in listed.items() if k in known and known[k] != rv]
    deleted = [k for k in known if k not in listed]
    return RelistDiff(added, modified, deleted)


class _RawItems(msgspec.Struct):
    items: list[msgspec.Raw] | None = None


_items_decoder = msgspec.json.Decoder(_RawItems)
_head_decoder = msgspec.json.Decoder(ObjectHead)
_event_decoder = msgspec.json.Decoder(WatchEvent)
_status_decoder = msgspec.json.Decoder(Status)

Emit = Callable[[EventType, bytes], Awaitable[None]]


class ObjectCache:
    """A `WatchSink` keeping raw objects by namespace/name, emitting real changes only."""

    def __init__(self, emit: Emit, *, resource: str = "") -> None:
        self._emit = emit
        self.resource = resource
        self.objects: dict[Key, tuple[str, bytes]] = {}
        self._listing: dict[Key, tuple[str, bytes]] | None = None
        self._partial = b""

    def _head(self, raw: bytes | msgspec.Raw) -> tuple[Key, str] | None:
        try:
            meta = _head_decoder.decode(raw).metadata
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            BAD_EVENTS.labels(self.resource).inc()
            log.warning("undecodable object skipped", resource=self.resource, error=str(exc))
            return None
        return (meta.namespace, meta.name), meta.resource_version

    async def begin_list(self) -> None:
        self._listing = {}

    async def list_page(self, page: bytes) -> None:
        assert self._listing is not None, "list_page before begin_list"
        try:
            items = _items_decoder.decode(page).items or []
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # The list cannot be trusted: fail it so the watch loop lists again later.
            BAD_EVENTS.labels(self.resource).inc()
            raise BadResponse(f"undecodable list page for {self.resource}: {exc}") from exc
        for raw in items:
            head = self._head(raw)
            if head is not None:
                self._listing[head[0]] = (head[1], bytes(raw))

    async def end_list(self, resource_version: str) -> None:
        assert self._listing is not None, "end_list before begin_list"
        listed, self._listing = self._listing, None
        diff = relist_diff(
            {k: v[0] for k, v in self.objects.items()}, {k: v[0] for k, v in listed.items()}
        )
        old = self.objects
        self.objects = listed
        for key in diff.deleted:
            await self._emit("DELETED", old[key][1])
        for key in diff.added:
            await self._emit("ADDED", listed[key][1])
        for key in diff.modified:
            await self._emit("MODIFIED", listed[key][1])

    async def feed(self, chunk: bytes) -> FeedResult:
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        newest: str | None = None
        count = 0
        for line in lines:
            if not line.strip():
                continue
            count += 1
            try:
                event = _event_decoder.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                BAD_EVENTS.labels(self.resource).inc()
                log.warning(
                    "undecodable watch line skipped", resource=self.resource, error=str(exc)
                )
                continue
            if event.type == "ERROR":
                self._partial = b""
                return FeedResult(newest, _watch_error(event.object), count)
            head = self._head(event.object)
            if head is None:
                continue
            key, rv = head
            if rv:
                newest = rv
            if self._listing is not None and event.type in ("ADDED", "MODIFIED"):
                # A streaming list's initial events are list items: end_list diffs them.
                self._listing[key] = (rv, bytes(event.object))
            elif event.type in ("ADDED", "MODIFIED"):
                known = self.objects.get(key)
                if known is not None and known[0] == rv:
                    continue  # already seen (a relist or our own write got there first)
                self.objects[key] = (rv, bytes(event.object))
                await self._emit("ADDED" if known is None else "MODIFIED", bytes(event.object))
            elif event.type == "DELETED":
                if self.objects.pop(key, None) is not None:
                    await self._emit("DELETED", bytes(event.object))
            elif event.type != "BOOKMARK":
                BAD_EVENTS.labels(self.resource).inc()
                log.warning("unknown watch event type", resource=self.resource, type=event.type)
        return FeedResult(newest, None, count)

    async def end_stream(self) -> None:
        self._partial = b""


def _watch_error(raw: msgspec.Raw) -> WatchError:
    try:
        status = _status_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return WatchError(500, "BadErrorEvent", bytes(raw).decode("utf-8", "replace")[:500])
    return WatchError(status.code, status.reason, status.message)


@dataclass(frozen=True, slots=True)
class Event(Generic[T]):
    type: EventType
    object: T
    raw: bytes


class Informer(Generic[T]):
    """Decoded events of one watch: ``async with Informer(client, WatchRequest(...), into=T)
    as informer: async for ev in informer``. `synced` is set after the
    first complete list; `cache` holds the raw objects. If the watch fails for good (the list
    is Forbidden), iteration raises that error."""

    def __init__(
        self, client: KubeClient, request: WatchRequest, *, into: type[T], buffer: int = 1024
    ) -> None:
        self._client = client
        self._request = request
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(into)
        self.synced = trio.Event()
        self.error: BaseException | None = None
        self._send, self._recv = trio.open_memory_channel[Event[T]](buffer)
        self.cache = ObjectCache(self._emit, resource=request.resource.plural)

    async def _emit(self, type: EventType, raw: bytes) -> None:
        try:
            obj = self._decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            BAD_EVENTS.labels(self._request.resource.plural).inc()
            log.warning("object does not fit the informer type", error=str(exc))
            return
        await self._send.send(Event(type, obj, raw))

    async def _run(self) -> None:
        async with self._send:
            try:
                await run_watch(self._client, self._request, self.cache, on_synced=self.synced.set)
            except Exception as exc:
                self.error = exc

    def __aiter__(self) -> AsyncIterator[Event[T]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event[T]]:
        async for event in self._recv:
            yield event
        if self.error is not None:
            raise self.error

    def __aenter__(self) -> Awaitable[Informer[T]]:
        self._cm: AbstractAsyncContextManager[Informer[T]] = self._running()
        return self._cm.__aenter__()

    def __aexit__(self, *exc: Any) -> Awaitable[bool | None]:
        return self._cm.__aexit__(*exc)

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[Informer[T]]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()
