"""Warning Events on the Node for inventory and publishing problems a plugin author must see (an
attribute that cannot be published, a rejected inventory, a pool refused). They go through the
process's `EventRecorder` (`kube/events.py`: aggregated, bounded, best effort); `NodeEvents` is
that recorder with the publisher's own client, for a publisher built without one."""

from __future__ import annotations

from nodeagent.kube import EventRecorder, EventSink

__all__ = ["EventSink", "NodeEvents"]


class NodeEvents(EventRecorder):
    def __init__(
        self, client: EventSink, node_name: str, *, backlog: int = 100, repeat_after: float = 600.0
    ) -> None:
        super().__init__(node_name, client=client, backlog=backlog, window=repeat_after)
