"""The desired slices of a plugin's inventory are written with its conversion (issue 30 item 3,
one serialise/parse round fewer per inventory): the Rust call that converts and validates the
message writes them from the model it has in hand, so building the publisher's desired state
neither encodes the inventory again nor has Rust read it back."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from google.protobuf.message import Message

from nodeagent.core.plugindata import PluginData
from nodeagent.protos.dra.v1alpha3 import api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources import desired as desired_module
from nodeagent.resources.desired import DesiredSlices
from nodeagent.resources.inventory import InventoryTracker
from nodeagent.resources.model import desired_specs

NODE = "node-a"
DRIVER = "gpu.example.com"


def plugin(message: Message) -> dict[str, PluginData]:
    data = PluginData(DRIVER, "DRAPlugin", "/plugins/gpu.sock", message, 0.0, registered=True)
    return {DRIVER: data}


def native() -> device_pb2.Inventory:
    return device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name=f"p{p}",
                devices=[
                    device_pb2.Device(
                        name=f"d{i}",
                        capacity={"memory": device_pb2.DeviceCapacity(value="1024Mi")},
                    )
                    for i in range(n)
                ],
            )
            for p, n in enumerate([3, 200])
        ]
    )


def seed() -> api_pb2.NodeListAndWatchResourcesResponse:
    memory = v1alpha2.NamedResourcesAttributeValue()
    memory.quantity.string = "2048Mi"
    instances = [
        v1alpha2.NamedResourcesInstance(
            name=f"gpu-{i}",
            attributes=[v1alpha2.NamedResourcesAttribute(name="mem", attributeValue=memory)],
        )
        for i in range(3)
    ]
    model = v1alpha2.ResourceModel(
        namedResources=v1alpha2.NamedResourcesResources(instances=instances)
    )
    return api_pb2.NodeListAndWatchResourcesResponse(resources=[model])


@pytest.mark.parametrize("message", [native, seed])
def test_the_desired_slices_come_with_the_conversion(message: Callable[[], Message]) -> None:
    tracker = InventoryTracker(NODE)
    tracker.update(plugin(message()), 0.0)
    state = tracker.drivers[DRIVER]
    assert state.inventory is not None and state.inventory.pools
    # What the Rust call wrote at conversion is what the inventory's own encode gives.
    assert state.specs == desired_specs(state.inventory, NODE)


def test_building_the_desired_slices_reads_no_inventory_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracker, desired = InventoryTracker(NODE), DesiredSlices(NODE)
    tracker.update(plugin(native()), 0.0)

    def encoded_again(*_: object) -> list[list[bytes]]:
        raise AssertionError("the inventory was encoded again for its desired slices")

    monkeypatch.setattr(desired_module, "desired_specs", encoded_again)
    pools = desired.build(tracker, [DRIVER])[DRIVER]
    assert sorted(p for _, p in pools) == ["p0", "p1"]
    assert [len(d.specs) for _, d in sorted(pools.items())] == [1, 2]


def test_a_rejected_inventory_has_no_desired_slices() -> None:
    tracker = InventoryTracker(NODE)
    bad = device_pb2.Inventory(pools=[device_pb2.Pool(name="p", devices=[device_pb2.Device()])])
    tracker.update(plugin(bad), 0.0)
    state = tracker.drivers[DRIVER]
    assert state.inventory is None and state.specs is None and state.last_error
