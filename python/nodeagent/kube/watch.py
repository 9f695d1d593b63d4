"""List-then-watch with informer-grade semantics, generic over a sink that takes raw bytes.

The loop lists (paged), then watches from the list's resourceVersion with bookmarks, a
jittered server timeout and a client inactivity timeout. A watch that ends or breaks resumes
from the newest resourceVersion seen; only a 410 (at watch start or as an ERROR event) or a
Forbidden watch (its relist tells whether access was revoked) relists, and then the sink reports
the difference. The loop never parses an event itself: the sink's `FeedResult` tells it the
newest resourceVersion and any ERROR event.

With `WatchOptions.streaming_list` ("on", or "auto" where the server supports it) a (re)list is
a streaming list instead (client-go's WatchList): one watch with ``sendInitialEvents=true`` and
``resourceVersionMatch=NotOlderThan`` whose initial ADDED events are the list, complete at the
BOOKMARK annotated ``k8s.io/initial-events-end``, and which then goes on as the watch. The
apiserver serves it from its watch cache object by object instead of building whole List pages
in memory. Only the bookmark's line is decoded in Python, and only once the marker's bytes were
found in the stream.

`run_watch(client, WatchRequest(...), sink)` is the one way to watch: the request says what,
the client's `WatchOptions` say how.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, Protocol, runtime_checkable

import httpx
import msgspec
import trio

from nodeagent.core.backoff import Backoff, Jitter
from nodeagent.kube import errors
from nodeagent.kube.client import KubeClient, selector_params
from nodeagent.kube.metrics import (
    BODIES_TOO_LARGE,
    WATCH_DECODE_ERRORS,
    WATCH_EVENTS,
    WATCH_RELISTS,
    WATCH_RESTARTS,
    WATCH_STREAMING_LISTS,
)
from nodeagent.kube.resource import Resource
from nodeagent.kube.transport import body_stream
from nodeagent.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WatchRequest:
    """What to list and watch: a resource, in one namespace (None: all, or a cluster-scoped
    resource), narrowed by label and field selectors."""

    resource: Resource
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None


@dataclass(frozen=True, slots=True)
class WatchError:
    """An ERROR event in the stream (a metav1.Status)."""

    code: int
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class FeedResult:
    resource_version: str | None  # newest RV seen in this chunk (events AND bookmarks), else None
    error: WatchError | None  # first ERROR event in the chunk; bytes after it are ignored
    events: int  # number of complete events consumed (for metrics)


class WatchSink(Protocol):
    async def begin_list(self) -> None:
        """A full (re)list starts. It may start again before `end_list` if a page failed."""

    async def list_page(self, page: bytes) -> None:
        """The raw JSON body of one List page."""

    async def end_list(self, resource_version: str) -> None:
        """The list is complete: anything known but not seen since `begin_list` is gone."""

    async def feed(self, chunk: bytes) -> FeedResult:
        """Raw watch body bytes: newline-delimited JSON events, split anywhere across chunks.
        Between `begin_list` and `end_list` they are a streaming list's initial events (ADDED
        events, the list's items, in complete lines), instead of List pages."""

    async def end_stream(self) -> None:
        """The watch connection ended: drop a partial line."""


@runtime_checkable
class ListFailureSink(Protocol):
    """Optional: a sink that also wants to know why a (re)list failed (e.g. for readiness).
    Every other failure is retried by the loop and only logged."""

    def list_failed(self, error: Exception, retry_in: float) -> None:
        """The list since the last `begin_list` failed; it is retried in ``retry_in`` s."""


@runtime_checkable
class GapSink(Protocol):
    """Optional: a sink that wants to know as soon as events are known to be missing (a 410, a
    watch body that could not be decoded, a watch Forbidden until it relists), not only once
    the relist that repairs it begins: that relist may first wait out the backoff, and a
    streaming one calls `begin_list` only once its stream connects, which may fail for long."""

    def events_missing(self, reason: str) -> None:
        """What the sink holds is stale until the next `end_list`; ``reason`` is the watch
        restart reason (``gone``, ``decode_error``, ``forbidden``)."""


INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_MARKER = INITIAL_EVENTS_END.encode()
# What a server without streaming lists answers (422 Invalid "sendInitialEvents is forbidden for
# watch unless the WatchList feature gate is enabled"; 400 from servers that reject the fields).
_UNSUPPORTED = frozenset({400, 404, 405, 422})
# A Forbidden watch after a good list relists (access revoked?) only once the watch has been
# refused this many times in a row: an apiserver that has just started answers 403 until its
# RBAC caches are synced (seen for ~1 s in the load runs), and a relist refused in that window
# would serve the query as empty (README, "Load: many agents against one apiserver").
FORBIDDEN_WATCHES_BEFORE_RELIST = 3


class _BookmarkMeta(msgspec.Struct):
    resource_version: str = msgspec.field(default="", name="resourceVersion")
    annotations: dict[str, str] = msgspec.field(default_factory=dict)


class _BookmarkObject(msgspec.Struct):
    metadata: _BookmarkMeta = msgspec.field(default_factory=_BookmarkMeta)


class _EventHead(msgspec.Struct):
    type: str = ""
    object: _BookmarkObject = msgspec.field(default_factory=_BookmarkObject)


_event_head = msgspec.json.Decoder(_EventHead)


def find_initial_events_end(lines: bytes) -> tuple[int, str] | None:
    """In ``lines`` (complete watch event lines): the offset just past the line of the first
    BOOKMARK annotated ``k8s.io/initial-events-end: "true"``, and its resourceVersion; None if
    there is none. The marker's bytes in an object (an annotation, a ConfigMap's data) are
    decoded and skipped: only a BOOKMARK event counts."""
    pos = 0
    while (i := lines.find(_MARKER, pos)) >= 0:
        start = lines.rfind(b"\n", 0, i) + 1
        end = lines.find(b"\n", i)
        end = len(lines) if end < 0 else end
        try:
            ev = _event_head.decode(lines[start:end])
        except (msgspec.DecodeError, msgspec.ValidationError):
            ev = None
        if ev is not None and ev.type == "BOOKMARK":
            meta = ev.object.metadata
            if meta.annotations.get(INITIAL_EVENTS_END) == "true" and meta.resource_version:
                return end + 1, meta.resource_version
        pos = end + 1
    return None


class _InitialEvents:
    """Splits a streaming list's bytes at the initial-events-end bookmark. Until then only
    complete lines go on (so the marker is never cut in two); a line still arriving is held
    as parts and joined once its end came."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def push(self, chunk: bytes) -> tuple[bytes, tuple[bytes, str] | None]:
        """(initial-event bytes to feed now, and once the bookmark came: (the bytes after it,
        which belong to the watch, and the list's resourceVersion))."""
        self._parts.append(chunk)
        if b"\n" not in chunk:
            return b"", None
        data = b"".join(self._parts)
        cut = data.rfind(b"\n") + 1
        lines, tail = data[:cut], data[cut:]
        self._parts = [tail] if tail else []
        found = find_initial_events_end(lines)
        if found is None:
            return lines, None
        end, rv = found
        rest = lines[end:] + tail
        self._parts = []
        return lines[:end], (rest, rv)


class UnsupportedStreamingList(errors.KubeError):
    """The server refused a streaming list as unsupported (kube.streaming_list = "auto" then
    lists with LIST)."""

    def __init__(self, cause: errors.ApiError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _ReconnectGate:
    """The watches of one client while the apiserver does not answer: one of them (the prober)
    goes on trying with its backoff, the others wait; once the server answers anything, each of
    them reconnects after a random 0..``reconnect_spread`` s, and after the watch backoff's
    maximum at the latest. An apiserver accepts connections for seconds before it serves them
    (its port is bound early in its start), so every attempt made meanwhile is answered in the
    same instant: one per agent instead of one per watch, the rest spread. (Waiting for an
    answer other than 403, 429 or 5xx, which a restarted apiserver gives for seconds, held the
    other watches back longer without lowering the load runs' peak.)"""

    def __init__(self) -> None:
        self.down = False
        self.prober: _Watch | None = None
        self._changed = trio.Event()

    def _fire(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def went_down(self, w: _Watch) -> None:
        """``w`` could not reach the server (its stream broke, a connect failed)."""
        self.down = True
        if self.prober is None:
            self.prober = w

    def answered(self) -> None:
        """The server answered a request of one of the watches (any status)."""
        if self.down:
            self.down, self.prober = False, None
            self._fire()

    def leave(self, w: _Watch) -> None:
        if self.prober is w:
            self.prober = None
            self._fire()

    async def pause(self, w: _Watch, delay: float, spread: float, rng: random.Random) -> None:
        """The backoff ``delay`` of ``w`` after the server could not be reached, cut short once
        it answers (then a random 0..``spread`` s, as the waiting watches). The prober waits
        ``spread`` s at most: with its backoff grown to 15..30 s in a long outage, a server
        serving again went unnoticed for as long (the soak: a config applied 41 s after)."""
        if spread <= 0:
            await trio.sleep(delay)
            return
        if self.prober is w:
            delay = min(delay, spread)
        with trio.move_on_after(delay):
            while self.down:
                await self._changed.wait()
            await trio.sleep(rng.uniform(0, spread))

    async def turn(self, w: _Watch, spread: float, rng: random.Random, most: float) -> None:
        """Wait until ``w`` may try to reach the server (``most`` seconds at the most: a prober
        refused for long, say by one resource's failing webhook, holds no one back for ever)."""
        if spread <= 0:
            return
        with trio.move_on_after(most):
            while self.down and self.prober is not w:
                if self.prober is None:
                    self.prober = w  # the prober left: this one takes over
                    return
                changed = self._changed
                await changed.wait()
                if not self.down:
                    await trio.sleep(rng.uniform(0, spread))
                    return


# The gate of each client's watches (a client is one agent's connection to its apiserver).
_GATES: weakref.WeakKeyDictionary[KubeClient, _ReconnectGate] = weakref.WeakKeyDictionary()


class _Watch:
    def __init__(
        self,
        client: KubeClient,
        request: WatchRequest,
        sink: WatchSink,
        on_synced: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.options = client.watch_options
        self.request = request
        self.sink = sink
        self.label = request.resource.plural
        self.rv: str | None = None
        self.healthy = False
        self.retry_after: float | None = None
        # Lists stream (sendInitialEvents) until "auto" finds the server does not support it.
        self.streaming = self.options.streaming_list != "off"
        # A streaming list is under way: its stream has not shown the end bookmark yet.
        self.listing = False
        self.synced = False
        self.on_synced = on_synced
        # Watches refused with 403 in a row since the last one the server accepted.
        self.forbidden_in_a_row = 0
        # A streaming list's initial events, split from the watch at its end bookmark.
        self._initial: _InitialEvents | None = None
        self.gate = _GATES.setdefault(client, _ReconnectGate())
        # (Trio clock) from when the server may close the current watch for its timeoutSeconds:
        # a close before that is the server going away, not the routine end of a watch.
        self.closes_from = 0.0

    def listed(self, rv: str) -> None:
        self.rv = rv
        if not self.synced:
            self.synced = True
            if self.on_synced is not None:
                self.on_synced()

    async def relist(self) -> str:
        WATCH_RELISTS.labels(self.label).inc()
        await self.sink.begin_list()
        rv = ""
        req = self.request
        async for page in self.client.list_pages(
            req.resource,
            req.namespace,
            label_selector=req.label_selector,
            field_selector=req.field_selector,
        ):
            self.gate.answered()
            await self.sink.list_page(page.body)
            rv = page.resource_version
        if not rv:
            # Watching from "" would mean "from any point": events could be lost.
            raise errors.BadResponse(f"list {self.label}: no resourceVersion")
        await self.sink.end_list(rv)
        self.listed(rv)
        return rv

    async def stream_once(self, rv: str | None) -> str:
        """One watch connection from ``rv``, or (None) a streaming list that goes on as the
        watch once listed; returns why the watch ended (the metric's reason). A streaming list
        that fails before its end bookmark raises, as a failed LIST would: `Forbidden`,
        `UnsupportedStreamingList` (auto mode) or the failure to retry with backoff."""
        self.healthy = False
        self.retry_after = None
        self.listing = rv is None
        try:
            reason = await self._stream(rv)
        except errors.BodyTooLarge as exc:
            # Bounded, not dropped: the event (or the error answer) is refused whole, and what
            # it would have told is only known again from a relist.
            BODIES_TOO_LARGE.labels(self.label, exc.limit).inc()
            log.error("watch body too large: relisting", resource=self.label, error=exc.message)
            self.rv = None
            if self.listing:
                raise self._list_failure(exc) from exc
            return "too_large"
        except errors.DecodeError as exc:
            # Events may have been lost in what could not be decoded: never go on from the
            # resourceVersion seen so far, relist (streaming lists are retried with backoff).
            WATCH_DECODE_ERRORS.labels(self.label).inc()
            log.error("watch body not decodable: relisting", resource=self.label, error=str(exc))
            self.rv = None
            if self.listing:
                raise self._list_failure(exc) from exc
            return "decode_error"
        except (httpx.TransportError, errors.KubeError) as exc:
            if isinstance(exc, errors.ApiError):
                self.gate.answered()
            if self.listing:
                raise self._list_failure(exc) from exc
            return self._watch_failure(exc)
        if self.listing:
            WATCH_STREAMING_LISTS.labels(self.label, "failed").inc()
            raise errors.BadResponse(
                f"streaming list of {self.label} ended ({reason}) before the "
                f"{INITIAL_EVENTS_END} bookmark"
            )
        return reason

    async def _stream(self, rv: str | None) -> str:
        lo, hi = self.options.server_timeout
        # Jittered so that many watches opened together do not all reconnect together.
        timeout = max(1, round(self.client.rng.uniform(lo, hi)))
        self.closes_from = trio.current_time() + timeout - 1
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
            **selector_params(self.request.label_selector, self.request.field_selector),
        }
        if rv is None:
            # No resourceVersion + NotOlderThan: a consistent list, as fresh as a quorum read.
            params["sendInitialEvents"] = "true"
            params["resourceVersionMatch"] = "NotOlderThan"
        else:
            params["resourceVersion"] = rv
        async with self.client.stream(
            self.request.resource.path(self.request.namespace),
            params,
            read_timeout=self.options.inactivity_timeout,
            resource=self.label,
        ) as resp:
            self.gate.answered()
            self.forbidden_in_a_row = 0
            self._initial = None
            if rv is None:
                WATCH_RELISTS.labels(self.label).inc()
                await self.sink.begin_list()
                self._initial = _InitialEvents()
            decoder, raw_chunks = body_stream(resp, max_line=self.options.max_event_bytes)
            try:
                async for raw in raw_chunks:
                    # In bounded pieces: a small chunk of a gzip bomb never becomes one huge one.
                    for chunk in decoder.pieces(raw):
                        if (error := await self._take(chunk)) is not None:
                            return self._on_error_event(error)
                decoder.finish()
            finally:
                await self.sink.end_stream()
        return "closed"

    async def _take(self, chunk: bytes) -> WatchError | None:
        """Feed one decoded piece of the stream: to the streaming list's initial events until
        its end bookmark, then to the watch. The ERROR event that came, if any."""
        if (initial := self._initial) is not None:
            lines, end = initial.push(chunk)
            if lines and (error := await self._feed(lines)) is not None:
                return error
            if end is None:
                return None
            chunk, list_rv = end
            self._initial = None
            await self.sink.end_list(list_rv)
            self.listing = False
            WATCH_STREAMING_LISTS.labels(self.label, "complete").inc()
            self.listed(list_rv)
            if not chunk:
                return None
        return await self._feed(chunk)

    async def _feed(self, data: bytes) -> WatchError | None:
        result = await self.sink.feed(data)
        if result.events:
            WATCH_EVENTS.labels(self.label).inc(result.events)
            self.healthy = True
        if result.resource_version and not self.listing:
            self.rv = result.resource_version
        return result.error

    def _list_failure(self, exc: Exception) -> Exception:
        """What a streaming list that failed before its end bookmark raises."""
        if (
            isinstance(exc, errors.ApiError)
            and exc.code in _UNSUPPORTED
            and self.options.streaming_list == "auto"
        ):
            return UnsupportedStreamingList(exc)  # counted as "unsupported" by run_watch
        WATCH_STREAMING_LISTS.labels(self.label, "failed").inc()
        if isinstance(exc, httpx.TransportError):
            return errors.TransportError(f"streaming list of {self.label}: {exc}", sent=True)
        return exc

    def _watch_failure(self, exc: Exception) -> str:
        """Why a watch (not a streaming list still under way) ended with ``exc``."""
        if isinstance(exc, httpx.ReadTimeout):
            log.warning(
                "watch inactive: reconnecting",
                resource=self.label,
                timeout=self.options.inactivity_timeout,
            )
            return "inactivity"
        if isinstance(exc, httpx.TransportError):
            log.info("watch stream broken", resource=self.label, error=str(exc))
            return "broken"
        if isinstance(exc, errors.Gone):
            self.rv = None
            return "gone"
        if isinstance(exc, errors.Forbidden):
            self.forbidden_in_a_row += 1
            if self.forbidden_in_a_row < FORBIDDEN_WATCHES_BEFORE_RELIST:
                # Most likely an apiserver whose authorizer is still warming up: the watch is
                # retried from the same resourceVersion after the backoff.
                log.info("watch forbidden: retrying", resource=self.label, error=str(exc))
                return "forbidden"
            # Access was revoked since the list (a watch is authorized when it opens): what the
            # sink holds can no longer be kept up to date. Relist: the list either works again
            # or raises Forbidden to the caller, which decides what a Forbidden resource means.
            log.warning("watch forbidden: relisting", resource=self.label, error=str(exc))
            self.forbidden_in_a_row = 0
            self.rv = None
            return "forbidden"
        if isinstance(exc, errors.ApiError):
            log.warning("watch request failed", resource=self.label, error=str(exc))
            self.retry_after = exc.retry_after
            return "http_error"
        log.warning("watch connect failed", resource=self.label, error=str(exc))
        return "connect"

    def _on_error_event(self, err: WatchError) -> str:
        if self.listing:
            # The streaming list failed: raised by stream_once like a failed LIST.
            raise errors.error_class(err.code, err.reason)(err.code, err.reason, err.message)
        if err.code == 410:
            # Never resume from a compacted resourceVersion: relist and diff.
            log.info("watch resourceVersion expired: relisting", resource=self.label)
            self.rv = None
            return "gone"
        log.warning(
            "watch error event",
            resource=self.label,
            code=err.code,
            reason=err.reason,
            message=err.message,
        )
        return "error"


async def run_watch(
    client: KubeClient,
    request: WatchRequest,
    sink: WatchSink,
    *,
    on_synced: Callable[[], None] | None = None,
) -> NoReturn:
    """List then watch ``request`` through ``client`` until cancelled, feeding raw bytes to
    ``sink``, with the client's `WatchOptions`. ``on_synced`` runs after the first complete list.

    A failed list is retried with backoff (and reported to a `ListFailureSink`), except
    `Forbidden`, which is raised: whether to go on without that resource is the caller's
    decision. A Forbidden watch (access revoked after the list) relists after the backoff, so
    it ends the same way.
    """
    w = _Watch(client, request, sink, on_synced)
    backoff = Backoff(
        *client.watch_options.backoff, jitter=Jitter.below(0.5), random=client.rng.random
    )
    spread = client.watch_options.reconnect_spread
    try:
        while True:
            await w.gate.turn(w, spread, client.rng, client.watch_options.backoff[1])
            await _attempt(w, client, sink, backoff, spread)
    finally:
        w.gate.leave(w)


async def _attempt(
    w: _Watch, client: KubeClient, sink: WatchSink, backoff: Backoff, spread: float
) -> None:
    """One (re)list or watch of `run_watch`, then the wait before the next."""
    try:
        if w.rv is None and not w.streaming:
            await w.relist()
        # A streaming list (rv None) goes on as the watch once its end bookmark came.
        reason = await w.stream_once(w.rv)
    except errors.Forbidden:
        raise
    except UnsupportedStreamingList as exc:
        WATCH_STREAMING_LISTS.labels(w.label, "unsupported").inc()
        log.warning(
            "streaming list not supported by the server: listing with LIST",
            resource=w.label,
            error=str(exc),
        )
        w.streaming = False
        return
    except (errors.ApiError, errors.TransportError, errors.CredentialError) as exc:
        if isinstance(exc, errors.TransportError):
            w.gate.went_down(w)
        delay = backoff.next()
        if isinstance(exc, errors.ApiError) and exc.retry_after is not None:
            delay = min(exc.retry_after, client.max_retry_after)
        log.warning("list failed", resource=w.label, error=str(exc), retry_in=delay)
        if isinstance(sink, ListFailureSink):
            sink.list_failed(exc, delay)
        if isinstance(exc, errors.TransportError):
            await w.gate.pause(w, delay, spread, client.rng)
        else:
            await trio.sleep(delay)
        return
    WATCH_RESTARTS.labels(w.label, reason).inc()
    if w.rv is None and isinstance(sink, GapSink):
        sink.events_missing(reason)
    if reason in ("broken", "connect"):
        w.gate.went_down(w)
    if w.healthy:
        # The stream delivered events or bookmarks: the server was fine. After the routine
        # close at its timeoutSeconds, resume at once. After a break, resume within a random
        # part of the spread: an apiserver restart breaks every agent's watches at once.
        backoff.reset()
        if spread <= 0 or (reason == "closed" and trio.current_time() >= w.closes_from):
            await trio.lowlevel.checkpoint()
        else:
            await trio.sleep(client.rng.uniform(0, spread))
        return
    # Refused (403 while a restarted apiserver's authorizer warms up, 429, 5xx): every agent
    # refused in the same second would retry in the same second on the jittered backoff (its
    # lower half is never drawn), so draw from the whole step.
    refused = reason in ("forbidden", "http_error")
    delay = backoff.next_full() if refused else backoff.next()
    if w.retry_after is not None:
        delay = min(w.retry_after, client.max_retry_after)
    log.debug("watch restart", resource=w.label, reason=reason, retry_in=delay)
    if reason in ("broken", "connect"):
        await w.gate.pause(w, delay, spread, client.rng)
    else:
        await trio.sleep(delay)
