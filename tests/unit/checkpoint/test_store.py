"""CheckpointStore: round trip, the three read outcomes, corrupt files moved aside (metric and
log), atomic writes that clean up after a failure, name validation, Katalyst's files."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from nodeagent.checkpoint import CheckpointRead, CheckpointState, CheckpointStore
from nodeagent.checkpoint.format import CorruptCheckpoint, decode, encode
from nodeagent.core.errors import ConfigError


def _metric(name: str, checkpoint: str) -> float:
    return REGISTRY.get_sample_value(name, {"name": checkpoint}) or 0.0


def _corrupt_count(checkpoint: str) -> float:
    return _metric("nodeagent_checkpoint_corrupt_total", checkpoint)


def _write_failures(checkpoint: str) -> float:
    return _metric("nodeagent_checkpoint_write_failures_total", checkpoint)


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "checkpoints")


def test_missing_checkpoint_and_missing_directory_read_as_not_found(
    store: CheckpointStore,
) -> None:
    assert store.read("reporter") == CheckpointRead(CheckpointState.NOT_FOUND)
    assert not store.directory.exists()


def test_written_checkpoint_reads_back(store: CheckpointStore) -> None:
    store.write("reporter", b'{"a": 1}')
    assert store.read("reporter") == CheckpointRead(CheckpointState.FOUND, data=b'{"a": 1}')
    store.write("reporter", b"")
    assert store.read("reporter").data == b""


def test_write_replaces_and_leaves_no_temp_file(store: CheckpointStore) -> None:
    store.write("a", b"one")
    store.write("a", b"two")
    store.write("b", b"three")
    assert sorted(p.name for p in store.directory.iterdir()) == ["a", "b"]
    assert store.read("a").data == b"two"
    assert (store.directory / "a").stat().st_mode & 0o777 == 0o600


def test_file_format_is_the_documented_header_then_the_payload(store: CheckpointStore) -> None:
    payload = b"payload\nwith newline"
    store.write("a", payload)
    blob = (store.directory / "a").read_bytes()
    digest = hashlib.sha256(payload).hexdigest()
    assert blob == f"nodeagent-checkpoint 1 sha256={digest} length=20\n".encode() + payload


def test_corrupt_checkpoint_is_moved_aside_logged_and_counted(
    store: CheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.write("reporter", b"good data")
    path = store.directory / "reporter"
    path.write_bytes(path.read_bytes()[:-1] + b"X")
    before = _corrupt_count("reporter")

    with caplog.at_level(logging.WARNING, logger="nodeagent.checkpoint"):
        result = store.read("reporter")

    assert result.state is CheckpointState.CORRUPT
    assert result.data is None
    assert result.reason == "sha256 of the payload does not match the header"
    assert result.moved_to is not None and result.moved_to.parent == store.directory
    assert result.moved_to.name.startswith("reporter.corrupt-")
    assert result.moved_to.read_bytes().endswith(b"good datX")  # kept for inspection
    assert not path.exists()
    assert _corrupt_count("reporter") == before + 1
    [record] = [r for r in caplog.records if r.name == "nodeagent.checkpoint.store"]
    assert record.getMessage() == "checkpoint corrupt, moved aside"
    assert record.fields["reason"] == result.reason  # type: ignore[attr-defined]
    # Then the component starts fresh: not found, and the next write is a normal one.
    assert store.read("reporter").state is CheckpointState.NOT_FOUND
    store.write("reporter", b"fresh")
    assert store.read("reporter").data == b"fresh"
    assert result.moved_to.exists()


def test_only_the_newest_corrupt_copies_are_kept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep_corrupt=2)
    moved = []
    for i in range(4):
        (tmp_path / "a").write_bytes(b"garbage %d" % i)
        result = store.read("a")
        assert result.state is CheckpointState.CORRUPT and result.moved_to is not None
        moved.append(result.moved_to)
    store.write("ab", b"x")  # another name's files are not touched
    (tmp_path / "ab").write_bytes(b"garbage")
    store.read("ab")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert [p.name for p in moved[2:]] == [n for n in left if n.startswith("a.corrupt-")]
    assert len([n for n in left if n.startswith("ab.corrupt-")]) == 1
    assert (moved[3]).read_bytes() == b"garbage 3"


def test_corrupt_file_that_cannot_be_moved_is_reported_not_raised(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store.write("a", b"x")
    (store.directory / "a").write_bytes(b"junk")

    def refuse(self: Path, target: Path) -> Path:
        raise PermissionError(13, "read-only", str(self))

    monkeypatch.setattr(Path, "rename", refuse)
    before = _corrupt_count("a")
    with caplog.at_level(logging.ERROR, logger="nodeagent.checkpoint"):
        result = store.read("a")
    assert result.state is CheckpointState.CORRUPT and result.moved_to is None
    assert _corrupt_count("a") == before + 1
    assert "could not be moved aside" in caplog.text


def test_failed_write_keeps_the_old_checkpoint_removes_the_temp_and_raises(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store.write("a", b"old")

    def fail(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fail)
    before = _write_failures("a")
    with caplog.at_level(logging.WARNING, logger="nodeagent.checkpoint"), pytest.raises(OSError):
        store.write("a", b"new")
    monkeypatch.undo()

    assert _write_failures("a") == before + 1
    assert "checkpoint write failed" in caplog.text
    assert sorted(p.name for p in store.directory.iterdir()) == ["a"]
    assert store.read("a").data == b"old"


def test_write_into_an_unusable_directory_is_counted(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    store = CheckpointStore(tmp_path / "file" / "checkpoints")
    before = _write_failures("a")
    with pytest.raises(OSError):
        store.write("a", b"x")
    assert _write_failures("a") == before + 1


def test_leftover_temp_files_are_removed_by_a_new_store(tmp_path: Path) -> None:
    CheckpointStore(tmp_path).write("a", b"x")
    (tmp_path / ".a.k3j_9x0q.tmp").write_bytes(b"half a write")
    (tmp_path / ".other").write_bytes(b"not ours")
    store = CheckpointStore(tmp_path)
    assert store.read("a").data == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other", "a"]


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-a",
        "a-",
        ".a",
        "a.",
        "a/b",
        "../a",
        "a b",
        "a\n",
        "ä",
        "a" * 201,
        "a.corrupt-20260101T000000.000000Z",
    ],
)
def test_invalid_names_are_refused_naming_the_rule(store: CheckpointStore, name: str) -> None:
    with pytest.raises(ConfigError) as raised:
        store.write(name, b"x")
    assert raised.value.field == "checkpoint name"
    assert "must" in raised.value.rule
    with pytest.raises(ConfigError):
        store.read(name)
    assert not store.directory.exists()


@pytest.mark.parametrize("name", ["a", "A9", "reporter_manager_checkpoint", "a.b-c_d", "a" * 200])
def test_valid_names_are_accepted_and_can_be_moved_aside(store: CheckpointStore, name: str) -> None:
    store.write(name, b"x")
    assert store.read(name).data == b"x"
    (store.directory / name).write_bytes(b"junk")
    moved = store.read(name).moved_to
    assert moved is not None and moved.read_bytes() == b"junk"


def test_keep_corrupt_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="keep_corrupt"):
        CheckpointStore(tmp_path, keep_corrupt=0)


def _katalyst_reporter_checkpoint() -> bytes:
    """A checkpoint as Katalyst's reporter manager writes it (katalyst.md 2.3)."""
    zone = base64.b64encode(b'[{"type":"Socket","name":"0"}]').decode()
    doc = {
        "Data": {
            "kubelet-reporter-plugin": {
                "content": [
                    {
                        "groupVersionKind": {
                            "group": "node.katalyst.kubewharf.io",
                            "version": "v1alpha1",
                            "kind": "CustomNodeResource",
                        },
                        "field": [{"fieldType": 1, "fieldName": "TopologyZone", "value": zone}],
                    }
                ]
            }
        },
        "Checksum": 3232077862,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def test_a_katalyst_checkpoint_reads_as_corrupt_is_moved_aside_and_we_start_fresh(
    store: CheckpointStore,
) -> None:
    katalyst = _katalyst_reporter_checkpoint()
    store.directory.mkdir(parents=True)
    (store.directory / "reporter_manager_checkpoint").write_bytes(katalyst)
    before = _corrupt_count("reporter_manager_checkpoint")

    result = store.read("reporter_manager_checkpoint")

    assert result.state is CheckpointState.CORRUPT
    assert result.reason is not None and "JSON" in result.reason
    assert result.moved_to is not None and result.moved_to.read_bytes() == katalyst
    assert _corrupt_count("reporter_manager_checkpoint") == before + 1
    assert store.read("reporter_manager_checkpoint").state is CheckpointState.NOT_FOUND
    store.write("reporter_manager_checkpoint", b"ours")
    assert store.read("reporter_manager_checkpoint").data == b"ours"


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (b"", "empty file"),
        (b"nodeagent-chec", "no complete header line (truncated)"),
        (b"nodeagent-checkpoint 1 sha256=", "no complete header line (truncated)"),
        (b"PK\x03\x04", "not a nodeagent checkpoint (unknown header)"),
        (b"nodeagent-checkpoint 1 sha256=00 length=0\n", "malformed header line"),
        (encode(b"x").replace(b" 1 ", b" 3 ", 1), "unsupported format version 3"),
        (encode(b"x").replace(b" 1 ", b" 2 ", 1), "format version 2 without a node"),
        (encode(b"x", "node-a").replace(b" 2 ", b" 1 ", 1), "format version 1 with a node"),
        (encode(b"xy")[:-1], "payload is 1 bytes, the header says 2"),
    ],
)
def test_decode_names_what_is_wrong(blob: bytes, reason: str) -> None:
    with pytest.raises(CorruptCheckpoint) as raised:
        decode(blob)
    assert raised.value.reason == reason


def test_directory_is_created_private(store: CheckpointStore) -> None:
    store.write("a", b"x")
    assert os.stat(store.directory).st_mode & 0o777 == 0o700


def test_a_leftover_that_cannot_be_removed_is_reported_and_the_checkpoint_still_read(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A read-only state directory holding the temp file of a killed write (issue 29 item 9):
    # the sweep's EROFS used to be raised out of the read, and out of the agent's boot.
    store.write("a", b"good")
    leftover = store.directory / ".a.abcd1234.tmp"
    leftover.write_bytes(b"half a checkpoint")
    unlink = Path.unlink

    def refuse(self: Path, missing_ok: bool = False) -> None:
        if self == leftover:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        unlink(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse)
    fresh = CheckpointStore(store.directory)
    before = _metric("nodeagent_checkpoint_sweep_failures_total", "a")
    with caplog.at_level(logging.ERROR, logger="nodeagent.checkpoint"):
        assert fresh.read("a").data == b"good"
        assert fresh.read("a").data == b"good"  # swept once: reported once
    assert _metric("nodeagent_checkpoint_sweep_failures_total", "a") == before + 1
    assert caplog.text.count("leftover checkpoint temp file not removed") == 1
    assert fresh.problem == f"leftover temp file {leftover} not removed: Read-only file system"
    assert leftover.exists()
    monkeypatch.undo()
    fresh.write("a", b"newer")  # the directory is writable again: nothing left to report
    assert fresh.problem is None
