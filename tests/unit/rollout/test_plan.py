"""The rollout planner's properties: the order is the rank order, admission never exceeds
maxUnavailable nodes not through their trial, the threshold never moves back except on abort, a
halt or pause freezes it, and replanning from the status it wrote changes nothing (restart
safety). Plus the agent's side: what a node decides alone from the status."""

from __future__ import annotations

import dataclasses

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.rollout.api import (
    ALL,
    NONE,
    Canary,
    FailurePolicy,
    Phase,
    RolloutSpec,
    RolloutStatus,
    canary_size,
    decode_spec,
    failure_limit,
    max_unavailable,
)
from nodeagent.rollout.plan import Node, NodeState, Revision, plan, wave_targets
from nodeagent.rollout.rank import (
    WAITING_FOR_CONTROLLER,
    WAITING_FOR_WAVE,
    admission,
    admitted,
    rank_key,
)
from tests.unit.rollout.strategies import UID, fleets, specs

REV = Revision(uid=UID, generation=3, config_hash="abc123")
T0 = 1_800_000_000.0


def order(threshold: str) -> tuple[int, str]:
    """The threshold's place: nobody < a rank key < everybody."""
    return (0, "") if threshold == NONE else (2, "") if threshold == ALL else (1, threshold)


def keyed(nodes: list[Node], status: RolloutStatus) -> list[tuple[str, Node]]:
    return sorted((rank_key(n.name, UID, status.generation, n.canary), n) for n in nodes)


def inside(nodes: list[Node], status: RolloutStatus) -> list[Node]:
    return [n for key, n in keyed(nodes, status) if admitted(key, status, status.config_hash)]


@st.composite
def situations(draw: st.DrawFn) -> tuple[RolloutSpec, list[Node], RolloutStatus]:
    """A policy, a fleet and a status the planner wrote for it (from some earlier fleet)."""
    spec, nodes = draw(specs), draw(fleets())
    earlier = [dataclasses.replace(n, state=NodeState.ACTIVE) for n in nodes]
    status = plan(spec, REV, earlier, None, T0).status
    for _ in range(draw(st.integers(0, 6))):
        status = plan(spec, REV, earlier, status, T0 + 3600).status
    return spec, nodes, status


@settings(max_examples=300, deadline=None)
@given(situations())
def test_admission_is_a_prefix_of_the_rank_order(
    situation: tuple[RolloutSpec, list[Node], RolloutStatus],
) -> None:
    spec, nodes, status = situation
    nxt = plan(spec, REV, nodes, status, T0 + 7200).status
    ranked = [n for _, n in keyed(nodes, nxt)]
    assert inside(nodes, nxt) == ranked[: len(inside(nodes, nxt))]
    assert nxt.admitted == len(inside(nodes, nxt))


@settings(max_examples=300, deadline=None)
@given(situations())
def test_new_admissions_keep_within_max_unavailable(
    situation: tuple[RolloutSpec, list[Node], RolloutStatus],
) -> None:
    spec, nodes, status = situation
    before = inside(nodes, status)
    nxt = plan(spec, REV, nodes, status, T0 + 7200).status
    after = inside(nodes, nxt)
    if len(after) > len(before):
        not_through = [n for n in after if n.state != NodeState.ACTIVE]
        assert len(not_through) <= max_unavailable(spec, len(nodes))


@settings(max_examples=300, deadline=None)
@given(situations(), st.booleans(), st.booleans())
def test_the_threshold_moves_back_only_on_abort_and_halts_or_pauses_freeze_it(
    situation: tuple[RolloutSpec, list[Node], RolloutStatus], paused: bool, abort: bool
) -> None:
    spec, nodes, status = situation
    spec = msgspec.structs.replace(spec, paused=paused, abort=abort)
    nxt = plan(spec, REV, nodes, status, T0 + 7200).status
    if nxt.phase == Phase.ABORTED:
        assert nxt.admitted_through == NONE and nxt.admitted == 0
        return
    assert order(nxt.admitted_through) >= order(status.admitted_through)
    if nxt.phase in (Phase.HALTED, Phase.PAUSED):
        assert nxt.admitted_through == status.admitted_through


@settings(max_examples=300, deadline=None)
@given(situations(), st.booleans(), st.booleans(), st.sampled_from([0.0, 15.0, 7200.0]))
def test_replanning_from_the_written_status_changes_nothing(
    situation: tuple[RolloutSpec, list[Node], RolloutStatus],
    paused: bool,
    abort: bool,
    later: float,
) -> None:
    spec, nodes, status = situation
    spec = msgspec.structs.replace(spec, paused=paused, abort=abort)
    first = plan(spec, REV, nodes, status, T0 + 7200)
    # A restarted controller reads the status back from the apiserver (JSON) and replans.
    stored = msgspec.json.decode(msgspec.json.encode(first.status), type=RolloutStatus)
    again = plan(spec, REV, nodes, stored, T0 + 7200)
    assert (again.status, again.events) == (first.status, ())
    assert plan(spec, REV, nodes, status, T0 + 7200) == first  # deterministic


def test_a_new_config_starts_over_at_the_canary_admitting_nobody_else() -> None:
    spec = RolloutSpec(canary=Canary(count=2), waves=(50, 100), max_unavailable=5)
    nodes = [Node(f"n{i}", False) for i in range(10)]
    started = plan(spec, REV, nodes, None, T0)
    assert started.status.wave == 0 and started.status.admitted == 2
    assert [e.reason for e in started.events] == ["RolloutStarted", "WaveStarted"]
    other = Revision(uid=UID, generation=4, config_hash="def456")
    moved = plan(spec, other, nodes, started.status, T0).status
    assert (moved.config_hash, moved.generation, moved.admitted) == ("def456", 4, 2)
    assert not any(admitted(k, moved, "abc123") for k, _ in keyed(nodes, moved))


def test_an_edit_of_spec_rollout_alone_keeps_the_rollout_and_its_order() -> None:
    spec = RolloutSpec(canary=Canary(count=2))
    nodes = [Node(f"n{i}", False) for i in range(10)]
    status = plan(spec, REV, nodes, None, T0).status
    paused = plan(
        msgspec.structs.replace(spec, paused=True),
        dataclasses.replace(REV, generation=REV.generation + 1),
        nodes,
        status,
        T0,
    ).status
    assert (paused.generation, paused.observed_generation) == (3, 4)
    assert paused.admitted_through == status.admitted_through and paused.phase == Phase.PAUSED


def run(
    spec: RolloutSpec,
    nodes: list[Node],
    fails: frozenset[str] = frozenset(),
) -> tuple[RolloutStatus, int, set[str]]:
    """Drive a fleet whose admitted nodes all take the config, the `fails` ones rolling back:
    the final status, the peak number of nodes on trial, and every node that ever tried it."""
    status, now, peak, tried = None, T0, 0, set[str]()
    for _ in range(200):
        result = plan(spec, REV, nodes, status, now)
        status = result.status
        if status.phase in (Phase.COMPLETE, Phase.HALTED, Phase.ABORTED):
            break
        admitted_now = {n.name for n in inside(nodes, status)}
        # Everyone admitted starts its trial; on the next tick it ends.
        nodes = [
            dataclasses.replace(
                n,
                state=(NodeState.ROLLED_BACK if n.name in fails else NodeState.ACTIVE)
                if n.state == NodeState.ON_TRIAL
                else NodeState.ON_TRIAL
                if n.name in admitted_now and n.state == NodeState.WAITING
                else n.state,
            )
            for n in nodes
        ]
        tried |= {n.name for n in nodes if n.state != NodeState.WAITING}
        peak = max(peak, sum(n.state == NodeState.ON_TRIAL for n in nodes))
        now += 10
    assert status is not None
    return status, peak, tried


def test_a_good_config_reaches_every_node_through_its_waves_within_max_unavailable() -> None:
    spec = RolloutSpec(
        canary=Canary(count=1), waves=(10, 50, 100), max_unavailable="10%", pause_seconds=20
    )
    nodes = [Node(f"n{i}", False) for i in range(100)]
    status, peak, _ = run(spec, nodes)
    assert status.phase == Phase.COMPLETE and status.admitted_through == ALL
    assert status.counts.active == 100 and peak == 10
    assert all(admitted(k, status, REV.config_hash) for k, _ in keyed(nodes, status))


def test_a_failing_canary_halts_and_nobody_outside_it_tries() -> None:
    spec = RolloutSpec(canary=Canary(count=3), max_unavailable=3)
    nodes = [Node(f"n{i}", i % 2 == 0) for i in range(40)]
    canary = {n.name for _, n in keyed(nodes, RolloutStatus(generation=3))[:3]}
    assert all(int(name[1:]) % 2 == 0 for name in canary), "the selector's nodes come first"
    status, _, tried = run(spec, nodes, fails=frozenset(canary))
    assert status.phase == Phase.HALTED and status.wave == 0
    assert tried == canary and status.counts.rolled_back == 3
    assert "rolled back" in status.halted_reason


def test_a_failure_with_revert_aborts_and_admits_nobody() -> None:
    spec = RolloutSpec(failure_policy=FailurePolicy(max_failures=1, revert=True))
    nodes = [
        Node(f"n{i}", False, NodeState.FAILED if i == 0 else NodeState.WAITING) for i in range(5)
    ]
    result = plan(spec, REV, nodes, None, T0)
    assert result.status.phase == Phase.ABORTED and result.status.admitted_through == NONE
    assert [e.reason for e in result.events] == ["RolloutStarted", "RolloutAborted"]


def test_the_pause_between_waves_counts_from_the_waves_last_trial() -> None:
    spec = RolloutSpec(canary=Canary(count=1), waves=(100,), max_unavailable=10, pause_seconds=60)
    nodes = [Node(f"n{i}", False) for i in range(4)]
    status = plan(spec, REV, nodes, None, T0).status
    (first,) = inside(nodes, status)
    nodes = [dataclasses.replace(n, state=NodeState.ACTIVE) if n == first else n for n in nodes]
    held = plan(spec, REV, nodes, status, T0 + 5).status
    assert held.wave == 0 and held.admitted == 1 and held.wave_complete_at
    assert plan(spec, REV, nodes, held, T0 + 64).status.wave == 0
    opened = plan(spec, REV, nodes, held, T0 + 65)
    assert opened.status.wave == 1 and opened.status.admitted == 4
    assert [e.reason for e in opened.events] == ["WaveStarted"]


def test_wave_targets_round_up_and_end_at_every_node() -> None:
    spec = RolloutSpec(canary=Canary(percent=5), waves=(10, 33, 100))
    assert wave_targets(spec, 100) == [(0, 5), (1, 10), (2, 33), (3, 100)]
    assert wave_targets(spec, 7) == [(0, 1), (1, 1), (2, 3), (3, 7)]
    assert wave_targets(RolloutSpec(canary=Canary(count=0), waves=(50,)), 4) == [(1, 2), (2, 4)]


def test_policy_defaults_and_shares() -> None:
    spec = decode_spec(None)
    assert (canary_size(spec, 50), max_unavailable(spec, 50), failure_limit(spec, 50)) == (1, 1, 1)
    spec = decode_spec(
        {
            "canary": {"percent": 10},
            "maxUnavailable": "25%",
            "failurePolicy": {"maxFailurePercent": 5},
        }
    )
    assert (canary_size(spec, 50), max_unavailable(spec, 50), failure_limit(spec, 50)) == (5, 12, 3)
    assert max_unavailable(spec, 2) == 1


def test_an_agent_waits_for_the_controller_then_for_its_wave() -> None:
    assert admission("n1", False, UID, "abc123", None, name="web").reason == WAITING_FOR_CONTROLLER
    other = RolloutStatus(config_hash="zzz", admitted_through=ALL)
    assert admission("n1", False, UID, "abc123", other, name="web").reason == WAITING_FOR_CONTROLLER
    spec = RolloutSpec(canary=Canary(count=1))
    nodes = [Node(f"n{i}", False) for i in range(5)]
    status = plan(spec, REV, nodes, None, T0).status
    answers = {n.name: admission(n.name, False, UID, "abc123", status, name="web") for n in nodes}
    assert sum(a.admitted for a in answers.values()) == 1
    waiting = [a for a in answers.values() if not a.admitted]
    assert {a.reason for a in waiting} == {WAITING_FOR_WAVE}
    assert "1 of 5 admitted" in waiting[0].message
    # The subject first, as in every NodeAgentConfigOK message (the controller parses it).
    assert waiting[0].message.startswith("NodeAgentConfig web (hash abc123) ")


@st.composite
def any_statuses(draw: st.DrawFn) -> RolloutStatus:
    """Any status of this rollout, written by any controller version or by hand."""
    threshold = draw(
        st.one_of(
            st.sampled_from([NONE, ALL]),
            st.builds(lambda c, h: f"{c}-{h}", st.sampled_from("01"), st.text("0123456789abcdef")),
        )
    )
    return RolloutStatus(
        config_hash=REV.config_hash,
        generation=draw(st.integers(1, REV.generation)),
        phase=draw(st.sampled_from(list(Phase))),
        admitted_through=threshold,
        admitted=draw(st.integers(0, 50)),
        wave=draw(st.integers(0, 6)),
        wave_complete_at=draw(st.sampled_from(["", "2027-01-15T08:00:00Z"])),
    )


@settings(max_examples=400, deadline=None)
@given(specs, fleets(), any_statuses(), st.booleans(), st.booleans())
def test_replanning_from_any_status_reaches_a_fixed_point_at_once(
    spec: RolloutSpec, nodes: list[Node], status: RolloutStatus, paused: bool, abort: bool
) -> None:
    spec = msgspec.structs.replace(spec, paused=paused, abort=abort)
    first = plan(spec, REV, nodes, status, T0 + 7200)
    again = plan(spec, REV, nodes, first.status, T0 + 7200)
    assert (again.status, again.events) == (first.status, ())
    nxt = first.status
    if nxt.phase != Phase.ABORTED:
        assert order(nxt.admitted_through) >= order(status.admitted_through)


def test_tolerated_failures_finish_their_wave_until_they_fill_max_unavailable() -> None:
    spec = RolloutSpec(
        canary=Canary(count=2),
        waves=(100,),
        max_unavailable=2,
        failure_policy=FailurePolicy(max_failures=3),
    )
    nodes = [Node(f"n{i}", False) for i in range(6)]
    status = plan(spec, REV, nodes, None, T0).status
    first, second = (n.name for n in inside(nodes, status))
    verdict = {first: NodeState.ROLLED_BACK, second: NodeState.ACTIVE}
    nodes = [dataclasses.replace(n, state=verdict.get(n.name, n.state)) for n in nodes]
    # One failure (under the limit) ends the canary like a pass; it still holds one of the two.
    opened = plan(spec, REV, nodes, status, T0).status
    assert (opened.phase, opened.wave, opened.admitted) == (Phase.PROGRESSING, 1, 3)
    third = next(n.name for n in inside(nodes, opened) if n.name not in verdict)
    nodes = [
        dataclasses.replace(n, state=NodeState.FAILED) if n.name == third else n for n in nodes
    ]
    # Two failed nodes fill maxUnavailable for good: halted, with the reason, not stuck.
    stuck = plan(spec, REV, nodes, opened, T0)
    assert stuck.status.phase == Phase.HALTED and stuck.status.admitted == 3
    assert "maxUnavailable" in stuck.status.halted_reason
    assert [e.reason for e in stuck.events] == ["RolloutHalted"]
    raised = msgspec.structs.replace(spec, max_unavailable=3)
    assert plan(raised, REV, nodes, stuck.status, T0).status.admitted == 4


def test_a_policy_the_crd_would_refuse_still_plans_within_the_fleet() -> None:
    """An object stored under a looser or older CRD: waves above 100 or unsorted, a canary
    larger than the fleet. The planner never admits past the last node (no IndexError)."""
    spec = RolloutSpec(canary=Canary(count=9), waves=(150, 20), max_unavailable=10)
    assert wave_targets(spec, 4) == [(0, 4), (1, 4), (2, 4)]
    nodes = [Node(f"n{i}", False) for i in range(4)]
    assert plan(spec, REV, nodes, None, T0).status.admitted == 4
