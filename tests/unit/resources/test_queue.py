"""The per-pool work queue: deduplication, per-key backoff, re-runs of keys added while busy."""

from __future__ import annotations

from typing import Any

import trio

from nodeagent.resources.queue import WorkQueue


async def test_keys_are_deduplicated_and_served_in_time_order(autojump_clock: Any) -> None:
    q: WorkQueue[str] = WorkQueue(1.0, 8.0)
    q.add("b", 2.0)
    q.add("a")
    q.add("a")
    q.add("b", 5.0)  # later than already queued: no effect
    assert len(q) == 2
    assert await q.get() == "a"
    t0 = trio.current_time()
    assert await q.get() == "b"
    assert trio.current_time() - t0 == 2.0
    assert len(q) == 0


async def test_failures_back_off_exponentially_and_success_resets(autojump_clock: Any) -> None:
    q: WorkQueue[str] = WorkQueue(1.0, 4.0)
    q.add("k")
    delays = []
    for _ in range(4):
        key = await q.get()
        delays.append(q.done(key, failed=True))
    assert delays == [1.0, 2.0, 4.0, 4.0]
    assert q.failures("k") == 4
    key = await q.get()
    assert q.done(key) is None and q.failures("k") == 0


async def test_a_key_added_while_processing_runs_again_after_done(autojump_clock: Any) -> None:
    q: WorkQueue[str] = WorkQueue(1.0, 4.0)
    q.add("k")
    key = await q.get()
    q.add("k")
    assert len(q) == 1
    q.done(key)
    t0 = trio.current_time()
    assert await q.get() == "k"
    assert trio.current_time() == t0


async def test_wait_idle_returns_once_nothing_is_queued_or_processing(
    autojump_clock: Any,
) -> None:
    q: WorkQueue[str] = WorkQueue(1.0, 4.0)
    await q.wait_idle()  # idle from the start
    q.add("k", 3.0)
    idle = trio.Event()

    async def waiter() -> None:
        await q.wait_idle()
        idle.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        key = await q.get()
        assert not idle.is_set()
        q.done(key)
        await idle.wait()
    assert trio.current_time() == 3.0
