from __future__ import annotations

import trio

from nodeagent.core.latest import LatestValue


async def test_readers_wait_for_a_newer_version_and_skip_intermediate_values(
    autojump_clock: trio.abc.Clock,
) -> None:
    latest: LatestValue[str] = LatestValue("initial")
    seen: list[tuple[int, str]] = []
    first_seen = trio.Event()

    async def reader(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        version = 0
        task_status.started()
        while len(seen) < 2:
            version, value = await latest.wait_newer(version)
            seen.append((version, value))
            first_seen.set()
            await trio.sleep(1)  # a slow consumer: values set meanwhile are coalesced

    async with trio.open_nursery() as nursery:
        await nursery.start(reader)
        latest.set("a")
        await first_seen.wait()
        latest.set("b")
        latest.set("c")  # b is superseded before the reader looks again
    assert seen == [(1, "a"), (3, "c")]
    assert latest.value == "c" and latest.version == 3


async def test_wait_newer_returns_at_once_when_already_newer() -> None:
    latest: LatestValue[int] = LatestValue(0)
    latest.set(5)
    with trio.fail_after(1):
        assert await latest.wait_newer(0) == (1, 5)
