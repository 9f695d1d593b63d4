"""The controller's reading of the fleet: `observe.node_state` against the condition messages the
agent's own builders write (dynconfig.status, rollout.rank.admission), so a change of the agent's
wording breaks here; which nodes an object targets (the agent's selection); the Node transform."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.dynconfig.state import Assignment, Bad, BadKind, Known, State, Trial
from nodeagent.dynconfig.status import (
    CONDITION_TYPE,
    Condition,
    bad_condition,
    condition_patch,
    resting_condition,
)
from nodeagent.rollout.api import Phase, RolloutStatus
from nodeagent.rollout.plan import NodeState
from nodeagent.rollout.rank import admission
from nodeagent.rollout_controller.observe import NodeView, node_state, rollouts

NAME, HASH = "web", "a1b2c3d4e5f60718"
PREVIOUS = Known(hash="0f0f0f0f0f0f0f0f", name="base")


def served(condition: Condition) -> dict[str, object]:
    """The condition as the Node serves it (the agent's own patch)."""
    (cond,) = condition_patch(condition, 0.0)["status"]["conditions"]
    return cond


def bad(kind: BadKind, name: str = NAME, hash_: str = HASH) -> Condition:
    b = Bad(hash=hash_, object_key="uid/1", name=name, kind=kind, reason="because", at=0.0)
    return bad_condition(b, PREVIOUS)


def on_trial(name: str = NAME, hash_: str = HASH) -> Condition:
    return resting_condition(
        State(trial=Trial(hash=hash_, name=name, started_at=0.0)), PREVIOUS, None
    )


def active(name: str = NAME, hash_: str = HASH, *, passed: bool = False) -> Condition:
    assigned = Assignment(name=name, uid="uid", generation=1, config={}, hash=hash_)
    mine = Known(hash=hash_, name=name)
    state = State(
        assigned=assigned, lkg=PREVIOUS if passed else mine, passed=mine if passed else None
    )
    return resting_condition(state, mine, None)


@pytest.mark.parametrize(
    ("condition", "state"),
    [
        (on_trial(), NodeState.ON_TRIAL),
        (active(), NodeState.ACTIVE),
        (active(passed=True), NodeState.ACTIVE),  # through its trial, short of last-known-good
        (bad(BadKind.UNHEALTHY), NodeState.ROLLED_BACK),
        (bad(BadKind.CRASH), NodeState.ROLLED_BACK),
        (bad(BadKind.INVALID), NodeState.FAILED),
        (bad(BadKind.VETO), NodeState.FAILED),
    ],
)
def test_each_reason_about_this_config_gives_its_state(
    condition: Condition, state: NodeState
) -> None:
    assert node_state(served(condition), NAME, HASH) == state


@pytest.mark.parametrize(
    "condition",
    [
        on_trial(hash_="ffffffffffffffff"),  # another config of the same object
        active(name="other"),  # another object's config
        bad(BadKind.UNHEALTHY, name="other"),
        active(hash_=PREVIOUS.hash),
    ],
)
def test_a_condition_about_another_config_is_waiting(condition: Condition) -> None:
    assert node_state(served(condition), NAME, HASH) == NodeState.WAITING


def test_the_first_named_config_is_the_subject() -> None:
    # A rollback of another config while this one is what the node keeps running: the
    # message names this config second ("keeping ..."), so it is not about it.
    other = Bad(hash="eeee", object_key="u/2", name=NAME, kind=BadKind.UNHEALTHY, reason="x", at=0)
    condition = bad_condition(other, Known(hash=HASH, name=NAME))
    assert HASH in condition.message
    assert node_state(served(condition), NAME, HASH) == NodeState.WAITING


def test_the_waiting_reasons_and_no_condition_are_waiting() -> None:
    assert node_state(None, NAME, HASH) == NodeState.WAITING
    assert node_state({}, NAME, HASH) == NodeState.WAITING
    statuses = [
        None,
        RolloutStatus(config_hash=HASH, generation=1, phase=Phase.PROGRESSING),
        RolloutStatus(config_hash=HASH, generation=1, phase=Phase.PAUSED),
        RolloutStatus(config_hash=HASH, generation=1, phase=Phase.HALTED),
        RolloutStatus(config_hash=HASH, generation=1, phase=Phase.ABORTED),
    ]
    for status in statuses:
        decision = admission("n1", False, "uid", HASH, status, name=NAME)
        assert not decision.admitted
        assert decision.message.startswith(f"NodeAgentConfig {NAME} (hash {HASH})")
        cond = served(Condition(True, decision.reason, decision.message))
        assert node_state(cond, NAME, HASH) == NodeState.WAITING


@given(st.text(), st.text(), st.text(min_size=1), st.text(min_size=1))
def test_any_condition_is_read_without_raising(
    reason: str, message: str, name: str, hash_: str
) -> None:
    state = node_state({"reason": reason, "message": message}, name, hash_)
    assert state in NodeState


def node(name: str, labels: dict[str, str], condition: Condition | None = None) -> NodeView:
    conditions = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "x"}]
    if condition is not None:
        conditions.append(served(condition))  # type: ignore[arg-type]
    raw = {"metadata": {"name": name, "labels": labels}, "status": {"conditions": conditions}}
    return msgspec.json.decode(msgspec.json.encode(raw), type=NodeView)


def test_the_node_transform_keeps_only_the_agents_condition() -> None:
    view = node("n1", {"a": "b"}, on_trial())
    assert [c.type for c in view.status.conditions] == [CONDITION_TYPE]
    assert view.condition is not None and view.condition["reason"] == "OnTrial"
    assert node("n2", {}).condition is None


def config(name: str, spec: dict[str, object], uid: str = "u") -> dict[str, object]:
    meta = {"name": name, "uid": uid, "generation": 3, "resourceVersion": "7"}
    return {"metadata": meta, "spec": spec}


def test_targets_follow_the_agents_selection_and_only_rollouts_are_planned() -> None:
    cfg = {"reporter": {"interval": 5.0}}
    from nodeagent.dynconfig.overlay import config_hash

    objects = [
        # Global, rolled out: the nodes nothing else targets.
        config("global", {"config": cfg, "rollout": {}}),
        # A selector outranks the global object on the nodes it matches.
        config(
            "gpu",
            {
                "nodeSelector": {"matchLabels": {"gpu": "yes"}},
                "config": cfg,
                "rollout": {"canary": {"selector": {"matchLabels": {"zone": "a"}}}},
            },
        ),
        # No spec.rollout: not the controller's (but still part of the selection).
        config("named", {"nodeNames": ["n4"], "config": cfg}),
    ]
    hash_ = config_hash(cfg)
    nodes = [
        node("n1", {}),
        node("n2", {"gpu": "yes", "zone": "a"}, on_trial("gpu", hash_)),
        node("n3", {"gpu": "yes"}, active("gpu", hash_)),
        node("n4", {"gpu": "yes"}),
    ]
    found = {r.name: r for r in rollouts(objects, nodes)}
    assert sorted(found) == ["global", "gpu"]
    assert [(n.name, n.canary, n.state) for n in found["gpu"].nodes] == [
        ("n2", True, NodeState.ON_TRIAL),
        ("n3", False, NodeState.ACTIVE),
    ]
    assert [n.name for n in found["global"].nodes] == ["n1"]
    gpu = found["gpu"]
    assert (gpu.revision.uid, gpu.revision.generation, gpu.revision.config_hash) == (
        "u",
        3,
        hash_,
    )
    assert gpu.resource_version == "7" and gpu.status is None


def test_an_undecodable_rollout_is_reported_and_the_others_go_on() -> None:
    objects = [
        config("bad", {"config": {}, "rollout": {"waves": "many"}}),
        config("good", {"config": {}, "rollout": {}}),
    ]
    problems: dict[str, str] = {}
    found = rollouts(objects, [node("n1", {})], problems)
    assert [r.name for r in found] == ["good"]
    assert "spec.rollout" in problems["bad"]
