from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from nodeagent.plugins.security import (
    EndpointRejected,
    allowed_uids_check,
    peer_credentials,
    resolve_inside,
)


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    import shutil

    root = Path(tempfile.mkdtemp(prefix="na-sec-", dir="/tmp"))
    outside = Path(tempfile.mkdtemp(prefix="na-out-", dir="/tmp"))
    yield root, outside
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(outside, ignore_errors=True)


def _listen(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


def test_resolve_inside_accepts_sockets_below_the_root(dirs: tuple[Path, Path]) -> None:
    root, _ = dirs
    (root / "sub").mkdir()
    with _listen(root / "sub" / "a.sock"):
        assert resolve_inside(str(root), str(root / "sub" / "a.sock")) == str(
            root / "sub" / "a.sock"
        )
        os.symlink(root / "sub" / "a.sock", root / "in.sock")
        assert resolve_inside(str(root), str(root / "in.sock")) == str(root / "sub" / "a.sock")


def test_resolve_inside_refuses_escapes_and_non_sockets(dirs: tuple[Path, Path]) -> None:
    root, outside = dirs
    with _listen(outside / "x.sock"):
        with pytest.raises(EndpointRejected, match="outside the registry directory"):
            resolve_inside(str(root), str(outside / "x.sock"))
        os.symlink(outside / "x.sock", root / "escape.sock")
        with pytest.raises(EndpointRejected, match="outside the registry directory"):
            resolve_inside(str(root), str(root / "escape.sock"))
        with pytest.raises(EndpointRejected, match="outside the registry directory"):
            resolve_inside(str(root), str(root / ".." / outside.name / "x.sock"))
    (root / "file").write_text("")
    with pytest.raises(EndpointRejected, match="is not a unix socket"):
        resolve_inside(str(root), str(root / "file"))
    with pytest.raises(EndpointRejected, match="No such file"):
        resolve_inside(str(root), str(root / "missing.sock"))
    with pytest.raises(EndpointRejected, match="not an absolute path"):
        resolve_inside(str(root), "relative.sock")


async def test_peer_credentials_report_the_listening_process(dirs: tuple[Path, Path]) -> None:
    root, _ = dirs
    with _listen(root / "a.sock"):
        creds = await peer_credentials(str(root / "a.sock"), connect_timeout=1.0)
    assert (creds.pid, creds.uid, creds.gid) == (os.getpid(), os.getuid(), os.getgid())
    with pytest.raises(OSError):
        await peer_credentials(str(root / "a.sock"), connect_timeout=1.0)  # nobody listens now


def test_default_uid_rule_is_root_and_own_user() -> None:
    default = allowed_uids_check(None)
    assert default(0) and default(os.getuid())
    assert not default(os.getuid() + 4242)
    configured = allowed_uids_check([1234])
    assert configured(1234) and not configured(0)


async def test_peer_credentials_timeout_is_bounded(dirs: tuple[Path, Path]) -> None:
    root, _ = dirs
    with trio.fail_after(5), pytest.raises(FileNotFoundError):
        await peer_credentials(str(root / "none.sock"), connect_timeout=1.0)
