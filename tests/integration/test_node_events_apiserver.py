"""The process's Event recorder against a real kube-apiserver, as the node's own identity (Node
authorizer + NodeRestriction): Events recorded before the client exists land once it is
attached, and a repeat is the same Event with a higher count."""

from __future__ import annotations

import uuid
from typing import Any

import trio

from nodeagent.kube import CORE_EVENTS, KubeClient
from nodeagent.kube.events import EventRecorder

WAIT = 30.0


async def node_events(admin: KubeClient, marker: str) -> list[dict[str, Any]]:
    events = await admin.list(CORE_EVENTS, "default", into=dict[str, Any])
    return [
        e
        for e in events.items
        if e["involvedObject"]["name"] == "node-a" and marker in e.get("message", "")
    ]


async def test_buffered_events_land_and_repeats_raise_the_count(
    admin_client: KubeClient, node_client: KubeClient
) -> None:
    marker = uuid.uuid4().hex
    recorder = EventRecorder(update_interval=0.2)
    recorder.warn("RecorderTest", f"first {marker}")
    recorder.normal("RecorderTest", f"second {marker}")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(recorder.run)
        recorder.attach(node_client, "node-a")
        with trio.fail_after(WAIT):
            while True:  # polling another process (the apiserver): no event to wait on
                found = await node_events(admin_client, marker)
                if len(found) == 2:
                    break
                await trio.sleep(0.05)
        by_message = {e["message"]: e for e in found}
        first = by_message[f"first {marker}"]
        assert (first["type"], first["reason"], first["count"]) == ("Warning", "RecorderTest", 1)
        assert first["source"] == {"component": "nodeagent", "host": "node-a"}
        assert by_message[f"second {marker}"]["type"] == "Normal"

        recorder.warn("RecorderTest", f"first {marker}")
        recorder.warn("RecorderTest", f"first {marker}")
        with trio.fail_after(WAIT):
            while True:
                found = await node_events(admin_client, marker)
                counts = {e["message"]: e["count"] for e in found}
                if counts[f"first {marker}"] == 3:
                    break
                await trio.sleep(0.05)
        # The same Event object, not a new one.
        assert len(found) == 2
        assert {e["metadata"]["name"] for e in found} >= {first["metadata"]["name"]}
        # The server stored the count before its answer reached the recorder, which counts the
        # post only then: cancelled now, it could still be waiting for that answer.
        with trio.fail_after(WAIT):
            while recorder.posted.get("RecorderTest", 0) < 3:  # noqa: ASYNC110 - no event for it
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert recorder.posted == {"RecorderTest": 3}
