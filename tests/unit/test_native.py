"""The Rust extension's Python surface: typed plan results, and the shared JSON scanner as both
the store and the planner see it (the rest is tested where each is used)."""

from __future__ import annotations

import json

import pytest

from nodeagent import _native
from nodeagent._native import PlanDelete, PlanUpdate, PoolPlan, Store


def _observed(name: str, generation: int, devices: list[str]) -> bytes:
    return json.dumps(
        {
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7"},
            "spec": {
                "pool": {"name": "p", "generation": generation, "resourceSliceCount": 1},
                "devices": [{"name": d} for d in devices],
            },
        }
    ).encode()


def test_plan_results_have_named_fields_and_stay_tuples() -> None:
    desired = [json.dumps({"pool": {"name": "p"}, "devices": [{"name": "a"}]}).encode()]
    observed = [_observed("s0", 1, ["b"]), _observed("old", 0, ["a"])]
    plan = _native.plan_pool(desired, observed)
    prepared = _native.plan_prepared(
        _native.prepare_desired(desired), _native.prepare_observed(observed)
    )

    assert isinstance(plan, PoolPlan) and isinstance(prepared, PoolPlan)
    assert plan == prepared
    assert plan.generation == 1 and plan.unchanged == [] and plan.creates == []
    (update,) = plan.updates
    assert isinstance(update, PlanUpdate)
    assert (update.observed, update.desired, update.name, update.resource_version) == (
        0,
        0,
        "s0",
        "7",
    )
    (delete,) = plan.deletes
    assert isinstance(delete, PlanDelete)
    assert (delete.observed, delete.name, delete.uid) == (1, "old", "uid-old")
    # Still the tuples callers unpack by position.
    generation, _, updates, _, deletes = plan
    assert (generation, updates[0][2], deletes[0][1]) == (1, "s0", "old")
    assert plan == (1, [], [(0, 0, "s0", "7")], [], [(1, "old", "uid-old", "7")])


def test_planner_rejects_a_unicode_escape_without_four_hex_digits() -> None:
    # The planner's own string reader once took `\u+041` for "A" (a signed hex number).
    with pytest.raises(ValueError, match=r"bad \\u escape"):
        _native.slice_spec_equal(b'{"a": "\\u+041"}', b'{"a": "A"}')
    assert _native.slice_spec_equal(b'{"a": "\\u0041"}', b'{"a":"A"}')


def test_store_decodes_an_escaped_string_after_whitespace() -> None:
    # The store's decoder once took the space after `"type":` for the string's opening quote.
    store = Store()
    rv, error, applied, malformed = store.feed(
        b'{"type": "ADD\\u0045D", "object": {"metadata": {"name": "a", "resourceVersion": "2"}}}\n'
    )
    assert (rv, error, applied, malformed) == ("2", None, 1, [])
