"""Warning Events on the Node for inventory problems a plugin author must see (an attribute
that cannot be published, a rejected inventory). Best effort: sent from a background task,
deduplicated for `repeat_after` seconds, dropped (and counted) when the backlog is full, and a
failed send is logged and counted, never retried into a storm."""

from __future__ import annotations

from typing import Any, Protocol

import trio

from nodeagent.kube import CORE_EVENTS
from nodeagent.kube.errors import KubeError
from nodeagent.log import get_logger
from nodeagent.resources import metrics

log = get_logger(__name__)

__all__ = ["EventSink", "NodeEvents"]


class EventSink(Protocol):
    async def create(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes: ...


class NodeEvents:
    def __init__(
        self, client: EventSink, node_name: str, *, backlog: int = 100, repeat_after: float = 600.0
    ) -> None:
        self._client = client
        self._node = node_name
        self._repeat_after = repeat_after
        self._last: dict[tuple[str, str], float] = {}
        self._send, self._receive = trio.open_memory_channel[tuple[str, str]](backlog)

    def warn(self, reason: str, message: str) -> None:
        now = trio.current_time()
        key = (reason, message)
        if now - self._last.get(key, -self._repeat_after) < self._repeat_after:
            return
        try:
            self._send.send_nowait(key)
        except trio.WouldBlock:
            metrics.EVENTS.labels("dropped").inc()
            return
        self._last[key] = now

    async def run(self) -> None:
        async for reason, message in self._receive:
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{self._node}."},
                # As the kubelet does: node events live in "default", the node's UID is its name.
                "involvedObject": {"kind": "Node", "name": self._node, "uid": self._node},
                "reason": reason,
                "message": message[:1024],
                "type": "Warning",
                "source": {"component": "nodeagent", "host": self._node},
            }
            try:
                await self._client.create(CORE_EVENTS, body, "default")
            except KubeError as exc:
                metrics.EVENTS.labels("failed").inc()
                log.warning("event not recorded", reason=reason, error=str(exc))
                continue
            metrics.EVENTS.labels("sent").inc()
