"""Child process of the kill tests: writes checkpoint generations until it is killed.

    python kill_writer.py <directory> loop             write generation n+1, n+2, ... forever,
                                                       n the generation found in the directory
    python kill_writer.py <directory> before-rename    die (SIGKILL) after the temp file is
                                                       written and fsynced, before the rename
    python kill_writer.py <directory> after-rename     die after the rename, before the
                                                       directory fsync

It prints "ready" once the store exists and the loop or the write is about to start.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from nodeagent.checkpoint import CheckpointStore

NAME = "generations"


def payload(generation: int) -> bytes:
    """Large enough that a write takes several syscalls; every byte depends on the generation."""
    return f"generation {generation}\n".encode() + bytes([generation % 251]) * 65536


def generation_of(data: bytes | None) -> int:
    assert data is not None
    generation = int(data.split(b"\n", 1)[0].removeprefix(b"generation "))
    assert data == payload(generation)
    return generation


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(directory: Path, mode: str) -> None:
    store = CheckpointStore(directory)
    if mode == "before-rename":
        os.replace = lambda *args, **kwargs: _die()
    elif mode == "after-rename":
        real_replace = os.replace

        def replace_then_die(src: str, dst: str) -> None:
            real_replace(src, dst)
            _die()

        os.replace = replace_then_die  # type: ignore[assignment]
    print("ready", flush=True)
    generation = generation_of(store.read(NAME).data) + 1
    while True:
        store.write(NAME, payload(generation))
        generation += 1


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
