"""Katalyst's CNR merge in plain Python, as literally as Go allows: the bench baseline and the
reference that `nodeagent.reporter.merge` is property-tested against.

The steps of [core] `reporter/manager.go` PushContents and `reporter/cnr/cnrreporter.go`
Update: every field's gogo ``String()`` is built and the fields stable-sorted by it; each field
is looked up by its Go name (a bad name or value fails the whole update: `KatalystError`); on the
first occurrence of a name the target is zeroed; the value is decoded into a Go value of the
field's type (every struct field present, zero when absent: Go's json.Unmarshal), then merged
with `syntax.SimpleMergeTwoValues`; finally reviseCNR (`util.MergeTopologyZone(nil, zones)`,
`MergeTaints(origin's unmanaged, taints)`).

Two places where Go is not deterministic are pinned: Go map iteration order (zones and
allocations are sorted after it anyway; attributes are sorted with a comparator that compares a
name to a value, so their order is whatever the map gave) sorts attributes by name here.
Quantities are canonical (Go's Quantity marshals canonically), through `nodeagent.core.k8s`.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.quantity import canonical, parse_quantity

__all__ = ["KatalystError", "field_string", "katalyst_merge"]


class KatalystError(Exception):
    """The whole update fails (Katalyst: one bad field blocks every CNR field)."""


# Go types: ("string",) ("int",) ("qty",) ("time",) ("any",) ("slice", T) ("map", T) ("ptr", T)
# ("struct", {json name: T}).
S: tuple[Any, ...] = ("string",)
QTY: tuple[Any, ...] = ("qty",)
TIME: tuple[Any, ...] = ("time",)
RL: tuple[Any, ...] = ("map", QTY)
RESOURCES: tuple[Any, ...] = (
    "struct",
    {
        "allocatable": ("ptr", RL),
        "capacity": ("ptr", RL),
        "resourcePackages": ("slice", ("any",)),
        "resourcePools": ("slice", ("any",)),
    },
)
ZONE_RESOURCES: tuple[Any, ...] = ("struct", {"allocatable": ("ptr", RL), "capacity": ("ptr", RL)})
ATTR: tuple[Any, ...] = ("struct", {"name": S, "value": S})
ZONE_FIELDS: dict[str, Any] = {}
ZONE: tuple[Any, ...] = ("struct", ZONE_FIELDS)
ZONE_FIELDS.update(
    {
        "type": S,
        "name": S,
        "resources": ZONE_RESOURCES,
        "attributes": ("slice", ATTR),
        "allocations": ("slice", ("ptr", ("struct", {"consumer": S, "requests": ("ptr", RL)}))),
        "children": ("slice", ("ptr", ZONE)),
        "siblings": ("slice", ("struct", {"type": S, "name": S, "attributes": ("slice", ATTR)})),
    }
)
GO_FIELDS: dict[tuple[str, str], tuple[str, str, tuple[Any, ...]]] = {
    ("Metadata", "Labels"): ("metadata", "labels", ("map", S)),
    ("Metadata", "Annotations"): ("metadata", "annotations", ("map", S)),
    ("Spec", "NodeResourceProperties"): (
        "spec",
        "nodeResourceProperties",
        (
            "slice",
            (
                "ptr",
                (
                    "struct",
                    {
                        "propertyName": S,
                        "propertyValues": ("slice", S),
                        "propertyQuantity": ("ptr", QTY),
                    },
                ),
            ),
        ),
    ),
    ("Spec", "Taints"): (
        "spec",
        "taints",
        (
            "slice",
            (
                "ptr",
                (
                    "struct",
                    {"qosLevel": S, "key": S, "value": S, "effect": S, "timeAdded": ("ptr", TIME)},
                ),
            ),
        ),
    ),
    ("Status", "Resources"): ("status", "resources", RESOURCES),
    ("Status", "TopologyZone"): ("status", "topologyZone", ("slice", ("ptr", ZONE))),
    ("Status", "TopologyPolicy"): ("status", "topologyPolicy", S),
    ("Status", "Conditions"): (
        "status",
        "conditions",
        (
            "slice",
            (
                "struct",
                {"type": S, "status": S, "lastHeartbeatTime": TIME, "reason": S, "message": S},
            ),
        ),
    ),
}
TYPE_NAMES = {0: "Spec", 1: "Status", 2: "Metadata"}


def field_string(field_type: int, name: str, value: bytes) -> str:
    """gogo's generated ``(*ReportField).String()``."""
    type_name = TYPE_NAMES.get(field_type, str(field_type))
    rendered = "[" + " ".join(str(b) for b in value) + "]"
    return f"&ReportField{{FieldType:{type_name},FieldName:{name},Value:{rendered},}}"


def zero(t: tuple[Any, ...]) -> Any:
    if t[0] == "string":
        return ""
    if t[0] == "int":
        return 0
    if t[0] == "struct":
        return {k: zero(ft) for k, ft in t[1].items()}
    return None  # nil slices, maps, pointers; the zero Quantity and Time


def decode(v: Any, t: tuple[Any, ...]) -> Any:
    """json.Unmarshal into a fresh value of type t."""
    kind = t[0]
    if v is None:
        return zero(t)
    if kind == "string":
        if not isinstance(v, str):
            raise KatalystError(f"cannot unmarshal {type(v).__name__} into string")
        return v
    if kind == "int":
        if not isinstance(v, int) or isinstance(v, bool):
            raise KatalystError("cannot unmarshal into int")
        return v
    if kind == "qty":
        try:
            return canonical(parse_quantity(str(v).strip()))
        except Exception as exc:
            raise KatalystError(f"quantity: {exc}") from exc
    if kind in ("time", "any"):
        return v
    if kind == "ptr":
        return decode(v, t[1])
    if kind == "slice":
        if not isinstance(v, list):
            raise KatalystError("cannot unmarshal into slice")
        return [decode(e, t[1]) if e is not None else zero(t[1]) for e in v]
    if kind == "map":
        if not isinstance(v, dict):
            raise KatalystError("cannot unmarshal into map")
        return {k: decode(e, t[1]) for k, e in v.items()}
    if not isinstance(v, dict):
        raise KatalystError("cannot unmarshal into struct")
    return {k: decode(v.get(k), ft) for k, ft in t[1].items()}


def simple_merge(src: Any, dst: Any, t: tuple[Any, ...]) -> Any:
    """syntax.SimpleMergeTwoValues(src, dst): the new dst."""
    kind = t[0]
    if kind == "slice":
        is_ptr = t[1][0] == "ptr"
        out = [e for e in (dst or []) if not (is_ptr and e is None)]
        out += [e for e in (src or []) if not (is_ptr and e is None)]
        return out or None
    if kind == "map":
        new = dict(dst or {})
        new.update(src or {})
        return new
    if kind == "struct":
        return {k: simple_merge(src[k], dst[k], ft) for k, ft in t[1].items()}
    if kind == "ptr":
        if src is None:
            return dst
        if dst is None:
            dst = zero(t[1])
        return simple_merge(src, dst, t[1])
    return src


def merge_resource_list(dst: Any, src: Any) -> Any:
    """native.MergeResources: the first value of each name wins."""
    if dst is None and src is None:
        return None
    out = dict(dst or {})
    for k, v in (src or {}).items():
        out.setdefault(k, v)
    return out


def merge_topology_zone(dst: Any, src: Any) -> Any:
    if dst is None and src is None:
        return None
    zones: dict[tuple[str, str], Any] = {}
    for z in dst or []:
        if z is not None:
            zones[(z["type"], z["name"])] = json.loads(json.dumps(z))
    for z in src or []:
        if z is None:
            continue
        key = (z["type"], z["name"])
        if key not in zones:
            zones[key] = json.loads(json.dumps(z))
            continue
        got = zones[key]
        for k in ("capacity", "allocatable"):
            got["resources"][k] = merge_resource_list(got["resources"][k], z["resources"][k])
        got["attributes"] = merge_attributes(got["attributes"], z["attributes"])
        got["allocations"] = merge_allocations(got["allocations"], z["allocations"])
        got["children"] = merge_topology_zone(got["children"], z["children"])
    return [zones[k] for k in sorted(zones)]


def merge_attributes(dst: Any, src: Any) -> Any:
    if dst is None and src is None:
        return None
    attrs: dict[str, Any] = {}
    for a in dst or []:
        attrs[a["name"]] = a
    for a in src or []:
        attrs.setdefault(a["name"], a)
    return [attrs[k] for k in sorted(attrs)]


def merge_allocations(dst: Any, src: Any) -> Any:
    if dst is None and src is None:
        return None
    allocs: dict[str, Any] = {}
    for a in dst or []:
        if a is not None:
            allocs[a["consumer"]] = dict(a)
    for a in src or []:
        if a is None:
            continue
        if a["consumer"] not in allocs:
            allocs[a["consumer"]] = dict(a)
            continue
        got = allocs[a["consumer"]]
        got["requests"] = merge_resource_list(got["requests"], a["requests"])
    return [allocs[k] for k in sorted(allocs)]


def merge_taints(origin: Any, new: Any) -> Any:
    seen: dict[tuple[str, str, str], Any] = {}
    for t in [*(origin or []), *(new or [])]:
        if t is None:
            continue
        seen.setdefault((t["qosLevel"], t["key"], t["effect"]), t)
    return [seen[k] for k in sorted(seen, key=lambda k: (k[1], k[0], k[2]))]


def katalyst_merge(origin: dict[str, Any], fields: list[tuple[int, str, bytes]]) -> dict[str, Any]:
    """The CNR after one PushContents: ``origin`` (JSON, not modified) with the fields merged.
    Raises KatalystError where Katalyst fails the update."""
    cnr = json.loads(json.dumps(origin))
    cnr.setdefault("metadata", {})
    cnr.setdefault("spec", {})
    cnr.setdefault("status", {})
    origin_taints = list((origin.get("spec") or {}).get("taints") or [])
    ordered = sorted(fields, key=lambda f: field_string(*f))
    seen: set[str] = set()
    touched: dict[tuple[str, str], tuple[Any, ...]] = {}
    for field_type, name, value in ordered:
        found = GO_FIELDS.get((TYPE_NAMES.get(field_type, ""), name))
        if found is None:
            raise KatalystError(f"field {name} not found")
        section, json_name, t = found
        try:
            parsed = decode(json.loads(value), t)
        except json.JSONDecodeError as exc:
            raise KatalystError(f"could not unmarshal: {exc}") from exc
        if name not in seen:
            seen.add(name)
            cnr[section][json_name] = zero(t)
        cnr[section][json_name] = simple_merge(parsed, cnr[section][json_name], t)
        touched[(section, json_name)] = t
    # reviseCNR
    zones = cnr["status"].get("topologyZone")
    if zones is not None:
        cnr["status"]["topologyZone"] = merge_topology_zone(None, zones)
    unmanaged = [t for t in origin_taints if not t["key"].startswith("node.katalyst.kubewharf.io")]
    if unmanaged or cnr["spec"].get("taints"):
        cnr["spec"]["taints"] = merge_taints(unmanaged, cnr["spec"].get("taints"))
    return cnr
