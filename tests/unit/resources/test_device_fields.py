"""The newer device fields' rules (rust/src/inventory/rules.rs, called by `validate_inventory`):
every case of `device_field_cases` gets v1.37's verdict, with a message naming the field."""

from __future__ import annotations

import msgspec
import pytest

from nodeagent.resources.model import (
    CapacityRequestPolicy,
    Device,
    DeviceCapacity,
    InvalidInventory,
    Inventory,
    NodeAllocatableMapping,
    NodeAllocatableOverhead,
    NodeAllocatableResource,
    Pool,
    desired_slices,
    validate_inventory,
)
from tests.unit.resources.device_field_cases import CASES, DRIVER, Case


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_v137_verdict(case: Case) -> None:
    inv = Inventory(driver=DRIVER, pools=[case.pool])
    if case.valid:
        validate_inventory(inv)
        return
    with pytest.raises(InvalidInventory) as info:
        validate_inventory(inv)
    if case.message is not None:
        assert case.message in str(info.value)


def test_messages_name_the_device_and_the_field() -> None:
    device = Device(
        name="nic-0",
        capacity={
            "bw": DeviceCapacity(
                value="1", request_policy=CapacityRequestPolicy(valid_values=["1"])
            )
        },
        allow_multiple_allocations=True,
    )
    with pytest.raises(InvalidInventory) as info:
        validate_inventory(Inventory(driver=DRIVER, pools=[Pool(name="p", devices=[device])]))
    assert info.value.errors == [
        "device 'nic-0': capacity['bw'].requestPolicy.default: required when validValues is set"
    ]


def test_unparsable_quantities_are_named() -> None:
    device = Device(
        name="d",
        node_allocatable_resources={
            "cpu": NodeAllocatableResource(
                mapping=NodeAllocatableMapping(device_multiplier="lots"),
                overhead=NodeAllocatableOverhead(per_pod="1x"),
            )
        },
    )
    with pytest.raises(InvalidInventory) as info:
        validate_inventory(Inventory(driver=DRIVER, pools=[Pool(name="p", devices=[device])]))
    text = str(info.value)
    assert "nodeAllocatableResources['cpu'].mapping.deviceMultiplier" in text
    assert "nodeAllocatableResources['cpu'].overhead.perPod" in text


def test_published_quantities_of_the_new_fields_are_canonical() -> None:
    device = Device(
        name="d",
        capacity={
            "bw": DeviceCapacity(
                value="1024Mi",
                request_policy=CapacityRequestPolicy(
                    default="1000m", valid_values=["1000m", "2048"]
                ),
            )
        },
        allow_multiple_allocations=True,
        node_allocatable_resources={
            "memory": NodeAllocatableResource(
                mapping=NodeAllocatableMapping(device_multiplier="1048576Ki"),
                overhead=NodeAllocatableOverhead(per_pod="1.5"),
            )
        },
    )
    pool = Pool(name="p", devices=[device])
    validate_inventory(Inventory(driver=DRIVER, pools=[pool]))
    (spec,) = desired_slices(DRIVER, pool, "n")
    raw = msgspec.to_builtins(spec)["devices"][0]
    assert raw["capacity"]["bw"] == {
        "value": "1Gi",
        "requestPolicy": {"default": "1", "validValues": ["1", "2048"]},
    }
    assert raw["nodeAllocatableResources"]["memory"] == {
        "mapping": {"deviceMultiplier": "1Gi"},
        "overhead": {"perPod": "1500m"},
    }


def test_the_stored_slice_decodes_with_upstream_nulls() -> None:
    # Upstream's CapacityRequestPolicy.default has no omitempty: a stored slice says null.
    from nodeagent.resources.model import ResourceSliceSpec

    spec = msgspec.json.decode(
        b'{"driver":"d","pool":{"name":"p","generation":1,"resourceSliceCount":1},'
        b'"devices":[{"name":"x","allowMultipleAllocations":true,"capacity":{"c":{"value":"1",'
        b'"requestPolicy":{"default":null,"validRange":{"min":"0"}}}}}]}',
        type=ResourceSliceSpec,
    )
    policy = spec.devices[0].capacity["c"].request_policy
    assert policy is not None and policy.default is None
    assert policy.valid_range is not None and policy.valid_range.min == "0"


def test_an_empty_policy_is_published_as_none() -> None:
    # The server stores an empty policy as {"default": null}, which is not the {} sent: the
    # planner would rewrite it forever. Empty means what no policy means, so none is sent.
    device = Device(
        name="d",
        capacity={"c": DeviceCapacity(value="1", request_policy=CapacityRequestPolicy())},
        allow_multiple_allocations=True,
    )
    pool = Pool(name="p", devices=[device])
    validate_inventory(Inventory(driver=DRIVER, pools=[pool]))
    (spec,) = desired_slices(DRIVER, pool, "n")
    assert msgspec.to_builtins(spec)["devices"][0]["capacity"] == {"c": {"value": "1"}}
