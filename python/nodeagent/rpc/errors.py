"""The only errors Trio code sees from the bridge (no grpclib or asyncio import: cheap to load)."""

from __future__ import annotations

import socket
from collections.abc import Callable

__all__ = [
    "ConnectCheck",
    "MalformedMessage",
    "MessageRejected",
    "MessageTooLarge",
    "RpcError",
    "connection_refused",
]


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


def connection_refused(exc: BaseException) -> bool:
    """Whether `exc`, or what caused it, is a refused connection (ECONNREFUSED). On a unix
    socket it means nobody listens there: the process that bound it is gone (or has not called
    listen yet), whereas a busy listener makes a connect wait, never refuse."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__
    return False


ConnectCheck = Callable[[socket.socket, str], None]
"""Called with each newly connected unix socket and its path, before any gRPC is spoken on it;
raises (an RpcError subclass) to refuse the connection."""
