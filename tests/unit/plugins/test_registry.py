from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from nodeagent.plugins.registry import ensure_registry_dir, scan_registry


def _listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def test_scan_finds_sockets_recursively_and_ignores_the_rest(registry: Path) -> None:
    (registry / "sub" / "deeper").mkdir(parents=True)
    (registry / ".hidden-dir").mkdir()
    (registry / "plain-file.sock").write_text("not a socket")
    keep = [
        _listen(registry / "a.sock"),
        _listen(registry / "sub" / "deeper" / "b.sock"),
        _listen(registry / ".dot.sock"),
        _listen(registry / ".hidden-dir" / "c.sock"),
    ]
    os.symlink(registry / "a.sock", registry / "link.sock")
    found = scan_registry(str(registry))
    assert sorted(found) == [
        str(registry / "a.sock"),
        str(registry / "sub" / "deeper" / "b.sock"),
    ]
    for sock in keep:
        sock.close()


def test_recreated_socket_gets_a_new_identity(registry: Path) -> None:
    path = registry / "a.sock"
    first = _listen(path)
    before = scan_registry(str(registry))[str(path)]
    assert scan_registry(str(registry))[str(path)] == before
    first.close()
    path.unlink()
    second = _listen(path)
    after = scan_registry(str(registry))[str(path)]
    assert after != before
    second.close()


def test_missing_root_raises_and_ensure_creates_it_private(registry: Path) -> None:
    root = registry / "x" / "registry"
    with pytest.raises(FileNotFoundError):
        scan_registry(str(root))
    ensure_registry_dir(str(root))
    assert root.stat().st_mode & 0o777 == 0o750 & ~_umask()
    assert scan_registry(str(root)) == {}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
