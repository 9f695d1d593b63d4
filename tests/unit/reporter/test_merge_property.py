"""Our merge against the plain-Python Katalyst algorithm (tests/support/katalyst_reference.py):
equal wherever Katalyst is right, and where it fails the whole update on a bad field ours merges
the rest the same."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeagent.reporter.merge import ReportedField, merge_fields
from tests.support.katalyst_reference import KatalystError, katalyst_merge

QTYS = st.sampled_from(["1", "4", "100m", "2Gi", "1500m", "3k"])
NAMES = st.sampled_from(["0", "1", "2"])
RL = st.dictionaries(st.sampled_from(["cpu", "memory", "gpu"]), QTYS, max_size=3)


def unique_by(key: str, elems: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    return st.lists(elems, max_size=3, unique_by=lambda e: e[key])


def zones(depth: int) -> st.SearchStrategy[list[dict[str, Any]]]:
    fields: dict[str, Any] = {
        "type": st.sampled_from(["Socket", "Numa"]),
        "name": NAMES,
    }
    optional: dict[str, Any] = {
        "resources": st.fixed_dictionaries({}, optional={"allocatable": RL, "capacity": RL}),
        "attributes": unique_by(
            "name", st.fixed_dictionaries({"name": NAMES, "value": st.sampled_from(["a", "b"])})
        ),
        "allocations": unique_by(
            "consumer",
            st.fixed_dictionaries(
                {"consumer": st.sampled_from(["p1", "p2"])}, optional={"requests": RL}
            ),
        ),
    }
    if depth:
        optional["children"] = zones(depth - 1)
    return st.lists(
        st.fixed_dictionaries(fields, optional=optional),
        max_size=3,
        unique_by=lambda z: (z["type"], z["name"]),
    )


VALUES: dict[tuple[int, str], st.SearchStrategy[Any]] = {
    (1, "TopologyZone"): zones(2),
    (1, "Resources"): st.fixed_dictionaries({}, optional={"allocatable": RL, "capacity": RL}),
    (1, "TopologyPolicy"): st.sampled_from(["None", "SingleNUMANodeContainerLevel", ""]),
    (1, "Conditions"): st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["AgentReady"]), "status": st.sampled_from(["True", "False"])}
        ),
        max_size=2,
    ),
    (0, "NodeResourceProperties"): st.lists(
        st.fixed_dictionaries(
            {"propertyName": st.sampled_from(["cpu", "numa"])},
            optional={"propertyQuantity": QTYS, "propertyValues": st.lists(NAMES, max_size=2)},
        ),
        max_size=3,
    ),
    (0, "Taints"): st.lists(
        st.fixed_dictionaries(
            {
                "key": st.sampled_from(["node.katalyst.kubewharf.io/a", "b"]),
                "effect": st.sampled_from(["NoSchedule"]),
                "qosLevel": st.sampled_from(["shared_cores", "reclaimed_cores"]),
            },
            optional={"value": NAMES},
        ),
        max_size=2,
    ),
}

FIELD = st.sampled_from(sorted(VALUES)).flatmap(
    lambda k: VALUES[k].map(lambda v: (k[0], k[1], json.dumps(v).encode()))
)
REPORTS = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), FIELD), max_size=8)


def normal(v: Any) -> Any:
    """Empty values dropped (Go's omitempty and nil-vs-empty), zone children, attributes and
    allocations sorted (Katalyst leaves a zone reported once as it came)."""
    if isinstance(v, dict):
        out = {k: normal(e) for k, e in v.items()}
        for k, key in (("children", ("type", "name")), ("attributes", ("name",))):
            if isinstance(out.get(k), list):
                out[k] = sorted(out[k], key=lambda e: tuple(e.get(x, "") for x in key))
        if isinstance(out.get("allocations"), list):
            out["allocations"] = sorted(out["allocations"], key=lambda e: e.get("consumer", ""))
        return {k: e for k, e in out.items() if e not in (None, "", [], {})}
    if isinstance(v, list):
        return [normal(e) for e in v]
    return v


def ours(fields: list[tuple[str, tuple[int, str, bytes]]]) -> dict[str, Any]:
    got = merge_fields([ReportedField(p, ft, n, v) for p, (ft, n, v) in fields])
    assert got.bad == ()
    return normal({s: got.body.get(s, {}) for s in ("metadata", "spec", "status")})


def reference(fields: list[tuple[str, tuple[int, str, bytes]]]) -> dict[str, Any]:
    got = katalyst_merge({}, [f for _, f in fields])
    return normal({s: got.get(s, {}) for s in ("metadata", "spec", "status")})


@settings(max_examples=300, deadline=None)
@given(REPORTS)
def test_merge_equals_katalyst(fields: list[tuple[str, tuple[int, str, bytes]]]) -> None:
    assert ours(fields) == reference(fields)


@settings(max_examples=100, deadline=None)
@given(REPORTS, st.sampled_from([(1, "Bogus", b"1"), (1, "Resources", b'{"capacity": 3}')]))
def test_bad_field_fails_katalyst_but_not_the_rest(
    fields: list[tuple[str, tuple[int, str, bytes]]], bad: tuple[int, str, bytes]
) -> None:
    try:
        katalyst_merge({}, [*(f for _, f in fields), bad])
    except KatalystError:
        pass
    else:
        raise AssertionError("Katalyst accepted a bad field")
    got = merge_fields([ReportedField(p, ft, n, v) for p, (ft, n, v) in [*fields, ("z", bad)]])
    assert [(b.plugin, b.field_name) for b in got.bad] == [("z", bad[1])]
    body = normal({s: got.body.get(s, {}) for s in ("metadata", "spec", "status")})
    assert body == reference(fields)


ZONE_FIELDS = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        zones(2).map(lambda v: (1, "TopologyZone", json.dumps(v).encode())),
    ),
    min_size=2,
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(ZONE_FIELDS)
def test_overlapping_zones_equal_katalyst(fields: list[tuple[str, tuple[int, str, bytes]]]) -> None:
    assert ours(fields) == reference(fields)
