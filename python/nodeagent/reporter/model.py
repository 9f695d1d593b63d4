"""What the report store publishes: each reporter plugin's last report and its lifecycle.

Also `PlainReport`: a reporter plugin's report without protobuf, as the in-tree system reporter
builds it and as the checkpoint restores reports. The merge only reads `content`, its
`groupVersionKind` and `field`s, so a `PlainReport` and a `GetReportContentResponse` serve alike;
keeping protobuf out of the idle path keeps an agent with no plugins ~3.5 MiB smaller (README
"Performance"). Its wire form is byte for byte protobuf's (`SerializeToString`), the
checkpoint's format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from nodeagent.protos.reporterplugin.v1alpha1.api_pb2 import GetReportContentResponse

__all__ = [
    "GroupVersionKind",
    "PlainReport",
    "PluginReport",
    "Report",
    "ReportContent",
    "ReportField",
    "parse_report",
]


@dataclass(frozen=True)
class GroupVersionKind:
    group: str = ""
    version: str = ""
    kind: str = ""


@dataclass(frozen=True)
class ReportField:
    fieldType: int  # the proto's field names: the merge reads either form
    fieldName: str
    value: bytes


@dataclass(frozen=True)
class ReportContent:
    groupVersionKind: GroupVersionKind
    field: tuple[ReportField, ...]


def _key(report: Any) -> tuple[Any, ...]:
    return tuple(
        (
            (c.groupVersionKind.group, c.groupVersionKind.version, c.groupVersionKind.kind),
            tuple((int(f.fieldType), f.fieldName, bytes(f.value)) for f in c.field),
        )
        for c in report.content
    )


@dataclass(frozen=True, eq=False)
class PlainReport:
    """A GetReportContentResponse as plain values; equal to any report with the same content
    (a protobuf message included)."""

    content: tuple[ReportContent, ...]
    # The wire form: as read (a restored report keeps unknown fields as protobuf does), or
    # encoded once when built.
    raw: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if not self.raw and self.content:
            object.__setattr__(self, "raw", _encode_response(self.content))

    def SerializeToString(self) -> bytes:  # protobuf's name: the store calls either
        return self.raw

    def __eq__(self, other: object) -> bool:
        if not hasattr(other, "content"):
            return NotImplemented
        return _key(self) == _key(other)

    __hash__ = None  # type: ignore[assignment]  # as protobuf messages: mutable peers


# A reporter plugin's report: a plugin's message, or the system reporter's / a restored one.
Report = Union["GetReportContentResponse", PlainReport]


@dataclass(frozen=True)
class PluginReport:
    """One reporter plugin's last valid report.

    `running` is False once the plugin deregistered or its stream ended (or it was restored from a
    checkpoint and has not re-registered yet); its report is kept until the grace runs out, then
    the plugin is absent from the published mapping. `stopped_at` is the wall-clock second it
    stopped (None while running).
    """

    plugin: str
    response: Report
    running: bool
    stopped_at: float | None


# -- protobuf's wire format, for the three messages of a report ----------------------------------
# GetReportContentResponse{repeated ReportContent content = 1}
# ReportContent{GroupVersionKind groupVersionKind = 1; repeated ReportField field = 2}
# GroupVersionKind{optional string group = 1, version = 2, kind = 3} (proto2: set -> written)
# ReportField{FieldType fieldType = 1; string fieldName = 2; bytes value = 3} (proto3)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _encode_field(f: ReportField) -> bytes:
    out = b""
    if f.fieldType:
        # Negative enum values are 10-byte varints in protobuf; FieldType has none.
        out += _varint(1 << 3) + _varint(f.fieldType & 0xFFFFFFFFFFFFFFFF)
    if f.fieldName:
        out += _len_field(2, f.fieldName.encode())
    if f.value:
        out += _len_field(3, f.value)
    return out


def _encode_response(content: tuple[ReportContent, ...]) -> bytes:
    out = []
    for c in content:
        gvk = c.groupVersionKind
        gvk_bytes = b"".join(
            _len_field(n, s.encode())
            for n, s in ((1, gvk.group), (2, gvk.version), (3, gvk.kind))
            if s
        )
        body = _len_field(1, gvk_bytes) + b"".join(_len_field(2, _encode_field(f)) for f in c.field)
        out.append(_len_field(1, body))
    return b"".join(out)


def _fields(data: bytes, where: str) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of a message; ValueError naming `where`."""
    out: list[tuple[int, int, Any]] = []
    pos, end = 0, len(data)

    def varint() -> int:
        nonlocal pos
        result = shift = 0
        while True:
            if pos >= end or shift > 63:
                raise ValueError(f"{where}: truncated or overlong varint")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    while pos < end:
        key = varint()
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError(f"{where}: field number 0")
        value: Any
        if wire == 0:
            value = varint()
        elif wire == 1 or wire == 5:
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise ValueError(f"{where}: truncated fixed field")
            value, pos = data[pos : pos + size], pos + size
        elif wire == 2:
            size = varint()
            if pos + size > end:
                raise ValueError(f"{where}: truncated length-delimited field")
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"{where}: unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


def _text(value: bytes, where: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not UTF-8") from None


def parse_report(raw: bytes) -> PlainReport:
    """A serialized GetReportContentResponse as a PlainReport; ValueError naming what is wrong.
    Unknown fields are kept in `raw` (as protobuf keeps them) and otherwise ignored."""
    contents = []
    for number, wire, value in _fields(raw, "response"):
        if number != 1:
            continue
        if wire != 2:
            raise ValueError("response.content: wrong wire type")
        gvk = GroupVersionKind()
        report_fields = []
        for c_number, c_wire, c_value in _fields(value, "content"):
            if c_number == 1 and c_wire == 2:
                parts = {1: "", 2: "", 3: ""}
                for g_number, g_wire, g_value in _fields(c_value, "groupVersionKind"):
                    if g_number in parts and g_wire == 2:
                        parts[g_number] = _text(g_value, "groupVersionKind")
                gvk = GroupVersionKind(parts[1], parts[2], parts[3])
            elif c_number == 2 and c_wire == 2:
                field_type, name, data = 0, "", b""
                for f_number, f_wire, f_value in _fields(c_value, "field"):
                    if f_number == 1 and f_wire == 0:
                        field_type = f_value - (1 << 64) if f_value >= 1 << 63 else f_value
                    elif f_number == 2 and f_wire == 2:
                        name = _text(f_value, "field.fieldName")
                    elif f_number == 3 and f_wire == 2:
                        data = bytes(f_value)
                report_fields.append(ReportField(field_type, name, data))
            elif c_number in (1, 2):
                raise ValueError("content: wrong wire type")
        contents.append(ReportContent(gvk, tuple(report_fields)))
    return PlainReport(tuple(contents), raw=bytes(raw))
