"""List-then-watch with informer-grade semantics, generic over a sink that takes raw bytes.

The loop lists (paged), then watches from the list's resourceVersion with bookmarks, a
jittered server timeout and a client inactivity timeout. A watch that ends or breaks resumes
from the newest resourceVersion seen; only a 410 (at watch start or as an ERROR event) or a
Forbidden watch (its relist tells whether access was revoked) relists, and then the sink reports
the difference. The loop never parses an event itself: the sink's `FeedResult` tells it the
newest resourceVersion and any ERROR event.

`run_watch(client, WatchRequest(...), sink)` is the one way to watch: the request says what,
the client's `WatchOptions` say how.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, Protocol, runtime_checkable

import httpx
import trio

from nodeagent.core.backoff import Backoff, Jitter
from nodeagent.kube import errors
from nodeagent.kube.client import KubeClient, selector_params
from nodeagent.kube.metrics import WATCH_EVENTS, WATCH_RELISTS, WATCH_RESTARTS
from nodeagent.kube.resource import Resource
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
        """Raw watch body bytes: newline-delimited JSON events, split anywhere across chunks."""

    async def end_stream(self) -> None:
        """The watch connection ended: drop a partial line."""


@runtime_checkable
class ListFailureSink(Protocol):
    """Optional: a sink that also wants to know why a (re)list failed (e.g. for readiness).
    Every other failure is retried by the loop and only logged."""

    def list_failed(self, error: Exception, retry_in: float) -> None:
        """The list since the last `begin_list` failed; it is retried in ``retry_in`` s."""


class _Watch:
    def __init__(self, client: KubeClient, request: WatchRequest, sink: WatchSink) -> None:
        self.client = client
        self.options = client.watch_options
        self.request = request
        self.sink = sink
        self.label = request.resource.plural
        self.rv: str | None = None
        self.healthy = False
        self.retry_after: float | None = None

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
            await self.sink.list_page(page.body)
            rv = page.resource_version
        if not rv:
            # Watching from "" would mean "from any point": events could be lost.
            raise errors.BadResponse(f"list {self.label}: no resourceVersion")
        await self.sink.end_list(rv)
        return rv

    async def stream_once(self, rv: str) -> str:
        """One watch connection from ``rv``; returns why it ended (the metric's reason)."""
        self.healthy = False
        self.retry_after = None
        lo, hi = self.options.server_timeout
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": rv,
            # Jittered so that many watches opened together do not all reconnect together.
            "timeoutSeconds": str(max(1, round(self.client.rng.uniform(lo, hi)))),
            **selector_params(self.request.label_selector, self.request.field_selector),
        }
        try:
            async with self.client.stream(
                self.request.resource.path(self.request.namespace),
                params,
                read_timeout=self.options.inactivity_timeout,
                resource=self.label,
            ) as resp:
                try:
                    async for chunk in resp.aiter_bytes():
                        result = await self.sink.feed(chunk)
                        if result.events:
                            WATCH_EVENTS.labels(self.label).inc(result.events)
                            self.healthy = True
                        if result.resource_version:
                            self.rv = result.resource_version
                        if result.error is not None:
                            return self._on_error_event(result.error)
                finally:
                    await self.sink.end_stream()
            return "closed"
        except httpx.ReadTimeout:
            log.warning(
                "watch inactive: reconnecting",
                resource=self.label,
                timeout=self.options.inactivity_timeout,
            )
            return "inactivity"
        except httpx.TransportError as exc:
            log.info("watch stream broken", resource=self.label, error=str(exc))
            return "broken"
        except errors.Gone:
            self.rv = None
            return "gone"
        except errors.Forbidden as exc:
            # Access was revoked since the list (a watch is authorized when it opens): what the
            # sink holds can no longer be kept up to date. Relist: the list either works again
            # or raises Forbidden to the caller, which decides what a Forbidden resource means.
            log.warning("watch forbidden: relisting", resource=self.label, error=str(exc))
            self.rv = None
            return "forbidden"
        except errors.ApiError as exc:
            log.warning("watch request failed", resource=self.label, error=str(exc))
            self.retry_after = exc.retry_after
            return "http_error"
        except (errors.TransportError, errors.CredentialError) as exc:
            log.warning("watch connect failed", resource=self.label, error=str(exc))
            return "connect"

    def _on_error_event(self, err: WatchError) -> str:
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
    w = _Watch(client, request, sink)
    backoff = Backoff(
        *client.watch_options.backoff, jitter=Jitter.below(0.5), random=client.rng.random
    )
    synced = False
    while True:
        if w.rv is None:
            try:
                w.rv = await w.relist()
            except errors.Forbidden:
                raise
            except (errors.ApiError, errors.TransportError, errors.CredentialError) as exc:
                delay = backoff.next()
                if isinstance(exc, errors.ApiError) and exc.retry_after is not None:
                    delay = min(exc.retry_after, client.max_retry_after)
                log.warning("list failed", resource=w.label, error=str(exc), retry_in=delay)
                if isinstance(sink, ListFailureSink):
                    sink.list_failed(exc, delay)
                await trio.sleep(delay)
                continue
            if not synced:
                synced = True
                if on_synced is not None:
                    on_synced()
        reason = await w.stream_once(w.rv)
        WATCH_RESTARTS.labels(w.label, reason).inc()
        if w.healthy:
            # The stream delivered events or bookmarks: the server is fine, resume at once.
            backoff.reset()
            await trio.lowlevel.checkpoint()
            continue
        delay = backoff.next()
        if w.retry_after is not None:
            delay = min(w.retry_after, client.max_retry_after)
        log.debug("watch restart", resource=w.label, reason=reason, retry_in=delay)
        await trio.sleep(delay)
