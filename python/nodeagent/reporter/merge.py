"""The CNR merge: every plugin's report fields folded into one CustomNodeResource, as Katalyst's
CNR reporter does (kubewharf/katalyst-core `pkg/agent/resourcemanager/reporter/manager.go`
PushContents, `pkg/agent/resourcemanager/reporter/cnr/cnrreporter.go` setCNR, `pkg/util/cnr.go`
reviseCNR), with its gaps fixed.

Kept from Katalyst:
- only fields of GVK node.katalyst.kubewharf.io/v1alpha1 CustomNodeResource count (other GVKs
  are ignored, as an unknown GVK is not an error there);
- fields are ordered by gogo ``ReportField.String()``: field type name, field name, then the
  value bytes rendered as decimal text (``[123 34 ...]``), so the later field of two wins;
- a field (by Go name) is zeroed at its first occurrence, then every occurrence is merged into
  it by type: lists append (null elements dropped), maps union with the later key winning,
  structs recurse field by field, pointers keep the earlier value when the later one is null,
  scalars, times and quantities take the later value;
- topology zones are deduplicated by (type, name) with the first occurrence winning per
  resource name, attribute and allocation consumer, then sorted; taints keep the observed
  object's unmanaged taints and dedupe by (qosLevel, key, effect), first wins, sorted.

Fixed:
- a bad field (unknown name, value that is not JSON of the field's type) is skipped and
  reported as a `BadField`, and every other field still merges (Katalyst fails the whole CNR);
- labels and annotations merge per key (Katalyst zeroes the whole map, wiping other writers'
  keys): the merge yields only the keys reported, and server-side apply keeps the rest;
- zones are normalised at every level (Katalyst sorts attributes with a typo'd comparator over
  Go map order, and leaves the children of a zone reported once unsorted);
- quantities are canonicalised (`nodeagent._native.quantity_canonical`, rust/src/quantity.rs), so
  equal values compare equal.

The result holds only what plugins report: `nodeagent.reporter.cnr` applies it with server-side
apply, which removes what this agent reported before and no longer does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from nodeagent._native import quantity_canonical
from nodeagent.core.k8s import is_rfc3339

__all__ = [
    "CNR_API_VERSION",
    "CNR_GROUP",
    "CNR_KIND",
    "CNR_VERSION",
    "FIELDS",
    "MANAGED_TAINT_PREFIX",
    "BadField",
    "FieldSpec",
    "MergeResult",
    "ReportedField",
    "fields_of",
    "merge_fields",
    "merge_taints",
    "merge_zones",
    "sort_key",
]

CNR_GROUP = "node.katalyst.kubewharf.io"
CNR_VERSION = "v1alpha1"
CNR_KIND = "CustomNodeResource"
CNR_API_VERSION = f"{CNR_GROUP}/{CNR_VERSION}"
MANAGED_TAINT_PREFIX = "node.katalyst.kubewharf.io"
FIELD_TYPE_NAMES = {0: "Spec", 1: "Status", 2: "Metadata"}

# --- the CNR's Go types, as far as the merge needs them ---


class _T:
    """A Go type of the CNR API: how a JSON value of it decodes and how two values merge."""


class _Scalar(_T):
    def __init__(self, py: type | tuple[type, ...], name: str) -> None:
        self.py, self.name = py, name


class _Time(_T):
    pass


class _Quantity(_T):
    pass


class _Any(_T):
    """A value kept whole (types the merge never looks into)."""


class _List(_T):
    def __init__(self, elem: _T) -> None:
        self.elem = elem


class _Map(_T):
    def __init__(self, value: _T) -> None:
        self.value = value


class _Ptr(_T):
    def __init__(self, inner: _T) -> None:
        self.inner = inner


class _Struct(_T):
    def __init__(self, fields: dict[str, _T]) -> None:
        self.fields = fields


STR = _Scalar(str, "string")
INT = _Scalar(int, "integer")
TIME = _Time()
QTY = _Quantity()
ANY = _Any()
RESOURCE_LIST = _Map(QTY)
RESOURCES = _Struct(
    {
        "allocatable": _Ptr(RESOURCE_LIST),
        "capacity": _Ptr(RESOURCE_LIST),
        "resourcePackages": _List(ANY),
        "resourcePools": _List(ANY),
    }
)
ATTRIBUTE = _Struct({"name": STR, "value": STR})
ALLOCATION = _Struct({"consumer": STR, "requests": _Ptr(RESOURCE_LIST)})
SIBLING = _Struct({"type": STR, "name": STR, "attributes": _List(ATTRIBUTE)})
ZONE = _Struct({})
ZONE.fields.update(
    {
        "type": STR,
        "name": STR,
        "resources": _Struct({"allocatable": _Ptr(RESOURCE_LIST), "capacity": _Ptr(RESOURCE_LIST)}),
        "attributes": _List(ATTRIBUTE),
        "allocations": _List(_Ptr(ALLOCATION)),
        "children": _List(_Ptr(ZONE)),
        "siblings": _List(SIBLING),
    }
)
PROPERTY = _Struct(
    {"propertyName": STR, "propertyValues": _List(STR), "propertyQuantity": _Ptr(QTY)}
)
TAINT = _Struct({"qosLevel": STR, "key": STR, "value": STR, "effect": STR, "timeAdded": _Ptr(TIME)})
CONDITION = _Struct(
    {"type": STR, "status": STR, "lastHeartbeatTime": TIME, "reason": STR, "message": STR}
)
NUMA_METRIC = _Struct({"numaId": INT, "usage": _Ptr(RESOURCE_LIST)})
NODE_METRIC_STATUS = _Ptr(
    _Struct(
        {
            "updateTime": TIME,
            "nodeMetric": _Ptr(
                _Struct({"genericUsage": _Ptr(RESOURCE_LIST), "numaUsage": _List(NUMA_METRIC)})
            ),
            "groupMetric": _List(ANY),
        }
    )
)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One reportable CNR field: its Go name (the report's ``fieldName``), where it lives in the
    object (``metadata``, ``spec`` or ``status``) and its JSON name there."""

    go_name: str
    section: str
    json_name: str
    type: _T = field(repr=False)


FIELDS: dict[tuple[str, str], FieldSpec] = {
    (ft, spec.go_name): spec
    for ft, spec in [
        ("Metadata", FieldSpec("Labels", "metadata", "labels", _Map(STR))),
        ("Metadata", FieldSpec("Annotations", "metadata", "annotations", _Map(STR))),
        (
            "Spec",
            FieldSpec(
                "NodeResourceProperties", "spec", "nodeResourceProperties", _List(_Ptr(PROPERTY))
            ),
        ),
        ("Spec", FieldSpec("Taints", "spec", "taints", _List(_Ptr(TAINT)))),
        ("Status", FieldSpec("Resources", "status", "resources", RESOURCES)),
        ("Status", FieldSpec("TopologyZone", "status", "topologyZone", _List(_Ptr(ZONE)))),
        ("Status", FieldSpec("TopologyPolicy", "status", "topologyPolicy", STR)),
        ("Status", FieldSpec("Conditions", "status", "conditions", _List(CONDITION))),
        ("Status", FieldSpec("NodeMetricStatus", "status", "nodeMetricStatus", NODE_METRIC_STATUS)),
    ]
}
"""The reportable fields by (field type name, Go field name): Katalyst's ``getCNRField`` looks
up any first-level Go field; the metadata ones other than labels and annotations (name,
finalizers, owner references...) are not a plugin's to set, so they are unknown here."""

# --- decoding: JSON of a Go type ---


class _DecodeError(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)


def _decode(v: Any, t: _T, path: str) -> Any:
    """A JSON value as the Go type would hold it, with absent meaning Go's zero value: None for
    null (Go leaves the zero value), struct fields not in the type dropped (Go ignores them),
    quantities canonical. Raises _DecodeError naming the path where the value does not fit."""
    if v is None:
        return None
    if isinstance(t, _Scalar):
        if not isinstance(v, t.py) or isinstance(v, bool):
            raise _DecodeError(path, f"want {t.name}, got {type(v).__name__}")
        return v
    if isinstance(t, _Time):
        if not isinstance(v, str) or not is_rfc3339(v):
            raise _DecodeError(path, "want an RFC 3339 time")
        return v
    if isinstance(t, _Quantity):
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise _DecodeError(path, "want a quantity")
        try:
            # The Rust quantity code (property-tested against nodeagent.core.k8s).
            return quantity_canonical(str(v).strip())
        except ValueError as exc:
            raise _DecodeError(path, str(exc)) from None
    if isinstance(t, _Any):
        return v
    if isinstance(t, _Ptr):
        return _decode(v, t.inner, path)
    if isinstance(t, _List):
        if not isinstance(v, list):
            raise _DecodeError(path, f"want a list, got {type(v).__name__}")
        return [_decode(e, t.elem, f"{path}[{i}]") for i, e in enumerate(v)]
    if isinstance(t, _Map):
        if not isinstance(v, dict):
            raise _DecodeError(path, f"want an object, got {type(v).__name__}")
        return {k: _decode(e, t.value, f"{path}.{k}") for k, e in v.items()}
    assert isinstance(t, _Struct)
    if not isinstance(v, dict):
        raise _DecodeError(path, f"want an object, got {type(v).__name__}")
    out: dict[str, Any] = {}
    for k, ft in t.fields.items():
        if k in v:
            d = _decode(v[k], ft, f"{path}.{k}" if path else k)
            if d is not None:
                out[k] = d
    return out


# --- merging: Katalyst's SimpleMergeTwoValues ---


def _merge(dst: Any, src: Any, t: _T) -> Any:
    """``src`` merged into ``dst`` (both decoded values of type ``t``, None for zero)."""
    # Empty lists and maps are None (Go's nil and empty both marshal to nothing with omitempty).
    # Both sides are fresh from _decode or an earlier _merge, so `dst` is extended in place:
    # appending field after field stays linear.
    if isinstance(t, _List):
        out_list = dst if dst is not None else []
        out_list.extend(e for e in (src or ()) if e is not None)
        return out_list or None
    if isinstance(t, _Map):
        out_map = dst if dst is not None else {}
        out_map.update(src or {})
        return out_map or None
    if isinstance(t, _Ptr):
        if src is None:
            return dst
        if isinstance(t.inner, _Struct | _List | _Map):
            return _merge(dst, src, t.inner)
        return src
    if isinstance(t, _Struct):
        d, s = dst or {}, src or {}
        out: dict[str, Any] = {}
        for k, ft in t.fields.items():
            m = _merge(d.get(k), s.get(k), ft)
            if m is not None:
                out[k] = m
        return out
    # Scalars, times, quantities (Go structs with unexported fields) and kept-whole values: the
    # later one replaces, its zero value (absent) included.
    return src


# --- normalising: Katalyst's reviseCNR ---


def _first_wins(dst: Mapping[str, Any] | None, src: Mapping[str, Any] | None) -> Any:
    """native.MergeResources: the keys of ``src`` that ``dst`` lacks are added."""
    if dst is None and src is None:
        return None
    out = dict(dst or {})
    for k, v in (src or {}).items():
        out.setdefault(k, v)
    return out


def _merge_zone_resources(dst: dict[str, Any], src: Mapping[str, Any]) -> None:
    got = dict(dst.get("resources") or {})
    theirs = src.get("resources") or {}
    for k in ("capacity", "allocatable"):
        m = _first_wins(got.get(k), theirs.get(k))
        if m is not None:
            got[k] = m
    if got:
        dst["resources"] = got


def _merge_attributes(dst: Sequence[Any], src: Sequence[Any]) -> list[Any]:
    by_name: dict[str, Any] = {}
    for a in (*dst, *src):
        by_name.setdefault(a.get("name", ""), a)
    return [by_name[k] for k in sorted(by_name)]


def _merge_allocations(dst: Sequence[Any], src: Sequence[Any]) -> list[Any]:
    by_consumer: dict[str, dict[str, Any]] = {}
    for a in (*dst, *src):
        if a is None:
            continue
        c = a.get("consumer", "")
        if c not in by_consumer:
            by_consumer[c] = dict(a)
            continue
        req = _first_wins(by_consumer[c].get("requests"), a.get("requests"))
        if req is not None:
            by_consumer[c]["requests"] = req
    return [by_consumer[k] for k in sorted(by_consumer)]


def merge_zones(zones: Iterable[Any]) -> list[dict[str, Any]]:
    """Katalyst's MergeTopologyZone(nil, zones), normalised at every level: one zone per (type,
    name), the first occurrence winning per resource name, attribute and allocation consumer
    (allocations of one consumer union their requests, first wins), children merged the same
    way; sorted by (type, name), attributes by name, allocations by consumer."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    children: dict[tuple[str, str], list[Any]] = {}
    for z in zones:
        if z is None:
            continue
        key = (z.get("type", ""), z.get("name", ""))
        got = merged.get(key)
        if got is None:
            merged[key] = got = {k: v for k, v in z.items() if k != "children"}
            children[key] = list(z.get("children") or ())
            got["attributes"] = _merge_attributes(z.get("attributes") or (), ())
            got["allocations"] = _merge_allocations(z.get("allocations") or (), ())
            continue
        _merge_zone_resources(got, z)
        got["attributes"] = _merge_attributes(got["attributes"], z.get("attributes") or ())
        got["allocations"] = _merge_allocations(got["allocations"], z.get("allocations") or ())
        children[key].extend(z.get("children") or ())
    out: list[dict[str, Any]] = []
    for key in sorted(merged):
        z = merged[key]
        kids = merge_zones(children[key])
        if kids:
            z["children"] = kids
        for k in ("attributes", "allocations"):
            if not z[k]:
                del z[k]
        out.append(z)
    return out


def merge_taints(observed: Iterable[Any], reported: Iterable[Any]) -> list[dict[str, Any]]:
    """Katalyst's MergeTaints(observed's unmanaged taints, reported): the taints of the observed
    object whose key is not under `MANAGED_TAINT_PREFIX` are kept ahead of the reported ones;
    one per (qosLevel, key, effect), the first winning; sorted by (key, qosLevel, effect)."""
    kept = [t for t in observed if t and not t.get("key", "").startswith(MANAGED_TAINT_PREFIX)]
    by_key: dict[tuple[str, str, str], dict[str, Any]] = {}
    for t in (*kept, *reported):
        if t is None:
            continue
        by_key.setdefault((t.get("qosLevel", ""), t.get("key", ""), t.get("effect", "")), t)
    return [by_key[k] for k in sorted(by_key, key=lambda k: (k[1], k[0], k[2]))]


# --- the merge ---


@dataclass(frozen=True, slots=True)
class ReportedField:
    """One CNR field of one plugin's report."""

    plugin: str
    field_type: int
    field_name: str
    value: bytes

    @property
    def type_name(self) -> str:
        return FIELD_TYPE_NAMES.get(self.field_type, str(self.field_type))


@dataclass(frozen=True, slots=True)
class BadField:
    """A field skipped by the merge, and why."""

    plugin: str
    field_type: str
    field_name: str
    reason: str

    def describe(self) -> str:
        return (
            f"plugin {self.plugin}: field {self.field_type}/{self.field_name} skipped: "
            f"{self.reason}"
        )


@dataclass(frozen=True, slots=True)
class MergeResult:
    """The merged CNR content: ``body`` has the reported fields only, under ``metadata``,
    ``spec`` and ``status`` (sections nobody reports are absent); ``reported`` the Go names of
    the fields merged; ``bad`` the fields skipped."""

    body: dict[str, Any]
    reported: frozenset[str]
    bad: tuple[BadField, ...]


_DECIMAL = [str(b) for b in range(256)]


def sort_key(f: ReportedField) -> tuple[str, str, str]:
    """The order of gogo's ``ReportField.String()``: type name, field name, then the value bytes
    as Go's ``%v`` of a []byte prints them. Field names are Go identifiers (all above ',' in
    ASCII), and the bytes text ends in ']', so the tuple sorts as the whole string does."""
    return (f.type_name, f.field_name, "[" + " ".join([_DECIMAL[b] for b in f.value]) + "]")


def fields_of(reports: Mapping[str, Any]) -> list[ReportedField]:
    """The CNR fields of every report (``reports``: plugin name -> GetReportContentResponse)."""
    out: list[ReportedField] = []
    for plugin, response in reports.items():
        for content in response.content:
            gvk = content.groupVersionKind
            if (gvk.group, gvk.version, gvk.kind) != (CNR_GROUP, CNR_VERSION, CNR_KIND):
                continue
            out.extend(
                ReportedField(plugin, int(f.fieldType), f.fieldName, bytes(f.value))
                for f in content.field
            )
    return out


_json = msgspec.json.Decoder()


def merge_fields(
    fields: Iterable[ReportedField], *, observed_taints: Iterable[Any] = ()
) -> MergeResult:
    """Katalyst's setCNR over every field, then reviseCNR (see the module docstring)."""
    merged: dict[str, Any] = {}
    specs: dict[str, FieldSpec] = {}
    bad: list[BadField] = []
    for f in sorted(fields, key=sort_key):
        spec = FIELDS.get((f.type_name, f.field_name))
        if spec is None:
            bad.append(BadField(f.plugin, f.type_name, f.field_name, "unknown field"))
            continue
        try:
            value = _decode(_json.decode(f.value), spec.type, "")
        except msgspec.DecodeError as exc:
            bad.append(BadField(f.plugin, f.type_name, f.field_name, f"not JSON: {exc}"))
            continue
        except _DecodeError as exc:
            bad.append(BadField(f.plugin, f.type_name, f.field_name, f"wrong type: {exc}"))
            continue
        # Zeroed at the first occurrence: absent from `merged` until then.
        merged[f.field_name] = _merge(merged.get(f.field_name), value, spec.type)
        specs[f.field_name] = spec
    if "TopologyZone" in merged:
        merged["TopologyZone"] = merge_zones(merged["TopologyZone"] or ())
    if "Taints" in merged:
        merged["Taints"] = merge_taints(observed_taints, merged["Taints"] or ())
    body: dict[str, Any] = {}
    for name, value in merged.items():
        spec = specs[name]
        body.setdefault(spec.section, {})[spec.json_name] = _empty_as_zero(value, spec.type)
    return MergeResult(body, frozenset(merged), tuple(bad))


def _empty_as_zero(value: Any, t: _T) -> Any:
    """What applying a reported zero value means: an empty list or map (the field is ours and
    empty), an empty object for a struct."""
    if value is not None:
        return value
    if isinstance(t, _List):
        return []
    if isinstance(t, _Map | _Struct) or (isinstance(t, _Ptr) and isinstance(t.inner, _Struct)):
        return {}
    if t is STR:
        return ""
    return None
