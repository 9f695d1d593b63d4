"""A change the report store took in but had not checkpointed yet when the agent stopped (a
write in progress in its worker thread, another change meanwhile) is written on the way out:
otherwise the next start restores an older state than the CNR holds and its first sync writes
the difference, a CNR write at a restart with unchanged plugins (issue 21 s5)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio.testing

from nodeagent.checkpoint import CheckpointStore
from nodeagent.core.latest import LatestValue
from nodeagent.reporter.settings import ReporterSettings
from nodeagent.reporter.store import CHECKPOINT_NAME, ReportStore, decode_checkpoint
from tests.unit.reporter.test_store import GRACE, Channel, Clock, settle

T = TypeVar("T")


async def test_a_change_pending_at_stop_is_checkpointed(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    checkpoints = CheckpointStore(tmp_path)
    release = trio.Event()
    writes: list[bytes] = []

    async def slow_io(fn: Callable[..., T], *args: Any) -> T:
        if fn == checkpoints.write and not release.is_set():
            writes.append(args[1])
            await release.wait()  # the first write is still in its worker thread
        return fn(*args)

    channel = Channel()
    store = ReportStore(
        channel.latest,
        LatestValue(ReporterSettings(grace=GRACE, sync_interval=5.0)),
        checkpoints,
        clock=Clock(),
        run_sync=slow_io,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        channel.send("a", 1)
        await settle()
        assert len(writes) == 1  # "a" on its way to disk
        channel.send("b", 2)  # taken in, not yet checkpointed
        await settle()
        assert set(store.latest.value) == {"a", "b"}
        release.set()
        nursery.cancel_scope.cancel()  # SIGTERM: the component is cancelled
    read = checkpoints.read(CHECKPOINT_NAME)
    assert read.data is not None
    assert set(decode_checkpoint(read.data)) == {"a", "b"}
