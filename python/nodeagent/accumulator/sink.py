"""The `WatchSink` of one query: hands the client's raw bytes to the Rust store and reports
what the store rejected. Large inputs are parsed in a worker thread (the store releases the
GIL), small ones inline, where a thread hop would cost more than the parse."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import trio

from nodeagent._native import Store
from nodeagent.accumulator import metrics
from nodeagent.kube import FeedResult, WatchError
from nodeagent.log import get_logger

log = get_logger(__name__)

R = TypeVar("R")


class StoreSink:
    def __init__(
        self, query: str, store: Store, on_change: Callable[[], None], thread_threshold: int
    ) -> None:
        self.query = query
        self.store = store
        self.on_change = on_change
        self.thread_threshold = thread_threshold
        # True from begin_list until end_list: the store may hold a half-applied relist.
        self.listing = False
        # The first list has completed (or was Forbidden and counts as empty).
        self.synced = False
        self.relists = 0
        # Why the current (re)list keeps failing, and how often it has; reset by a complete list.
        self.list_error: str | None = None
        self.list_failures = 0
        # The list was Forbidden (the error's message): the store is kept empty until a list
        # completes again.
        self.forbidden: str | None = None
        # Events are known to be missing (a 410, an undecodable watch body, a watch Forbidden
        # until it relists): what the store holds is stale until the next list completes, also
        # while that list waits out its backoff or cannot connect (the watch loop's reason).
        self.gap: str | None = None
        # Lists completed: each one makes the query known again, which the consumer must hear
        # of even when the list changed no object.
        self.lists_completed = 0
        # When the query, known before, stopped being known (Trio time; None: known, or never
        # listed): readiness gives a relist a bound before it counts as a watch not kept.
        self.unknown_since: float | None = None
        # A streaming list (initial watch events instead of List pages) had a malformed event:
        # an object held might be the one we could not read, so the relist deletes nothing.
        self.initial_malformed = False

    async def _run(self, fn: Callable[[bytes], R], data: bytes) -> R:
        if len(data) >= self.thread_threshold:
            return await trio.to_thread.run_sync(fn, data)
        return fn(data)

    async def begin_list(self) -> None:
        self.store.begin_list()
        self._lost()
        self.listing = True
        self.initial_malformed = False

    async def list_page(self, page: bytes) -> None:
        try:
            _items, malformed = await self._run(self.store.list_page, page)
        except ValueError as exc:
            metrics.MALFORMED.labels(self.query, "list_page").inc()
            log.error(
                "malformed list page: nothing will be deleted by this relist",
                query=self.query,
                error=str(exc),
            )
            return
        for msg in malformed:
            metrics.MALFORMED.labels(self.query, "list_item").inc()
            log.error("malformed list item skipped", query=self.query, error=msg)

    async def end_list(self, resource_version: str) -> None:
        if self.initial_malformed:
            gone = 0
            log.error(
                "malformed initial event: nothing will be deleted by this relist", query=self.query
            )
        else:
            gone = self.store.end_list(resource_version)
        self.listing = False
        if self.synced:
            self.relists += 1
            log.info("relist complete", query=self.query, vanished=gone)
        if self.list_failures:
            log.info("list recovered", query=self.query, failures=self.list_failures)
        self.list_error = None
        self.list_failures = 0
        self.gap = None
        self.unknown_since = None
        self.lists_completed += 1
        if self.forbidden is not None:
            self.forbidden = None
            metrics.FORBIDDEN.labels(self.query).set(0)
        self.mark_synced()

    @property
    def stale(self) -> bool:
        """Events are known to be missing: a relist is under way, waiting or failing."""
        return self.listing or self.gap is not None

    def events_missing(self, reason: str) -> None:
        """The watch loop lost events (``reason``: why the watch ended) and will relist."""
        if self.gap is None:
            log.info("events missing: relisting", query=self.query, reason=reason)
        self._lost()
        self.gap = reason

    def _lost(self) -> None:
        if self.synced and self.unknown_since is None and not self.stale:
            self.unknown_since = trio.current_time()

    def list_failed(self, error: Exception, retry_in: float) -> None:
        """The watch loop's (re)list failed and will be retried in ``retry_in`` seconds."""
        self.list_failures += 1
        self.list_error = str(error) or type(error).__name__
        metrics.LIST_FAILURES.labels(self.query).inc()

    def serve_forbidden(self, message: str) -> None:
        """The list is Forbidden: whatever the store held (a good list from before RBAC was
        revoked, own writes) is no longer known to exist, so the query is served as empty."""
        if self.forbidden is None:
            metrics.FORBIDDEN.labels(self.query).set(1)
        self.forbidden = message
        self.list_error = None
        self.list_failures = 0
        self.gap = None
        self.store.begin_list()
        self.store.end_list("")  # nothing listed: every watched object goes
        self.store.expire(math.inf)  # and every own write not yet confirmed
        self.mark_synced()

    def mark_synced(self) -> None:
        self.listing = False
        if not self.synced:
            self.synced = True
            metrics.SYNCED.labels(self.query).set(1)
        self.on_change()

    async def feed(self, chunk: bytes) -> FeedResult:
        got = await self._run(self.store.feed, chunk)
        if got.malformed and self.listing:
            self.initial_malformed = True
        for msg in got.malformed:
            metrics.MALFORMED.labels(self.query, "event").inc()
            log.error("malformed watch event skipped", query=self.query, error=msg)
        if got.events and self.store.pending():
            self.on_change()
        error = got.error
        return FeedResult(
            resource_version=got.resource_version,
            error=None if error is None else WatchError(error.code, error.reason, error.message),
            events=got.events,
        )

    async def end_stream(self) -> None:
        self.store.end_stream()
