"""A model-based test of a query's status (issue 21 section 3): Hypothesis drives the real watch
loop, client, sink and accumulator against an in-process apiserver whose every answer is a rule:
lists and streaming lists answered or failing before the server answers (503, 429 with
Retry-After, connection refused, a failed exec credential), a streaming list cut before its end
bookmark, watches accepted or refused with 410 at connect, watch events, bookmarks, 410 ERROR
events, streams closed or broken, and time passing (backoffs, the notifier's pacing). A small
reference model follows only what the server did, and after every step:

- `.known` holds iff the last (re)list completed and no gap (a 410) is known since;
- the state and its text match the model's (`not synced`, `relisting`, `relist failed Nx, ...`);
- every transition to known wakes a consumer waiting in `changed()`, even when the relist found
  no difference, and once known its snapshot shows exactly the server's objects.

The loop runs in Trio in a thread of its own on a manual `MockClock`; each rule hands the server
its decision and waits until every task is blocked again, so a step's effects are complete when
the invariants are checked.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nodeagent.accumulator import Accumulator, AccumulatorSettings, ObjectMap, Query, QueryState
from nodeagent.kube import CONFIGMAPS, KubeClient, WatchOptions, errors
from nodeagent.kube.kubeconfig import ClusterConfig
from nodeagent.kube.watch import INITIAL_EVENTS_END

T = TypeVar("T")
INTERVAL = 0.01  # the notifier's pacing (max_interval)
NAMES = ("a", "b", "c")


def _line(type: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": type, "object": obj}).encode() + b"\n"


def _obj(name: str, rv: int) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": str(rv)}
    return {"metadata": meta}


def _bookmark(rv: int, end: bool = False) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return _line("BOOKMARK", {"kind": "ConfigMap", "metadata": meta})


def _status(code: int, reason: str, **headers: str) -> httpx.Response:
    body = {"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": ""}
    return httpx.Response(code, json=body, headers=headers)


EXPIRED = _line("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"})


@dataclass
class Pending:
    kind: str  # "list" (paged LIST), "stream" (a streaming list) or "watch" (resumed from an rv)
    answer: trio.MemorySendChannel[httpx.Response | Exception]


class _Closed:
    pass


CLOSE = _Closed()


class Server:
    """Holds each request until the test decides its answer; an accepted watch streams what the
    test sends into it."""

    def __init__(self) -> None:
        self.pending: Pending | None = None
        self.stream: trio.MemorySendChannel[bytes | Exception | _Closed] | None = None

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        kind = "list" if params.get("watch") != "true" else "watch"
        if params.get("sendInitialEvents") == "true":
            kind = "stream"
        send, receive = trio.open_memory_channel[httpx.Response | Exception](1)
        assert self.pending is None, "one request at a time"
        assert self.stream is None, "a request while a watch is open"
        self.pending = Pending(kind, send)
        try:
            answer = await receive.receive()
        finally:
            self.pending = None
        if isinstance(answer, Exception):
            raise answer
        return answer

    def open_stream(self, first: bytes = b"") -> httpx.Response:
        send, receive = trio.open_memory_channel[bytes | Exception | _Closed](100)
        self.stream = send
        if first:
            send.send_nowait(first)
        return httpx.Response(200, stream=_Body(self, send, receive))


class _Body(httpx.AsyncByteStream):
    """A watch body: what the test sends, until it closes it or the client does."""

    def __init__(
        self,
        server: Server,
        send: trio.MemorySendChannel[bytes | Exception | _Closed],
        receive: trio.MemoryReceiveChannel[bytes | Exception | _Closed],
    ) -> None:
        self.server, self.send, self.receive = server, send, receive

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for item in self.receive:
                if isinstance(item, _Closed):
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self._gone()

    async def aclose(self) -> None:
        self._gone()

    def _gone(self) -> None:
        if self.server.stream is self.send:
            self.server.stream = None


class Tokens:
    async def token(self) -> str:
        return "t"

    def invalidate(self) -> None:
        pass


@dataclass
class View:
    cms: ObjectMap[Any] = field(default_factory=ObjectMap)


class Harness:
    """The agent's side in a Trio run of its own thread: client, accumulator and a consumer."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.clock = trio.testing.MockClock()
        self.server = Server()
        self.wakes: list[bool] = []  # per changed() return: the query was known at that time
        self.view = View()
        self.acc: Accumulator | None = None
        self.error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)
        assert self._token is not None, self.error

    def _run(self, ready: threading.Event) -> None:
        try:
            trio.run(self._main, ready, clock=self.clock)
        except BaseException as exc:
            self.error = exc
            ready.set()

    async def _main(self, ready: threading.Event) -> None:
        options = WatchOptions(streaming_list=self.mode, backoff=(0.5, 30.0))  # type: ignore[arg-type]
        client = KubeClient(
            ClusterConfig(server="http://kube.test"),
            transport=httpx.MockTransport(self.server),
            watch=options,
            qps=1e6,
            burst=1_000_000,
            max_attempts=1,
            request_timeout=1e9,
            rng=random.Random(7),  # the backoff's jitter: the same steps, the same timing
        )
        client.tokens = Tokens()
        query: Query[Any] = Query("cms", "v1", CONFIGMAPS, namespace="ns")
        self.acc = acc = Accumulator(
            client, [query], AccumulatorSettings(max_interval=INTERVAL, thread_threshold=1 << 30)
        )
        self._stop = trio.Event()
        async with client, trio.open_nursery() as nursery:
            await nursery.start(acc.run)
            nursery.start_soon(self._consume, acc)
            self._token = trio.lowlevel.current_trio_token()
            ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    async def _consume(self, acc: Accumulator) -> None:
        while True:
            await acc.changed()
            acc.update(self.view)
            self.wakes.append(acc.status("cms").known)

    def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        if self.error is not None:
            raise AssertionError("the agent's Trio run ended") from self.error
        assert self._token is not None
        try:
            return trio.from_thread.run(fn, trio_token=self._token)
        except BaseException:
            self._thread.join(10)
            if self.error is not None:
                raise AssertionError("the agent's Trio run ended") from self.error
            raise

    def step(self, action: Callable[[], None] | None = None, advance: float = 0.0) -> None:
        """Runs ``action`` in Trio, lets time pass, and waits until every task is blocked."""

        async def go() -> None:
            await trio.testing.wait_all_tasks_blocked()
            if action is not None:
                action()
                await trio.testing.wait_all_tasks_blocked()
            if advance:
                self.clock.jump(advance)
                await trio.testing.wait_all_tasks_blocked()
            # A pacing wait or a backoff ending just now runs too.
            await trio.lowlevel.checkpoint()
            await trio.testing.wait_all_tasks_blocked()

        self.call(go)

    def stop(self) -> None:
        if self._token is not None and self.error is None and self._stop is not None:
            stop = self._stop
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(stop.set, trio_token=self._token)
        self._thread.join(10)


class WatchStatusMachine(RuleBasedStateMachine):
    mode = "off"

    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(self.mode)
        self.h.step()
        # The reference model: what the server did, and nothing of how the loop works.
        self.objects: dict[str, int] = {}
        self.rv = 10
        self.synced = False  # a list completed once
        self.gap = False  # events known missing since the last completed list
        self.failures = 0  # list attempts failed since the last completed list

    def teardown(self) -> None:
        self.h.stop()

    @property
    def known(self) -> bool:
        return self.synced and not self.gap

    def _pending(self, *kinds: str) -> bool:
        p = self.h.server.pending
        return p is not None and p.kind in kinds

    def _answer(self, answer: httpx.Response | Exception) -> None:
        p = self.h.server.pending
        assert p is not None
        p.answer.send_nowait(answer)

    def _list_completes(self, answer: Callable[[], httpx.Response]) -> None:
        """The server answers a (re)list in full: known again, and a consumer waiting in
        `changed()` must hear of it within the notifier's pacing."""
        was_known, wakes = self.known, len(self.h.wakes)
        self.h.step(lambda: self._answer(answer()), advance=INTERVAL)
        self.synced, self.gap, self.failures = True, False, 0
        if not was_known:
            assert len(self.h.wakes) > wakes, "not woken when the query became known"
            assert self.h.wakes[-1], "woken, but the query was not known"

    # -- lists ----------------------------------------------------------------------------

    @precondition(lambda self: self._pending("list"))
    @rule()
    def answer_list(self) -> None:
        items = [_obj(n, rv) for n, rv in sorted(self.objects.items())]
        body = {"metadata": {"resourceVersion": str(self.rv)}, "items": items}
        self._list_completes(lambda: httpx.Response(200, json=body))

    @precondition(lambda self: self._pending("stream"))
    @rule()
    def answer_streaming_list(self) -> None:
        initial = b"".join(_line("ADDED", _obj(n, rv)) for n, rv in sorted(self.objects.items()))
        first = initial + _bookmark(self.rv, end=True)
        self._list_completes(lambda: self.h.server.open_stream(first))

    @precondition(lambda self: self._pending("stream"))
    @rule(cut=st.booleans())
    def streaming_list_cut_short(self, cut: bool) -> None:
        # The stream closes (or breaks) before the end bookmark: a failed list.
        initial = b"".join(_line("ADDED", _obj(n, rv)) for n, rv in sorted(self.objects.items()))

        def act() -> None:
            self._answer(self.h.server.open_stream(initial))
            assert self.h.server.stream is not None
            self.h.server.stream.send_nowait(httpx.ReadError("reset") if cut else CLOSE)

        self.h.step(act)
        self.failures += 1

    # -- failures before the server answers -------------------------------------------------

    @precondition(lambda self: self.h.server.pending is not None)
    @rule(kind=st.sampled_from(["503", "429", "refused", "credential"]))
    def connect_fails(self, kind: str) -> None:
        answer: httpx.Response | Exception
        if kind == "503":
            answer = _status(503, "ServiceUnavailable")
        elif kind == "429":
            answer = _status(429, "TooManyRequests", **{"Retry-After": "1"})
        elif kind == "refused":
            answer = httpx.ConnectError("[Errno 111] Connection refused")
        else:
            answer = errors.CredentialError("exec plugin /bin/cred exited 1")
        listing = self._pending("list", "stream")
        self.h.step(lambda: self._answer(answer))
        if listing:
            self.failures += 1
        # A resumed watch that cannot connect is retried from its resourceVersion: no gap.

    @precondition(lambda self: self._pending("watch"))
    @rule()
    def watch_gone_at_connect(self) -> None:
        self.h.step(lambda: self._answer(_status(410, "Expired")))
        self.gap = True

    @precondition(lambda self: self._pending("watch"))
    @rule()
    def accept_watch(self) -> None:
        self.h.step(lambda: self._answer(self.h.server.open_stream()))

    # -- an open watch ----------------------------------------------------------------------

    def _send(self, item: bytes | Exception | _Closed) -> None:
        s = self.h.server.stream
        assert s is not None
        s.send_nowait(item)

    @precondition(lambda self: self.h.server.stream is not None)
    @rule(name=st.sampled_from(NAMES), delete=st.booleans())
    def watch_event(self, name: str, delete: bool) -> None:
        self.rv += 1
        if delete and name in self.objects:
            del self.objects[name]
            ev = _line("DELETED", _obj(name, self.rv))
        else:
            ev = _line("MODIFIED" if name in self.objects else "ADDED", _obj(name, self.rv))
            self.objects[name] = self.rv
        self.h.step(lambda: self._send(ev), advance=INTERVAL)

    @precondition(lambda self: self.h.server.stream is not None)
    @rule()
    def bookmark(self) -> None:
        self.rv += 1
        self.h.step(lambda: self._send(_bookmark(self.rv)))

    @precondition(lambda self: self.h.server.stream is not None)
    @rule()
    def gone_event(self) -> None:
        self.h.step(lambda: self._send(EXPIRED))
        self.gap = True

    @precondition(lambda self: self.h.server.stream is not None)
    @rule(broken=st.booleans())
    def stream_ends(self, broken: bool) -> None:
        # The server's timeout closes it, or the connection breaks: resumed, no gap.
        self.h.step(lambda: self._send(httpx.ReadError("reset") if broken else CLOSE))

    # -- time -------------------------------------------------------------------------------

    @rule(seconds=st.sampled_from([0.1, 1.0, 5.0, 40.0]))
    def time_passes(self, seconds: float) -> None:
        self.h.step(advance=seconds)

    # -- invariants -------------------------------------------------------------------------

    @invariant()
    def status_matches_the_model(self) -> None:
        acc = self.h.acc
        assert acc is not None
        st_ = acc.status("cms")
        assert st_.known == self.known, (st_, self.synced, self.gap)
        n = self.failures
        if not self.synced:
            assert st_.state is QueryState.SYNCING
            want = f"not synced (list failed {n}x, last: " if n else "not synced"
        elif self.gap:
            assert st_.state is QueryState.RELISTING
            want = f"relist failed {n}x, last: " if n else "relisting"
        else:
            assert st_.state is QueryState.SYNCED and st_.reason is None
            return
        assert st_.reason is not None
        assert st_.reason.startswith(want) if n else st_.reason == want, (st_.reason, want)

    @invariant()
    def a_known_snapshot_shows_the_servers_objects(self) -> None:
        if self.known:
            shown = {
                k.name: int(json.loads(raw)["metadata"]["resourceVersion"])
                for k, raw in self.h.view.cms.items_list()
            }
            assert shown == self.objects


_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class PagedMachine(WatchStatusMachine):
    mode = "off"


class StreamingMachine(WatchStatusMachine):
    mode = "on"


TestPagedListStatus = PagedMachine.TestCase
TestPagedListStatus.settings = _SETTINGS
TestStreamingListStatus = StreamingMachine.TestCase
TestStreamingListStatus.settings = _SETTINGS
