"""The accumulator: one coalescing, bootstrap-gated snapshot over several watched queries.

    acc = Accumulator(client, [Query("cms", "v1", "ConfigMap", namespace="ns", into=ConfigMap)])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(acc.run)
        snap = Snap()   # any object with one attribute per query name
        while True:
            await acc.changed()
            deltas: list[Delta[Any]] = []
            if acc.update(snap, deltas):
                ...  # snap.cms is an ObjectMap[ConfigMap]

Per query, the Rust store ingests the client's raw watch bytes and keeps the coalesced
"changed since the last update()" set; update() decodes only the objects that changed.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any, NoReturn, Protocol

import msgspec
import trio

from nodeagent.accumulator import metrics
from nodeagent.accumulator.model import Delta, Query, QueryState, QueryStatus
from nodeagent.accumulator.notifier import ChangeNotifier
from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.accumulator.sink import StoreSink
from nodeagent.accumulator.view import QueryView
from nodeagent.core.backoff import Backoff, Jitter
from nodeagent.kube import (
    Forbidden,
    KubeClient,
    KubeError,
    Resource,
    WatchRequest,
    WatchSink,
    WriteEvent,
    run_watch,
)
from nodeagent.log import get_logger

log = get_logger(__name__)


# First retry of a Forbidden relist of a query known before (then doubling, jittered, up to
# accumulator.forbidden_retry).
FORBIDDEN_RELIST_RETRY = 1.0

Watch = Callable[[WatchRequest, WatchSink], Awaitable[NoReturn]]
"""Lists then watches one request into a sink until cancelled: `nodeagent.kube.run_watch`
bound to a client (tests put a fake here)."""


# The watches serving a client (a `WatchHub` registers its own while it runs): what
# accumulators built without ``watch=`` watch through, so that the components of the agent,
# each building its own accumulators, share its watches without being handed them.
_served: weakref.WeakKeyDictionary[KubeClient, Watch] = weakref.WeakKeyDictionary()


@contextmanager
def serving(client: KubeClient, watch: Watch) -> Iterator[None]:
    """Accumulators over ``client`` built without ``watch=`` that start within the block
    watch through ``watch``."""
    _served[client] = watch
    try:
        yield
    finally:
        if _served.get(client) is watch:
            del _served[client]


class AccumulatorClient(Protocol):
    """The part of `nodeagent.kube.KubeClient` the accumulator uses besides its watches."""

    async def discover(self, api_version: str, kind: str) -> Resource: ...

    def observe_writes(self, fn: Callable[[WriteEvent], None]) -> AbstractContextManager[None]: ...


class QueryForbiddenError(Exception):
    """A query's list is Forbidden and `forbidden_fatal` is set."""


class _Field:
    def __init__(self, query: Query[Any], view: QueryView, sink: StoreSink) -> None:
        self.query = query
        self.view = view
        self.sink = sink
        self.resource: Resource | None = query.kind if isinstance(query.kind, Resource) else None
        self.problem: str | None = None  # why the kind cannot be resolved
        # update() has shown this query at least once (a consistent view exists to fall back on
        # while it relists).
        self.shown = False
        # The sink's completed lists as of the last update(): a list completed since then made
        # the query known again, which is news for the consumer even without object changes.
        self.lists_shown = 0

    def status(self) -> QueryStatus:
        name, sink = self.query.name, self.sink
        if sink.forbidden is not None:
            return QueryStatus(name, QueryState.FORBIDDEN, f"list forbidden: {sink.forbidden}")
        if self.problem is not None:
            return QueryStatus(name, QueryState.SYNCING, self.problem)
        failing = f"failed {sink.list_failures}x, last: {sink.list_error}"
        if not sink.synced:
            reason = f"not synced (list {failing})" if sink.list_error else "not synced"
            return QueryStatus(name, QueryState.SYNCING, reason)
        if sink.stale:
            reason = f"relist {failing}" if sink.list_error else "relisting"
            return QueryStatus(name, QueryState.RELISTING, reason)
        return QueryStatus(name, QueryState.SYNCED)

    def unready(self, now: float, bound: float) -> str | None:
        """The status reason if its consumer must not count as ready: at once for a query never
        listed, Forbidden or unresolved; for one known before that stopped being known (a
        relist under way or failing) only once that lasted longer than ``bound``, so that a
        brief control-plane restart does not flip readiness."""
        st = self.status()
        if st.state is QueryState.SYNCED:
            return None
        if st.state is QueryState.RELISTING:
            since = self.sink.unknown_since
            if since is None or now - since <= bound:
                return None
            return f"{st.reason} (not known for {now - since:.0f}s, bound {bound:g}s)"
        return st.reason

    def alarm(self) -> str | None:
        """The status reason if an operator must hear about it (a relist merely under way is
        not worth a readiness failure; one that failed is)."""
        st = self.status()
        if st.state is QueryState.SYNCED:
            return None
        if st.state is QueryState.RELISTING and self.sink.list_error is None:
            return None
        return st.reason


class Accumulator:
    """One consistent, coalesced snapshot over several watched queries, for one consumer.

    Owns, per query, a Rust `Store` (through its `QueryView`) fed by a `StoreSink` with the raw
    bytes of the query's list and watch (`run_watch`, or the injected ``watch``), and one
    `ChangeNotifier` for all queries. `run()` starts, in one nursery, the watch of every query
    (kind discovery first, retried with backoff; a Forbidden list is served as empty or, with
    `forbidden_fatal`, ends the run; a Forbidden relist of a query known before is retried
    first, keeping the last state, for up to `unknown_bound`), the notifier and the sweep
    that drops own writes the watch never confirmed; while it runs, writes made through the
    client are shown at once (read-your-writes). The consumer awaits `changed()` and calls
    `update()`, which decodes only what changed since its last call; nothing is shown before
    every query has listed.
    """

    def __init__(
        self,
        client: AccumulatorClient,
        queries: Sequence[Query[Any]],
        settings: AccumulatorSettings | None = None,
        *,
        watch: Watch | None = None,
    ) -> None:
        """``watch`` defaults to the watches of ``client``, which must then be a `KubeClient`:
        those of the `WatchHub` serving it when the accumulator starts (the agent's: one watch
        per request for the whole process), else `run_watch` through it."""
        self.settings = settings or AccumulatorSettings()
        self.settings.validate()
        if not queries:
            raise ValueError("an accumulator needs at least one query")
        names = [q.name for q in queries]
        if len(set(names)) != len(names):
            raise ValueError(f"query names must be unique: {names}")
        if watch is None and not isinstance(client, KubeClient):
            raise TypeError(f"{type(client).__name__} is not a KubeClient: pass watch=")
        self._client = client
        self._watch_given = watch
        self._notifier = ChangeNotifier(self.settings.max_interval, self._offer_ready)
        self._fields: list[_Field] = []
        for q in queries:
            view = QueryView(q)
            sink = StoreSink(
                q.name, view.store, self._notifier.poke, self.settings.thread_threshold
            )
            self._fields.append(_Field(q, view, sink))
            metrics.SYNCED.labels(q.name).set(0)
            metrics.FORBIDDEN.labels(q.name).set(0)
        self._first_update = True

    # -- state --------------------------------------------------------------------------

    @property
    def bootstrapped(self) -> bool:
        """Every query has completed its initial list (and, if it relists before the first
        `update()`, that relist too: the first snapshot is consistent for every query)."""
        return all(f.sink.synced and (f.shown or not f.sink.listing) for f in self._fields)

    def status(self, query: str) -> QueryStatus:
        """The state of one query (by name): whether its snapshot can be trusted, and if not
        why. KeyError for an unknown name."""
        for f in self._fields:
            if f.query.name == query:
                return f.status()
        raise KeyError(f"no query named {query!r}")

    def statuses(self) -> dict[str, QueryStatus]:
        """Every query's state, by name."""
        return {f.query.name: f.status() for f in self._fields}

    def problems(self) -> dict[str, str]:
        """Queries whose state an operator should hear about, with the reason: not synced yet,
        Forbidden, kind not resolved, or a relist that failed (a relist merely under way is
        not a problem, but its query is not `known` either)."""
        return {f.query.name: why for f in self._fields if (why := f.alarm()) is not None}

    def not_ready_reason(self) -> str | None:
        """Why the snapshot is not (fully) trustworthy, for readiness; None when it is."""
        return "; ".join(f"{name}: {why}" for name, why in self.problems().items()) or None

    def unready_reason(self) -> str | None:
        """Why the consumer must not count as ready (None: it may): a query never listed,
        Forbidden or unresolved at once; a watch that cannot be kept (a query known before
        and not since, relisting or failing to) only after `unknown_bound` seconds."""
        now, bound = trio.current_time(), self.settings.unknown_bound
        reasons = [f"{f.query.name}: {why}" for f in self._fields if (why := f.unready(now, bound))]
        return "; ".join(reasons) or None

    def _pending(self) -> bool:
        """update() has something to show: a query that is not relisting has changes (a
        relisting one is held back until its relist completes, without holding the others), or
        has become known again since the last update() (a consumer that held back because it
        was not known must be woken even when the relist changed no object)."""
        return self._first_update or any(
            f.view.store.pending() or f.sink.lists_completed != f.lists_shown
            for f in self._fields
            if not f.sink.listing
        )

    def _offer_ready(self) -> bool:
        return self.bootstrapped and self._pending()

    # -- consumer API -------------------------------------------------------------------

    async def changed(self) -> None:
        """Returns when `update()` has something new (level-triggered: one return covers every
        change since the last update)."""
        await self._notifier.wait()

    def update(self, target: object, deltas: list[Delta[Any]] | None = None) -> bool:
        """Sets one attribute of ``target`` per query (an `ObjectMap`) and, if given, fills
        ``deltas`` with the coalesced changes since the last call. Returns whether anything
        changed: an object, or a query that became known again (a relist completed, also one
        that changed no object: ``deltas`` then stays empty); the first call after bootstrap
        always returns True. Before bootstrap it
        returns False and leaves ``target`` alone."""
        if deltas is not None:
            deltas.clear()
        if not self.bootstrapped:
            return False
        for f in self._fields:
            if not _declares(target, f.query.name):
                raise AttributeError(
                    f"snapshot {type(target).__name__} has no field {f.query.name!r}"
                )
        t0 = time.perf_counter()
        changed = self._first_update
        for f in self._fields:
            if f.sink.listing:
                # A relist is half-applied (adds before deletes): keep the last consistent view.
                continue
            got = f.view.drain()
            f.shown = True
            if f.lists_shown != f.sink.lists_completed:
                # Known again (a relist completed), even if it changed no object: news for a
                # consumer that held back while the query was not known.
                f.lists_shown = f.sink.lists_completed
                changed = True
            if got:
                changed = True
                if deltas is not None:
                    deltas.extend(got)
        for f in self._fields:
            setattr(target, f.query.name, f.view.view)
        self._first_update = False
        if not self._pending():
            self._notifier.clear()
        metrics.UPDATE_SECONDS.observe(time.perf_counter() - t0)
        return changed

    # -- running ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Runs every query's watch until cancelled. Raises `QueryForbiddenError` when a list
        is Forbidden and `forbidden_fatal` is set. Own writes through the client are seen
        while it runs (read-your-writes)."""
        with self._client.observe_writes(self._on_write):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._notifier.run)
                nursery.start_soon(self._expire_loop)
                for f in self._fields:
                    nursery.start_soon(self._watch, f)
                task_status.started()

    async def _resolve(self, f: _Field) -> Resource:
        backoff = Backoff(1.0, 30.0)
        while f.resource is None:
            assert isinstance(f.query.kind, str)
            try:
                f.resource = await self._client.discover(f.query.api_version, f.query.kind)
            except (KubeError, OSError) as exc:
                f.problem = f"discovery failed: {exc}"
                delay = backoff.next()
                log.warning(
                    "cannot resolve query kind: retrying",
                    query=f.query.name,
                    api_version=f.query.api_version,
                    kind=f.query.kind,
                    error=str(exc),
                    retry_in=delay,
                )
                await trio.sleep(delay)
        f.problem = None
        return f.resource

    def _watch_one(self, request: WatchRequest, sink: WatchSink) -> Awaitable[NoReturn]:
        watch = self._watch_given
        if watch is None:
            assert isinstance(self._client, KubeClient)
            watch = _served.get(self._client) or partial(run_watch, self._client)
        return watch(request, sink)

    async def _watch(self, f: _Field) -> None:
        resource = await self._resolve(f)
        q = f.query
        namespace = q.namespace if resource.namespaced else None
        request = WatchRequest(resource, namespace, q.label_selector, q.field_selector)
        # Retries of a Forbidden relist of a query known before, jittered: the fleet's agents
        # all relist when a restarted apiserver is back, and must not retry in step.
        transient = Backoff(
            FORBIDDEN_RELIST_RETRY,
            max(FORBIDDEN_RELIST_RETRY, self.settings.forbidden_retry),
            jitter=Jitter.below(0.5),
        )
        while True:
            try:
                await self._watch_one(request, f.sink)
            except Forbidden as exc:
                if f.sink.unknown_since is None:
                    transient.reset()  # known until now: a new streak
                if self._forbidden_may_pass(f):
                    # Known before: most likely an apiserver just (re)started, whose authorizer
                    # refuses until its caches are synced (issue 24 s5: served as empty, 39 of
                    # 100 agents went not ready and waited forbidden_retry). The last good
                    # state is kept (not known: nothing acts on absences) and the list retried
                    # soon; RBAC really revoked is served as empty once the query has not been
                    # known for unknown_bound.
                    delay = transient.next()
                    f.sink.events_missing("forbidden")
                    f.sink.list_failed(exc, delay)
                    log.warning(
                        "relist forbidden: keeping the last state, retrying",
                        query=q.name,
                        resource=resource.plural,
                        error=str(exc),
                        retry_in=delay,
                    )
                    await trio.sleep(delay)
                    continue
                log.error(
                    "query list forbidden: served as empty",
                    query=q.name,
                    resource=resource.plural,
                    namespace=namespace,
                    error=str(exc),
                    fatal=self.settings.forbidden_fatal,
                    retry_in=self.settings.forbidden_retry,
                )
                if self.settings.forbidden_fatal:
                    raise QueryForbiddenError(f"query {q.name}: {exc}") from exc
                # Forbidden stays the query's state until a list succeeds again.
                f.sink.serve_forbidden(exc.message or str(exc))
                await trio.sleep(self.settings.forbidden_retry)

    def _forbidden_may_pass(self, f: _Field) -> bool:
        """A Forbidden list of ``f`` is taken for transient: the query was listed (not served
        as Forbidden) and has not been unknown for longer than `unknown_bound`."""
        sink = f.sink
        if not sink.synced or sink.forbidden is not None:
            return False
        since = sink.unknown_since
        return since is None or trio.current_time() - since <= self.settings.unknown_bound

    async def _expire_loop(self) -> None:
        period = self.settings.local_write_ttl / 4
        while True:
            await trio.sleep(period)
            now = trio.current_time()
            for f in self._fields:
                n = f.view.store.expire(now)
                if n:
                    metrics.LOCAL_EXPIRED.labels(f.query.name).inc(n)
                    log.warning(
                        "own writes never confirmed by the watch: dropped",
                        query=f.query.name,
                        count=n,
                    )
                    self._notifier.poke()

    # -- read-your-writes ---------------------------------------------------------------

    def _on_write(self, ev: WriteEvent) -> None:
        doc: dict[str, Any] | None = None
        try:
            now = trio.current_time()
        except RuntimeError:
            now = -math.inf  # outside Trio: nothing to order against, expire on the next sweep
        deadline = now + self.settings.local_write_ttl
        for f in self._fields:
            r = f.resource
            if r is None or (r.group, r.plural) != (ev.resource.group, ev.resource.plural):
                continue
            if f.sink.forbidden is not None:
                continue  # served as empty until the list works again
            q = f.query
            ns = ev.namespace or ""
            if q.namespace is not None and r.namespaced and ns != q.namespace:
                continue
            if ev.obj is None:
                changed = f.view.store.delete_local(ns, ev.name, deadline)
            else:
                if doc is None:
                    try:
                        doc = msgspec.json.decode(ev.obj)
                    except msgspec.DecodeError as exc:
                        metrics.MALFORMED.labels(q.name, "local_write").inc()
                        log.error("own write result is not JSON", query=q.name, error=str(exc))
                        return
                if self._selects(q, doc):
                    try:
                        changed = f.view.store.apply_local(ev.obj, deadline)
                    except ValueError as exc:
                        metrics.MALFORMED.labels(q.name, "local_write").inc()
                        log.error("own write result rejected", query=q.name, error=str(exc))
                        continue
                else:
                    # The write took the object out of this query's selection.
                    changed = f.view.store.delete_local(ns, ev.name, deadline)
            if changed:
                metrics.LOCAL_WRITES.labels(q.name).inc()
                self._notifier.poke()

    @staticmethod
    def _selects(q: Query[Any], doc: Any) -> bool:
        if not isinstance(doc, dict):
            return False
        meta = doc.get("metadata")
        labels = meta.get("labels") if isinstance(meta, dict) else None
        return q.labels.matches(labels if isinstance(labels, dict) else {}) and q.fields.matches(
            doc
        )


def _declares(target: object, name: str) -> bool:
    """The snapshot object has a field for ``name``: an attribute, a slot, or a bare annotation
    (``class View: cms: ObjectMap[ConfigMap]``), so a misspelt query name fails loudly."""
    if hasattr(target, name):
        return True
    return any(
        name in vars(k) or name in vars(k).get("__annotations__", {}) for k in type(target).__mro__
    )
