"""A read-only store (the dry run's): it reads what a real agent wrote and changes nothing in
the directory."""

from __future__ import annotations

from pathlib import Path

from nodeagent.checkpoint import CheckpointStore
from nodeagent.checkpoint.store import CheckpointState


def _listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_read_only_store_reads_and_writes_nothing(tmp_path: Path) -> None:
    real = CheckpointStore(tmp_path, node="node-a")
    real.write("state", b"real")
    (tmp_path / ".state.abcdefgh.tmp").write_bytes(b"a killed writer's leftover")
    before = _listing(tmp_path)
    dry = CheckpointStore(tmp_path, node="node-a", read_only=True)
    assert dry.read("state").data == b"real"
    dry.write("state", b"dry")
    dry.write("other", b"dry")
    assert _listing(tmp_path) == before
    assert real.read("state").data == b"real"


def test_a_corrupt_checkpoint_is_reported_and_left_in_place(tmp_path: Path) -> None:
    (tmp_path / "state").write_bytes(b"not a checkpoint")
    dry = CheckpointStore(tmp_path, read_only=True)
    read = dry.read("state")
    assert read.state is CheckpointState.CORRUPT and read.moved_to is None
    assert read.reason
    assert _listing(tmp_path) == {"state": b"not a checkpoint"}


def test_a_read_only_store_creates_no_directory(tmp_path: Path) -> None:
    dry = CheckpointStore(tmp_path / "checkpoints", read_only=True)
    dry.write("state", b"dry")
    assert dry.read("state").state is CheckpointState.NOT_FOUND
    assert not (tmp_path / "checkpoints").exists()
