"""systemd notification protocol (sd_notify(3)) on a datagram unix socket, without libsystemd.

`$NOTIFY_SOCKET` is a filesystem path or, with a leading `@`, an abstract socket name.
The watchdog interval is half of `$WATCHDOG_USEC`, and only when `$WATCHDOG_PID` is unset or names
this process (sd_watchdog_enabled(3)): a forked helper must not ping on behalf of the main PID.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Mapping

from nodeagent.log import get_logger
from nodeagent.service.metrics import SD_NOTIFY_ERRORS

log = get_logger(__name__)


def encode(**fields: str | int) -> bytes:
    """`READY=1\\nSTATUS=...` from keyword fields; newlines inside values would split a field."""
    lines = []
    for key, value in fields.items():
        text = str(value)
        if "\n" in text:
            text = text.replace("\n", " ")
        lines.append(f"{key}={text}")
    return "\n".join(lines).encode()


def socket_address(notify_socket: str) -> str | bytes:
    if notify_socket.startswith("@"):
        return b"\0" + notify_socket[1:].encode()
    return notify_socket


def watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """Seconds between WATCHDOG=1 pings, or None when the watchdog is not enabled for us."""
    usec_text = env.get("WATCHDOG_USEC", "")
    if not usec_text:
        return None
    pid_text = env.get("WATCHDOG_PID", "")
    if pid_text and (not pid_text.isdigit() or int(pid_text) != pid):
        return None
    try:
        usec = int(usec_text)
    except ValueError:
        log.warning("ignoring invalid WATCHDOG_USEC", value=usec_text)
        return None
    if usec <= 0:
        return None
    return usec / 1_000_000 / 2


class SystemdNotifier:
    """Sends notifications when `$NOTIFY_SOCKET` is set; otherwise every call is a cheap no-op."""

    def __init__(self, notify_socket: str | None, watchdog: float | None = None) -> None:
        self.address = socket_address(notify_socket) if notify_socket else None
        self.watchdog_interval = watchdog
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, pid: int | None = None
    ) -> SystemdNotifier:
        env = os.environ if env is None else env
        pid = os.getpid() if pid is None else pid
        return cls(env.get("NOTIFY_SOCKET") or None, watchdog_interval(env, pid))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: str | int) -> bool:
        if self.address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            # Non-blocking: a full receive queue must never stall the main loop (and so the
            # watchdog that the main loop drives).
            self._sock.sendto(encode(**fields), socket.MSG_DONTWAIT, self.address)
        except OSError as exc:
            SD_NOTIFY_ERRORS.inc()
            if exc.errno != errno.EAGAIN:
                log.warning("sd_notify failed", error=str(exc), fields=",".join(fields))
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status, MAINPID=os.getpid())

    def status(self, status: str) -> bool:
        return self.send(STATUS=status)

    def stopping(self, status: str = "stopping") -> bool:
        return self.send(STOPPING=1, STATUS=status)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
