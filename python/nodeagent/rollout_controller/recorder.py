"""Events on NodeAgentConfigs, posted in the background (client-go tools/record style: recording
never blocks the controller's step; a failed post is logged and counted, not retried).

The plan gives each transition's Events once (a replan from the stored status gives none), and
the controller records them only after the status holding that transition was written, so a
restarted controller or a new leader never posts them twice. No aggregation is needed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import trio

from nodeagent.kube import CORE_EVENTS, EventSink, KubeError
from nodeagent.log import get_logger
from nodeagent.rollout.plan import Event
from nodeagent.rollout_controller import metrics

log = get_logger(__name__)

__all__ = ["COMPONENT", "EventRecorder"]

COMPONENT = "nodeagent-rollout-controller"
BACKLOG = 1000
# Events of cluster-scoped objects live in "default", as client-go's recorder puts them.
NAMESPACE = "default"


@dataclass(frozen=True, slots=True)
class _Pending:
    involved: dict[str, Any]
    event: Event
    at: float


class EventRecorder:
    def __init__(self, client: EventSink, *, identity: str = "") -> None:
        self._client = client
        self._identity = identity
        self._send, self._receive = trio.open_memory_channel[_Pending](BACKLOG)
        self.posted: list[tuple[str, str]] = []  # (object, reason), for tests

    def record(self, obj: dict[str, Any], event: Event) -> None:
        meta = obj.get("metadata") or {}
        involved = {
            "apiVersion": obj.get("apiVersion", "nodeagent.io/v1alpha1"),
            "kind": obj.get("kind", "NodeAgentConfig"),
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        }
        try:
            self._send.send_nowait(_Pending(involved, event, time.time()))
        except trio.WouldBlock:
            metrics.EVENTS.labels(event.reason, "dropped").inc()
            log.warning("event dropped: backlog full", reason=event.reason)

    async def run(self) -> None:
        async for pending in self._receive:
            await self._post(pending)

    async def _post(self, pending: _Pending) -> None:
        event, involved = pending.event, pending.involved
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(pending.at))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}."},
            "involvedObject": involved,
            "reason": event.reason,
            "message": event.message[:1024],
            "type": event.type,
            "source": {"component": COMPONENT, "host": self._identity},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._identity,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
        }
        try:
            await self._client.create(CORE_EVENTS, body, NAMESPACE)
        except KubeError as exc:
            metrics.EVENTS.labels(event.reason, "failed").inc()
            log.warning("event not recorded", reason=event.reason, error=str(exc))
            return
        metrics.EVENTS.labels(event.reason, "ok").inc()
        self.posted.append((involved["name"], event.reason))
