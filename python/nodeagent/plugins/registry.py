"""Scanning the registry directory for plugin sockets.

The directory is polled with `os.scandir` rather than watched with inotify: there is no inotify
binding in the stack, a poll is one readdir + lstat per entry (a few dozen entries on a node, a
fraction of a millisecond), plugins register at human time scales where a one-second delay is
what the kubelet's own 1 s reconciler adds anyway, and polling cannot miss events (inotify queue
overflows, watches on subdirectories created between events) so it needs no resync logic.
"""

from __future__ import annotations

import os
import stat

from nodeagent.plugins.state import SocketIdentity

__all__ = ["ensure_registry_dir", "scan_registry"]


def ensure_registry_dir(path: str) -> None:
    """Create the registry directory (mode 0750: plugins run as root or the agent's user)."""
    os.makedirs(path, mode=0o750, exist_ok=True)


def scan_registry(root: str) -> dict[str, SocketIdentity]:
    """Every unix socket below `root` (recursively), keyed by path.

    Names starting with "." are ignored (files and directories, as the kubelet does), and so is
    everything that is not a socket. Symbolic links are not followed: a plugin socket must be a
    real socket inside the registry directory.
    """
    found: dict[str, SocketIdentity] = {}
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            if directory == root:
                raise
            continue  # a subdirectory removed while scanning
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                pending.append(entry.path)
            elif stat.S_ISSOCK(st.st_mode):
                found[entry.path] = SocketIdentity(st.st_dev, st.st_ino, st.st_ctime_ns)
    return found
