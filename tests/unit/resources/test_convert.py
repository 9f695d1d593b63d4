"""Both plugin APIs into the inventory model: the native API one-to-one, the seed API with
per-attribute rejection of slices."""

from __future__ import annotations

import msgspec
import pytest

from nodeagent.protos.dra.v1alpha3 import api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.protos.k8s.apimachinery.pkg.api.resource import generated_pb2 as quantity_pb2
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources.convert import AttributeRejection, from_native, from_seed
from nodeagent.resources.model import InvalidInventory, desired_slices, validate_inventory


def test_native_inventory_maps_one_to_one_onto_v1() -> None:
    msg = device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name="node-a",
                devices=[
                    device_pb2.Device(
                        name="gpu-0",
                        attributes={
                            "model": device_pb2.DeviceAttribute(string="x100"),
                            "index": device_pb2.DeviceAttribute(int=0),
                            "mig": device_pb2.DeviceAttribute(bool=False),
                            "driverVersion": device_pb2.DeviceAttribute(version="1.2.3"),
                        },
                        capacity={"memory": device_pb2.DeviceCapacity(value="80Gi")},
                        consumes_counters=[
                            device_pb2.DeviceCounterConsumption(
                                counter_set="mem",
                                counters={"bytes": device_pb2.Counter(value="1Gi")},
                            )
                        ],
                        taints=[
                            device_pb2.DeviceTaint(key="example.com/hot", effect="NoSchedule"),
                            device_pb2.DeviceTaint(
                                key="k",
                                value="v",
                                effect="NoExecute",
                                time_added="2024-05-01T10:00:00Z",
                            ),
                        ],
                    )
                ],
                shared_counters=[
                    device_pb2.CounterSet(
                        name="mem", counters={"bytes": device_pb2.Counter(value="80Gi")}
                    )
                ],
            )
        ]
    )
    inv = from_native("gpu.example.com", msg)
    validate_inventory(inv)
    (spec,) = desired_slices(inv.driver, inv.pools[0], "node-a")
    raw = msgspec.to_builtins(spec)
    assert raw["devices"] == [
        {
            "name": "gpu-0",
            "attributes": {
                "model": {"string": "x100"},
                "index": {"int": 0},
                "mig": {"bool": False},
                "driverVersion": {"version": "1.2.3"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
            "consumesCounters": [{"counterSet": "mem", "counters": {"bytes": {"value": "1Gi"}}}],
            "taints": [
                {"key": "example.com/hot", "effect": "NoSchedule"},
                {
                    "key": "k",
                    "effect": "NoExecute",
                    "value": "v",
                    "timeAdded": "2024-05-01T10:00:00Z",
                },
            ],
        }
    ]
    assert raw["sharedCounters"] == [{"name": "mem", "counters": {"bytes": {"value": "80Gi"}}}]


def test_native_attribute_without_value_fails_validation_naming_the_device() -> None:
    msg = device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name="p",
                devices=[
                    device_pb2.Device(name="d", attributes={"x": device_pb2.DeviceAttribute()})
                ],
            )
        ]
    )
    with pytest.raises(InvalidInventory, match="device 'd': attribute 'x': exactly one of"):
        validate_inventory(from_native("drv", msg))


def _attr(name: str, **value: object) -> v1alpha2.NamedResourcesAttribute:
    return v1alpha2.NamedResourcesAttribute(
        name=name,
        attributeValue=v1alpha2.NamedResourcesAttributeValue(**value),  # type: ignore[arg-type]
    )


def test_seed_instances_become_devices_and_slices_are_rejected_per_attribute() -> None:
    msg = api_pb2.NodeListAndWatchResourcesResponse(
        resources=[
            v1alpha2.ResourceModel(
                namedResources=v1alpha2.NamedResourcesResources(
                    instances=[
                        v1alpha2.NamedResourcesInstance(
                            name="gpu-0",
                            attributes=[
                                _attr("healthy", bool=True),
                                _attr("index", int=3),
                                _attr("model", string="x100"),
                                _attr("driverVersion", version="1.0.0"),
                                _attr("memory", quantity=quantity_pb2.Quantity(string="1024Mi")),
                                _attr(
                                    "numa", intSlice=v1alpha2.NamedResourcesIntSlice(ints=[0, 1])
                                ),
                                _attr(
                                    "tags",
                                    stringSlice=v1alpha2.NamedResourcesStringSlice(strings=["a"]),
                                ),
                            ],
                        ),
                        v1alpha2.NamedResourcesInstance(name="gpu-1"),
                    ]
                )
            )
        ]
    )
    inv, rejected = from_seed("gpu.example.com", "node-a", msg)
    validate_inventory(inv)
    assert rejected == [
        AttributeRejection(
            "gpu-0",
            "numa",
            "int slices have no resource.k8s.io/v1 equivalent; the attribute is not published",
        ),
        AttributeRejection(
            "gpu-0",
            "tags",
            "string slices have no resource.k8s.io/v1 equivalent; the attribute is not published",
        ),
    ]
    assert str(rejected[0]).startswith("device 'gpu-0': attribute 'numa': int slices")
    (spec,) = desired_slices(inv.driver, inv.pools[0], "node-a")
    raw = msgspec.to_builtins(spec)
    assert raw["pool"] == {"name": "node-a", "resourceSliceCount": 1}
    assert raw["devices"] == [
        {
            "name": "gpu-0",
            "attributes": {
                "healthy": {"bool": True},
                "index": {"int": 3},
                "model": {"string": "x100"},
                "driverVersion": {"version": "1.0.0"},
            },
            "capacity": {"memory": {"value": "1Gi"}},
        },
        {"name": "gpu-1"},
    ]


def test_seed_attribute_without_exactly_one_value_is_rejected() -> None:
    msg = api_pb2.NodeListAndWatchResourcesResponse(
        resources=[
            v1alpha2.ResourceModel(
                namedResources=v1alpha2.NamedResourcesResources(
                    instances=[
                        v1alpha2.NamedResourcesInstance(
                            name="d", attributes=[_attr("x"), _attr("y", bool=True, int=1)]
                        )
                    ]
                )
            )
        ]
    )
    _, rejected = from_seed("drv", "node-a", msg)
    assert [(r.attribute, r.rule) for r in rejected] == [
        ("x", "exactly one value must be set, got 0"),
        ("y", "exactly one value must be set, got 2"),
    ]


def test_seed_instance_names_that_are_not_dns_labels_fail_validation() -> None:
    msg = api_pb2.NodeListAndWatchResourcesResponse(
        resources=[
            v1alpha2.ResourceModel(
                namedResources=v1alpha2.NamedResourcesResources(
                    instances=[v1alpha2.NamedResourcesInstance(name="gpu.0")]
                )
            )
        ]
    )
    inv, _ = from_seed("drv", "node-a", msg)
    with pytest.raises(InvalidInventory, match=r"device 'gpu\.0': name must be a DNS label"):
        validate_inventory(inv)
