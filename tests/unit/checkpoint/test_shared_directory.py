"""Two stores share one directory (the agent's dynconfig and reporter stores share
<state_dir>/checkpoints), and a state directory can be reused under another node name (a renamed
node, a cloned disk image); issue 21, section 5:

- a store's first operation swept every leftover temp file of the directory, the other store's
  write in progress included, whose rename then failed (FileNotFoundError, the old checkpoint
  kept): each store sweeps only the temp files of the names it uses;
- checkpoints record the node that wrote them, and a store refuses one of another node
  (FOREIGN: logged, counted in nodeagent_checkpoint_foreign_total{name}), so that node's
  last-known-good or plugin reports never run here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import msgspec
import pytest
import trio.testing
from prometheus_client import REGISTRY

from nodeagent.checkpoint import CheckpointState, CheckpointStore
from nodeagent.checkpoint import format as checkpoint_format
from nodeagent.dynconfig.boot import boot
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.dynconfig.state import CHECKPOINT_NAME, Known, State
from tests.support.fake_dynconfig import LOCAL, build, hasher
from tests.unit.reporter.test_store import Channel, running, settle


def test_a_store_does_not_sweep_another_stores_write_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "checkpoints"
    reporter = CheckpointStore(directory)
    dynconfig = CheckpointStore(directory)
    reporter.write("reporter_manager_checkpoint", b"old")
    in_fsync, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def paused_fsync(fd: int) -> None:
        if threading.current_thread().name == "writer":
            in_fsync.set()
            assert release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", paused_fsync)  # the store's module uses os.fsync
    errors: list[BaseException] = []

    def write() -> None:
        try:
            reporter.write("reporter_manager_checkpoint", b"new")
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write, name="writer")
    writer.start()
    assert in_fsync.wait(10)  # the temp file is written, not yet renamed
    # The other store's first operation (the agent's start-up: the dynconfig boot).
    assert dynconfig.read("dynconfig_state").state is CheckpointState.NOT_FOUND
    release.set()
    writer.join(10)
    assert errors == []
    assert reporter.read("reporter_manager_checkpoint").data == b"new"


def test_leftovers_of_a_name_are_swept_by_its_first_operation(tmp_path: Path) -> None:
    (tmp_path / ".a.k3j_9x0q.tmp").write_bytes(b"half a write of a")
    (tmp_path / ".b.k3j_9x0q.tmp").write_bytes(b"half a write of b")
    store = CheckpointStore(tmp_path)
    store.read("a")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".b.k3j_9x0q.tmp"]
    store.write("b", b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def _foreign(name: str) -> float:
    return REGISTRY.get_sample_value("nodeagent_checkpoint_foreign_total", {"name": name}) or 0.0


def test_a_checkpoint_of_another_node_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    CheckpointStore(tmp_path, node="node-a").write("dynconfig_state", b"{}")
    assert checkpoint_format.decode_with_node((tmp_path / "dynconfig_state").read_bytes()) == (
        b"{}",
        "node-a",
    )
    before = _foreign("dynconfig_state")
    with caplog.at_level(logging.WARNING):
        read = CheckpointStore(tmp_path, node="node-b").read("dynconfig_state")
    assert read.state is CheckpointState.FOREIGN and read.data is None
    assert read.reason is not None and "node-a" in read.reason and "node-b" in read.reason
    assert _foreign("dynconfig_state") == before + 1
    assert "checkpoint of another node" in caplog.text
    # Left as it is (not moved aside): the next write of this node replaces it.
    assert (tmp_path / "dynconfig_state").exists()
    assert CheckpointStore(tmp_path, node="node-a").read("dynconfig_state").data == b"{}"
    CheckpointStore(tmp_path, node="node-b").write("dynconfig_state", b"[]")
    assert CheckpointStore(tmp_path, node="node-b").read("dynconfig_state").data == b"[]"


def test_a_checkpoint_without_a_node_is_read(tmp_path: Path) -> None:
    """Written by an older agent (format 1, no node): taken, an upgrade keeps its state."""
    (tmp_path / "a").write_bytes(checkpoint_format.encode(b"old"))
    assert CheckpointStore(tmp_path, node="node-b").read("a").data == b"old"
    assert checkpoint_format.decode(checkpoint_format.encode(b"old")) == b"old"


def test_a_changed_node_byte_reads_as_corrupt(tmp_path: Path) -> None:
    CheckpointStore(tmp_path, node="node-a").write("a", b"x")
    blob = (tmp_path / "a").read_bytes()
    (tmp_path / "a").write_bytes(blob.replace(b"node-a", b"node-b", 1))
    assert CheckpointStore(tmp_path, node="node-b").read("a").state is CheckpointState.CORRUPT


def test_every_truncation_and_byte_change_of_a_node_checkpoint_is_detected(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path, node="node-a.example")
    store.write("c", b'{"lkg": "x"}')
    blob = (tmp_path / "c").read_bytes()
    for cut in range(len(blob)):
        (tmp_path / "c").write_bytes(blob[:cut])
        assert store.read("c").state is CheckpointState.CORRUPT, blob[:cut]
    for position in range(len(blob)):
        changed = bytearray(blob)
        changed[position] ^= 0x01
        (tmp_path / "c").write_bytes(bytes(changed))
        # Corrupt, never FOUND nor taken for another node's.
        assert store.read("c").state is CheckpointState.CORRUPT, bytes(changed)


async def test_the_reporter_restores_nothing_of_another_node(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    checkpoints = CheckpointStore(tmp_path, node="node-a")
    channel = Channel()
    async with running(channel, checkpoints) as store:
        channel.send("a", 1)
        await settle()
        await store.checkpoint_synced()
    # The disk image cloned to node-b: node-a's plugin reports are not restored there.
    async with running(Channel(), CheckpointStore(tmp_path, node="node-b")) as store:
        assert dict(store.latest.value) == {}
    async with running(Channel(), CheckpointStore(tmp_path, node="node-a")) as store:
        assert set(store.latest.value) == {"a"}


def test_dynconfig_boots_nothing_of_another_node(tmp_path: Path) -> None:
    lkg = Known(hash=hasher({"interval": 7}), name="fleet", config={"interval": 7})
    state = State(lkg=lkg, confirmed_at=time.time())
    CheckpointStore(tmp_path, node="node-a").write(CHECKPOINT_NAME, msgspec.json.encode(state))
    for node, interval in (("node-b", LOCAL["interval"]), ("node-a", 7)):
        booted = boot(DynconfigSettings(), CheckpointStore(tmp_path, node=node), build)
        assert booted.config["interval"] == interval, node
    assert (
        "another node"
        in boot(DynconfigSettings(), CheckpointStore(tmp_path, node="node-b"), build).reason
    )
