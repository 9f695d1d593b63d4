"""Hypothesis strategies for rollout policies and fleets (shared by the planner's tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from nodeagent.rollout.api import Canary, FailurePolicy, RolloutSpec
from nodeagent.rollout.plan import Node, NodeState

UID = "6f1c3a52-0000-4000-8000-000000000031"


@st.composite
def waves(draw: st.DrawFn) -> tuple[int, ...]:
    inner = draw(st.lists(st.integers(1, 99), unique=True, max_size=4))
    return (*sorted(inner), 100)


canaries = st.one_of(
    st.builds(Canary),
    st.builds(Canary, count=st.integers(0, 5)),
    st.builds(Canary, percent=st.integers(0, 100)),
)
failure_policies = st.one_of(
    st.builds(FailurePolicy, revert=st.booleans()),
    st.builds(FailurePolicy, max_failures=st.integers(1, 4), revert=st.booleans()),
    st.builds(FailurePolicy, max_failure_percent=st.integers(1, 100), revert=st.booleans()),
)
specs = st.builds(
    RolloutSpec,
    canary=canaries,
    waves=waves(),
    max_unavailable=st.one_of(st.integers(1, 4), st.integers(1, 100).map(lambda p: f"{p}%")),
    pause_seconds=st.sampled_from([0, 30]),
    failure_policy=failure_policies,
)


@st.composite
def fleets(draw: st.DrawFn, max_size: int = 30) -> list[Node]:
    size = draw(st.integers(0, max_size))
    return [
        Node(f"node-{i}", draw(st.booleans()), draw(st.sampled_from(list(NodeState))))
        for i in range(size)
    ]
