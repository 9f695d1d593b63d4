"""Node Warning events: deduplication, a full backlog, failed sends."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from nodeagent.kube.errors import Forbidden
from nodeagent.resources import metrics
from nodeagent.resources.events import NodeEvents


class Sink:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.fail = fail

    async def create(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes:
        if self.fail:
            raise Forbidden(403, "Forbidden", "no events for you")
        self.sent.append(obj)
        return b"{}"


async def test_duplicates_wait_for_repeat_after(autojump_clock: Any) -> None:
    sink = Sink()
    events = NodeEvents(sink, "node-a", repeat_after=60.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(events.run)
        events.warn("R", "m")
        events.warn("R", "m")
        events.warn("R", "other")
        await trio.testing.wait_all_tasks_blocked()
        assert [e["message"] for e in sink.sent] == ["m", "other"]
        await trio.sleep(61)
        events.warn("R", "m")
        await trio.testing.wait_all_tasks_blocked()
        assert len(sink.sent) == 3
        nursery.cancel_scope.cancel()


async def test_full_backlog_drops_and_failures_are_counted(autojump_clock: Any) -> None:
    events = NodeEvents(Sink(fail=True), "node-a", backlog=1)
    dropped = metrics.EVENTS.labels("dropped")._value.get()
    failed = metrics.EVENTS.labels("failed")._value.get()
    events.warn("R", "a")
    events.warn("R", "b")  # backlog full: dropped
    assert metrics.EVENTS.labels("dropped")._value.get() == dropped + 1
    async with trio.open_nursery() as nursery:
        nursery.start_soon(events.run)
        await trio.testing.wait_all_tasks_blocked()
        assert metrics.EVENTS.labels("failed")._value.get() == failed + 1
        nursery.cancel_scope.cancel()
