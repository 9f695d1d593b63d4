"""Hypothesis: the Rust planner and semantic equality give exactly what the plain Python
reference gives, on random pools and observed states."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent import _native
from tests.support.planner_reference import reference_plan, spec_equal
from tests.unit.resources.strategies import changed_copy, desired_spec, pool_case, semantic_copy

# Bounded so each test takes a few seconds (about 15 ms an example); the strategies draw small
# pools from few names and spellings, so collisions and respellings come up within this budget.
_SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _b(x: Any) -> bytes:
    return json.dumps(x).encode()


@_SETTINGS
@given(pool_case())
def test_rust_plan_equals_reference(case: tuple[list[Any], list[Any]]) -> None:
    desired, observed = case
    d, o = [_b(x) for x in desired], [_b(x) for x in observed]
    plan = _native.plan_pool(d, o)
    assert plan == reference_plan(desired, observed)
    assert _native.plan_prepared(_native.prepare_desired(d), _native.prepare_observed(o)) == plan


@st.composite
def _pair(draw: st.DrawFn) -> tuple[Any, Any, bool | None]:
    a = draw(desired_spec())
    kind = draw(st.sampled_from(["same", "changed", "other"]))
    if kind == "same":
        return a, draw(semantic_copy(a)), True
    if kind == "changed":
        return a, draw(changed_copy(a)), None
    return a, draw(desired_spec()), None


@settings(_SETTINGS, max_examples=600)
@given(_pair())
def test_rust_semantic_equality_equals_reference(pair: tuple[Any, Any, bool | None]) -> None:
    a, b, expected = pair
    ref = spec_equal(a, b)
    assert _native.slice_spec_equal(_b(a), _b(b)) == ref
    assert _native.slice_spec_equal(_b(b), _b(a)) == ref
    if expected is not None:
        assert ref is expected
