"""Content validation of plugin messages: what is refused, and why."""

from __future__ import annotations

import pytest

from nodeagent.plugins.dra import validate_resources
from nodeagent.plugins.handler import InvalidMessage
from nodeagent.plugins.reporter_plugin import validate_report
from nodeagent.protos.dra.v1alpha3 import api_pb2 as dra
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from nodeagent.sdk import Device, Quantity, ReportItem, SemVer, build_report, build_resources


def _report(**field: object) -> rep.GetReportContentResponse:
    values: dict[str, object] = {"fieldType": rep.Status, "fieldName": "resources", "value": b"{}"}
    values.update(field)
    return rep.GetReportContentResponse(
        content=[
            rep.ReportContent(
                groupVersionKind={"group": "g", "version": "v1alpha1", "kind": "K"},
                field=[rep.ReportField(**values)],  # type: ignore[arg-type]
            )
        ]
    )


def test_sdk_reports_are_valid() -> None:
    message = build_report(
        [
            ReportItem("g", "v1alpha1", "K", "Status", "a", {"x": [1, 2]}),
            ReportItem("g", "v1alpha1", "K", "Spec", "b", "text"),
            ReportItem("", "v1", "Node", "Metadata", "Labels", {"k": "v"}),
        ]
    )
    validate_report(message)
    assert len(message.content) == 2  # grouped by GroupVersionKind
    assert [f.fieldName for f in message.content[0].field] == ["a", "b"]
    assert message.content[0].field[0].value == b'{"x":[1,2]}'
    validate_report(rep.GetReportContentResponse())


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (_report(fieldName=""), r"content\[0\].field\[0\].fieldName: must not be empty"),
        (_report(value=b"{nope"), r"value \(resources\): not valid JSON"),
        (_report(value=b""), "not valid JSON"),
        (_report(value=b"\xff\xfe\xfa"), "not valid JSON"),
        (_report(fieldType=7), "fieldType: 7: unknown field type"),
        (
            rep.GetReportContentResponse(content=[rep.ReportContent()]),
            "groupVersionKind: version and kind must be set",
        ),
        (
            rep.GetReportContentResponse(
                content=[rep.ReportContent(groupVersionKind={"group": "g", "version": "v1"})]
            ),
            "version and kind must be set",
        ),
    ],
)
def test_invalid_reports_are_refused_naming_the_field(
    message: rep.GetReportContentResponse, error: str
) -> None:
    with pytest.raises(InvalidMessage, match=error):
        validate_report(message)


def test_sdk_device_lists_are_valid() -> None:
    message = build_resources(
        [
            Device(
                "gpu-0",
                {
                    "memory": Quantity("40Gi"),
                    "index": 0,
                    "healthy": True,
                    "model": "A100",
                    "driver": SemVer("1.2.3"),
                    "cores": [0, 1],
                    "links": ["a", "b"],
                },
            ),
            Device("gpu-1.example"),
        ]
    )
    validate_resources(message)
    value = message.resources[0].namedResources.instances[0].attributes[2].attributeValue
    assert value.HasField("bool") and value.bool
    validate_resources(dra.NodeListAndWatchResourcesResponse())


def _devices(*instances: dict[str, object]) -> dra.NodeListAndWatchResourcesResponse:
    return dra.NodeListAndWatchResourcesResponse(
        resources=[{"namedResources": {"instances": list(instances)}}]
    )


def test_a_model_without_named_resources_is_refused() -> None:
    with pytest.raises(InvalidMessage, match=r"resources\[0\]: exactly one model"):
        validate_resources(dra.NodeListAndWatchResourcesResponse(resources=[{}]))


@pytest.mark.parametrize(
    "message",
    [
        _devices({"name": ""}),
        _devices({"name": "GPU_0"}),
        _devices({"name": "a"}, {"name": "a"}),
        _devices({"name": "a", "attributes": [{"name": ""}]}),
        _devices({"name": "a", "attributes": [{"name": "x", "attributeValue": {}}]}),
        _devices(
            {"name": "a", "attributes": [{"name": "x", "attributeValue": {"int": 1, "bool": True}}]}
        ),
        _devices({"name": "a", "attributes": [{"name": "x", "attributeValue": {"int": 1}}] * 2}),
        _devices(
            {
                "name": "a",
                "attributes": [{"name": "m", "attributeValue": {"quantity": {"string": "x"}}}],
            }
        ),
    ],
)
def test_bad_devices_and_attributes_do_not_refuse_the_whole_message(
    message: dra.NodeListAndWatchResourcesResponse,
) -> None:
    # Judged one device / one attribute at a time by the seed conversion instead.
    validate_resources(message)


def test_unsupported_sdk_attribute_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unsupported attribute value"):
        build_resources([Device("a", {"x": [1, "two"]})])  # type: ignore[dict-item]
