"""PlainReport (the system reporter's and restored reports, no protobuf) against protobuf itself:
the same wire bytes, the same content after a round trip, equal to the same message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from nodeagent.reporter.model import (
    GroupVersionKind,
    PlainReport,
    ReportContent,
    ReportField,
    parse_report,
)
from nodeagent.reporter.system import (
    CNR_GROUP,
    CNR_KIND,
    CNR_VERSION,
    SystemReporter,
    node_resource_properties,
    read_machine,
    topology_zones,
)

from .test_system import GIB_KB, fake_tree


def protobuf(report: PlainReport) -> rep.GetReportContentResponse:
    message = rep.GetReportContentResponse()
    for c in report.content:
        content = message.content.add()
        gvk = c.groupVersionKind
        content.groupVersionKind.group = gvk.group
        content.groupVersionKind.version = gvk.version
        content.groupVersionKind.kind = gvk.kind
        for f in c.field:
            content.field.add(fieldType=f.fieldType, fieldName=f.fieldName, value=f.value)
    return message


REPORTS = [
    PlainReport(()),
    PlainReport(
        (
            ReportContent(
                GroupVersionKind("g", "v1", "K"),
                (
                    ReportField(0, "Spec0", b'{"a":1}'),
                    ReportField(1, "Status", b"[" + b"1," * 300 + b"1]"),  # 2-byte lengths
                    ReportField(2, "Metadata", b""),
                    ReportField(1, "", b"x"),
                    ReportField(0, "n\u00e4me", "\u00fc".encode()),
                ),
            ),
            ReportContent(GroupVersionKind(CNR_GROUP, CNR_VERSION, CNR_KIND), ()),
        )
    ),
]


@pytest.mark.parametrize("report", REPORTS)
def test_wire_form_is_protobufs_and_round_trips(report: PlainReport) -> None:
    message = protobuf(report)
    assert report.SerializeToString() == message.SerializeToString()
    parsed = parse_report(message.SerializeToString())
    assert parsed == report and parsed == message and message == parsed
    assert parsed.SerializeToString() == message.SerializeToString()
    assert rep.GetReportContentResponse.FromString(report.SerializeToString()) == message


def test_differing_content_is_not_equal() -> None:
    (_, report) = REPORTS
    other = protobuf(report)
    other.content[0].field[0].value = b"2"
    assert report != other and other != report


def test_unknown_fields_are_kept_in_the_wire_form_as_protobuf_keeps_them() -> None:
    message = protobuf(REPORTS[1])
    raw = message.SerializeToString() + b"\x10\x05" + b"\x1a\x03abc" + b"\x25\x00\x00\x00\x00"
    parsed = parse_report(raw)
    assert parsed == message
    assert (
        parsed.SerializeToString()
        == rep.GetReportContentResponse.FromString(raw).SerializeToString()
    )


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"\x0a\x05ab", "truncated"),
        (b"\x0a", "truncated"),
        (b"\x0b", "wire type"),
        (b"\x08\x01", "wrong wire type"),
        (b"\x0a\x04\x12\x02\x12\x80", "truncated"),
        (b"\x0a\x05\x12\x03\x12\x01\xff", "not UTF-8"),
    ],
)
def test_malformed_bytes_are_a_value_error(raw: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_report(raw)


def test_system_report_is_byte_identical_to_the_protobuf_built_one(tmp_path: Path) -> None:
    sockets = {cpu: 0 if cpu < 4 else 1 for cpu in range(8)}
    nodes = {0: ("0-3", 8 * GIB_KB), 1: ("4-7", 8 * GIB_KB), 2: ("", 2 * GIB_KB)}
    root = fake_tree(tmp_path, online="0-7", sockets=sockets, nodes=nodes, memtotal_kb=18 * GIB_KB)
    reporter = SystemReporter(root, cpu_flags=True, cpu_model=True)
    report = reporter.collect()
    machine = read_machine(root)

    def field(field_type: rep.FieldType, name: str, value: object) -> rep.ReportField:
        encoded = json.dumps(value, separators=(",", ":")).encode()
        return rep.ReportField(fieldType=field_type, fieldName=name, value=encoded)

    # What build_system_report built with protobuf before PlainReport.
    content = rep.ReportContent(
        field=[
            field(
                rep.Spec,
                "NodeResourceProperties",
                node_resource_properties(machine, cpu_flags=True, cpu_model=True),
            ),
            field(rep.Status, "TopologyZone", topology_zones(machine)),
        ]
    )
    content.groupVersionKind.group = CNR_GROUP
    content.groupVersionKind.version = CNR_VERSION
    content.groupVersionKind.kind = CNR_KIND
    expected = rep.GetReportContentResponse(content=[content])
    assert report == expected
    assert report.SerializeToString() == expected.SerializeToString()
