"""The Trio-facing gRPC bridge: grpclib (asyncio-only) on one asyncio loop in a thread of its own.

The service opens the bridge once at the root of the process's task tree
(``async with open_grpc_bridge() as bridge:``) and passes it down. Everything else talks to gRPC
through this module's small API, so no asyncio object or grpclib exception reaches Trio code:

- `GrpcBridge.channel(path)` opens a client channel on a unix socket (closed on exit), optionally
  checking every connection it makes (`check`: e.g. the peer's credentials) before use;
- `GrpcBridge.connect(channel, within=...)` dials a channel now, bounded (otherwise the first
  call dials);
- `GrpcBridge.unary(method, request, timeout=...)` makes a unary call with a deadline that both
  sides see (grpclib's ``timeout=`` sends ``grpc-timeout``; a Trio deadline backs it up);
- `GrpcBridge.server_stream(method, request)` opens a server-streaming call, yielding a Trio
  async iterator of replies;
- `GrpcBridge.serve(handlers, path)` serves grpclib handlers on a unix socket;
- `run_in_trio(fn, *args)`, awaited by asyncio code on the bridge loop (a grpclib handler),
  runs `fn` in Trio (in a task of the bridge's nursery when it is async) and returns its result.

Every failure surfaces as `RpcError` (with the gRPC status name) or one of its subclasses, an
`asyncio.CancelledError` of the asyncio side included.

How: the loop runs in a dedicated thread, started on the bridge's first call (a node with no
plugins never imports asyncio or grpclib) and stopped when the bridge closes. Each hop is one
callback posted to the other side (`loop.call_soon_threadsafe` one way,
`TrioToken.run_sync_soon` the other); a server stream is pumped by one asyncio task into a
small buffer that the Trio side drains, with one wake-up per batch rather than per message.
Every asyncio task the bridge starts belongs to a Trio caller, which cancels it and waits for it
(bounded by `_CLOSE_TIMEOUT`) when it leaves: nothing on the asyncio side outlives its Trio
owner. Why a thread (and not trio-asyncio or a guest run): docs/architecture/index.md, "The gRPC
bridge".
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import os
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, cast, overload

import outcome
import trio

from nodeagent.rpc.errors import (
    ConnectCheck,
    MalformedMessage,
    MessageRejected,
    MessageTooLarge,
    RpcError,
)

if TYPE_CHECKING:
    # Bound at run time by `_import_asyncio`, when a bridge first starts its loop: everything
    # below that touches asyncio runs on that loop or after it started.
    import asyncio

    from google.protobuf.message import Message
    from grpclib.client import Channel, UnaryStreamMethod, UnaryUnaryMethod

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "ConnectCheck",
    "GrpcBridge",
    "GrpcChannel",
    "MalformedMessage",
    "MessageRejected",
    "MessageTooLarge",
    "RpcError",
    "ServerStream",
    "open_grpc_bridge",
    "run_in_trio",
]

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# The Trio deadline is a backstop for a peer or connection that ignores grpc-timeout; the margin
# lets grpclib's own DEADLINE_EXCEEDED (with the peer informed) win the race in the normal case.
_TRIO_DEADLINE_MARGIN = 0.25
# Closing a stream or server must not hang shutdown on a wedged peer.
_CLOSE_TIMEOUT = 5.0
# A stream's pump stops reading (and so HTTP/2 flow control pushes back on the plugin) once this
# many replies wait for the Trio consumer, and reads on when it has taken half of them.
_STREAM_BUFFER = 16

P = ParamSpec("P")
T = TypeVar("T")
Req = TypeVar("Req", bound="Message")
Rep = TypeVar("Rep", bound="Message")


def _import_asyncio() -> None:
    # Lazily, with grpclib: asyncio (with concurrent.futures) is ~1.5 MiB an idle node never uses.
    global asyncio
    import asyncio


def _grpc_module() -> Any:
    # Lazily: an idle node with no plugins never loads grpclib, h2, hpack, multidict.
    from nodeagent.rpc import _grpc

    return _grpc


class _Stub(Protocol):
    def __init__(self, channel: Channel) -> None: ...


StubT = TypeVar("StubT", bound=_Stub)


class GrpcChannel:
    """A client channel on one unix socket: one multiplexed HTTP/2 connection, opened lazily."""

    def __init__(self, channel: Channel, path: str) -> None:
        self._channel = channel
        self.path = path

    def stub(self, stub_type: type[StubT]) -> StubT:
        """A generated grpclib stub (e.g. ``RegistrationStub``) bound to this channel."""
        return stub_type(self._channel)


_END = object()


class _Inbox:
    """Replies handed from the pump (asyncio thread) to the consumer (Trio thread).

    The consumer, when it finds the buffer empty, parks on an eventfd of its own, which the pump
    writes once per batch (only when the consumer is parked and no wake-up is on its way). Trio's
    I/O wait then schedules the consumer itself: no callback through Trio's entry queue and no
    second scheduling round (`TrioToken.run_sync_soon` + an Event would take two), which is a
    paced message's latency. The lock guards the hand-over flags and the descriptor's life.
    """

    def __init__(self, bridge: GrpcBridge) -> None:
        self._bridge = bridge
        self._lock = threading.Lock()
        self._items: collections.deque[Any] = collections.deque()
        self._parked = False
        self._wake_posted = False
        self._room: asyncio.Future[None] | None = None
        self._fd: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    # -- asyncio side
    def push(self, item: Any, *, last: bool = False) -> asyncio.Future[None] | None:
        """Queue `item`; returns a future to await before reading more when the buffer is full
        (never for the `last` item: nothing reads after it)."""
        with self._lock:
            self._items.append(item)
            if self._parked and not self._wake_posted and self._fd is not None:
                self._wake_posted = True
                # Under the lock: the consumer cannot close the descriptor meanwhile.
                os.eventfd_write(self._fd, 1)
            room = None
            if not last and len(self._items) >= _STREAM_BUFFER:
                room = self._room = asyncio.get_running_loop().create_future()
        return room

    # -- Trio side
    async def get(self) -> Any:
        while True:
            with self._lock:
                if self._items:
                    item = self._items.popleft()
                    room = None
                    if self._room is not None and len(self._items) <= _STREAM_BUFFER // 2:
                        room, self._room = self._room, None
                    break
                fd = self._fd
                if fd is None:
                    raise RpcError("CANCELLED", "the stream is closed")
                self._parked = True
            try:
                await trio.lowlevel.wait_readable(fd)
            finally:
                with self._lock:
                    self._parked = False
                    self._wake_posted = False
                    # Always drained: a write that lands after this (posted before the wake-up
                    # was taken) costs one more empty round, never a busy loop.
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(fd)
        if room is not None:
            self._bridge._to_loop(_resolve, room)
        return item

    def close(self) -> None:
        """Release the descriptor (Trio side, once the pump is stopped or given up on)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            trio.lowlevel.notify_closing(fd)
            os.close(fd)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ServerStream(Generic[Rep]):
    """The replies of a server-streaming call, as a Trio async iterator."""

    def __init__(self, inbox: _Inbox) -> None:
        self._inbox = inbox
        self._failed: RpcError | None = None
        self._ended = False

    def __aiter__(self) -> ServerStream[Rep]:
        return self

    def buffered(self) -> int:
        """Replies already received and readable without waiting (a snapshot: more may come)."""
        return len(self._inbox._items)

    async def __anext__(self) -> Rep:
        if self._ended:
            raise StopAsyncIteration
        if self._failed is not None:
            # A new exception each time: re-raising one object would chain its tracebacks.
            raise RpcError(self._failed.status, self._failed.message)
        item = await self._inbox.get()
        if item is _END:
            self._ended = True
            raise StopAsyncIteration
        if isinstance(item, RpcError):
            if not isinstance(item, MessageRejected):
                self._failed = item  # the call is over
            raise item
        return cast(Rep, item)


class _Call(Generic[T]):
    """One asyncio task run for a Trio caller: started, cancelled and reported through hops."""

    __slots__ = ("done", "result", "task")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.task: asyncio.Task[T] | None = None
        self.result: outcome.Outcome[T] | None = None


class GrpcBridge:
    """Runs grpclib on the bridge's asyncio loop (its own thread). Open with `open_grpc_bridge`."""

    def __init__(self, token: trio.lowlevel.TrioToken, nursery: trio.Nursery) -> None:
        self._token = token
        self._nursery = nursery
        # The loop and its thread start on the first call (`_started`): a node with no plugins
        # never imports asyncio or grpclib, nor runs a second thread.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped = trio.Event()
        self._closed = False

    def _started(self) -> asyncio.AbstractEventLoop:
        """The bridge's loop, started (with its thread) on first use. Trio thread only."""
        if self._loop is not None:
            return self._loop
        if self._closed:
            raise RpcError("UNAVAILABLE", "the gRPC bridge is closed")
        _import_asyncio()
        loop = asyncio.new_event_loop()
        token = self._token
        stopped = self._stopped
        self._thread = threading.Thread(
            target=_run_loop,
            args=(loop, lambda: token.run_sync_soon(stopped.set)),
            name="nodeagent-grpc",
            daemon=True,  # a wedged peer must not keep the process alive
        )
        self._loop = loop
        _BRIDGES[loop] = self
        self._thread.start()
        return loop

    async def _close(self) -> None:
        """Stop the loop (what is left on it cancelled) and join its thread, if it started."""
        self._closed = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with trio.CancelScope(shield=True):
            with contextlib.suppress(RuntimeError):  # the loop already stopped (it never should)
                loop.call_soon_threadsafe(_start_shutdown, loop)
            with trio.move_on_after(2 * _CLOSE_TIMEOUT):
                await self._stopped.wait()
            if self._stopped.is_set():
                thread.join()

    def _inbox(self) -> _Inbox:
        """A new stream's hand-over buffer (a bench's prototype bridge swaps its wake-up)."""
        return _Inbox(self)

    # -- the two hops (the loop is started: every call enters through `run_asyncio`)
    def _to_loop(self, fn: Callable[..., object], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)

    def _to_trio(self, fn: Callable[..., object], *args: Any) -> None:
        self._token.run_sync_soon(fn, *args)

    async def run_asyncio(
        self, fn: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Await the coroutine function `fn` on the bridge loop, as a task owned by the caller: a
        Trio cancellation cancels it and waits for it. Every failure is an RpcError."""
        loop = self._started()
        call: _Call[T] = _Call()

        def finish(task: asyncio.Task[T]) -> None:  # Trio thread
            if task.cancelled():
                call.result = outcome.Error(
                    RpcError("CANCELLED", "call cancelled on the gRPC side")
                )
            else:
                exc = task.exception()
                call.result = outcome.Value(task.result()) if exc is None else outcome.Error(exc)
            call.done.set()

        def start() -> None:  # asyncio thread
            try:
                task = loop.create_task(fn(*args, **kwargs))
            except BaseException as exc:
                call.result = outcome.Error(exc)
                self._to_trio(call.done.set)
                return
            call.task = task
            task.add_done_callback(lambda done: self._to_trio(finish, done))

        self._to_loop(start)
        try:
            await call.done.wait()
        except BaseException:
            # Cancelled (or interrupted): the asyncio side is cancelled and waited for, so it
            # never outlives the caller; a wedged peer is given up on after _CLOSE_TIMEOUT.
            self._to_loop(_cancel_call, call)
            with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                await call.done.wait()
            raise
        assert call.result is not None
        try:
            return call.result.unwrap()
        except RpcError:
            raise
        except BaseException as exc:
            raise _grpc_module().to_rpc_error(exc) from exc

    _call = run_asyncio

    @asynccontextmanager
    async def channel(
        self,
        path: str,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        check: ConnectCheck | None = None,
    ) -> AsyncIterator[GrpcChannel]:
        """A channel to the gRPC server on unix socket `path`, closed when the block exits.
        With `check`, every connection is checked before use (a refusal fails the call)."""
        grpc = _grpc_module()

        async def create() -> Channel:
            # Inside the loop: grpclib's Channel captures the running loop.
            codec = grpc.LimitedProtoCodec(max_message_bytes)
            if check is not None:
                return cast("Channel", grpc.CheckedChannel(path=path, codec=codec, check=check))
            return cast("Channel", grpc.LimitedChannel(path=path, codec=codec))

        raw = await self.run_asyncio(create)
        try:
            yield GrpcChannel(raw, path)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                await self.run_asyncio(_close_channel, raw)

    async def connect(self, channel: GrpcChannel, *, within: float) -> None:
        """Dial `channel` now (a no-op when connected); RpcError if it fails or takes longer
        than `within` seconds (a dial timeout apart from the deadline of the calls that follow)."""
        try:
            with trio.fail_after(within):
                await self.run_asyncio(channel._channel.__connect__)
        except trio.TooSlowError:
            raise RpcError("DEADLINE_EXCEEDED", f"not connected within {within}s") from None

    async def unary(
        self,
        method: UnaryUnaryMethod[Req, Rep],
        request: Req,
        *,
        timeout: float,  # noqa: ASYNC109 - sent to the peer as grpc-timeout; a scope cannot be
    ) -> Rep:
        """One unary call. The deadline is sent to the peer (grpc-timeout) and enforced here."""

        async def call() -> Rep:
            return await method(request, timeout=timeout)

        try:
            with trio.fail_after(timeout + _TRIO_DEADLINE_MARGIN):
                return await self.run_asyncio(call)
        except trio.TooSlowError:
            raise RpcError("DEADLINE_EXCEEDED", f"no reply within {timeout}s") from None

    @asynccontextmanager
    async def server_stream(
        self,
        method: UnaryStreamMethod[Req, Rep],
        request: Req,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - sent to the peer as grpc-timeout
        open_timeout: float = 10.0,
    ) -> AsyncIterator[ServerStream[Rep]]:
        """Open a server-streaming call and yield its replies; the call is ended on exit.

        `timeout` bounds the whole call (none for a watch); `open_timeout` bounds connecting and
        sending the request. A pump task on the loop reads the replies ahead (a few at most) so
        a burst crosses to Trio in batches; leaving the block cancels it, which resets the
        stream (the peer sees CANCEL), and waits for it.
        """
        grpc = _grpc_module()
        inbox = self._inbox()
        opened: asyncio.Future[None] | None = None

        async def pump() -> None:
            stream = method.open(timeout=timeout)
            try:
                async with stream:
                    await stream.send_message(request, end=True)
                    assert opened is not None
                    _resolve(opened)
                    while True:
                        message: Rep | MessageRejected | None
                        try:
                            message = await stream.recv_message()
                        except MessageRejected as exc:
                            # One refused message (the stream was reset when it was too large:
                            # then the next read fails), as the old per-call bridge reported it.
                            message = exc
                        if message is None:
                            # End of stream: only the trailers tell a clean end from a failure.
                            await stream.recv_trailing_metadata()
                            inbox.push(_END, last=True)
                            return
                        room = inbox.push(message)
                        if room is not None:
                            await room
            except Exception as exc:
                raise grpc.trailers_only_status(stream) or grpc.to_rpc_error(exc) from exc

        async def run() -> None:
            nonlocal opened
            opened = asyncio.get_running_loop().create_future()
            task = asyncio.ensure_future(pump())
            pumping.append(task)
            task.add_done_callback(lambda done: _pump_done(done, inbox, grpc))
            # Open: the request sent (the stream then runs on), or the call failed first.
            await asyncio.wait([opened, task], return_when=asyncio.FIRST_COMPLETED)
            if not opened.done():
                await task  # raises the failure

        pumping: list[asyncio.Task[None]] = []
        try:
            try:
                with trio.fail_after(open_timeout):
                    await self.run_asyncio(run)
            except trio.TooSlowError:
                raise RpcError(
                    "DEADLINE_EXCEEDED", f"stream not open within {open_timeout}s"
                ) from None
            yield ServerStream(inbox)
        finally:
            if pumping:
                with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                    await self.run_asyncio(_stop_task, pumping[0])
            inbox.close()

    @asynccontextmanager
    async def serve(self, handlers: Sequence[Any], path: str) -> AsyncIterator[None]:
        """Serve grpclib handler objects on unix socket `path` until the block exits."""
        grpc = _grpc_module()

        async def start() -> Any:
            server = grpc.Server(list(handlers))
            await server.start(path=path)
            return server

        server = await self.run_asyncio(start)
        try:
            yield
        finally:
            # Every connection the server accepted is closed with it, none left to a peer
            # hanging up or to the garbage collector (see `_grpc.Server.stop`).
            with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                await self.run_asyncio(server.stop)

    # -- asyncio code calling Trio (see `run_in_trio`)
    async def _from_asyncio(self, fn: Callable[..., Any], *args: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        scope = trio.CancelScope()

        def deliver(result: outcome.Outcome[Any]) -> None:  # asyncio thread
            if not future.done():
                if isinstance(result, outcome.Error):
                    future.set_exception(result.error)
                elif isinstance(result, outcome.Value):
                    future.set_result(result.value)

        async def run_async(awaitable: Awaitable[Any]) -> None:  # a task of the bridge's nursery
            result: outcome.Outcome[Any] = outcome.Error(asyncio.CancelledError())
            try:
                with scope:
                    try:
                        result = outcome.Value(await awaitable)
                    except trio.Cancelled:
                        raise
                    except Exception as exc:
                        result = outcome.Error(exc)
            finally:
                self._to_loop(deliver, result)

        def start() -> None:  # Trio thread
            try:
                value = fn(*args)
            except Exception as exc:
                self._to_loop(deliver, outcome.Error(exc))
                return
            if not inspect.isawaitable(value):
                self._to_loop(deliver, outcome.Value(value))
                return
            try:
                self._nursery.start_soon(run_async, value)
            except RuntimeError as exc:  # the bridge is closing
                if inspect.iscoroutine(value):
                    value.close()
                self._to_loop(deliver, outcome.Error(exc))

        self._to_trio(start)
        try:
            return await future
        except asyncio.CancelledError:
            self._to_trio(scope.cancel)
            raise


_BRIDGES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GrpcBridge] = (
    weakref.WeakKeyDictionary()
)


@overload
async def run_in_trio(fn: Callable[..., Awaitable[T]], *args: Any) -> T: ...
@overload
async def run_in_trio(fn: Callable[..., T], *args: Any) -> T: ...
async def run_in_trio(fn: Callable[..., Any], *args: Any) -> Any:
    """Awaited by asyncio code on a bridge's loop (a grpclib handler): run `fn(*args)` in Trio and
    return its result. An async `fn` runs as a task of the bridge's nursery, cancelled when the
    awaiting asyncio task is; a plain function is called in the Trio thread (touching a Trio
    object, e.g. ``LatestValue.set``, from the loop's thread would be a cross-thread race)."""
    _import_asyncio()  # (the caller's loop may be another than a bridge's)
    bridge = _BRIDGES.get(asyncio.get_running_loop())
    if bridge is None:
        raise RuntimeError("run_in_trio: not on a gRPC bridge's loop")
    return await bridge._from_asyncio(fn, *args)


def _cancel_call(call: _Call[Any]) -> None:
    if call.task is not None:
        call.task.cancel()


async def _stop_task(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.wait([task])


async def _close_channel(channel: Channel) -> None:
    channel.close()
    # The transport closes its socket from a callback queued by close(): let it run, so the
    # socket is gone when the Trio owner leaves.
    await asyncio.sleep(0)


def _pump_done(task: asyncio.Task[None], inbox: _Inbox, grpc: Any) -> None:
    if task.cancelled():
        inbox.push(RpcError("CANCELLED", "stream cancelled on the gRPC side"), last=True)
        return
    exc = task.exception()
    if exc is not None:
        inbox.push(grpc.to_rpc_error(exc), last=True)


def _run_loop(loop: asyncio.AbstractEventLoop, stopped: Callable[[], None]) -> None:
    try:
        asyncio.set_event_loop(loop)
        loop.run_forever()
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
            stopped()


async def _shutdown_loop() -> None:
    """Cancel whatever is left on the loop (nothing, when every owner left cleanly), then stop."""
    current = asyncio.current_task()
    left = [task for task in asyncio.all_tasks() if task is not current]
    for task in left:
        task.cancel()
    if left:
        await asyncio.wait(left, timeout=_CLOSE_TIMEOUT)
    asyncio.get_running_loop().stop()


def _start_shutdown(loop: asyncio.AbstractEventLoop) -> None:
    loop.create_task(_shutdown_loop())


@asynccontextmanager
async def open_grpc_bridge() -> AsyncIterator[GrpcBridge]:
    """The process's bridge: its asyncio loop starts in a thread of its own on the first call (a
    node with no plugins never starts it); on exit the loop, if started, is stopped (what is left
    on it cancelled) and its thread joined."""
    token = trio.lowlevel.current_trio_token()
    bridge: GrpcBridge | None = None
    try:
        async with trio.open_nursery() as nursery:
            bridge = GrpcBridge(token, nursery)
            try:
                yield bridge
            finally:
                nursery.cancel_scope.cancel()
    finally:
        if bridge is not None:
            await bridge._close()
