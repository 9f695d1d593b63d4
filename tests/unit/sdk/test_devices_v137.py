"""The Kubernetes 1.37 device fields through the SDK: typed SDK values -> the native wire message
(field numbers as in k8s.io/api resource/v1 generated.proto) -> the inventory model -> the
published slice spec, and what the seed API refuses."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from google.protobuf.message import Message

from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources.convert import from_native
from nodeagent.resources.model import desired_slices, validate_inventory
from nodeagent.sdk import (
    Capacity,
    CounterConsumption,
    CounterSet,
    Device,
    NodeAllocatable,
    Pool,
    RequestPolicy,
    SemVer,
    Taint,
    ValidRange,
    build_inventory,
    build_resources,
)

DRIVER = "gpu.example.com"


def partitioned_pool() -> Pool:
    """Every new field once: a consumable-capacity NIC, a CPU device, MIG-style partitions."""
    nic = Device(
        "nic-0",
        attributes={"model": "cx7"},
        capacity={
            "bandwidth": Capacity(
                "100G",
                RequestPolicy(default="1G", valid_range=ValidRange(min="1G", max="10G", step="1G")),
            ),
            "queues": Capacity("16", RequestPolicy(default="2", valid_values=["1", "2", "4", "8"])),
            "ports": "2",
        },
        allow_multiple_allocations=True,
        binding_conditions=["example.com/attached"],
        binding_failure_conditions=["example.com/attach-failed"],
        binds_to_node=True,
    )
    cpu = Device(
        "cpu-0",
        capacity={"cores": "8"},
        node_allocatable={
            "cpu": NodeAllocatable(capacity_key="cores", capacity_multiplier="2"),
            "memory": NodeAllocatable(per_pod="64Mi", per_container="1024Ki"),
        },
    )
    parts = [
        Device(
            f"gpu-0-{i}",
            attributes={"gpu.example.com/profile": "1g.10gb"},
            consumes_counters=[
                CounterConsumption("gpu-0", {"memory": "10Gi"}, compatibility_groups=["mig"])
            ],
        )
        for i in range(2)
    ]
    return Pool(
        "node-a",
        [nic, cpu, *parts],
        shared_counters=[CounterSet("gpu-0", {"memory": "20Gi"})],
        partition_type_attribute="gpu.example.com/profile",
        skip_node_operations=["NodeUnprepareResources"],
    )


def test_wire_field_numbers_are_the_v1_generated_protos() -> None:
    numbers = {
        (m.name, f.name): f.number
        for m in device_pb2.DESCRIPTOR.message_types_by_name.values()
        for f in m.fields
    }
    assert {
        ("Pool", "shared_counters"): 8,
        ("Pool", "partition_type_attribute"): 9,
        ("Pool", "skip_node_operations"): 10,
        ("Device", "binds_to_node"): 9,
        ("Device", "binding_conditions"): 10,
        ("Device", "binding_failure_conditions"): 11,
        ("Device", "allow_multiple_allocations"): 12,
        ("Device", "node_allocatable_resources"): 14,
        ("DeviceCapacity", "request_policy"): 2,
        ("CapacityRequestPolicy", "default"): 1,
        ("CapacityRequestPolicy", "valid_values"): 3,
        ("CapacityRequestPolicy", "valid_range"): 4,
        ("CapacityRequestPolicyRange", "min"): 1,
        ("CapacityRequestPolicyRange", "max"): 2,
        ("CapacityRequestPolicyRange", "step"): 3,
        ("DeviceCounterConsumption", "compatibility_groups"): 3,
        ("NodeAllocatableResource", "mapping"): 3,
        ("NodeAllocatableResource", "overhead"): 4,
        ("NodeAllocatableMapping", "capacity_key"): 1,
        ("NodeAllocatableMapping", "capacity_multiplier"): 2,
        ("NodeAllocatableMapping", "device_multiplier"): 3,
        ("NodeAllocatableOverhead", "per_pod"): 1,
        ("NodeAllocatableOverhead", "per_container"): 2,
    }.items() <= numbers.items()


def test_every_new_field_reaches_the_published_spec() -> None:
    message = build_inventory([partitioned_pool()])
    # What the agent receives: the bytes, decoded.
    wire = device_pb2.Inventory.FromString(message.SerializeToString())
    inv = from_native(DRIVER, wire)
    validate_inventory(inv)
    specs = [msgspec.to_builtins(s) for s in desired_slices(DRIVER, inv.pools[0], "node-a")]
    devices = {d["name"]: d for s in specs for d in s.get("devices", [])}
    assert devices["nic-0"] == {
        "name": "nic-0",
        "attributes": {"model": {"string": "cx7"}},
        "capacity": {
            "bandwidth": {
                "value": "100G",
                "requestPolicy": {
                    "default": "1G",
                    "validRange": {"min": "1G", "max": "10G", "step": "1G"},
                },
            },
            "queues": {
                "value": "16",
                "requestPolicy": {"default": "2", "validValues": ["1", "2", "4", "8"]},
            },
            "ports": {"value": "2"},
        },
        "bindsToNode": True,
        "bindingConditions": ["example.com/attached"],
        "bindingFailureConditions": ["example.com/attach-failed"],
        "allowMultipleAllocations": True,
    }
    assert devices["cpu-0"]["nodeAllocatableResources"] == {
        "cpu": {"mapping": {"capacityKey": "cores", "capacityMultiplier": "2"}},
        # Quantities are published in canonical form, as everywhere else.
        "memory": {"overhead": {"perPod": "64Mi", "perContainer": "1Mi"}},
    }
    assert devices["gpu-0-1"]["consumesCounters"] == [
        {
            "counterSet": "gpu-0",
            "counters": {"memory": {"value": "10Gi"}},
            "compatibilityGroups": ["mig"],
        }
    ]
    for spec in specs:
        # Counter slices hold no devices to skip operations for.
        skip = ["NodeUnprepareResources"] if spec.get("devices") else None
        assert spec.get("skipNodeOperations") == skip
        consumers = [d for d in spec.get("devices", []) if d.get("consumesCounters")]
        # Upstream refuses the attribute on a slice without counter-consuming devices.
        assert ("partitionTypeAttribute" in spec) == bool(consumers)
        if consumers:
            assert spec["partitionTypeAttribute"] == "gpu.example.com/profile"


def test_unset_fields_stay_off_the_wire_and_out_of_the_spec() -> None:
    plain = Device("d", capacity={"memory": "1Gi"})
    (pool,) = build_inventory([Pool("p", [plain])]).pools
    assert not pool.devices[0].capacity["memory"].HasField("request_policy")
    assert not pool.partition_type_attribute and not pool.skip_node_operations
    inv = from_native(DRIVER, build_inventory([Pool("p", [plain])]))
    (spec,) = desired_slices(DRIVER, inv.pools[0], "n")
    raw = msgspec.to_builtins(spec)
    assert raw["devices"] == [{"name": "d", "capacity": {"memory": {"value": "1Gi"}}}]
    assert "partitionTypeAttribute" not in raw and "skipNodeOperations" not in raw


def test_an_empty_request_policy_is_still_sent() -> None:
    # Upstream rules on a present policy (it needs allowMultipleAllocations) even when empty.
    device = Device("d", capacity={"c": Capacity("1", RequestPolicy())})
    (pool,) = build_inventory([Pool("p", [device])]).pools
    assert pool.devices[0].capacity["c"].HasField("request_policy")
    inv = from_native(DRIVER, build_inventory([Pool("p", [device])]))
    with pytest.raises(ValueError, match="needs allowMultipleAllocations true"):
        validate_inventory(inv)


@pytest.mark.parametrize(
    ("device", "field"),
    [
        (Device("d", allow_multiple_allocations=True), "allow_multiple_allocations"),
        (Device("d", binding_conditions=["a"]), "binding_conditions"),
        (Device("d", binding_failure_conditions=["a"]), "binding_failure_conditions"),
        (Device("d", binds_to_node=True), "binds_to_node"),
        (Device("d", node_allocatable={"cpu": NodeAllocatable(per_pod="1")}), "node_allocatable"),
        (
            Device("d", capacity={"c": Capacity("1", RequestPolicy(default="1"))}),
            "capacity request policies",
        ),
    ],
)
def test_the_seed_api_refuses_what_it_cannot_carry(device: Device, field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} need the native API"):
        build_resources([device])


def test_the_seed_api_takes_a_policy_free_capacity_object() -> None:
    (model,) = build_resources([Device("d", capacity={"c": Capacity("2Gi")})]).resources
    (instance,) = model.namedResources.instances
    assert instance.attributes[0].attributeValue.quantity.string == "2Gi"


def test_list_attributes_are_refused_on_the_native_api_with_the_reason() -> None:
    with pytest.raises(ValueError, match="DRAListTypeAttributes"):
        build_inventory([Pool("p", [Device("d", {"numa": [0, 1]})])])


def _set_fields(message: Message, out: set[tuple[str, str]]) -> None:
    for field, value in message.ListFields():
        out.add((message.DESCRIPTOR.name, field.name))
        if field.message_type is None:
            continue
        items: list[object]
        if isinstance(value, Message):
            items = [value]
        elif field.message_type.GetOptions().map_entry:
            items = list(value.values())
        else:
            items = list(value)
        for item in items:
            if isinstance(item, Message):
                _set_fields(item, out)


def test_the_sdk_can_set_every_field_of_the_native_api() -> None:
    # A field added to device.proto without an SDK way to set it fails here.
    sink = Device(
        "sink",
        attributes={"i": 1, "b": True, "s": "x", "v": SemVer("1.0.0")},
        taints=[Taint("example.com/t", "v", "NoSchedule", "2026-01-01T00:00:00Z")],
        node_allocatable={
            "cpu": NodeAllocatable(device_multiplier="1", per_pod="1", per_container="1")
        },
    )
    pool = partitioned_pool()
    message = build_inventory([dataclasses.replace(pool, devices=[*pool.devices, sink])])
    seen: set[tuple[str, str]] = set()
    _set_fields(message, seen)
    every = {
        (m.name, f.name)
        for m in device_pb2.DESCRIPTOR.message_types_by_name.values()
        if m.name != "ListAndWatchRequest"
        for f in m.fields
    }
    assert every - seen == set()
