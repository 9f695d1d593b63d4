"""The controller's writes, with a fake apiserver and Trio's autojump clock: a plan equal to the
stored status writes nothing; a change within --write-interval of the last write waits for its
end (one write carries both); a 409 reads the object again and replans; the plan's Events are
recorded only once their status is stored; only a leader writes."""

from __future__ import annotations

from typing import Any, cast

import msgspec
import trio
import trio.testing

from nodeagent.dynconfig.status import Condition, condition_patch
from nodeagent.kube import ClusterConfig, Conflict, Involved, KubeClient
from nodeagent.rollout.plan import Event
from nodeagent.rollout_controller import metrics
from nodeagent.rollout_controller.controller import Controller
from nodeagent.rollout_controller.observe import NodeView, Rollout, rollouts
from nodeagent.rollout_controller.settings import ControllerSettings

CONFIG = {"reporter": {"interval": 5.0}}


class Api:
    """One NodeAgentConfig's status subresource, as the apiserver keeps it."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.version = 1
        self.writes: list[dict[str, Any]] = []
        self.conflict_next = False

    async def update(
        self, resource: Any, obj: dict[str, Any], namespace: str | None = None, **kw: Any
    ) -> bytes:
        assert kw == {"subresource": "status"}
        if self.conflict_next or obj["metadata"]["resourceVersion"] != str(self.version):
            self.conflict_next = False
            self.version += 1  # someone else's write
            self.obj["metadata"]["resourceVersion"] = str(self.version)
            raise Conflict(409, "Conflict", "modified")
        self.version += 1
        self.obj = msgspec.json.decode(msgspec.json.encode(obj))
        self.obj["metadata"]["resourceVersion"] = str(self.version)
        self.writes.append(self.obj)
        return msgspec.json.encode(self.obj)

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> bytes:
        return msgspec.json.encode(self.obj)


def controller(api: Api, *, leading: bool = True) -> tuple[Controller, list[Event]]:
    client = KubeClient(ClusterConfig(server="https://127.0.0.1:1"))
    made = Controller(client, ControllerSettings(identity="t", metrics_address=""))
    made.client = cast(KubeClient, api)
    made.elector._holding = leading
    made.elector._renewed = trio.current_time() if leading else -1e9
    events: list[Event] = []

    def record(
        event_type: str, reason: str, message: str, *, about: Involved | None = None
    ) -> None:
        events.append(Event(event_type, reason, message))

    made.recorder.record = record  # type: ignore[method-assign]
    return made, events


def node(name: str, reason: str | None = None, hash_: str = "") -> NodeView:
    conditions = []
    if reason is not None:
        message = f"NodeAgentConfig web (hash {hash_}) something"
        conditions = condition_patch(Condition(True, reason, message), 0)["status"]["conditions"]
    raw = {"metadata": {"name": name}, "status": {"conditions": conditions}}
    return msgspec.json.decode(msgspec.json.encode(raw), type=NodeView)


def observed(api: Api, nodes: list[NodeView]) -> Rollout:
    (found,) = rollouts([api.obj], nodes)
    return found


def nac() -> dict[str, Any]:
    meta = {"name": "web", "uid": "u1", "generation": 1, "resourceVersion": "1"}
    return {"metadata": meta, "spec": {"config": CONFIG, "rollout": {"canary": {"count": 1}}}}


async def test_writes_are_coalesced_and_none_when_equal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    api = Api(nac())
    ctl, events = controller(api)
    nodes = [node("a"), node("b")]
    await ctl._reconcile(observed(api, nodes), nodes)
    assert len(api.writes) == 1 and [e.reason for e in events] == [
        "RolloutStarted",
        "WaveStarted",
    ]
    # Replanned from what it wrote, nothing changed: no write, no Event.
    await ctl._reconcile(observed(api, nodes), nodes)
    assert len(api.writes) == 1 and len(events) == 2
    # A node on trial right after: the write waits for the interval's end.
    hash_ = api.obj["status"]["rollout"]["configHash"]
    nodes = [node("a", "OnTrial", hash_), node("b", "OnTrial", hash_)]
    await ctl._reconcile(observed(api, nodes), nodes)
    assert len(api.writes) == 1
    written_at = ctl._last_write["web"]
    assert ctl._wake_at["web"] == written_at + ctl.settings.write_interval
    await trio.sleep_until(ctl._wake_at["web"])
    await ctl._reconcile(observed(api, nodes), nodes)
    assert len(api.writes) == 2
    assert api.obj["status"]["rollout"]["counts"]["onTrial"] == 2


async def test_a_conflict_rereads_and_replans(autojump_clock: trio.testing.MockClock) -> None:
    api = Api(nac())
    ctl, events = controller(api)
    nodes = [node("a")]
    api.conflict_next = True
    await ctl._reconcile(observed(api, nodes), nodes)
    assert ctl.conflicts == 1 and len(api.writes) == 1
    assert api.writes[0]["status"]["rollout"]["admitted"] == 1
    assert len(events) == 2  # posted once, for the write that was stored


async def test_a_follower_writes_nothing(autojump_clock: trio.testing.MockClock) -> None:
    api = Api(nac())
    ctl, events = controller(api, leading=False)
    nodes = [node("a")]
    await ctl._reconcile(observed(api, nodes), nodes)
    assert api.writes == [] and events == []


async def test_an_unreadable_rollout_is_reported_once_and_left_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bad = nac()
    bad["spec"]["rollout"] = {"waves": "many"}
    api = Api(bad)
    ctl, events = controller(api)
    for _ in range(3):  # every step sees it; one Event for one problem
        problems: dict[str, str] = {}
        assert rollouts([bad], [node("a")], problems) == []
        ctl._report([bad], problems)
    assert [(e.type, e.reason) for e in events] == [("Warning", "RolloutInvalid")]
    assert "spec.rollout" in events[0].message
    assert metrics.INVALID._value.get() == 1
    ctl._report([bad], {})
    assert metrics.INVALID._value.get() == 0 and api.writes == []
