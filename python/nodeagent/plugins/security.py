"""Which sockets the agent dials and which peers it talks to.

Only sockets inside the registry directory are dialled (after resolving symbolic links), and the
process listening on a plugin socket must run as an allowed UID, read with SO_PEERCRED on a
separate probe connection before any gRPC is spoken.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

__all__ = [
    "EndpointRejected",
    "PeerCredentials",
    "UidCheck",
    "allowed_uids_check",
    "peer_credentials",
    "resolve_inside",
]

UidCheck = Callable[[int], bool]
_UCRED = struct.Struct("3i")


class EndpointRejected(Exception):
    """A socket path or its peer broke a security rule; the message says which."""


@dataclass(frozen=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int


def allowed_uids_check(uids: Iterable[int] | None) -> UidCheck:
    """The default UID rule: the configured UIDs, or root and the agent's own user."""
    allowed = frozenset(uids) if uids is not None else frozenset({0, os.getuid()})
    return allowed.__contains__


def resolve_inside(root: str, path: str) -> str:
    """`path` with symbolic links resolved; EndpointRejected unless it is a socket under `root`."""
    if not os.path.isabs(path):
        raise EndpointRejected(f"endpoint {path!r} is not an absolute path")
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root or real == real_root:
        raise EndpointRejected(
            f"endpoint {path!r} resolves to {real!r}, outside the registry directory {real_root!r}"
        )
    try:
        mode = os.stat(real).st_mode
    except OSError as exc:
        raise EndpointRejected(f"endpoint {path!r}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise EndpointRejected(f"endpoint {path!r} is not a unix socket")
    return real


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
