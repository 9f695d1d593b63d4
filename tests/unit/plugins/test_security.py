from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from nodeagent.plugins.security import (
    EndpointMissing,
    EndpointRejected,
    PeerRejected,
    allowed_uids_check,
    peer_check,
    peer_credentials,
    resolve_endpoint,
    socket_peer,
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


def test_resolve_endpoint_accepts_sockets_below_an_allowed_dir(dirs: tuple[Path, Path]) -> None:
    root, outside = dirs
    (root / "sub").mkdir()
    allowed = [str(root), str(outside)]
    with _listen(root / "sub" / "a.sock"), _listen(outside / "b.sock"):
        assert resolve_endpoint(allowed, str(root / "sub" / "a.sock")) == str(
            root / "sub" / "a.sock"
        )
        # Any of the allowed directories: the upstream layout keeps the service socket apart.
        assert resolve_endpoint(allowed, str(outside / "b.sock")) == str(outside / "b.sock")
        os.symlink(root / "sub" / "a.sock", root / "in.sock")
        assert resolve_endpoint(allowed, str(root / "in.sock")) == str(root / "sub" / "a.sock")


def test_resolve_endpoint_refuses_escapes_and_non_sockets(dirs: tuple[Path, Path]) -> None:
    root, outside = dirs
    allowed = [str(root)]
    with _listen(outside / "x.sock"):
        with pytest.raises(EndpointRejected, match="outside the allowed endpoint directories"):
            resolve_endpoint(allowed, str(outside / "x.sock"))
        os.symlink(outside / "x.sock", root / "escape.sock")
        with pytest.raises(EndpointRejected, match="outside the allowed endpoint directories"):
            resolve_endpoint(allowed, str(root / "escape.sock"))
        with pytest.raises(EndpointRejected, match="outside the allowed endpoint directories"):
            resolve_endpoint(allowed, str(root / ".." / outside.name / "x.sock"))
    # A sibling whose name merely starts with the allowed directory's is outside it.
    sibling = Path(str(root) + "-x")
    sibling.mkdir()
    try:
        with _listen(sibling / "s.sock"), pytest.raises(EndpointRejected, match="outside"):
            resolve_endpoint(allowed, str(sibling / "s.sock"))
    finally:
        (sibling / "s.sock").unlink()
        sibling.rmdir()
    (root / "file").write_text("")
    with pytest.raises(EndpointRejected, match="is not a unix socket"):
        resolve_endpoint(allowed, str(root / "file"))
    with pytest.raises(EndpointMissing, match="No such file"):
        resolve_endpoint(allowed, str(root / "missing.sock"))
    with pytest.raises(EndpointRejected, match="not an absolute path"):
        resolve_endpoint(allowed, "relative.sock")


def test_connection_check_reads_the_peer_of_the_connection_itself(
    dirs: tuple[Path, Path],
) -> None:
    root, _ = dirs
    with _listen(root / "a.sock") as server, socket.socket(socket.AF_UNIX) as client:
        client.connect(str(root / "a.sock"))
        creds = socket_peer(client)
        assert (creds.pid, creds.uid) == (os.getpid(), os.getuid())
        peer_check(lambda uid: True)(client, str(root / "a.sock"))
        with pytest.raises(PeerRejected, match=f"uid {os.getuid()}, which is not an allowed") as e:
            peer_check(lambda uid: False)(client, str(root / "a.sock"))
        assert e.value.status == "PERMISSION_DENIED"
        server.close()


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
