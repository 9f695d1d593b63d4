"""The planner's rules, on the Rust planner and the Python reference alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from nodeagent import _native
from nodeagent._native import PoolPlan
from tests.support.planner_reference import PlanTuple, reference_plan

# Both planners: the Rust one returns named tuples, the reference plain ones; they compare equal.
Planner = Callable[[list[Any], list[Any]], PoolPlan | PlanTuple]


def _rust(desired: list[Any], observed: list[Any]) -> PoolPlan:
    enc = json.dumps
    return _native.plan_pool(
        [enc(d).encode() for d in desired], [enc(o).encode() for o in observed]
    )


@pytest.fixture(params=[_rust, reference_plan], ids=["rust", "reference"])
def plan(request: pytest.FixtureRequest) -> Planner:
    fn: Planner = request.param
    return fn


def spec(*names: str, mem: str = "1Gi") -> dict[str, Any]:
    return {
        "driver": "gpu.example.com",
        "pool": {"name": "pool-a"},
        "nodeName": "node-a",
        "devices": [{"name": n, "capacity": {"mem": {"value": mem}}} for n in names],
    }


def published(name: str, s: dict[str, Any], generation: int, count: int) -> dict[str, Any]:
    s = json.loads(json.dumps(s))
    s["pool"] = {"name": "pool-a", "generation": generation, "resourceSliceCount": count}
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7"}, "spec": s}


def test_first_publish_creates_everything_at_generation_one(plan: Planner) -> None:
    assert plan([spec("a"), spec("b")], []) == (1, [], [], [0, 1], [])


def test_restart_with_unchanged_plugins_writes_nothing(plan: Planner) -> None:
    desired = [spec("a", "b"), spec("c")]
    # Read back from the server: quantities respelled, empty fields dropped or null.
    s0 = published("s0", spec("a", "b", mem="1073741824"), 3, 2)
    s1 = published("s1", spec("c", mem="1024Mi"), 3, 2)
    s1["spec"]["sharedCounters"] = None
    assert plan(desired, [s1, s0]) == (3, [0, 1], [], [], [])


def test_one_changed_slice_is_updated_in_place_without_a_bump(plan: Planner) -> None:
    desired = [spec("a", "b"), spec("c", mem="2Gi")]
    observed = [published("s0", spec("a", "b"), 3, 2), published("s1", spec("c"), 3, 2)]
    assert plan(desired, observed) == (3, [0], [(1, 1, "s1", "7")], [], [])


def test_two_changed_slices_bump_the_generation(plan: Planner) -> None:
    desired = [spec("a", mem="2Gi"), spec("c", mem="2Gi")]
    observed = [published("s0", spec("a"), 3, 2), published("s1", spec("c"), 3, 2)]
    gen, unchanged, updates, creates, deletes = plan(desired, observed)
    assert (gen, unchanged, creates, deletes) == (4, [], [], [])
    assert updates == [(0, 0, "s0", "7"), (1, 1, "s1", "7")]


def test_a_new_slice_bumps_and_rewrites_every_kept_slice(plan: Planner) -> None:
    desired = [spec("a"), spec("b")]
    observed = [published("s0", spec("a"), 2, 1)]
    assert plan(desired, observed) == (3, [], [(0, 0, "s0", "7")], [1], [])


def test_a_single_slice_matches_its_single_desired_slice(plan: Planner) -> None:
    observed = [published("s0", spec("x", "y"), 1, 1)]
    assert plan([spec("a")], observed) == (1, [], [(0, 0, "s0", "7")], [], [])


def test_content_then_device_names_then_leftovers(plan: Planner) -> None:
    desired = [spec("a"), spec("b", mem="2Gi"), spec("c")]
    observed = [
        published("s0", spec("z"), 1, 3),  # leftover, rewritten as desired[2]
        published("s1", spec("b"), 1, 3),  # same device names as desired[1]
        published("s2", spec("a"), 1, 3),  # identical to desired[0]
    ]
    assert plan(desired, observed) == (
        2,
        [],
        [(2, 0, "s2", "7"), (1, 1, "s1", "7"), (0, 2, "s0", "7")],
        [],
        [],
    )


def test_surplus_and_obsolete_slices_are_deleted_with_preconditions(plan: Planner) -> None:
    desired = [spec("a")]
    observed = [
        published("old", spec("a"), 1, 1),
        published("s0", spec("a"), 2, 2),
        published("s1", spec("b"), 2, 2),
    ]
    gen, unchanged, updates, creates, deletes = plan(desired, observed)
    # s0 holds the right devices but the old slice count: one change, no bump.
    assert (gen, unchanged, updates, creates) == (2, [], [(1, 0, "s0", "7")], [])
    assert deletes == [(0, "old", "uid-old", "7"), (2, "s1", "uid-s1", "7")]


def test_no_desired_slices_deletes_the_pool(plan: Planner) -> None:
    observed = [published("s0", spec("a"), 1, 1)]
    assert plan([], observed) == (1, [], [], [], [(0, "s0", "uid-s0", "7")])


def test_device_order_is_significant(plan: Planner) -> None:
    desired = [spec("b", "a")]
    observed = [published("s0", spec("a", "b"), 1, 1)]
    assert plan(desired, observed) == (1, [], [(0, 0, "s0", "7")], [], [])


def test_taint_time_within_a_second_or_unset_is_equal(plan: Planner) -> None:
    def tainted(time: str | None) -> dict[str, Any]:
        s = spec("a")
        taint: dict[str, Any] = {"key": "example.com/t", "effect": "NoSchedule"}
        if time is not None:
            taint["timeAdded"] = time
        s["devices"][0]["taints"] = [taint]
        return s

    observed = [published("s0", tainted("2024-05-01T10:00:00Z"), 1, 1)]
    assert plan([tainted(None)], observed)[1] == [0]
    assert plan([tainted("2024-05-01T10:00:01Z")], observed)[1] == [0]
    assert plan([tainted("2024-05-01T10:00:02Z")], observed)[2] == [(0, 0, "s0", "7")]


def test_rust_rejects_malformed_input_naming_it() -> None:
    with pytest.raises(ValueError, match="desired slice 0"):
        _native.plan_pool([b"{"], [])
    with pytest.raises(ValueError, match=r"observed slice 0: metadata.name is missing"):
        _native.plan_pool([], [b'{"spec": {}}'])
    with pytest.raises(ValueError, match="different pools"):
        _native.plan_pool([b'{"pool": {"name": "a"}}', b'{"pool": {"name": "b"}}'], [])
    with pytest.raises(ValueError, match="not a JSON object"):
        _native.plan_pool([b"[]"], [])


def test_json_spelling_does_not_matter() -> None:
    a = b'{"driver": "d", "devices": [{"name": "x", "attributes": {"m": {"string": "a\\"b"}}}]}'
    b = (
        b'{"devices":[{"attributes":{"m":{"string":"a\\u0022b"}},"name":"\\u0078"}],'
        b'"driver":"d","driver":"d"}'
    )
    assert _native.slice_spec_equal(a, b)
    assert not _native.slice_spec_equal(a, b.replace(b"u0078", b"u0079"))
    # The last of duplicate keys wins, as in Go's and Python's decoders.
    assert _native.slice_spec_equal(b'{"driver": "x", "driver": "d"}', b'{"driver": "d"}')
    assert _native.slice_spec_equal(b'{"n": -0, "f": 1.0}', b'{"n": 0, "f": 1.00}')
    assert not _native.slice_spec_equal(b'{"n": 1}', b'{"n": 1.0}')


@pytest.mark.parametrize(
    "bad",
    [
        b'{"a": }',
        b'{"a": 1,}',
        b'{"a": "\\x"}',
        b'{"a": 01}',
        b'{"a": 1} x',
        b'{"a": "\xff"}',
        b'{"a": "\\ud800"}',
        b'{"a": ' + b"[" * 200 + b"]" * 200 + b"}",
        b'{"a": tru}',
    ],
)
def test_invalid_json_is_rejected(bad: bytes) -> None:
    with pytest.raises(ValueError, match="invalid"):
        _native.slice_spec_equal(b"{}", bad)


def test_prepared_slices_expose_their_identity() -> None:
    (o,) = _native.prepare_observed([json.dumps(published("s0", spec("a"), 1, 1)).encode()])
    (d,) = _native.prepare_desired([json.dumps(spec("a")).encode()])
    assert (o.name, o.uid, o.resource_version, d.pool_name) == ("s0", "uid-s0", "7", "pool-a")
    assert _native.plan_prepared([d], [o]) == (1, [0], [], [], [])
    with pytest.raises(ValueError, match="observed slice 0"):
        _native.prepare_observed([b"{"])
