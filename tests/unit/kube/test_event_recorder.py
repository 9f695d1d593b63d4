"""The process's Event recorder: buffered until attached, repeats aggregated into a count, a
bounded backlog, failures counted and not retried; Events on the Node by default, on another
object (the rollout controller's NodeAgentConfigs) when a record names it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing
from prometheus_client import CollectorRegistry, Counter

from nodeagent.kube.errors import Forbidden, NotFound
from nodeagent.kube.events import NODE_EVENTS, EventRecorder, EventSink, Involved
from tests.support.nodeagentconfig import NAC
from tests.support.resources import PODS


class Sink:
    """Creates (named) and patches Events; `fail` refuses every request, `gone` answers
    patches 404."""

    def __init__(self, namespace: str = "default") -> None:
        self.namespace = namespace  # where every request must go
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.fail = False
        self.gone = False

    async def create(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes:
        assert namespace == self.namespace
        if self.fail:
            raise Forbidden(403, "Forbidden", "no events for you")
        self.created.append(obj)
        prefix = obj["metadata"]["generateName"]
        return json.dumps({"metadata": {"name": f"{prefix}{len(self.created)}"}}).encode()

    async def patch(
        self, resource: Any, name: str, patch: Any, namespace: str | None = None
    ) -> bytes:
        assert namespace == self.namespace
        if self.gone:
            raise NotFound(404, "NotFound", "events not found")
        self.patched.append((name, patch))
        return b"{}"


class CreateOnly:
    """A sink without `patch`."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def create(self, resource: Any, obj: Any, namespace: str | None = None) -> bytes:
        self.created.append(obj)
        return json.dumps({"metadata": {"name": "e"}}).encode()


def count(result: str) -> float:
    return NODE_EVENTS.labels(result)._value.get()


@asynccontextmanager
async def running(recorder: EventRecorder) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(recorder.run)
        yield
        nursery.cancel_scope.cancel()


def wall() -> float:
    return 1_800_000_000.0 + trio.current_time()


async def test_events_wait_for_the_client_then_are_posted_with_their_count(
    autojump_clock: trio.abc.Clock,
) -> None:
    recorder = EventRecorder(clock=wall)
    sink = Sink()
    recorder.warn("Rolled", "rolled back")
    recorder.warn("Rolled", "rolled back")
    recorder.normal("Applied", "applied")
    async with running(recorder):
        await trio.sleep(100)  # no client: nothing is lost, nothing posted
        assert not recorder.attached
        recorder.attach(sink, "node-a")
        await trio.testing.wait_all_tasks_blocked()
    first, second = sink.created
    assert first["involvedObject"] == {"kind": "Node", "name": "node-a", "uid": "node-a"}
    assert first["metadata"] == {"generateName": "node-a."}
    assert (first["type"], first["reason"], first["count"]) == ("Warning", "Rolled", 2)
    assert first["firstTimestamp"] == first["lastTimestamp"] == "2027-01-15T08:00:00Z"
    assert first["source"] == {"component": "nodeagent", "host": "node-a"}
    assert (second["type"], second["reason"], second["count"]) == ("Normal", "Applied", 1)
    assert recorder.posted == {"Rolled": 1, "Applied": 1}


async def test_repeats_in_the_window_update_the_count_at_most_once_per_interval(
    autojump_clock: trio.abc.Clock,
) -> None:
    sink = Sink()
    recorder = EventRecorder("node-a", client=sink, window=600, update_interval=60, clock=wall)
    updated = count("updated")
    async with running(recorder):
        recorder.warn("R", "m")
        await trio.testing.wait_all_tasks_blocked()
        assert len(sink.created) == 1
        for _ in range(5):  # a storm of the same warning: one PATCH
            await trio.sleep(1)
            recorder.warn("R", "m")
        await trio.testing.wait_all_tasks_blocked()
        assert sink.patched == []
        await trio.sleep(60)
        assert sink.patched == [("node-a.1", {"count": 6, "lastTimestamp": "2027-01-15T08:00:05Z"})]
        assert count("updated") == updated + 1
        # Past the window since the last occurrence: a new Event.
        await trio.sleep(600)
        recorder.warn("R", "m")
        await trio.testing.wait_all_tasks_blocked()
    assert [e["count"] for e in sink.created] == [1, 1]
    assert len(sink.patched) == 1
    assert recorder.posted == {"R": 3}


async def test_an_event_the_server_dropped_is_created_again(
    autojump_clock: trio.abc.Clock,
) -> None:
    sink = Sink()
    recorder = EventRecorder("node-a", client=sink, update_interval=10)
    async with running(recorder):
        recorder.warn("R", "m")
        await trio.testing.wait_all_tasks_blocked()
        sink.gone = True
        recorder.warn("R", "m")
        await trio.sleep(11)
    assert [e["count"] for e in sink.created] == [1, 2]
    assert sink.patched == []


async def test_a_full_backlog_drops_and_a_failed_post_is_not_retried(
    autojump_clock: trio.abc.Clock,
) -> None:
    sink = Sink()
    sink.fail = True
    recorder = EventRecorder("node-a", backlog=2)
    dropped, failed = count("dropped"), count("failed")
    for message in "abc":
        recorder.warn("R", message)
    assert count("dropped") == dropped + 1
    recorder.attach(sink)
    async with running(recorder):
        await trio.testing.wait_all_tasks_blocked()
        assert count("failed") == failed + 2
        sink.fail = False
        recorder.warn("R", "a")  # within the window of a failed post: only counted
        await trio.sleep(1000)
        assert sink.created == [] and sink.patched == []
        recorder.warn("R", "a")  # past it: a new Event
        await trio.testing.wait_all_tasks_blocked()
    assert [e["message"] for e in sink.created] == ["a"]


async def test_a_sink_without_patch_gets_no_updates(autojump_clock: trio.abc.Clock) -> None:
    sink = CreateOnly()
    recorder = EventRecorder("node-a", client=sink, update_interval=1)
    async with running(recorder):
        recorder.warn("R", "m")
        await trio.testing.wait_all_tasks_blocked()
        recorder.warn("R", "m")
        await trio.sleep(10)
    assert len(sink.created) == 1


async def test_messages_are_cut_to_the_api_limit(autojump_clock: trio.abc.Clock) -> None:
    sink: EventSink = Sink()
    recorder = EventRecorder("node-a", client=sink)
    async with running(recorder):
        recorder.warn("R", "x" * 5000)
        await trio.testing.wait_all_tasks_blocked()
    assert isinstance(sink, Sink)
    assert len(sink.created[0]["message"]) == 1024


def test_events_recorded_before_the_event_loop_runs_are_posted() -> None:
    """The dynamic-config controller boots (and may roll back) before `trio.run`: what it
    records then is kept and posted once the loop runs and the client is attached."""
    sink = Sink()
    recorder = EventRecorder("node-a")
    recorder.warn("ConfigRolledBack", "rolled back at start")
    recorder.warn("ConfigRolledBack", "rolled back at start")

    async def main() -> None:
        recorder.attach(sink)
        async with running(recorder):
            await trio.testing.wait_all_tasks_blocked()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    (event,) = sink.created
    assert (event["reason"], event["count"]) == ("ConfigRolledBack", 2)


def test_a_recorder_turned_off_keeps_nothing() -> None:
    """Standalone: a dynconfig rollback recorded at boot, and everything after, is neither kept
    nor counted as dropped."""
    recorder = EventRecorder("node-a", backlog=1)
    recorder.warn("ConfigRolledBack", "rolled back at start")
    recorder.off()
    dropped = count("dropped")
    for message in "abc":
        recorder.warn("R", message)
    assert count("dropped") == dropped
    sink = Sink()

    async def main() -> None:
        recorder.attach(sink)
        async with running(recorder):
            await trio.testing.wait_all_tasks_blocked()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sink.created == []


ROLLOUT = "nodeagent-rollout-controller"


def nac(name: str, uid: str, version: str) -> Involved:
    obj = {"metadata": {"name": name, "uid": uid, "resourceVersion": version}}
    return Involved.of(NAC, obj)


async def test_events_on_a_cluster_scoped_object_live_in_default_and_aggregate_per_object(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The rollout controller's shape: no Node, its own source and counter; the same message on
    two objects is two Events, its repeat on one a count on that one's Event."""
    counter = Counter("test_rollout_events_total", "t", ["result"], registry=CollectorRegistry())
    sink = Sink()
    recorder = EventRecorder(
        client=sink, component=ROLLOUT, host="ctl-1", counter=counter, clock=wall
    )
    node_created = count("created")
    async with running(recorder):
        recorder.record("Normal", "WaveStarted", "wave 1", about=nac("web", "u1", "7"))
        recorder.record("Normal", "WaveStarted", "wave 1", about=nac("db", "u2", "3"))
        await trio.testing.wait_all_tasks_blocked()
        # A later resourceVersion of the same object: the same series.
        recorder.record("Normal", "WaveStarted", "wave 1", about=nac("web", "u1", "8"))
        await trio.sleep(61)
    web, db = sink.created
    assert web["involvedObject"] == {
        "apiVersion": "nodeagent.io/v1alpha1",
        "kind": "NodeAgentConfig",
        "name": "web",
        "uid": "u1",
        "resourceVersion": "7",
    }
    assert web["metadata"] == {"generateName": "web."}
    assert db["involvedObject"]["name"] == "db" and db["metadata"] == {"generateName": "db."}
    assert web["source"] == {"component": ROLLOUT, "host": "ctl-1"}
    assert (web["reportingComponent"], web["reportingInstance"]) == (ROLLOUT, "ctl-1")
    assert [(e["reason"], e["count"]) for e in sink.created] == [("WaveStarted", 1)] * 2
    assert sink.patched == [("web.1", {"count": 2, "lastTimestamp": "2027-01-15T08:00:00Z"})]
    assert recorder.posted == {"WaveStarted": 3}
    # Counted on the counter given, not on the Node's.
    assert counter.labels("created")._value.get() == 2
    assert counter.labels("aggregated")._value.get() == 1
    assert counter.labels("updated")._value.get() == 1
    assert count("created") == node_created


async def test_events_on_a_namespaced_object_live_in_its_namespace(
    autojump_clock: trio.abc.Clock,
) -> None:
    sink = Sink(namespace="team-a")
    recorder = EventRecorder("node-a", client=sink, update_interval=1)
    pod = {"metadata": {"name": "p", "namespace": "team-a", "uid": "u", "resourceVersion": "1"}}
    async with running(recorder):
        recorder.record("Warning", "R", "m", about=Involved.of(PODS, pod))
        await trio.testing.wait_all_tasks_blocked()
        recorder.record("Warning", "R", "m", about=Involved.of(PODS, pod))
        await trio.sleep(2)
    (event,) = sink.created
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team-a",
        "name": "p",
        "uid": "u",
        "resourceVersion": "1",
    }
    # Without a host of its own: the node's name, as the Node's Events.
    assert event["source"] == {"component": "nodeagent", "host": "node-a"}
    assert [name for name, _ in sink.patched] == ["p.1"]
