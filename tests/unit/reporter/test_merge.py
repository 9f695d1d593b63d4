"""The CNR merge: Katalyst's rules where they are right, its gaps fixed."""

from __future__ import annotations

import json
from typing import Any

from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as pb
from nodeagent.reporter.merge import (
    CNR_GROUP,
    CNR_KIND,
    CNR_VERSION,
    ReportedField,
    fields_of,
    merge_fields,
    sort_key,
)

SPEC, STATUS, METADATA = 0, 1, 2


def field(plugin: str, ft: int, name: str, value: Any) -> ReportedField:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return ReportedField(plugin, ft, name, raw)


def zone(t: str, name: str, **kw: Any) -> dict[str, Any]:
    return {"type": t, "name": name, **kw}


def test_sort_key_is_gogo_string_order() -> None:
    # "[1 2 3]" sorts before "[1 2]" in Go's String() (' ' < ']'): not a numeric or prefix order.
    a = ReportedField("p", STATUS, "X", bytes([1, 2, 3]))
    b = ReportedField("p", STATUS, "X", bytes([1, 2]))
    m = ReportedField("p", METADATA, "X", b"")
    s = ReportedField("p", SPEC, "X", b"")
    assert sorted([b, s, a, m], key=sort_key) == [m, s, a, b]


def test_later_scalar_wins_and_lists_append() -> None:
    r = merge_fields(
        [
            field("b", STATUS, "TopologyPolicy", "SingleNUMANodeContainerLevel"),
            field("a", STATUS, "TopologyPolicy", "None"),
            field("a", SPEC, "NodeResourceProperties", [{"propertyName": "cpu"}]),
            field("b", SPEC, "NodeResourceProperties", [{"propertyName": "mem"}, None]),
        ]
    )
    # '"N' (34 78) < '"S' (34 83): the SingleNUMA value sorts later and wins.
    assert r.body["status"]["topologyPolicy"] == "SingleNUMANodeContainerLevel"
    names = [p["propertyName"] for p in r.body["spec"]["nodeResourceProperties"]]
    # Decimal text, not bytes: "c" is "99" and "m" is "109", and "1" < "9", so mem comes first.
    assert names == ["mem", "cpu"]
    assert r.bad == ()


def test_structs_recurse_maps_union_later_wins() -> None:
    r = merge_fields(
        [
            field("a", STATUS, "Resources", {"allocatable": {"cpu": "1", "memory": "1Gi"}}),
            field(
                "b", STATUS, "Resources", {"allocatable": {"cpu": "2000m"}, "capacity": {"cpu": 4}}
            ),
        ]
    )
    res = r.body["status"]["resources"]
    # Quantities canonical: "2000m" is "2", 4 is "4".
    assert res == {"allocatable": {"cpu": "2", "memory": "1Gi"}, "capacity": {"cpu": "4"}}


def test_overlapping_zones_dedup_first_wins_sorted() -> None:
    first = [
        zone(
            "Socket",
            "0",
            resources={"allocatable": {"cpu": "4"}},
            attributes=[{"name": "b", "value": "1"}],
            children=[zone("Numa", "1"), zone("Numa", "0", resources={"capacity": {"cpu": "2"}})],
        )
    ]
    second = [
        zone("Socket", "1"),
        zone(
            "Socket",
            "0",
            resources={"allocatable": {"cpu": "8", "memory": "1Gi"}},
            attributes=[{"name": "b", "value": "2"}, {"name": "a", "value": "3"}],
            children=[zone("Numa", "0", resources={"capacity": {"cpu": "9", "memory": "2Gi"}})],
        ),
    ]
    r = merge_fields(
        [field("a", STATUS, "TopologyZone", first), field("b", STATUS, "TopologyZone", second)]
    )
    zones = r.body["status"]["topologyZone"]
    # Order of the fields: plugin a's value text starts "[91 123 34 110" ('{"n'?), no: both
    # start '[{"type"'... the sort is by bytes; whichever is first wins per key below.
    order = sorted([first, second], key=lambda v: sort_key(field("x", STATUS, "T", v)))
    winner = order[0]
    assert [(z["type"], z["name"]) for z in zones] == [("Socket", "0"), ("Socket", "1")]
    s0 = zones[0]
    if winner is first:
        assert s0["resources"]["allocatable"] == {"cpu": "4", "memory": "1Gi"}
        assert s0["attributes"] == [{"name": "a", "value": "3"}, {"name": "b", "value": "1"}]
        assert s0["children"][0]["resources"]["capacity"] == {"cpu": "2", "memory": "2Gi"}
    else:
        assert s0["resources"]["allocatable"] == {"cpu": "8", "memory": "1Gi"}
        assert s0["attributes"] == [{"name": "a", "value": "3"}, {"name": "b", "value": "2"}]
        assert s0["children"][0]["resources"]["capacity"] == {"cpu": "9", "memory": "2Gi"}
    assert [c["name"] for c in s0["children"]] == ["0", "1"]


def test_managed_taints_replaced_others_kept() -> None:
    observed = [
        {
            "key": "node.katalyst.kubewharf.io/old",
            "effect": "NoSchedule",
            "qosLevel": "shared_cores",
        },
        {"key": "example.com/mine", "effect": "NoSchedule", "qosLevel": "shared_cores"},
    ]
    reported = [
        {
            "key": "node.katalyst.kubewharf.io/new",
            "effect": "NoSchedule",
            "qosLevel": "reclaimed_cores",
        },
        {
            "key": "example.com/mine",
            "effect": "NoSchedule",
            "qosLevel": "shared_cores",
            "value": "x",
        },
    ]
    r = merge_fields([field("e", SPEC, "Taints", reported)], observed_taints=observed)
    taints = r.body["spec"]["taints"]
    assert [t["key"] for t in taints] == ["example.com/mine", "node.katalyst.kubewharf.io/new"]
    assert "value" not in taints[0]  # the observed one came first and wins


def test_bad_fields_skipped_and_reported_others_merge() -> None:
    r = merge_fields(
        [
            field("good", STATUS, "TopologyPolicy", "None"),
            field("bad", STATUS, "NoSuchField", 1),
            field("bad", STATUS, "Resources", {"allocatable": {"cpu": "lots"}}),
            field("bad", SPEC, "NodeResourceProperties", {"not": "a list"}),
            field("bad", METADATA, "Name", "evil"),
            field("bad", STATUS, "TopologyZone", b"{not json"),
        ]
    )
    assert r.body == {"status": {"topologyPolicy": "None"}}
    assert sorted((b.plugin, b.field_name) for b in r.bad) == [
        ("bad", "Name"),
        ("bad", "NoSuchField"),
        ("bad", "NodeResourceProperties"),
        ("bad", "Resources"),
        ("bad", "TopologyZone"),
    ]
    why = {b.field_name: b.reason for b in r.bad}
    assert "allocatable.cpu" in why["Resources"]
    assert "unknown field" in why["NoSuchField"]


def test_labels_merge_per_key() -> None:
    r = merge_fields(
        [
            field("a", METADATA, "Labels", {"x": "1", "y": "1"}),
            field("b", METADATA, "Labels", {"y": "2"}),
        ]
    )
    assert r.body == {"metadata": {"labels": {"x": "1", "y": "2"}}}
    assert r.reported == {"Labels"}


def test_fields_of_keeps_only_cnr_gvk() -> None:
    def resp(group: str, name: str) -> pb.GetReportContentResponse:
        c = pb.ReportContent(
            field=[pb.ReportField(fieldType=pb.Status, fieldName=name, value=b'"None"')]
        )
        c.groupVersionKind.group, c.groupVersionKind.version = group, CNR_VERSION
        c.groupVersionKind.kind = CNR_KIND
        return pb.GetReportContentResponse(content=[c])

    got = fields_of({"p": resp(CNR_GROUP, "TopologyPolicy"), "q": resp("other.io", "X")})
    assert got == [ReportedField("p", STATUS, "TopologyPolicy", b'"None"')]
