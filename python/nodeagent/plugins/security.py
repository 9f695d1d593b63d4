"""Which sockets the agent dials and which peers it talks to.

A plugin's registration socket is one the registry scan found; its service endpoint may be any
absolute path (as the kubelet allows: the upstream helper puts it in
/var/lib/kubelet/plugins/<driver>/dra.sock) inside the configured endpoint directories, after
resolving symbolic links, and must be a socket. The process listening on either must run as an
allowed UID, read with SO_PEERCRED: on a probe connection at registration, and again on every
connection a stream is opened on, so a socket swapped after registration is refused too.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import trio

from nodeagent.plugins.settings import default_allowed_uids
from nodeagent.rpc.errors import ConnectCheck, RpcError

__all__ = [
    "EndpointMissing",
    "EndpointRejected",
    "PeerCredentials",
    "PeerRejected",
    "UidCheck",
    "allowed_uids_check",
    "peer_check",
    "peer_credentials",
    "resolve_endpoint",
    "socket_peer",
]

UidCheck = Callable[[int], bool]
_UCRED = struct.Struct("3i")


class EndpointRejected(Exception):
    """A socket path or its peer broke a security rule; the message says which."""


class EndpointMissing(Exception):
    """A socket path does not exist (yet): a plugin may create its registration socket before
    its service socket, so this is worth retrying, unlike EndpointRejected."""


class PeerRejected(RpcError):
    """A connection's peer runs as a UID that is not allowed (the connection is refused)."""

    def __init__(self, message: str) -> None:
        super().__init__("PERMISSION_DENIED", message)


@dataclass(frozen=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int


def allowed_uids_check(uids: Iterable[int] | None) -> UidCheck:
    """The default UID rule: the configured UIDs, or root and the agent's own user."""
    allowed = frozenset(uids if uids is not None else default_allowed_uids())
    return allowed.__contains__


def resolve_endpoint(allowed_dirs: Sequence[str], path: str) -> str:
    """`path` with symbolic links resolved; EndpointRejected unless it is an absolute path to a
    socket below one of `allowed_dirs` (each already resolved), EndpointMissing if it does not
    exist."""
    if not os.path.isabs(path):
        raise EndpointRejected(f"endpoint {path!r} is not an absolute path")
    real = os.path.realpath(path)
    if not any(os.path.commonpath([d, real]) == d and real != d for d in allowed_dirs):
        raise EndpointRejected(
            f"endpoint {path!r} resolves to {real!r}, outside the allowed endpoint "
            f"directories {list(allowed_dirs)} (plugins.endpoint_dirs)"
        )
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError as exc:
        raise EndpointMissing(f"endpoint {path!r}: {exc.strerror}") from None
    except OSError as exc:
        raise EndpointRejected(f"endpoint {path!r}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise EndpointRejected(f"endpoint {path!r} is not a unix socket")
    return real


def socket_peer(sock: socket.socket) -> PeerCredentials:
    """The credentials of the process at the other end of connected unix socket `sock`."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return PeerCredentials(*_UCRED.unpack(raw))


def peer_check(uid_allowed: UidCheck) -> ConnectCheck:
    """A bridge connection check: PeerRejected unless the peer runs as an allowed UID."""

    def check(sock: socket.socket, path: str) -> None:
        creds = socket_peer(sock)
        if not uid_allowed(creds.uid):
            raise PeerRejected(
                f"socket {path} is served by pid {creds.pid} uid {creds.uid}, "
                "which is not an allowed plugin UID"
            )

    return check


async def peer_credentials(path: str, connect_timeout: float) -> PeerCredentials:
    """Connect to unix socket `path` and read the listening process's credentials.

    OSError (e.g. connection refused) or trio.TooSlowError when the socket does not answer.
    """
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        with trio.fail_after(connect_timeout):
            await sock.connect(path)
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerCredentials(pid, uid, gid)
