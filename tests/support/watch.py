"""A raw watch sink for tests and benches that look at individual events."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import trio

from nodeagent.kube.watch import FeedResult


class EventSink:
    """Implements the client's `WatchSink`: decodes each watch event and hands it to `on_event`.

    `listed` is set once the first list is complete; `arrived` is set (and replaced) after every
    chunk that carried events; `received_at` is the `perf_counter` time the last chunk arrived.
    """

    def __init__(self) -> None:
        self.listed = trio.Event()
        self.arrived = trio.Event()
        self.received_at = 0.0
        self._buffer = b""

    def on_event(self, type: str, obj: dict[str, Any]) -> None:
        """Called for every event (ADDED, MODIFIED, DELETED, BOOKMARK) in arrival order."""

    async def begin_list(self) -> None:
        pass

    async def list_page(self, page: bytes) -> None:
        pass

    async def end_list(self, resource_version: str) -> None:
        self.listed.set()

    async def feed(self, chunk: bytes) -> FeedResult:
        self.received_at = time.perf_counter()
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        rv = None
        for line in lines:
            if not line.strip():
                continue
            event = msgspec.json.decode(line)
            rv = event["object"]["metadata"].get("resourceVersion", rv)
            self.on_event(event["type"], event["object"])
        if lines:
            self.arrived.set()
            self.arrived = trio.Event()
        return FeedResult(rv, None, len(lines))

    async def end_stream(self) -> None:
        self._buffer = b""
