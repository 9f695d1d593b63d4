"""Properties of the checkpoint store: random contents round-trip; every truncation and every
single-byte change of a written file reads as corrupt; a writer killed (SIGKILL) at any point
leaves the old or the new checkpoint, never neither."""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.checkpoint import CheckpointState, CheckpointStore
from nodeagent.checkpoint.format import CorruptCheckpoint, decode
from tests.unit.checkpoint import kill_writer

# Every example writes and fsyncs files: a shared, busy disk must not fail it on time.
io_settings = settings(deadline=None)

names = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,30}[A-Za-z0-9])?", fullmatch=True).filter(
    lambda name: ".corrupt-" not in name
)


def _written(content: bytes, directory: Path) -> tuple[CheckpointStore, Path, bytes]:
    store = CheckpointStore(directory)
    store.write("c", content)
    path = directory / "c"
    return store, path, path.read_bytes()


def _assert_corrupt(store: CheckpointStore, path: Path, blob: bytes) -> None:
    path.write_bytes(blob)
    result = store.read("c")
    assert result.state is CheckpointState.CORRUPT, blob
    assert result.moved_to is not None and result.moved_to.read_bytes() == blob
    assert not path.exists()


@io_settings
@given(name=names, content=st.binary(max_size=4096))
def test_random_contents_round_trip(name: str, content: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = CheckpointStore(Path(directory))
        store.write(name, content)
        result = CheckpointStore(Path(directory)).read(name)
        assert result.state is CheckpointState.FOUND
        assert result.data == content


@io_settings
@given(content=st.binary(max_size=512), data=st.data())
def test_a_truncated_file_reads_as_corrupt(content: bytes, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store, path, blob = _written(content, Path(directory))
        cut = data.draw(st.integers(0, len(blob) - 1), label="cut")
        _assert_corrupt(store, path, blob[:cut])


@io_settings
@given(content=st.binary(max_size=512), data=st.data())
def test_a_file_with_one_byte_changed_reads_as_corrupt(content: bytes, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store, path, blob = _written(content, Path(directory))
        position = data.draw(st.integers(0, len(blob) - 1), label="position")
        xor = data.draw(st.integers(1, 255), label="xor")
        changed = bytearray(blob)
        changed[position] ^= xor
        _assert_corrupt(store, path, bytes(changed))


def test_every_truncation_and_every_byte_change_of_a_small_file_is_detected(
    tmp_path: Path,
) -> None:
    store, path, blob = _written(b'{"plugin": "a", "fields": [1, 2]}', tmp_path)
    for cut in range(len(blob)):
        _assert_corrupt(store, path, blob[:cut])
    for position in range(len(blob)):
        # Every other value of every byte through the decoder; one per position through the
        # store's whole read path (move aside included).
        for value in range(256):
            if value != blob[position]:
                changed = blob[:position] + bytes([value]) + blob[position + 1 :]
                try:
                    decode(changed)
                except CorruptCheckpoint:
                    continue
                raise AssertionError(f"byte {position} = {value} not detected")
        _assert_corrupt(
            store, path, blob[:position] + bytes([blob[position] ^ 0xFF]) + blob[position + 1 :]
        )
    # Appending is caught too (the header's length).
    _assert_corrupt(store, path, blob + b"\n")


def _run_writer(directory: Path, mode: str, delay: float | None) -> None:
    """Start the writer, let it run `delay` seconds into its loop (None: until it dies), kill."""
    child = subprocess.Popen(
        [sys.executable, kill_writer.__file__, str(directory), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        if delay is not None:
            # Not a synchronisation: the random point of the write loop at which it dies.
            time.sleep(delay)
            child.kill()
        assert child.wait(timeout=10) == -9
    finally:
        child.kill()
        child.wait()


def _read_generation(directory: Path) -> int:
    result = CheckpointStore(directory).read(kill_writer.NAME)
    assert result.state is CheckpointState.FOUND, result
    generation = kill_writer.generation_of(result.data)
    # The new store removed the killed writer's temp file, if it left one.
    assert [p.name for p in directory.iterdir()] == [kill_writer.NAME]
    return generation


def test_a_writer_killed_at_a_random_point_leaves_the_old_or_the_new_checkpoint(
    tmp_path: Path,
) -> None:
    rng = random.Random()
    CheckpointStore(tmp_path).write(kill_writer.NAME, kill_writer.payload(0))
    generations = [0]
    for _ in range(20):
        # Each writer continues from the generation it finds: it leaves that one (old) or a
        # later complete one (new), never a torn, missing or older file.
        _run_writer(tmp_path, "loop", rng.uniform(0, 0.03))
        generations.append(_read_generation(tmp_path))
        assert generations[-1] >= generations[-2], generations
    # The kills landed inside the loops (not all before their first write).
    assert generations[-1] > 0, generations


def test_a_writer_killed_before_the_rename_leaves_the_old_checkpoint(tmp_path: Path) -> None:
    CheckpointStore(tmp_path).write(kill_writer.NAME, kill_writer.payload(0))
    _run_writer(tmp_path, "before-rename", None)
    assert any(p.name.startswith(".") for p in tmp_path.iterdir())  # its temp file
    assert _read_generation(tmp_path) == 0


def test_a_writer_killed_after_the_rename_leaves_the_new_checkpoint(tmp_path: Path) -> None:
    CheckpointStore(tmp_path).write(kill_writer.NAME, kill_writer.payload(0))
    _run_writer(tmp_path, "after-rename", None)
    assert _read_generation(tmp_path) == 1
