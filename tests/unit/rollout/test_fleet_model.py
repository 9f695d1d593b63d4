"""A model of a fleet under a rollout: agents that take the config only when the status admits
them (rank.admitted), pass or fail their trial, return to their previous config when no longer
admitted (abort); an operator who pauses, resumes, aborts and changes the config; a controller
that plans, is killed and restarts from the stored status (JSON round trip). After every step:
nobody outside the admitted share ever tried the config, admission kept within maxUnavailable,
the threshold only moved forward (but on abort or a new config), a halt froze it."""

from __future__ import annotations

import dataclasses

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nodeagent.rollout.api import NONE, Phase, RolloutSpec, RolloutStatus, max_unavailable
from nodeagent.rollout.plan import Node, NodeState, Revision, plan
from nodeagent.rollout.rank import admitted, rank_key
from tests.unit.rollout.strategies import UID, specs
from tests.unit.rollout.test_plan import order

TOOK = (NodeState.ON_TRIAL, NodeState.ACTIVE)
ENDS = (Phase.COMPLETE, Phase.HALTED, Phase.ABORTED)


class Fleet(RuleBasedStateMachine):
    @initialize(spec=specs, size=st.integers(1, 10), canary=st.lists(st.booleans(), max_size=10))
    def start(self, spec: RolloutSpec, size: int, canary: list[bool]) -> None:
        self.spec = spec
        self.nodes = {
            f"node-{i}": Node(f"node-{i}", i < len(canary) and canary[i]) for i in range(size)
        }
        self.revision = Revision(uid=UID, generation=1, config_hash="c1")
        self.stored: RolloutStatus | None = None  # what the apiserver holds
        self.memory: RolloutStatus | None = None  # a running controller's last plan
        self.now = 1_800_000_000.0
        self.tried: set[str] = set()

    def _admits(self, name: str) -> bool:
        if self.stored is None:
            return False
        node = self.nodes[name]
        key = rank_key(name, UID, self.stored.generation, node.canary)
        return admitted(key, self.stored, self.revision.config_hash)

    def _set(self, name: str, state: NodeState) -> None:
        self.nodes[name] = dataclasses.replace(self.nodes[name], state=state)

    # The controller.
    @rule(seconds=st.sampled_from([0, 5, 40]))
    def controller_plans(self, seconds: int) -> None:
        self.now += seconds
        before = self.stored
        admitted_before = {n for n in self.nodes if self._admits(n)}
        result = plan(self.spec, self.revision, list(self.nodes.values()), self.memory, self.now)
        self.stored = result.status
        self.memory = result.status
        if result.status.phase == Phase.ABORTED:
            self.tried.clear()  # everyone went back: a lifted abort starts from the canary
        admitted_after = {n for n in self.nodes if self._admits(n)}
        if admitted_after - admitted_before:
            through = {n for n in admitted_after if self.nodes[n].state == NodeState.ACTIVE}
            budget = max_unavailable(self.spec, len(self.nodes))
            assert len(admitted_after - through) <= budget
        same = before is not None and before.config_hash == result.status.config_hash
        if same and before is not None and result.status.phase != Phase.ABORTED:
            assert order(result.status.admitted_through) >= order(before.admitted_through)
            if result.status.phase in (Phase.HALTED, Phase.PAUSED):
                assert result.status.admitted_through == before.admitted_through

    @rule()
    def controller_restarts(self) -> None:
        """Killed and restarted: its memory is what the apiserver stored, read back as JSON; it
        plans exactly what the controller it replaced would have, and a replay of a plan it
        already wrote posts nothing again."""
        nodes = list(self.nodes.values())
        running = plan(self.spec, self.revision, nodes, self.memory, self.now)
        if self.stored is not None:
            self.memory = msgspec.json.decode(msgspec.json.encode(self.stored), type=RolloutStatus)
        restarted = plan(self.spec, self.revision, nodes, self.memory, self.now)
        assert restarted == running
        replay = plan(self.spec, self.revision, nodes, restarted.status, self.now)
        assert (replay.status, replay.events) == (restarted.status, ())

    # The operator.
    @rule(paused=st.sampled_from([False, False, True]))
    def operator_pauses_or_resumes(self, paused: bool) -> None:
        self.spec = msgspec.structs.replace(self.spec, paused=paused)
        self.revision = dataclasses.replace(self.revision, generation=self.revision.generation + 1)

    @rule(abort=st.sampled_from([False, False, False, True]))
    def operator_aborts_or_lifts_the_abort(self, abort: bool) -> None:
        self.spec = msgspec.structs.replace(self.spec, abort=abort)

    @rule()
    def operator_changes_the_config(self) -> None:
        generation = self.revision.generation + 1
        self.revision = Revision(uid=UID, generation=generation, config_hash=f"c{generation}")
        # Every node still runs what it ran; for the new config all are waiting.
        for name in self.nodes:
            self._set(name, NodeState.WAITING)
        self.tried = set()

    # The agents.
    @rule(data=st.data())
    def an_admitted_agent_takes_it(self, data: st.DataObject) -> None:
        ready = sorted(
            n
            for n, node in self.nodes.items()
            if node.state == NodeState.WAITING and self._admits(n)
        )
        if ready:
            name = data.draw(st.sampled_from(ready))
            self._set(name, data.draw(st.sampled_from([NodeState.ON_TRIAL, NodeState.FAILED])))
            self.tried.add(name)

    @rule(data=st.data(), passes=st.booleans())
    def a_trial_ends(self, data: st.DataObject, passes: bool) -> None:
        on_trial = sorted(n for n, node in self.nodes.items() if node.state == NodeState.ON_TRIAL)
        if on_trial:
            name = data.draw(st.sampled_from(on_trial))
            self._set(name, NodeState.ACTIVE if passes else NodeState.ROLLED_BACK)

    @rule()
    def every_admitted_agent_takes_it_and_passes(self) -> None:
        """A quiet stretch: each admitted node tries the config and passes (so runs reach the
        later waves and Complete, not only the canary)."""
        for name, node in self.nodes.items():
            if node.state in (NodeState.WAITING, NodeState.ON_TRIAL) and self._admits(name):
                self._set(name, NodeState.ACTIVE)
                self.tried.add(name)

    @rule()
    def agents_no_longer_admitted_go_back(self) -> None:
        for name, node in self.nodes.items():
            if node.state in TOOK and not self._admits(name):
                self._set(name, NodeState.WAITING)

    @rule()
    def a_quiet_fleet_finishes(self) -> None:
        """Liveness: not paused, not aborted, every admitted node passing, the controller
        planning after each pause: the rollout completes (or halts, or aborts with revert,
        on earlier failures) within a bounded number of steps."""
        if self.spec.paused or self.spec.abort:
            return
        for _ in range(2 * len(self.nodes) + len(self.spec.waves) + 4):
            self.every_admitted_agent_takes_it_and_passes()
            self.controller_plans(self.spec.pause_seconds + 1)
            assert self.stored is not None
            if self.stored.phase in ENDS:
                break
        assert self.stored is not None
        assert self.stored.phase in ENDS, self.stored
        if self.stored.phase == Phase.COMPLETE:
            done = (NodeState.ACTIVE, NodeState.ROLLED_BACK, NodeState.FAILED)
            assert all(node.state in done for node in self.nodes.values())

    @invariant()
    def nobody_outside_the_admitted_share_tried_it(self) -> None:
        if self.stored is None or self.stored.admitted_through == NONE:
            return
        outside = {n for n in self.nodes if not self._admits(n)}
        # A node tried it only while admitted; a threshold moves back only on abort (NONE).
        assert not (self.tried & outside)

    @invariant()
    def the_status_counts_the_fleet(self) -> None:
        stored = self.stored
        if stored is not None and stored.config_hash == self.revision.config_hash:
            assert stored.admitted == sum(self._admits(n) for n in self.nodes)

    @precondition(lambda self: self.stored is not None)
    @invariant()
    def the_rollout_keeps_its_generation_while_the_config_stays(self) -> None:
        assert self.stored is not None
        if self.stored.config_hash == self.revision.config_hash:
            assert self.stored.generation <= self.revision.generation


Fleet.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFleet = Fleet.TestCase
