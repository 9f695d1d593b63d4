"""One state directory, one agent: an exclusive `flock` on ``<state_dir>/agent.lock``, held for
the life of the process.

Two agents on one state directory (a second one started by hand on a node, a quick start as
root beside the DaemonSet) would both run ready, each overwriting the other's checkpoints and
trial marker. The kernel releases a flock when its holder's last descriptor closes, also on a
SIGKILL or an OOM kill, so a lock is never stale; the file itself stays (unlinking it would let a
third process lock a new inode while another waits on the old one). The holder writes who it is
in the file, for the refusal message.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from typing import IO

from nodeagent import __version__
from nodeagent.core.component import FatalError
from nodeagent.core.errors import ConfigError

__all__ = ["LOCK_NAME", "lock_state_dir"]

LOCK_NAME = "agent.lock"
# The holder's description is read back into an error message: bounded.
_HOLDER_MAX = 4096


def lock_state_dir(state_dir: str, node: str) -> IO[bytes]:
    """Lock `state_dir` for this process (keep the returned file open as long as it runs).

    ConfigError (`agent.state_dir`, exit 2 as for an invalid configuration) naming the holder
    if another process holds it; FatalError (exit 1) if the lock file cannot be opened."""
    path = os.path.join(state_dir, LOCK_NAME)
    try:
        # Not truncated on open: the holder's description is what a refused start reads.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise FatalError(f"cannot open {path}: {exc.strerror or exc}") from exc
    # Unbuffered: the holder's line is written now or not at all (nothing left to flush later).
    lock = open(fd, "r+b", buffering=0)  # noqa: SIM115 (open for the process's life)
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(lock)
        lock.close()
        raise ConfigError(
            "agent.state_dir",
            state_dir,
            f"in use by {holder}: stop it or give this one another --state-dir",
        ) from None
    except BaseException:
        lock.close()
        raise
    me = {
        "pid": os.getpid(),
        "pid_namespace": _pid_namespace(),
        "node": node,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "version": __version__,
    }
    try:
        lock.truncate(0)
        lock.write(json.dumps(me).encode() + b"\n")
    except OSError:
        # A full disk: the lock holds all the same, a refused start just cannot name us.
        pass
    return lock


def _holder(lock: IO[bytes]) -> str:
    try:
        holder = json.loads(lock.read(_HOLDER_MAX))
        pid, node, started = holder["pid"], holder["node"], holder["started"]
    except (OSError, ValueError, TypeError, KeyError):
        # Locked a moment ago and not written yet, or not ours.
        return "another process (it has not said which)"
    where = ""
    if holder.get("pid_namespace") != _pid_namespace():
        where = " in another PID namespace (a container)"
    return f"nodeagent pid {pid}{where} on node {node}, started {started}"


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
