"""The Trio-facing gRPC bridge: grpclib (asyncio-only) inside one long-lived trio-asyncio loop.

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
- `GrpcBridge.serve(handlers, path)` serves grpclib handlers on a unix socket.

Every failure surfaces as `RpcError` (with the gRPC status name) or one of its subclasses.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

import trio
import trio_asyncio
from google.protobuf.message import DecodeError, Message
from grpclib import GRPCError
from grpclib.client import Channel, UnaryStreamMethod, UnaryUnaryMethod
from grpclib.client import Stream as ClientStream
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import ProtocolError, StreamTerminatedError
from grpclib.metadata import Deadline
from grpclib.protocol import H2Protocol
from grpclib.protocol import Stream as H2Stream
from grpclib.server import Server
from h2.errors import ErrorCodes
from multidict import MultiDict

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
]

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# The Trio deadline is a backstop for a peer or connection that ignores grpc-timeout; the margin
# lets grpclib's own DEADLINE_EXCEEDED (with the peer informed) win the race in the normal case.
_TRIO_DEADLINE_MARGIN = 0.25
# Closing a stream or server must not hang shutdown on a wedged peer.
_CLOSE_TIMEOUT = 5.0

P = ParamSpec("P")
T = TypeVar("T")
Req = TypeVar("Req", bound=Message)
Rep = TypeVar("Rep", bound=Message)


class RpcError(Exception):
    """A gRPC call failed. `status` is the gRPC status name, e.g. ``"UNAVAILABLE"``."""

    def __init__(self, status: str, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"{status}: {message}")


class MessageRejected(RpcError):
    """The peer sent a message that was refused before it reached any consumer."""


class MessageTooLarge(MessageRejected):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__("RESOURCE_EXHAUSTED", f"message of {size} bytes exceeds limit {limit}")
        self.size = size
        self.limit = limit


class MalformedMessage(MessageRejected):
    def __init__(self, detail: str) -> None:
        super().__init__("INTERNAL", f"malformed protobuf message: {detail}")


class _LimitedProtoCodec(ProtoCodec):
    """Refuses undecodable messages; the size limit is enforced before buffering (below), and
    checked here again for messages that reach the codec some other way."""

    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_message_bytes:
            raise MessageTooLarge(len(data), self.max_message_bytes)
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            raise MalformedMessage(str(exc)) from None


def _limit_reads(stream: H2Stream, limit: int) -> None:
    """Refuse a message longer than `limit` from its 5-byte gRPC prefix, before its body is read.

    grpclib reads the prefix (``recv_data(5)``), then ``recv_data(length)`` for the body, which
    waits until that many bytes are buffered, granting HTTP/2 window all the while: a peer
    announcing 400 MB is sent window for all of it. Here a body read over the limit resets the
    stream (RST_STREAM CANCEL: no more window for it, and h2 credits the connection window for
    any DATA still in flight) and hands back the connection window of what was already buffered,
    so the connection's other streams do not stall. At most one stream window (grpclib: 4 MiB)
    of a refused message is ever held, and only until this returns.
    """
    read = stream.recv_data

    async def recv_data(size: int) -> bytes:
        if size > limit:
            if stream.closable:
                stream.reset_nowait(ErrorCodes.CANCEL)
            buffered = stream.buffer.unacked_size()  # drains the buffer
            if buffered and stream.id is not None:
                stream.connection.ack(stream.id, buffered)
            raise MessageTooLarge(size, limit)
        data: bytes = await read(size)
        return data

    stream.recv_data = recv_data  # type: ignore[method-assign]


class _LimitedClientStream(ClientStream[Any, Any]):
    """A client call whose every received message is size-checked before buffering."""

    def __init__(self, *args: Any, max_message_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_message_bytes = max_message_bytes

    async def send_request(self, *, end: bool = False) -> None:
        await super().send_request(end=end)
        # The HTTP/2 stream exists from here on; nothing has been read from it yet.
        _limit_reads(self._stream, self._max_message_bytes)


class _LimitedChannel(Channel):
    """A channel whose calls refuse oversized messages before buffering them."""

    def __init__(self, *, path: str, codec: _LimitedProtoCodec) -> None:
        super().__init__(path=path, codec=codec)
        self._max_message_bytes = codec.max_message_bytes

    def request(
        self,
        name: str,
        cardinality: Any,
        request_type: Any,
        reply_type: Any,
        *,
        timeout: float | None = None,
        deadline: Deadline | None = None,
        metadata: Any = None,
    ) -> ClientStream[Any, Any]:
        # As grpclib's Channel.request, with the stream type replaced.
        if timeout is not None:
            limit = Deadline.from_timeout(timeout)
            deadline = limit if deadline is None else min(limit, deadline)
        return _LimitedClientStream(
            self,
            name,
            MultiDict(metadata or ()),
            cardinality,
            request_type,
            reply_type,
            codec=self._codec,
            status_details_codec=self._status_details_codec,
            dispatch=self.__dispatch__,
            deadline=deadline,
            max_message_bytes=self._max_message_bytes,
        )


def _to_rpc_error(exc: BaseException) -> RpcError | None:
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, GRPCError):
        return RpcError(exc.status.name, exc.message or exc.status.name)
    if isinstance(exc, StreamTerminatedError | ProtocolError):
        return RpcError("UNAVAILABLE", f"stream terminated: {exc}")
    # Before OSError: asyncio.TimeoutError is the builtin TimeoutError, an OSError subclass.
    if isinstance(exc, asyncio.TimeoutError | trio.TooSlowError):
        return RpcError("DEADLINE_EXCEEDED", "deadline exceeded")
    if isinstance(exc, OSError):
        return RpcError("UNAVAILABLE", f"connection failed: {exc}")
    if isinstance(exc, asyncio.CancelledError):
        # The asyncio side cancelled the call (e.g. the channel was closed under it).
        return RpcError("CANCELLED", "call cancelled")
    return None


ConnectCheck = Callable[[socket.socket, str], None]
"""Called with each newly connected unix socket and its path, before any gRPC is spoken on it;
raises (an RpcError subclass) to refuse the connection."""


class _CheckedChannel(_LimitedChannel):
    """A unix-socket channel that connects the socket itself and runs `check` on it first, on
    every (re)connection: what is checked is the very connection the calls then use."""

    def __init__(self, *, path: str, codec: _LimitedProtoCodec, check: ConnectCheck) -> None:
        super().__init__(path=path, codec=codec)
        self._check = check

    async def _create_connection(self) -> H2Protocol:
        path = self._path
        assert path is not None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await self._loop.sock_connect(sock, path)
            self._check(sock, path)
            _, protocol = await self._loop.create_unix_connection(self._protocol_factory, sock=sock)
        except BaseException:
            sock.close()
            raise
        return protocol


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


class ServerStream(Generic[Rep]):
    """The replies of a server-streaming call, as a Trio async iterator."""

    def __init__(self, bridge: GrpcBridge, stream: ClientStream[Any, Rep]) -> None:
        self._bridge = bridge
        self._stream = stream

    def __aiter__(self) -> ServerStream[Rep]:
        return self

    async def __anext__(self) -> Rep:
        try:
            message: Rep | None = await self._bridge._call(self._stream.recv_message)
        except RpcError as exc:
            raise _trailers_only_status(self._stream) or exc from exc.__cause__
        if message is None:
            # End of stream: only the trailers tell a clean end from a failed call.
            await self._bridge._call(self._stream.recv_trailing_metadata)
            raise StopAsyncIteration
        return message


def _trailers_only_status(stream: ClientStream[Any, Any]) -> RpcError | None:
    """The real status of a trailers-only error response without a content-type header.

    grpclib's own server answers an unknown method with grpc-status 12 (UNIMPLEMENTED) but no
    content-type, and grpclib's client then reports "UNKNOWN: Missing content-type header"
    before looking at grpc-status. grpc-go includes the header; for grpclib peers the status is
    read from the received headers here, so UNIMPLEMENTED is recognised from either.
    """
    headers = dict(getattr(getattr(stream, "_stream", None), "headers", None) or ())
    code = headers.get("grpc-status")
    if code is None or headers.get("content-type") is not None:
        return None
    try:
        status = Status(int(code))
    except ValueError:
        return None
    return RpcError(status.name, headers.get("grpc-message", status.name))


class GrpcBridge:
    """Runs grpclib on the trio-asyncio loop it was opened with. Create with `open_grpc_bridge`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def _call(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Await an asyncio coroutine function on the bridge loop, mapping failures to RpcError."""
        try:
            return await trio_asyncio.aio_as_trio(fn, loop=self._loop)(*args, **kwargs)  # type: ignore[no-any-return]
        except trio.Cancelled:
            raise
        except RpcError:
            raise
        except Exception as exc:
            # grpclib has internal races (e.g. a connection lost while a stream is being
            # created raises AttributeError); whatever escapes is a failed call to the caller.
            mapped = _to_rpc_error(exc) or RpcError("INTERNAL", f"gRPC failure: {exc!r}")
            raise mapped from exc

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

        async def create() -> Channel:
            # Inside the loop: a Channel made from Trio code would capture no event loop.
            codec = _LimitedProtoCodec(max_message_bytes)
            if check is not None:
                return _CheckedChannel(path=path, codec=codec, check=check)
            return _LimitedChannel(path=path, codec=codec)

        raw = await self._call(create)
        try:
            yield GrpcChannel(raw, path)
        finally:
            raw.close()

    async def connect(self, channel: GrpcChannel, *, within: float) -> None:
        """Dial `channel` now (a no-op when connected); RpcError if it fails or takes longer
        than `within` seconds (a dial timeout apart from the deadline of the calls that follow)."""
        try:
            with trio.fail_after(within):
                await self._call(channel._channel.__connect__)
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
        try:
            with trio.fail_after(timeout + _TRIO_DEADLINE_MARGIN):
                reply: Rep = await self._call(method, request, timeout=timeout)
                return reply
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
        sending the request.
        """

        async def start() -> ClientStream[Req, Rep]:
            stream = method.open(timeout=timeout)
            await stream.__aenter__()
            try:
                await stream.send_message(request, end=True)
            except BaseException:
                await stream.__aexit__(*sys.exc_info())
                raise
            return stream

        try:
            with trio.fail_after(open_timeout):
                stream = await self._call(start)
        except trio.TooSlowError:
            raise RpcError("DEADLINE_EXCEEDED", f"stream not open within {open_timeout}s") from None
        exc_info: tuple[Any, Any, Any] = (None, None, None)
        try:
            yield ServerStream(self, stream)
        except BaseException:
            exc_info = sys.exc_info()
            raise
        finally:
            # A cancelled or failed consumer resets the stream (the peer sees CANCEL). A failing
            # close means the call already failed; that error is the one to see.
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(_CLOSE_TIMEOUT),
                contextlib.suppress(RpcError),
            ):
                await self._call(stream.__aexit__, *exc_info)

    @asynccontextmanager
    async def serve(self, handlers: Sequence[Any], path: str) -> AsyncIterator[None]:
        """Serve grpclib handler objects on unix socket `path` until the block exits."""

        async def start() -> Server:
            server = Server(list(handlers))
            await server.start(path=path)
            return server

        async def stop(server: Server) -> None:
            server.close()
            await server.wait_closed()

        server = await self._call(start)
        try:
            yield
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT):
                await self._call(stop, server)


@asynccontextmanager
async def open_grpc_bridge() -> AsyncIterator[GrpcBridge]:
    """Open the process's one trio-asyncio loop and the bridge that runs grpclib on it."""
    async with trio_asyncio.open_loop() as loop:
        yield GrpcBridge(loop)
