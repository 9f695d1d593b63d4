"""The native device API: SDK message building and the handler's shape rules."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict, ParseDict

from nodeagent.plugins.dra import DraHandler
from nodeagent.plugins.handler import InvalidMessage
from nodeagent.plugins.inventory_shape import validate_inventory_message
from nodeagent.protos.dra.v1alpha3 import api_pb2 as dra
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.sdk import (
    CounterConsumption,
    CounterSet,
    Device,
    Pool,
    Quantity,
    SemVer,
    Taint,
    build_inventory,
    build_resources,
)


def test_sdk_builds_the_native_inventory_one_to_one() -> None:
    message = build_inventory(
        [
            Pool(
                "node-a",
                [
                    Device(
                        "gpu-0",
                        {"index": 0, "healthy": True, "model": "A100", "fw": SemVer("1.2.3")},
                        capacity={"memory": "40Gi", "cores": Quantity("108")},
                        taints=[Taint("example.com/broken", "yes", "NoExecute")],
                        consumes_counters=[CounterConsumption("mem", {"bytes": "40Gi"})],
                    ),
                    Device("gpu-1", {"slots": Quantity("2")}),  # a Quantity attribute: capacity
                ],
                shared_counters=[CounterSet("mem", {"bytes": "80Gi"})],
            )
        ]
    )
    validate_inventory_message(message)
    assert MessageToDict(message) == {
        "pools": [
            {
                "name": "node-a",
                "devices": [
                    {
                        "name": "gpu-0",
                        "attributes": {
                            "index": {"int": "0"},
                            "healthy": {"bool": True},
                            "model": {"string": "A100"},
                            "fw": {"version": "1.2.3"},
                        },
                        "capacity": {"memory": {"value": "40Gi"}, "cores": {"value": "108"}},
                        "consumesCounters": [
                            {"counterSet": "mem", "counters": {"bytes": {"value": "40Gi"}}}
                        ],
                        "taints": [
                            {"key": "example.com/broken", "value": "yes", "effect": "NoExecute"}
                        ],
                    },
                    {"name": "gpu-1", "capacity": {"slots": {"value": "2"}}},
                ],
                "sharedCounters": [{"name": "mem", "counters": {"bytes": {"value": "80Gi"}}}],
            }
        ]
    }


def test_seed_message_spells_capacity_as_quantity_attributes() -> None:
    message = build_resources([Device("gpu-0", {"index": 0}, capacity={"memory": "1Gi"})])
    attributes = message.resources[0].namedResources.instances[0].attributes
    assert [(a.name, a.attributeValue.ListFields()[0][0].name) for a in attributes] == [
        ("index", "int"),
        ("memory", "quantity"),
    ]
    assert attributes[1].attributeValue.quantity.string == "1Gi"


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: build_inventory([Pool("p", [Device("a", {"l": [1, 2]})])]), "list values"),
        (
            lambda: build_inventory(
                [Pool("p", [Device("a", {"m": Quantity("1")}, capacity={"m": "2"})])]
            ),
            "capacity 'm' given twice",
        ),
        (lambda: build_resources([Device("a", taints=[Taint("k")])]), "need the native API"),
        (
            lambda: build_resources(
                [Device("a", consumes_counters=[CounterConsumption("s", {"c": "1"})])]
            ),
            "need the native API",
        ),
        (
            lambda: build_resources([Device("a", {"m": 1}, capacity={"m": "1"})]),
            "'m' is an attribute and a capacity",
        ),
    ],
)
def test_what_an_api_cannot_carry_is_refused(build: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        build()


def _inventory(*devices: dict[str, Any], **pool: Any) -> device_pb2.Inventory:
    return ParseDict(
        {"pools": [{"name": "p", "devices": list(devices), **pool}]}, device_pb2.Inventory()
    )


_QTY = {"value": "1"}


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (device_pb2.Inventory(pools=[device_pb2.Pool()]), r"pools\[0\].name: must not be empty"),
        (
            ParseDict({"pools": [{"name": "p"}, {"name": "p"}]}, device_pb2.Inventory()),
            r"pools\[1\].name: 'p': duplicate pool name",
        ),
        (_inventory({"name": ""}), r"devices\[0\].name: must not be empty"),
        (_inventory({"name": "a"}, {"name": "a"}), r"devices\[1\].name: 'a': duplicate device"),
        (
            _inventory({"name": "a", "attributes": {"x": {}}}),
            r"devices\[0\] \(a\).attributes\['x'\]: exactly one value must be set",
        ),
        (
            _inventory({"name": "a", "capacity": {"m": {"value": "lots"}}}),
            r"capacity\['m'\].value: 'lots': not a valid quantity",
        ),
        (
            _inventory({"name": "a", "capacity": {f"c{i}": _QTY for i in range(33)}}),
            "33 attributes and capacities, at most 32",
        ),
        (
            _inventory({"name": "a", "taints": [{"key": "k"}] * 17}),
            "17 taints, at most 16",
        ),
        (_inventory({"name": "a", "taints": [{"value": "v"}]}), r"taints\[0\].key: must not be"),
        (
            _inventory({"name": "a", "consumesCounters": [{"counters": {"c": _QTY}}]}),
            r"consumes_counters\[0\].counter_set: must not be empty",
        ),
        (
            _inventory(
                {"name": "a", "consumesCounters": [{"counterSet": "s", "counters": {"c": {}}}]}
            ),
            r"counters\['c'\].value: '': not a valid quantity",
        ),
        (
            _inventory(sharedCounters=[{"name": "s"}, {"name": "s"}]),
            r"shared_counters\[1\].name: 's': duplicate counter set",
        ),
        (
            _inventory(
                sharedCounters=[{"name": "s", "counters": {f"c{i}": _QTY for i in range(33)}}]
            ),
            "33 counters, at most 32",
        ),
    ],
)
def test_malformed_native_inventories_are_refused_naming_the_field(
    message: device_pb2.Inventory, error: str
) -> None:
    with pytest.raises(InvalidMessage, match=error):
        validate_inventory_message(message)


def test_a_pool_may_have_more_counter_sets_than_a_slice() -> None:
    # Issue 29 item 12: the publisher lays them out 8 to a slice; the server takes 9 as 8 + 1.
    sets = [{"name": f"s{i}", "counters": {"c": _QTY}} for i in range(9)]
    validate_inventory_message(_inventory(sharedCounters=sets))


def test_the_handler_validates_each_api_by_message_type() -> None:
    handler = DraHandler.__new__(DraHandler)  # validate_message uses no state
    handler.validate_message(device_pb2.Inventory())
    handler.validate_message(dra.NodeListAndWatchResourcesResponse())
    with pytest.raises(InvalidMessage, match="duplicate device"):
        handler.validate_message(_inventory({"name": "a"}, {"name": "a"}))
    with pytest.raises(InvalidMessage, match="exactly one model"):
        handler.validate_message(dra.NodeListAndWatchResourcesResponse(resources=[{}]))
    with pytest.raises(InvalidMessage, match="unexpected message type ListAndWatchRequest"):
        handler.validate_message(device_pb2.ListAndWatchRequest())
