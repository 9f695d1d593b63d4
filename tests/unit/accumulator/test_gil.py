"""The store parses with the GIL released: Trio keeps running while a worker thread feeds."""

from __future__ import annotations

import trio

from nodeagent._native import Store
from tests.unit.accumulator.helpers import event, obj


async def test_event_loop_runs_while_a_thread_parses() -> None:
    data = b"".join(
        event("ADDED", obj(f"o{i}", i + 1, data={"k": "x" * 900})) for i in range(100_000)
    )
    store = Store()
    ticks = 0
    done = False

    async def tick() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        result = await trio.to_thread.run_sync(store.feed, data)
        done = True
    assert result[2] == 100_000 and len(store) == 100_000
    # Had the parse held the GIL, the loop could not have run while it worked.
    assert ticks > 100
