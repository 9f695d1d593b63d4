"""Plain Python reference of the ResourceSlice planner: the same rules as rust/src/planner,
written as recursive semantic comparison on dicts with Fraction quantities and O(n*m) scans, no
canonical strings and no hashing."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from tests.support.go_time import parse_rfc3339
from tests.support.quantity import QuantityError, parse_quantity

Json = Any
PlanTuple = tuple[
    int,
    list[int],
    list[tuple[int, int, str, str]],
    list[int],
    list[tuple[int, str, str, str]],
]

# Where the v1 spec holds Quantities ("*" is any list index or map key).
_QUANTITY_MAPS = {
    ("devices", "*", "capacity"),
    ("devices", "*", "consumesCounters", "*", "counters"),
    ("sharedCounters", "*", "counters"),
}
_TAINTS = ("devices", "*", "taints")
# Optional (*Quantity) scalars: compared by value; null is absent. "*" matches any key.
_POLICY = ("devices", "*", "capacity", "*", "entry", "requestPolicy")
_ALLOC = ("devices", "*", "nodeAllocatableResources", "*")
_QUANTITY_FIELDS = [
    (*_POLICY, "default"),
    (*_POLICY, "validRange", "min"),
    (*_POLICY, "validRange", "max"),
    (*_POLICY, "validRange", "step"),
    (*_ALLOC, "mapping", "capacityMultiplier"),
    (*_ALLOC, "mapping", "deviceMultiplier"),
    (*_ALLOC, "overhead", "perPod"),
    (*_ALLOC, "overhead", "perContainer"),
]
# List elements: a null one is a zero Quantity.
_QUANTITY_LIST = (*_POLICY, "validValues", "*")


def _matches(path: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    return len(path) == len(pattern) and all(
        q == "*" or p == q for p, q in zip(path, pattern, strict=True)
    )


def _empty(v: Json) -> bool:
    return v is None or v == [] or v == {}


def _quantity_value(v: Json) -> tuple[str, Any]:
    if v is None:
        return ("q", Fraction(0))
    if isinstance(v, bool) or not isinstance(v, str | int):
        return ("other", v)
    try:
        return ("q", parse_quantity(str(v)).value)
    except QuantityError:
        return ("bad", str(v))


def _times_equal(a: Json, b: Json) -> bool:
    if a is None or b is None:
        return True
    if not (isinstance(a, str) and isinstance(b, str)):
        return bool(a == b and type(a) is type(b))
    ta, tb = parse_rfc3339(a), parse_rfc3339(b)
    if ta is None or tb is None:
        return a == b
    return abs(ta - tb) <= 10**9


def _scalar_equal(a: Json, b: Json) -> bool:
    return type(a) is type(b) and a == b


def _eq(a: Json, b: Json, path: tuple[str, ...]) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        if path in _QUANTITY_MAPS:
            return _quantity_map_equal(a, b, path)
        for k in a.keys() | b.keys():
            x, y = a.get(k), b.get(k)
            if path == () and k == "pool":
                continue
            if path == () and k == "allNodes":
                x = None if x is False else x
                y = None if y is False else y
            if path == (*_TAINTS, "*") and k == "timeAdded":
                if not _times_equal(x, y):
                    return False
                continue
            if any(_matches((*path, k), q) for q in _QUANTITY_FIELDS):
                if x is None and y is None:
                    continue
                if x is None or y is None or _quantity_value(x) != _quantity_value(y):
                    return False
                continue
            if _empty(x) and _empty(y):
                continue
            if _empty(x) or _empty(y) or not _eq(x, y, (*path, k)):
                return False
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_eq(x, y, (*path, "*")) for x, y in zip(a, b, strict=True))
    if _matches(path, _QUANTITY_LIST):
        return _quantity_value(a) == _quantity_value(b)
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    return _scalar_equal(a, b)


def _quantity_map_equal(a: dict[str, Json], b: dict[str, Json], path: tuple[str, ...]) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        x = {} if x is None else x
        y = {} if y is None else y
        if not (isinstance(x, dict) and isinstance(y, dict)):
            if not _eq(x, y, (*path, "*")):
                return False
            continue
        if _quantity_value(x.get("value")) != _quantity_value(y.get("value")):
            return False
        rest_x = {f: v for f, v in x.items() if f != "value"}
        rest_y = {f: v for f, v in y.items() if f != "value"}
        if not _eq(rest_x, rest_y, (*path, "*", "entry")):
            return False
    return True


def spec_equal(a: Json, b: Json) -> bool:
    """Semantic equality of two spec objects, ignoring `pool`."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return _eq(a, b, ("<not a spec>",))
    return _eq(a, b, ())


def _int_or_zero(v: Json) -> int | None:
    if v is None:
        return 0
    if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63:
        return v
    return None


def _names(spec: Json) -> list[str]:
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if not isinstance(devices, list):
        return []
    return sorted(
        d["name"] if isinstance(d, dict) and isinstance(d.get("name"), str) else "" for d in devices
    )


def _pool(spec: Json) -> dict[str, Json]:
    pool = spec.get("pool") if isinstance(spec, dict) else None
    return pool if isinstance(pool, dict) else {}


def reference_plan(desired: list[Json], observed: list[Json]) -> PlanTuple:
    """The plan for one pool, in the same shape as `nodeagent._native.plan_pool`."""
    obs = []
    for j, o in enumerate(observed):
        meta = o.get("metadata") or {}
        if not meta.get("name"):
            raise ValueError(f"observed slice {j}: metadata.name is missing")
        spec = o.get("spec")
        pool = _pool(spec)
        gen = _int_or_zero(pool.get("generation"))
        name = pool.get("name")
        obs.append(
            {
                "index": j,
                "name": meta["name"],
                "uid": meta.get("uid") or "",
                "rv": meta.get("resourceVersion") or "",
                "gen": -(2**63) if gen is None else gen,
                "pool_name": "" if name is None else name if isinstance(name, str) else None,
                "count": _int_or_zero(pool.get("resourceSliceCount")),
                "spec": spec,
            }
        )
    obs.sort(key=lambda o: o["name"])
    max_gen = max([0, *(o["gen"] for o in obs)])
    current = [o for o in obs if o["gen"] >= max_gen]
    deletes = [o["index"] for o in obs if o["gen"] < max_gen]

    def delete_tuples(idx: list[int]) -> list[tuple[int, str, str, str]]:
        by = {o["index"]: o for o in obs}
        return [(j, by[j]["name"], by[j]["uid"], by[j]["rv"]) for j in sorted(idx)]

    if not desired:
        return (max_gen, [], [], [], delete_tuples(deletes + [o["index"] for o in current]))

    match: list[dict[str, Any] | None] = [None] * len(desired)
    taken: set[int] = set()
    if len(current) == 1 and len(desired) == 1:
        match[0] = current[0]
        taken.add(current[0]["index"])
    else:
        for i, d in enumerate(desired):
            for o in current:
                if o["index"] not in taken and spec_equal(d, o["spec"]):
                    match[i] = o
                    taken.add(o["index"])
                    break
        for i, d in enumerate(desired):
            if match[i] is None:
                for o in current:
                    if o["index"] not in taken and _names(o["spec"]) == _names(d):
                        match[i] = o
                        taken.add(o["index"])
                        break
        spare = [o for o in current if o["index"] not in taken]
        for i in range(len(desired)):
            if match[i] is None and spare:
                o = spare.pop(0)
                match[i] = o
                taken.add(o["index"])
    deletes += [o["index"] for o in current if o["index"] not in taken]

    pool_name = _pool(desired[0]).get("name") or ""
    creates = [i for i, m in enumerate(match) if m is None]
    changed: list[int] = []
    same: list[int] = []
    for i, m in enumerate(match):
        if m is None:
            continue
        unchanged = (
            m["pool_name"] == pool_name
            and m["count"] == len(desired)
            and spec_equal(desired[i], m["spec"])
        )
        (same if unchanged else changed).append(i)
    generation = max_gen
    if creates or len(changed) > 1:
        generation += 1
        changed, same = [i for i, m in enumerate(match) if m is not None], []
    updates = []
    for i in changed:
        m = match[i]
        assert m is not None
        updates.append((m["index"], i, m["name"], m["rv"]))
    unchanged_idx = sorted(m["index"] for i in same if (m := match[i]) is not None)
    return (generation, unchanged_idx, updates, creates, delete_tuples(deletes))
