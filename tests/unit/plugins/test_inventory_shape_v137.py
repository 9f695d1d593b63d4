"""The native message's shape rules for the 1.37 device fields: unparsable quantities and lists
over the v1 limits refuse the message, naming the field path; everything else is the
publisher's (rust/src/inventory/rules.rs, through `model.validate_inventory`)."""

from __future__ import annotations

import pytest
from google.protobuf.json_format import ParseDict

from nodeagent.plugins.handler import InvalidMessage
from nodeagent.plugins.inventory_shape import validate_inventory_message
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2


def _message(device: dict[str, object], **pool: object) -> device_pb2.Inventory:
    return ParseDict(
        {"pools": [{"name": "node-a", "devices": [{"name": "d", **device}], **pool}]},
        device_pb2.Inventory(),
    )


def test_a_message_using_every_new_field_passes() -> None:
    validate_inventory_message(
        _message(
            {
                "capacity": {
                    "c": {
                        "value": "10",
                        "requestPolicy": {
                            "default": "1",
                            "validValues": ["1", "2"],
                            "validRange": {"min": "1", "max": "10", "step": "1"},
                        },
                    }
                },
                "allowMultipleAllocations": True,
                "bindingConditions": ["a"],
                "bindingFailureConditions": ["b"],
                "bindsToNode": True,
                "nodeAllocatableResources": {
                    "cpu": {
                        "mapping": {"capacityKey": "c", "capacityMultiplier": "2"},
                        "overhead": {"perPod": "1", "perContainer": "0"},
                    }
                },
                "consumesCounters": [
                    {
                        "counterSet": "s",
                        "counters": {"x": {"value": "1"}},
                        "compatibilityGroups": ["g"],
                    }
                ],
            },
            partitionTypeAttribute="example.com/profile",
            skipNodeOperations=["*"],
        )
    )


@pytest.mark.parametrize(
    ("device", "message"),
    [
        (
            {"capacity": {"c": {"value": "1", "requestPolicy": {"default": "x"}}}},
            "pools[0].devices[0] (d).capacity['c'].request_policy.default: 'x'",
        ),
        (
            {"capacity": {"c": {"value": "1", "requestPolicy": {"validValues": ["1", "?"]}}}},
            "request_policy.valid_values[1]: '?'",
        ),
        (
            {"capacity": {"c": {"value": "1", "requestPolicy": {"validRange": {"step": "1 2"}}}}},
            "request_policy.valid_range.step: '1 2'",
        ),
        (
            {"capacity": {"c": {"value": "99", "requestPolicy": {"validValues": ["1"] * 11}}}},
            "valid_values: 11 values, at most 10",
        ),
        ({"bindingConditions": list("abcde")}, "binding_conditions: 5 conditions, at most 4"),
        (
            {"bindingFailureConditions": list("abcde")},
            "binding_failure_conditions: 5 conditions, at most 4",
        ),
        (
            {"nodeAllocatableResources": {"cpu": {"mapping": {"deviceMultiplier": "two"}}}},
            "node_allocatable_resources['cpu'].mapping.device_multiplier: 'two'",
        ),
        (
            {"nodeAllocatableResources": {"memory": {"overhead": {"perContainer": "1Q"}}}},
            "node_allocatable_resources['memory'].overhead.per_container: '1Q'",
        ),
        (
            {
                "consumesCounters": [
                    {"counterSet": "s", "counters": {}, "compatibilityGroups": ["a", "b", "c"]}
                ]
            },
            "consumes_counters[0].compatibility_groups: 3 groups, at most 2",
        ),
    ],
)
def test_shape_errors_name_the_field(device: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidMessage) as info:
        validate_inventory_message(_message(device))
    assert message in str(info.value)
