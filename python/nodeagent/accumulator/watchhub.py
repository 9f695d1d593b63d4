"""The process's watches: one per distinct request, shared by every accumulator that asks, and
what they say about the apiserver's reachability.

Two consumers watching the same thing (the publisher and the dynamic configuration both watch
this node's Node) used to open a watch each: every watch costs the apiserver a connection, a
watcher and a reconnect every 4-5 minutes. The hub runs one watch per `WatchRequest` and fans
its raw bytes out to every subscribed sink, so each accumulator keeps its own store, coalescing
and read-your-writes, as before. A sink that subscribes while the watch runs gets the current
state replayed as a list (begin_list, one page, end_list) from the hub's own store, which only
the watch feeds; one that subscribes mid-list gets it once that list ends.

Watches are also proof that the apiserver answers: an event, a bookmark (the apiserver sends one
on every watch about once a minute) or a completed list. `reachable()` says whether every watch
showed such proof recently and none is failing, so that the cluster probe can skip its request
while they do (issue 24 s4: two thirds of an idle agent's requests were that probe).

    hub = WatchHub(partial(run_watch, client))
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        acc = Accumulator(client, queries, settings, watch=hub.watch)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from typing import Any, NoReturn, TypeVar, cast

import httpx
import trio

from nodeagent._native import Store
from nodeagent.accumulator.accumulator import Watch, serving
from nodeagent.kube import (
    ApiError,
    FeedResult,
    GapSink,
    KubeClient,
    ListFailureSink,
    WatchError,
    WatchRequest,
    WatchSink,
    run_watch,
)
from nodeagent.log import get_logger

log = get_logger(__name__)

R = TypeVar("R")

# A watch whose stream ended and has not opened again for this long (a healthy one reconnects at
# once) no longer shows the apiserver reachable.
RECONNECT_GRACE = 1.0

# List pages and watch chunks at least this large are parsed by the hub's store in a worker
# thread (as the accumulator's sinks do).
THREAD_THRESHOLD = 65536


class _Shared:
    """One running watch and its subscribers; it is itself the watch's sink (fan-out)."""

    def __init__(self, hub: WatchHub, request: WatchRequest, key: object, shared: bool) -> None:
        self.hub = hub
        self.request = request
        self.key = key
        # Fed by the watch only: what a late subscriber is replayed (None: one subscriber only,
        # no copy of the objects).
        self.store: Store | None = Store() if shared else None
        self.live: list[WatchSink] = []
        self.pending: list[WatchSink] = []  # subscribed mid-list: replayed when it ends
        # Sink calls of the watch and replays to new subscribers never interleave.
        self.lock = trio.Lock()
        self.listing = False
        self.listed = False
        self.resource_version = ""
        self.last_proof: float | None = None
        self.failing: str | None = None
        # When its stream ended (None: open, or never opened): reconnecting.
        self.closed_at: float | None = None
        self.ended = trio.Event()
        self.error: Exception | None = None
        self.scope = trio.CancelScope()
        self.joining = 0  # subscribers waiting for the lock to join

    @property
    def subscribers(self) -> int:
        return len(self.live) + len(self.pending) + self.joining

    async def run(self, watch: Watch) -> None:
        with self.scope:
            try:
                await watch(self.request, self)
            except Exception as exc:  # Forbidden, for each subscriber to decide; or a bug
                if not isinstance(exc, ApiError):
                    log.exception("shared watch failed", resource=self.request.resource.plural)
                self.error = exc
        self.hub._forget(self)
        self.ended.set()

    async def join(self, sink: WatchSink) -> None:
        try:
            await self.lock.acquire()
        finally:
            self.joining -= 1
        try:
            if self.listing:
                self.pending.append(sink)
                return
            if self.listed:
                await self._replay(sink)
            self.live.append(sink)
        finally:
            self.lock.release()

    def leave(self, sink: WatchSink) -> None:
        for group in (self.live, self.pending):
            if sink in group:
                group.remove(sink)
        if not self.subscribers:
            self.hub._forget(self)
            self.scope.cancel()

    async def _replay(self, sink: WatchSink) -> None:
        assert self.store is not None
        self.store.drain(None)  # everything held becomes "shown": shown_keys lists it all
        items = [
            raw
            for ns, name in self.store.shown_keys()
            if (raw := self.store.get(ns, name)) is not None
        ]
        rv = self.resource_version.encode()
        page = b'{"metadata":{"resourceVersion":"' + rv + b'"},"items":[' + b",".join(items)
        await sink.begin_list()
        await sink.list_page(page + b"]}")
        await sink.end_list(self.resource_version)

    def _proof(self) -> None:
        self.last_proof = trio.current_time()
        self.failing = None

    def stream_opened(self) -> None:
        """The server accepted the watch's stream (200): it answers."""
        self.closed_at = None
        self._proof()

    def stream_closed(self) -> None:
        self.closed_at = trio.current_time()
        self.hub._trouble.set()  # looked at again once a healthy watch had time to reconnect

    async def _run(self, fn: Callable[[bytes], R], data: bytes) -> R:
        if len(data) >= THREAD_THRESHOLD:
            return await trio.to_thread.run_sync(fn, data)
        return fn(data)

    # -- WatchSink (the watch's side) ---------------------------------------------------------

    async def begin_list(self) -> None:
        async with self.lock:
            if self.store is not None:
                self.store.begin_list()
            self.listing = True
            for sink in tuple(self.live):
                await sink.begin_list()

    async def list_page(self, page: bytes) -> None:
        async with self.lock:
            if self.store is not None:
                with contextlib.suppress(ValueError):  # each subscriber's sink reports it
                    await self._run(self.store.list_page, page)
            for sink in tuple(self.live):
                await sink.list_page(page)

    async def end_list(self, resource_version: str) -> None:
        async with self.lock:
            if self.store is not None:
                self.store.end_list(resource_version)
            self.listing, self.listed = False, True
            self.resource_version = resource_version
            self._proof()
            for sink in tuple(self.live):
                await sink.end_list(resource_version)
            pending, self.pending = self.pending, []
            for sink in pending:
                await self._replay(sink)
                self.live.append(sink)

    async def feed(self, chunk: bytes) -> FeedResult:
        async with self.lock:
            result: FeedResult | None = None
            if self.store is not None:
                rv, error, events, _malformed = await self._run(self.store.feed, chunk)
                result = FeedResult(rv, WatchError(*error) if error is not None else None, events)
            for sink in tuple(self.live):
                got = await sink.feed(chunk)
                result = result or got
            if result is None:  # no subscriber left: the watch is being stopped
                return FeedResult(None, None, 0)
            if result.resource_version is not None or result.events:
                self._proof()
            if result.resource_version is not None and not self.listing:
                self.resource_version = result.resource_version
            return result

    async def end_stream(self) -> None:
        async with self.lock:
            if self.store is not None:
                self.store.end_stream()
            for sink in tuple(self.live):
                await sink.end_stream()

    def list_failed(self, error: Exception, retry_in: float) -> None:
        self.failing = f"list failed: {error}"
        self.hub._trouble.set()
        for sink in (*self.live, *self.pending):
            if isinstance(sink, ListFailureSink):
                sink.list_failed(error, retry_in)

    def events_missing(self, reason: str) -> None:
        self.failing = f"events missing ({reason})"
        self.hub._trouble.set()
        for sink in (*self.live, *self.pending):
            if isinstance(sink, GapSink):
                sink.events_missing(reason)


class WatchHub:
    """Runs one watch per distinct `WatchRequest` for every subscriber (`watch`, the
    accumulator's ``watch=``) in its own nursery (`run`), and tells whether the watches show
    the apiserver reachable (`reachable`)."""

    def __init__(
        self,
        watch: Watch,
        share: Callable[[WatchRequest], bool] = lambda _: True,
        *,
        client: KubeClient | None = None,
    ) -> None:
        """``share``: whether subscribers of a request share one watch; the hub then keeps a
        copy of its objects for late subscribers. Others get a watch each (still counted for
        `reachable`). ``client``: while the hub runs, accumulators over it built without
        ``watch=`` watch through the hub."""
        self._watch = watch
        self._client = client
        self._share = share
        self._shared: dict[object, _Shared] = {}
        self._nursery: trio.Nursery | None = None
        self._trouble = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hosts the watches until cancelled."""
        with serving(self._client, self.watch) if self._client is not None else nullcontext():
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                try:
                    await trio.sleep_forever()
                finally:
                    self._nursery = None

    async def watch(self, request: WatchRequest, sink: WatchSink) -> NoReturn:
        """Feeds ``sink`` from the one watch of ``request`` until cancelled (the `Watch`
        signature). When that watch fails (a Forbidden list) every subscriber gets the error,
        as from a watch of its own."""
        while True:
            if self._nursery is None:
                raise RuntimeError("the watch hub is not running")
            share = self._share(request)
            key: object = request if share else (request, id(sink))
            shared = self._shared.get(key)
            if shared is None:
                shared = self._shared[key] = _Shared(self, request, key, share)
                self._nursery.start_soon(shared.run, self._watch)
            shared.joining += 1
            try:
                await shared.join(sink)
                await shared.ended.wait()
            finally:
                shared.leave(sink)
            if shared.error is not None:
                raise _again(shared.error)
            # Stopped as every other subscriber left while this one was joining: start anew.

    def _forget(self, shared: _Shared) -> None:
        if self._shared.get(shared.key) is shared:
            del self._shared[shared.key]

    @property
    def watches(self) -> int:
        """Watches running (each possibly shared)."""
        return len(self._shared)

    def subscribers(self, request: WatchRequest) -> int:
        """Subscribers of ``request``'s watches."""
        return sum(s.subscribers for s in self._shared.values() if s.request == request)

    def reachable(self, now: float, stall_after: float) -> tuple[bool, str]:
        """(whether every watch shows the apiserver reachable, why not or how). A watch shows
        it when it has had an event, a bookmark or a completed list within ``stall_after``
        seconds and is not failing (a list failing, events missing); with no watch, nothing
        is shown."""
        if not self._shared:
            return False, "no watch running"
        oldest = math.inf
        for shared in self._shared.values():
            label = shared.request.resource.plural
            if shared.failing is not None:
                return False, f"watch of {label}: {shared.failing}"
            if shared.closed_at is not None and now - shared.closed_at >= RECONNECT_GRACE:
                gone = now - shared.closed_at
                return False, f"watch of {label}: not reconnected for {gone:.0f}s"
            if shared.last_proof is None:
                return False, f"watch of {label}: not listed yet"
            if now - shared.last_proof > stall_after:
                silent = now - shared.last_proof
                return False, f"watch of {label}: silent for {silent:.0f}s"
            oldest = min(oldest, shared.last_proof)
        return True, f"{len(self._shared)} watches live (last heard {now - oldest:.0f}s ago)"

    def lost_since(self, now: float) -> float | None:
        """When the first of the watches whose stream ended and has not opened again within
        `RECONNECT_GRACE` ended (None: none): they are trying to reach the apiserver."""
        ended = [
            s.closed_at
            for s in self._shared.values()
            if s.closed_at is not None and now - s.closed_at >= RECONNECT_GRACE
        ]
        return min(ended) if ended else None

    async def trouble(self) -> None:
        """Returns when a watch starts failing (a list failed, events went missing) or its
        stream ends (a healthy one reconnects within `RECONNECT_GRACE`)."""
        await self._trouble.wait()
        self._trouble = trio.Event()


def _again(error: Exception | None) -> Exception:
    """The shared watch's error, anew for each subscriber (one instance raised in several tasks
    would share its traceback)."""
    if isinstance(error, ApiError):
        return type(error)(error.code, error.reason, error.message, error.details)
    return RuntimeError(f"shared watch ended: {error!r}")


def client_watch(client: KubeClient) -> Watch:
    """`run_watch` through ``client``, telling a hub's watch when its stream opens and ends
    (the sink alone cannot tell a watch reconnecting from one waiting for its next event)."""

    async def watch(request: WatchRequest, sink: WatchSink) -> NoReturn:
        seen: KubeClient = client
        if isinstance(sink, _Shared):
            seen = cast(KubeClient, _StreamsObserved(client, sink))
        await run_watch(seen, request, sink)

    return watch


class _StreamsObserved:
    """``client`` as one watch sees it: its streams tell the watch when they open and end."""

    def __init__(self, client: KubeClient, shared: _Shared) -> None:
        self._client = client
        self._shared = shared

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    @asynccontextmanager
    async def stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        async with self._client.stream(*args, **kwargs) as resp:
            self._shared.stream_opened()
            try:
                yield resp
            finally:
                self._shared.stream_closed()
