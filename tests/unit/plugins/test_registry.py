from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.plugins.registry import ensure_registry_dir, scan_registry


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="na-scan-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def test_scan_finds_sockets_recursively_and_ignores_the_rest(short_tmp: Path) -> None:
    (short_tmp / "sub" / "deeper").mkdir(parents=True)
    (short_tmp / ".hidden-dir").mkdir()
    (short_tmp / "plain-file.sock").write_text("not a socket")
    keep = [
        _listen(short_tmp / "a.sock"),
        _listen(short_tmp / "sub" / "deeper" / "b.sock"),
        _listen(short_tmp / ".dot.sock"),
        _listen(short_tmp / ".hidden-dir" / "c.sock"),
    ]
    os.symlink(short_tmp / "a.sock", short_tmp / "link.sock")
    found = scan_registry(str(short_tmp))
    assert sorted(found) == [
        str(short_tmp / "a.sock"),
        str(short_tmp / "sub" / "deeper" / "b.sock"),
    ]
    for sock in keep:
        sock.close()


def test_recreated_socket_gets_a_new_identity(short_tmp: Path) -> None:
    path = short_tmp / "a.sock"
    first = _listen(path)
    before = scan_registry(str(short_tmp))[str(path)]
    assert scan_registry(str(short_tmp))[str(path)] == before
    first.close()
    path.unlink()
    second = _listen(path)
    after = scan_registry(str(short_tmp))[str(path)]
    assert after != before
    second.close()


def test_missing_root_raises_and_ensure_creates_it_private(short_tmp: Path) -> None:
    root = short_tmp / "x" / "registry"
    with pytest.raises(FileNotFoundError):
        scan_registry(str(root))
    ensure_registry_dir(str(root))
    assert root.stat().st_mode & 0o777 == 0o750 & ~_umask()
    assert scan_registry(str(root)) == {}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
