"""Hypothesis strategies: a pool's desired slice specs and observed slices that are semantic
copies (quantities respelled, null vs empty vs absent, taint times within a second), changed
copies, stale generations and strangers."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

Json = Any
ABSENT = object()

# Spellings of one value each.
QUANTITY_GROUPS: list[list[Json]] = [
    ["1Gi", "1073741824", "1024Mi", "1048576Ki", "1.0Gi"],
    ["1", "1000m", "1000000u", "1e0", "0.001k"],
    ["1500m", "1.5", "1500000000n"],
    ["0", "0m", "-0", None, ABSENT],
    ["2k", "2000", "2e3"],
]
# Spellings of *Quantity fields (request policies, node-allocatable resources): null is absent
# there, not zero.
OPTIONAL_QUANTITY_GROUPS: list[list[Json]] = [
    [v for v in g if v is not None and v is not ABSENT] for g in QUANTITY_GROUPS
]
TIMES: list[list[Json]] = [
    [
        "2024-05-01T10:00:00Z",
        "2024-05-01T12:00:00+02:00",
        "2024-05-01T10:00:01Z",
        # Go's parser takes these (issue 29 item 12); the server stores them without fraction.
        "2024-05-01T10:00:00.1234567891Z",
        "2024-05-01T9:00:00,5-01:00",
    ],
    ["2024-05-01T10:00:05Z", "2024-05-01T10:00:04Z"],
    [None, ABSENT],
    ["not-a-time"],
    ["2024-02-30T10:00:00Z"],  # the right shape, no such day: compared as text
]
DEVICE_NAMES = [f"dev-{i}" for i in range(8)]
EMPTY = [None, [], {}, ABSENT]


def _put(obj: dict[str, Json], key: str, value: Json) -> None:
    if value is not ABSENT:
        obj[key] = value


@st.composite
def device(draw: st.DrawFn, name: str) -> dict[str, Json]:
    d: dict[str, Json] = {"name": name}
    _put(
        d,
        "attributes",
        draw(
            st.sampled_from(
                [
                    ABSENT,
                    None,
                    {},
                    {"m": {"string": "a"}},
                    {"m": {"string": "b"}},
                    {"i": {"int": 1}},
                    {"i": {"int": 1}, "b": {"bool": False}},
                ]
            )
        ),
    )
    caps = draw(
        st.dictionaries(
            st.sampled_from(["mem", "cores"]), st.integers(0, len(QUANTITY_GROUPS) - 1), max_size=2
        )
    )
    if bool(caps) or draw(st.booleans()):
        capacity: dict[str, Json] = {}
        for k, g in caps.items():
            v = QUANTITY_GROUPS[g][0]
            capacity[k] = {} if v is ABSENT else {"value": v}
            policy = draw(request_policy())
            if policy is not ABSENT:
                capacity[k]["requestPolicy"] = policy
        d["capacity"] = capacity
    if draw(st.integers(0, 3)) == 0:
        d["allowMultipleAllocations"] = True
        d["nodeAllocatableResources"] = {
            "cpu": {"mapping": {"capacityKey": "mem", "capacityMultiplier": draw(_opt_q())}},
            "memory": {"overhead": {"perPod": draw(_opt_q()), "perContainer": draw(_opt_q())}},
        }
    if draw(st.integers(0, 3)) == 0:
        taint: dict[str, Json] = {"key": "example.com/t", "effect": "NoSchedule"}
        _put(taint, "timeAdded", TIMES[draw(st.integers(0, len(TIMES) - 1))][0])
        d["taints"] = [taint]
    return d


def _opt_q() -> st.SearchStrategy[Json]:
    return st.sampled_from([g[0] for g in OPTIONAL_QUANTITY_GROUPS])


@st.composite
def request_policy(draw: st.DrawFn) -> Json:
    kind = draw(st.sampled_from(["none", "none", "values", "range", "default"]))
    if kind == "none":
        return ABSENT
    policy: dict[str, Json] = {"default": draw(_opt_q())}
    if kind == "values":
        policy["validValues"] = draw(st.lists(_opt_q(), min_size=1, max_size=3))
    elif kind == "range":
        policy["validRange"] = {"min": draw(_opt_q()), "step": draw(_opt_q())}
    return policy


def _respell_optional(obj: dict[str, Json], key: str, draw: st.DrawFn) -> None:
    """Respell an optional quantity member; an absent one may become null."""
    if key in obj:
        obj[key] = _respell(obj[key], draw, OPTIONAL_QUANTITY_GROUPS)
    elif draw(st.booleans()):
        obj[key] = None


@st.composite
def desired_spec(draw: st.DrawFn) -> dict[str, Json]:
    names = draw(st.lists(st.sampled_from(DEVICE_NAMES), max_size=4, unique=True))
    spec: dict[str, Json] = {
        "driver": "gpu.example.com",
        "pool": {"name": "pool-a", "generation": 0, "resourceSliceCount": 1},
        "nodeName": "node-a",
        "devices": [draw(device(n)) for n in names],
    }
    kind = draw(st.sampled_from(["devices", "devices", "counters", "both"]))
    if kind != "devices":
        # "counters": the layout the publisher writes (a slice of counter sets only); "both":
        # what older agents wrote, still to be matched and replaced.
        sets = draw(st.lists(st.sampled_from(["set", "set-2", "gpu-0"]), min_size=1, unique=True))
        value = draw(st.sampled_from(["4", "4000m", "8"]))
        spec["sharedCounters"] = [{"name": n, "counters": {"c": {"value": value}}} for n in sets]
        if kind == "counters":
            del spec["devices"]
    return spec


def _respell(value: Json, draw: st.DrawFn, groups: list[list[Json]]) -> Json:
    for g in groups:
        if value in g:
            return draw(st.sampled_from(g))
    return value


@st.composite
def semantic_copy(draw: st.DrawFn, spec: dict[str, Json]) -> dict[str, Json]:
    """A spec semantically equal to `spec` (pool aside)."""
    out = copy.deepcopy(spec)
    for d in out.get("devices", []):
        for k in ("attributes", "capacity", "taints"):
            if k in d and not d[k]:
                v = draw(st.sampled_from(EMPTY))
                d.pop(k)
                _put(d, k, v)
        for c in (d.get("capacity") or {}).values():
            v = _respell(c.get("value", ABSENT), draw, QUANTITY_GROUPS)
            c.pop("value", None)
            _put(c, "value", v)
            policy = c.get("requestPolicy")
            if policy is not None:
                _respell_optional(policy, "default", draw)
                if "validValues" in policy:
                    policy["validValues"] = [
                        _respell(q, draw, OPTIONAL_QUANTITY_GROUPS) for q in policy["validValues"]
                    ]
                if "validRange" in policy:
                    for k in ("min", "max", "step"):
                        _respell_optional(policy["validRange"], k, draw)
        for resource in (d.get("nodeAllocatableResources") or {}).values():
            for part, keys in (
                ("mapping", ("capacityMultiplier", "deviceMultiplier")),
                ("overhead", ("perPod", "perContainer")),
            ):
                for k in keys:
                    if part in resource:
                        _respell_optional(resource[part], k, draw)
        for t in d.get("taints") or []:
            v = _respell(t.get("timeAdded", ABSENT), draw, TIMES[:1] + TIMES[2:])
            t.pop("timeAdded", None)
            _put(t, "timeAdded", v)
    if not out.get("sharedCounters"):
        out.pop("sharedCounters", None)
        _put(out, "sharedCounters", draw(st.sampled_from(EMPTY)))
    if draw(st.booleans()):
        out["allNodes"] = False
    return out


@st.composite
def changed_copy(draw: st.DrawFn, spec: dict[str, Json]) -> dict[str, Json]:
    out = draw(semantic_copy(spec))
    devices = out.get("devices") or []
    change = draw(
        st.sampled_from(
            ["reorder", "attr", "drop", "add", "time", "time2", "quantity", "policy", "overhead"]
        )
    )
    if change == "reorder" and len(devices) > 1:
        devices.reverse()
    elif change == "attr" and devices:
        devices[0]["attributes"] = {"m": {"string": "changed"}}
    elif change == "drop" and devices:
        devices.pop()
    elif change == "add":
        free = [n for n in DEVICE_NAMES if n not in {d["name"] for d in devices}]
        if free:
            devices.append({"name": free[0]})
            out["devices"] = devices
    elif change == "time" and devices:
        devices[0]["taints"] = [
            {"key": "example.com/t", "effect": "NoSchedule", "timeAdded": "2024-05-01T10:00:05Z"}
        ]
    elif change == "time2" and devices:
        # Two seconds from the first spelling, one from the second: the tolerance's edge.
        devices[0]["taints"] = [
            {"key": "example.com/t", "effect": "NoSchedule", "timeAdded": "2024-05-01T10:00:02Z"}
        ]
    elif change == "quantity" and devices:
        devices[0]["capacity"] = {"mem": {"value": "1G"}}
    elif change == "policy" and devices:
        policy = {"default": draw(st.sampled_from(["3", None])), "validValues": ["3"]}
        devices[0]["capacity"] = {"mem": {"value": "4", "requestPolicy": policy}}
    elif change == "overhead" and devices:
        devices[0]["nodeAllocatableResources"] = {"memory": {"overhead": {"perPod": "7"}}}
    return out


@st.composite
def pool_case(draw: st.DrawFn) -> tuple[list[Json], list[Json]]:
    desired = draw(st.lists(desired_spec(), max_size=5))
    if draw(st.booleans()):
        return desired, draw(republished(desired))
    n_obs = draw(st.integers(0, 6))
    observed = []
    for k in range(n_obs):
        kind = draw(st.sampled_from(["same", "changed", "stranger"]))
        if desired and kind != "stranger":
            base = draw(st.sampled_from(desired))
            spec = draw(semantic_copy(base) if kind == "same" else changed_copy(base))
        else:
            spec = draw(desired_spec())
        spec["pool"] = {
            "name": draw(st.sampled_from(["pool-a", "pool-a", "pool-a", "other"])),
            "generation": draw(st.sampled_from([0, 1, 1, 2, None, "x"])),
            "resourceSliceCount": draw(st.sampled_from([len(desired), len(desired), 1, None])),
        }
        observed.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "name": draw(st.sampled_from([f"s-{k}", f"z-{k}", f"a-{k}"])),
                    "uid": f"uid-{k}",
                    "resourceVersion": str(100 + k),
                },
                "spec": spec,
            }
        )
    return desired, observed


@st.composite
def republished(draw: st.DrawFn, desired: list[Json]) -> list[Json]:
    """What an earlier publish of `desired` left: semantic copies at one generation, with at
    most a few slices changed, dropped or left over from an older generation."""
    gen = draw(st.integers(1, 3))
    observed = []
    for k, d in enumerate(desired):
        # Changed slices are common enough that two of them (a generation bump) come up often.
        fate = draw(st.sampled_from(["same", "same", "changed", "changed", "gone"]))
        if fate == "gone":
            continue
        spec = draw(semantic_copy(d) if fate == "same" else changed_copy(d))
        spec["pool"] = {"name": "pool-a", "generation": gen, "resourceSliceCount": len(desired)}
        observed.append(_slice(f"s-{draw(st.integers(0, 99)):02d}-{k}", k, spec))
    for k in range(draw(st.integers(0, 2))):
        spec = draw(desired_spec())
        spec["pool"]["generation"] = draw(st.integers(0, gen))
        observed.append(_slice(f"x-{k}", 50 + k, spec))
    return observed


def _slice(name: str, k: int, spec: dict[str, Json]) -> dict[str, Json]:
    return {
        "metadata": {"name": name, "uid": f"uid-{k}", "resourceVersion": str(100 + k)},
        "spec": spec,
    }
