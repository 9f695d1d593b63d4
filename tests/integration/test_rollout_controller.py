"""`nodeagent rollout-controller` on the real kube-apiserver, with the agents simulated.

Each test creates its own Nodes (a label only its NodeAgentConfig selects) and a `Fleet` plays
their agents by the contract (docs/architecture/rollout.md): a node takes the config only when
`rollout.rank.admission` admits it (it writes its NodeAgentConfigOK condition OnTrial, built by
the agent's own `dynconfig.status` builders), passes (Active) or fails (RolledBack) its trial at
the next status the controller writes, and goes back to the previous config on an abort. The
Fleet records every status it sees and, at each, how many admitted nodes are on trial or
failed: the tests wait on the controller's status (tests/support/wait.py), never on time.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.dynconfig.overlay import config_hash
from nodeagent.dynconfig.state import Assignment, Bad, BadKind, Known, State, Trial
from nodeagent.dynconfig.status import Condition, bad_condition, condition_patch, resting_condition
from nodeagent.kube import CORE_EVENTS, NODES, KubeClient, errors
from nodeagent.rollout.api import (
    Phase,
    RolloutStatus,
    decode_spec,
    decode_status,
    max_unavailable,
)
from nodeagent.rollout.rank import admission, rank_key
from nodeagent.rollout_controller.controller import Controller
from nodeagent.rollout_controller.settings import ControllerSettings
from tests.integration.conftest import client_for
from tests.support.apiserver import ApiServer
from tests.support.follow import follow_nodeagentconfig
from tests.support.nodeagentconfig import NAC, install_nodeagentconfig_crd, nodeagentconfig
from tests.support.wait import NotYet, wait_until

CONFIG = {"reporter": {"interval": 17.0}}
PREVIOUS = "0000000000000000"  # the config every node ran before (its hash)
WAIT = 120.0  # a loaded 2-core machine: a bound named in the failure, not a pace


@dataclass
class Fleet:
    """The agents of ``nodes`` (canary: those matching the canary selector), simulated."""

    client: KubeClient
    obj: str
    nodes: list[str]
    canary: set[str] = field(default_factory=set)
    bad: set[str] = field(default_factory=set)  # nodes whose trial fails (RolledBack)
    hold: bool = False  # keep nodes on trial (a rollout stopped mid-wave)
    hold_at: int | None = None  # ... once the rollout is at this wave
    state: dict[str, str] = field(default_factory=dict)
    tries: dict[str, int] = field(default_factory=dict)
    statuses: list[RolloutStatus] = field(default_factory=list)
    peak: int = 0  # most admitted nodes on trial or failed at once
    order: list[str] = field(default_factory=list)  # nodes in the order they took the config
    obj_seen: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.state = dict.fromkeys(self.nodes, "waiting")

    @property
    def last(self) -> RolloutStatus | None:
        return self.statuses[-1] if self.statuses else None

    async def _condition(self, node: str, condition: Condition) -> None:
        patch = condition_patch(condition, time.time())
        await self.client.patch(NODES, node, patch, type="strategic", subresource="status")

    async def run(self) -> None:
        await follow_nodeagentconfig(self.client, self.obj, self.step)

    async def release(self) -> None:
        """Let the nodes held on trial finish it (as at the next status)."""
        self.hold, self.hold_at = False, None
        if self.obj_seen is not None:
            await self.step(self.obj_seen, again=True)

    async def step(self, obj: dict[str, Any], *, again: bool = False) -> None:
        self.obj_seen = obj
        status = decode_status((obj.get("status") or {}).get("rollout"))
        if status is None:
            return
        if self.statuses and self.statuses[-1] == status and not again:
            return
        await self._act(obj, status)
        # Recorded once acted on: a test that sees it sees the fleet's answer too.
        if not again:
            self.statuses.append(status)

    async def _act(self, obj: dict[str, Any], status: RolloutStatus) -> None:
        name, uid = obj["metadata"]["name"], obj["metadata"]["uid"]
        generation = obj["metadata"]["generation"]
        hash_ = config_hash(obj["spec"]["config"])
        previous = Known(hash=PREVIOUS, name=name)
        mine = Known(hash=hash_, name=name)
        now = time.time()
        # Trials end at the next status the controller writes (it has seen them start).
        for node in self.nodes:
            held = self.hold or (self.hold_at is not None and status.wave >= self.hold_at)
            if self.state[node] != "trial" or held or status.phase == Phase.ABORTED:
                continue
            if node in self.bad:
                bad = Bad(
                    hash=hash_,
                    object_key=f"{uid}/{generation}",
                    name=name,
                    kind=BadKind.UNHEALTHY,
                    reason="the health check failed",
                    at=now,
                )
                self.state[node] = "failed"
                await self._condition(node, bad_condition(bad, previous))
            else:
                self.state[node] = "active"
                assigned = Assignment(name=name, uid=uid, generation=generation, config=CONFIG)
                state = State(assigned=msgspec.structs.replace(assigned, hash=hash_))
                await self._condition(node, resting_condition(state, mine, None))
        for node in self.nodes:
            decision = admission(node, node in self.canary, uid, hash_, status, name=name)
            if decision.admitted and self.state[node] == "waiting":
                self.state[node] = "trial"
                self.tries[node] = self.tries.get(node, 0) + 1
                self.order.append(node)
                trial = State(trial=Trial(hash=hash_, name=name, started_at=now))
                await self._condition(node, resting_condition(trial, previous, None))
            elif not decision.admitted and self.state[node] in ("trial", "active"):
                # Aborted: back to the previous config, the new one not marked bad.
                self.state[node] = "reverted"
                await self._condition(
                    node, Condition(True, decision.reason, f"{decision.message}; running ...")
                )
        unavailable = sum(1 for s in self.state.values() if s in ("trial", "failed"))
        self.peak = max(self.peak, unavailable)

    async def until(self, check: Callable[[RolloutStatus], bool], what: str) -> RolloutStatus:
        def seen() -> RolloutStatus | NotYet:
            last = self.last
            return last if last is not None and check(last) else NotYet(last)

        return await wait_until(seen, what, timeout=WAIT)


@dataclass
class Scene:
    apiserver: ApiServer
    admin: KubeClient
    prefix: str
    nursery: trio.Nursery

    def settings(self, identity: str = "one", **kw: Any) -> ControllerSettings:
        kw.setdefault("lease_duration", 6.0)
        kw.setdefault("renew_deadline", 4.0)
        kw.setdefault("retry_period", 0.5)
        kw.setdefault("write_interval", 0.2)
        return ControllerSettings(
            namespace="default",
            lease_name=f"rc-{self.prefix}",
            identity=identity,
            metrics_address="",
            **kw,
        )

    async def nodes(self, count: int, canary: int = 0) -> list[str]:
        names = [f"{self.prefix}-n{i:02d}" for i in range(count)]

        async def make(i: int, name: str) -> None:
            labels = {"rollout-test": self.prefix}
            if i < canary:
                labels["pool"] = "canary"
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
            }
            await self.admin.create(NODES, body)

        async with trio.open_nursery() as n:
            for i, name in enumerate(names):
                n.start_soon(make, i, name)
        return names

    async def config(self, rollout: dict[str, Any]) -> str:
        name = f"{self.prefix}-cfg"
        spec = {
            "nodeSelector": {"matchLabels": {"rollout-test": self.prefix}},
            "config": CONFIG,
            "rollout": rollout,
        }
        await self.admin.create(NAC, nodeagentconfig(name, spec=spec))
        return name

    async def start(self, settings: ControllerSettings) -> tuple[Controller, trio.CancelScope]:
        """A controller with its own client, running until its scope is cancelled."""
        scope = trio.CancelScope()
        started: list[Controller] = []
        ready = trio.Event()

        async def run() -> None:
            with scope:
                async with client_for(self.apiserver, "admin") as client:
                    controller = Controller(client, settings)
                    started.append(controller)
                    ready.set()
                    await controller.run()

        self.nursery.start_soon(run)
        await ready.wait()
        return started[0], scope

    async def fleet(self, obj: str, nodes: list[str], **kw: Any) -> Fleet:
        fleet = Fleet(self.admin, obj, nodes, **kw)
        self.nursery.start_soon(fleet.run)
        return fleet

    async def events(self, obj: str) -> list[tuple[str, str]]:
        raw = await self.admin.list(
            CORE_EVENTS, "default", field_selector=f"involvedObject.name={obj}"
        )
        # Posted one at a time by the controller's recorder: in resourceVersion order.
        items = sorted(
            (msgspec.json.decode(e) for e in raw.items),
            key=lambda e: int(e["metadata"]["resourceVersion"]),
        )
        return [(e["type"], e["reason"]) for e in items]


@pytest.fixture
async def scene(apiserver: ApiServer, admin_client: KubeClient) -> AsyncIterator[Scene]:
    await install_nodeagentconfig_crd(admin_client)
    prefix = f"ro-{uuid.uuid4().hex[:6]}"
    async with trio.open_nursery() as nursery:
        made = Scene(apiserver, admin_client, prefix, nursery)
        try:
            yield made
        finally:
            nursery.cancel_scope.cancel()
    with contextlib.suppress(errors.NotFound):
        await admin_client.delete(NAC, f"{prefix}-cfg")
    nodes = await admin_client.list(NODES, label_selector=f"rollout-test={prefix}")
    for node in nodes.items:
        with contextlib.suppress(errors.NotFound):
            await admin_client.delete(NODES, msgspec.json.decode(node)["metadata"]["name"])


def _events(scene: Scene, obj: str, last: str) -> Callable[[], Awaitable[Any]]:
    """The object's Events, once one with reason ``last`` is among them."""

    async def check() -> list[tuple[str, str]] | NotYet:
        seen = await scene.events(obj)
        return seen if any(r == last for _, r in seen) else NotYet(seen)

    return check


async def test_a_good_config_reaches_complete_through_canary_and_waves(scene: Scene) -> None:
    nodes = await scene.nodes(8, canary=1)
    rollout = {
        "canary": {"count": 1, "selector": {"matchLabels": {"pool": "canary"}}},
        "waves": [25, 50, 100],
        "maxUnavailable": 2,
    }
    obj = await scene.config(rollout)
    fleet = await scene.fleet(obj, nodes, canary={nodes[0]})
    controller, _ = await scene.start(scene.settings())
    done = await fleet.until(lambda s: s.phase == Phase.COMPLETE, "the rollout Complete")
    assert done.admitted_through == "all" and done.counts.active == 8
    # The canary first, every node once, never more than maxUnavailable on trial at once.
    assert fleet.order[0] == nodes[0]
    assert sorted(fleet.order) == sorted(nodes) and set(fleet.tries.values()) == {1}
    assert fleet.peak <= 2
    budget = max_unavailable(decode_spec(rollout), 8)
    for status in fleet.statuses:
        assert status.admitted - status.counts.active <= budget, status
    assert [s.wave for s in fleet.statuses] == sorted(s.wave for s in fleet.statuses)
    seen = await wait_until(_events(scene, obj, "RolloutComplete"), "the Events", timeout=WAIT)
    # Started (the canary, wave 0), each of the three waves opened, complete: once each.
    waves = [("Normal", "WaveStarted")] * 4
    assert seen == [("Normal", "RolloutStarted"), *waves, ("Normal", "RolloutComplete")]
    served = msgspec.json.decode(await scene.admin.get(NAC, obj))
    (cond,) = [c for c in served["status"]["conditions"] if c["type"] == "RolledOut"]
    assert (cond["status"], cond["reason"]) == ("True", "Complete")
    assert controller.writes >= len(fleet.statuses) > 0


async def test_a_failing_canary_halts_the_rollout_there(scene: Scene) -> None:
    nodes = await scene.nodes(6, canary=1)
    rollout = {"canary": {"count": 1, "selector": {"matchLabels": {"pool": "canary"}}}}
    obj = await scene.config(rollout)
    fleet = await scene.fleet(obj, nodes, canary={nodes[0]}, bad={nodes[0]})
    await scene.start(scene.settings())
    halted = await fleet.until(lambda s: s.phase == Phase.HALTED, "the rollout Halted")
    assert (halted.wave, halted.admitted, halted.counts.rolled_back) == (0, 1, 1)
    assert "rolled back or refused" in halted.halted_reason
    # Nobody beyond the canary ever tried it.
    assert fleet.tries == {nodes[0]: 1}
    seen = await wait_until(_events(scene, obj, "RolloutHalted"), "the Events", timeout=WAIT)
    assert seen == [
        ("Normal", "RolloutStarted"),
        ("Normal", "WaveStarted"),
        ("Warning", "RolloutHalted"),
    ]
    served = msgspec.json.decode(await scene.admin.get(NAC, obj))
    (cond,) = [c for c in served["status"]["conditions"] if c["type"] == "RolledOut"]
    assert (cond["status"], cond["reason"]) == ("False", "Halted")


async def test_abort_admits_nobody_and_the_nodes_go_back(scene: Scene) -> None:
    nodes = await scene.nodes(6)
    obj = await scene.config({"canary": {"count": 2}, "maxUnavailable": 2})
    fleet = await scene.fleet(obj, nodes, hold=True)
    await scene.start(scene.settings())
    await fleet.until(lambda s: s.counts.on_trial == 2, "the canary on trial")
    patch = {"spec": {"rollout": {"abort": True}}}
    await scene.admin.patch(NAC, obj, patch)
    aborted = await fleet.until(lambda s: s.phase == Phase.ABORTED, "the rollout Aborted")
    assert (aborted.admitted_through, aborted.admitted) == ("none", 0)
    # The two that took it went back; nobody else tried it.
    assert sorted(n for n, s in fleet.state.items() if s == "reverted") == sorted(fleet.tries)
    assert len(fleet.tries) == 2
    seen = await wait_until(_events(scene, obj, "RolloutAborted"), "the Events", timeout=WAIT)
    assert seen[-1] == ("Warning", "RolloutAborted")


async def test_a_restarted_controller_resumes_without_admitting_or_posting_again(
    scene: Scene,
) -> None:
    nodes = await scene.nodes(6)
    obj = await scene.config({"canary": {"count": 1}, "waves": [50, 100], "maxUnavailable": 2})
    fleet = await scene.fleet(obj, nodes, hold_at=1)
    first, scope = await scene.start(scene.settings("first"))
    # Mid-rollout: the canary passed, wave 1's nodes on trial (held there).
    await fleet.until(lambda s: s.wave == 1 and s.counts.on_trial == 2, "wave 1 on trial")
    before = await wait_until(_events(scene, obj, "WaveStarted"), "the Events", timeout=WAIT)
    scope.cancel()
    await wait_until(lambda: not first.elector.leading, "the first controller stopped")
    stored = fleet.last
    second, _ = await scene.start(scene.settings("second"))
    # The new leader replans from the stored status: the same status, nothing written.
    await wait_until(lambda: second.plans > 0, "the second controller planning", timeout=WAIT)
    assert second.writes == 0 and fleet.last == stored
    await fleet.release()
    done = await fleet.until(lambda s: s.phase == Phase.COMPLETE, "the rollout Complete")
    assert done.counts.active == 6 and set(fleet.tries.values()) == {1}
    seen = await wait_until(_events(scene, obj, "RolloutComplete"), "the Events", timeout=WAIT)
    assert seen[: len(before)] == before
    assert [r for _, r in seen].count("RolloutStarted") == 1
    # Canary, wave 1, wave 2: each opened once, whoever led.
    assert [r for _, r in seen].count("WaveStarted") == 3


async def test_two_controllers_never_both_write(scene: Scene) -> None:
    nodes = await scene.nodes(6)
    obj = await scene.config({"canary": {"count": 1}, "waves": [50, 100], "maxUnavailable": 2})
    fleet = await scene.fleet(obj, nodes)
    # The contract's durations: a loaded machine must not make the leader miss its renewals
    # (a handover would make both write, one after the other, legitimately).
    durations = {"lease_duration": 15.0, "renew_deadline": 10.0, "retry_period": 1.0}
    one, _ = await scene.start(scene.settings("one", **durations))
    two, _ = await scene.start(scene.settings("two", **durations))
    await fleet.until(lambda s: s.phase == Phase.COMPLETE, "the rollout Complete")
    assert sorted([one.writes, two.writes])[0] == 0, (one.writes, two.writes)
    assert max(one.writes, two.writes) > 0
    assert one.elector.transitions + two.elector.transitions == 1


async def test_the_pause_between_waves_ends_by_a_timer(scene: Scene) -> None:
    # After the canary passes the fleet is quiet: only the controller's own wake-up at the
    # pause's end can open the next wave.
    nodes = await scene.nodes(3)
    pause = 2
    obj = await scene.config({"canary": {"count": 1}, "waves": [100], "pauseSeconds": pause})
    fleet = await scene.fleet(obj, nodes)
    await scene.start(scene.settings())
    paused = await fleet.until(lambda s: bool(s.wave_complete_at), "the canary done")
    assert paused.wave == 0 and paused.admitted == 1
    done = await fleet.until(lambda s: s.phase == Phase.COMPLETE, "the rollout Complete")
    assert done.counts.active == 3
    opened = next(s for s in fleet.statuses if s.wave == 1)
    assert opened.admitted == 2 and not opened.wave_complete_at  # one more (maxUnavailable 1)


async def test_failures_halt_at_the_wave_that_crosses_the_limit(scene: Scene) -> None:
    nodes = await scene.nodes(8)
    rollout = {
        "canary": {"count": 1},
        "waves": [25, 50, 100],
        "maxUnavailable": 2,
        "failurePolicy": {"maxFailures": 2},
    }
    obj = await scene.config(rollout)
    uid = msgspec.json.decode(await scene.admin.get(NAC, obj))["metadata"]["uid"]
    # Rank order of the rollout (generation 1): canary 1, wave 1 -> 2, wave 2 -> 4, wave 3 -> 8.
    order = sorted(nodes, key=lambda n: rank_key(n, uid, 1, False))
    fleet = await scene.fleet(obj, nodes, bad=set(order[2:4]))  # wave 2's two nodes
    await scene.start(scene.settings())
    halted = await fleet.until(lambda s: s.phase == Phase.HALTED, "the rollout Halted")
    assert (halted.wave, halted.admitted, halted.counts.rolled_back) == (2, 4, 2)
    assert sorted(fleet.tries) == sorted(order[:4])  # nobody past wave 2 tried it
    assert fleet.peak <= 2
