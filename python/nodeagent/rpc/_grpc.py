"""The grpclib side of the bridge: what runs on the bridge's asyncio loop.

Imported on the first channel or server only (`GrpcBridge` imports it lazily), so a node that
never talks to a plugin never loads grpclib, h2, hpack or multidict.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, cast

from google.protobuf.message import DecodeError
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.client import Stream as ClientStream
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import ProtocolError, StreamTerminatedError
from grpclib.metadata import Deadline
from grpclib.protocol import H2Protocol
from grpclib.protocol import Stream as H2Stream
from grpclib.server import Server as _GrpclibServer
from h2.errors import ErrorCodes
from multidict import MultiDict

from nodeagent.rpc.errors import ConnectCheck, MalformedMessage, MessageTooLarge, RpcError

__all__ = [
    "CheckedChannel",
    "LimitedChannel",
    "LimitedProtoCodec",
    "Server",
    "StreamCodec",
    "limit_reads",
    "to_rpc_error",
    "trailers_only_status",
]


class LimitedProtoCodec(ProtoCodec):
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


class StreamCodec(LimitedProtoCodec):
    """One streaming call's codec: a message whose bytes are those of the message before is not
    decoded again, the same object is handed back. A plugin re-sending its whole state unchanged
    (8,192 devices at 10 Hz) then costs a comparison of bytes (~0.1 ms a MiB) instead of a
    decode on this thread holding the GIL for tens of milliseconds, and the consumer tells a
    re-send from a change by identity, before converting anything. Holds the last message's
    bytes (at most ``max_message_bytes``) as long as the call lasts."""

    def __init__(self, max_message_bytes: int) -> None:
        super().__init__(max_message_bytes)
        self._last: tuple[bytes, Any, Any] | None = None  # bytes, message type, message

    def decode(self, data: bytes, message_type: Any) -> Any:
        last = self._last
        if last is not None and last[1] is message_type and last[0] == data:
            return last[2]
        message = super().decode(data, message_type)
        self._last = (data, message_type, message)
        return message


def limit_reads(stream: H2Stream, limit: int) -> None:
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
        limit_reads(self._stream, self._max_message_bytes)


class LimitedChannel(Channel):
    """A channel whose calls refuse oversized messages before buffering them."""

    def __init__(self, *, path: str, codec: LimitedProtoCodec) -> None:
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
        # As grpclib's Channel.request, with the stream type replaced and, for a call whose
        # replies stream, a codec of its own (`StreamCodec`).
        codec = self._codec
        if cardinality.server_streaming:
            codec = StreamCodec(self._max_message_bytes)
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
            codec=codec,
            status_details_codec=self._status_details_codec,
            dispatch=self.__dispatch__,
            deadline=deadline,
            max_message_bytes=self._max_message_bytes,
        )


class CheckedChannel(LimitedChannel):
    """A unix-socket channel that connects the socket itself and runs `check` on it first, on
    every (re)connection: what is checked is the very connection the calls then use."""

    def __init__(self, *, path: str, codec: LimitedProtoCodec, check: ConnectCheck) -> None:
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


class _ServerProtocol(H2Protocol):
    """grpclib's server connection, known to its server until the connection is lost."""

    def __init__(self, base: H2Protocol, server: Server) -> None:
        super().__init__(base.handler, base.config, base.h2_config)
        self._server = server
        self.transport: asyncio.Transport | None = None
        server._connections.add(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        super().connection_made(transport)
        if self._server._stopping:
            transport.close()  # made after the server began to stop: closed with the others

    def connection_lost(self, exc: BaseException | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self._server._lost(self)


class Server(_GrpclibServer):
    """grpclib's server, stopped with every connection it accepted (`stop`).

    grpclib's close() leaves the accepted connections open (their handlers cancelled): asyncio's
    Server.wait_closed then waits for the peers to hang up (3.12+; a plugin's agent never does
    while it serves), and on 3.11, where it does not wait, their sockets outlive the server.
    """

    def __init__(self, handlers: list[Any]) -> None:
        super().__init__(handlers)
        self._connections: set[_ServerProtocol] = set()
        self._stopping = False
        self._all_lost: asyncio.Event | None = None

    def _protocol_factory(self) -> H2Protocol:
        return _ServerProtocol(super()._protocol_factory(), self)

    def _lost(self, protocol: _ServerProtocol) -> None:
        self._connections.discard(protocol)
        if not self._connections and self._all_lost is not None:
            self._all_lost.set()

    async def stop(self) -> None:
        """Stop serving: no new connection, the handlers cancelled and waited for, then every
        accepted connection closed (aborted if the caller gives up waiting) and gone."""
        listening = cast("asyncio.Server | None", self._server)
        assert listening is not None, "stop() before start()"
        # Stop accepting first, the listening sockets still open. asyncio accepts a connection
        # in one callback and makes its transport in a task that runs later: had the server
        # closed in between, that transport would fail to attach to it and its socket would be
        # left to the garbage collector (which, from 3.12 on, wakes the closed server a second
        # time: an unraisable TypeError). One loop pass lets those tasks attach their transports.
        loop = asyncio.get_running_loop()
        for sock in listening.sockets:
            loop.remove_reader(sock.fileno())
        await asyncio.sleep(0)
        self._stopping = True
        self.close()  # the listening sockets closed, every handler cancelled
        try:
            handlers = [loop.create_task(handler.wait_closed()) for handler in self._handlers]
            if handlers:
                await asyncio.wait(handlers)  # their last frames (a reset, a status) queued
            if self._connections:
                self._all_lost = asyncio.Event()
                for protocol in list(self._connections):
                    if protocol.transport is not None:
                        protocol.transport.close()  # after writing what is queued
                    # (else it is closed as soon as it is made, see connection_made)
                await self._all_lost.wait()
            await self.wait_closed()
        except BaseException:
            for protocol in list(self._connections):
                if protocol.transport is not None:
                    protocol.transport.abort()
            raise


def to_rpc_error(exc: BaseException) -> RpcError:
    """What Trio code sees of any failure on the asyncio side: always an RpcError."""
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, GRPCError):
        return RpcError(exc.status.name, exc.message or exc.status.name)
    if isinstance(exc, StreamTerminatedError | ProtocolError):
        return RpcError("UNAVAILABLE", f"stream terminated: {exc}")
    # Before OSError: asyncio.TimeoutError is the builtin TimeoutError, an OSError subclass.
    if isinstance(exc, asyncio.TimeoutError):
        return RpcError("DEADLINE_EXCEEDED", "deadline exceeded")
    if isinstance(exc, OSError):
        return RpcError("UNAVAILABLE", f"connection failed: {exc}")
    if isinstance(exc, asyncio.CancelledError):
        # The asyncio side cancelled the call (e.g. the channel was closed under it). A
        # BaseException: let through, it would cancel the caller's whole task group.
        return RpcError("CANCELLED", "call cancelled on the gRPC side")
    # grpclib has internal races (e.g. a connection lost while a stream is being created raises
    # AttributeError); whatever escapes is a failed call to the caller.
    return RpcError("INTERNAL", f"gRPC failure: {exc!r}")


def trailers_only_status(stream: ClientStream[Any, Any]) -> RpcError | None:
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
