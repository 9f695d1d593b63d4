"""Both plugin APIs into the inventory model: the native API one-to-one, the seed API with
names mapped to DNS labels and what v1 cannot hold rejected one attribute or one device at a
time."""

from __future__ import annotations

import hashlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.protos.dra.v1alpha3 import api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.protos.k8s.apimachinery.pkg.api.resource import generated_pb2 as quantity_pb2
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources.convert import SeedRejection, from_native, from_seed, seed_device_name
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
    counters, spec = desired_slices(inv.driver, inv.pools[0], "node-a")
    raw = msgspec.to_builtins(spec)
    assert "sharedCounters" not in raw
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
    # The counter set is a slice of its own (upstream: only one of sharedCounters or devices).
    assert msgspec.to_builtins(counters) == {
        "driver": "gpu.example.com",
        "pool": {"name": "node-a", "resourceSliceCount": 2},
        "nodeName": "node-a",
        "sharedCounters": [{"name": "mem", "counters": {"bytes": {"value": "80Gi"}}}],
    }


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
        SeedRejection(
            "gpu-0",
            "numa",
            "int slices have no resource.k8s.io/v1 equivalent; the attribute is not published",
        ),
        SeedRejection(
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


def _seed(*instances: v1alpha2.NamedResourcesInstance) -> api_pb2.NodeListAndWatchResourcesResponse:
    return api_pb2.NodeListAndWatchResourcesResponse(
        resources=[
            v1alpha2.ResourceModel(
                namedResources=v1alpha2.NamedResourcesResources(instances=list(instances))
            )
        ]
    )


def _hashed(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:8]


def test_seed_subdomain_names_are_published_under_a_stable_dns_label() -> None:
    msg = _seed(
        v1alpha2.NamedResourcesInstance(name="gpu.0", attributes=[_attr("index", int=0)]),
        v1alpha2.NamedResourcesInstance(name="gpu-0"),
        v1alpha2.NamedResourcesInstance(name="nic.eth0.example.com"),
    )
    inv, rejected = from_seed("drv", "node-a", msg)
    validate_inventory(inv)
    assert rejected == []
    assert [d.name for d in inv.pools[0].devices] == [
        f"gpu-0-{_hashed('gpu.0')}",
        "gpu-0",
        f"nic-eth0-example-com-{_hashed('nic.eth0.example.com')}",
    ]
    assert inv.pools[0].devices[0].attributes["index"].int_ == 0
    # A pure function of the name: the same after a restart, in any process.
    again, _ = from_seed("drv", "node-a", msg)
    assert again == inv


def test_long_seed_names_are_cut_to_a_63_character_label() -> None:
    name = ".".join(["a" * 60, "b" * 60, "c" * 60])
    mapped = seed_device_name(name)
    assert mapped == f"{'a' * 54}-{_hashed(name)}"
    dashes = "x" * 53 + ".y"  # the cut falls just after the dash: no double dash
    assert seed_device_name(dashes) == f"{'x' * 53}-{_hashed(dashes)}"


_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


@given(st.lists(_LABEL, min_size=1, max_size=15).map(".".join))
def test_every_seed_subdomain_maps_to_a_valid_distinct_label(name: str) -> None:
    mapped = seed_device_name(name)
    assert mapped is not None
    validate_inventory(
        from_seed("drv", "node-a", _seed(v1alpha2.NamedResourcesInstance(name=name)))[0]
    )
    if "." in name or len(name) > 63:
        assert mapped != name and mapped.endswith(_hashed(name))
    else:
        assert mapped == name


def test_a_name_with_no_v1_form_rejects_only_that_device() -> None:
    msg = _seed(
        v1alpha2.NamedResourcesInstance(name="GPU_0"),
        v1alpha2.NamedResourcesInstance(name="gpu.1"),
        v1alpha2.NamedResourcesInstance(name="gpu-2"),
        v1alpha2.NamedResourcesInstance(name="gpu-2", attributes=[_attr("dup", bool=True)]),
    )
    inv, rejected = from_seed("drv", "node-a", msg)
    validate_inventory(inv)
    assert [d.name for d in inv.pools[0].devices] == [f"gpu-1-{_hashed('gpu.1')}", "gpu-2"]
    assert inv.pools[0].devices[1].attributes == {}  # the first of a duplicated name wins
    assert [(r.device, r.attribute) for r in rejected] == [("GPU_0", None), ("gpu-2", None)]
    assert str(rejected[0]).startswith("device 'GPU_0': name must be a DNS subdomain")
    assert "already used" in rejected[1].rule


def test_attributes_v1_cannot_hold_are_dropped_one_at_a_time() -> None:
    msg = _seed(
        v1alpha2.NamedResourcesInstance(
            name="d",
            attributes=[
                _attr("none"),
                _attr("two", bool=True, int=1),
                _attr("mem", quantity=quantity_pb2.Quantity(string="lots")),
                _attr("ver", version="not-semver"),
                _attr("long", string="x" * 65),
                _attr("bad name!", int=1),
                _attr("ok", int=7),
                _attr("ok", int=8),
                _attr("size", quantity=quantity_pb2.Quantity(string="2Gi")),
            ],
        )
    )
    inv, rejected = from_seed("drv", "node-a", msg)
    validate_inventory(inv)
    (device,) = inv.pools[0].devices
    assert (
        device.attributes == {"ok": device.attributes["ok"]} and device.attributes["ok"].int_ == 7
    )
    assert list(device.capacity) == ["size"]
    assert [r.attribute for r in rejected] == [
        "none",
        "two",
        "mem",
        "ver",
        "long",
        "bad name!",
        "ok",
    ]
    assert rejected[-1].rule == "duplicate attribute name"


def test_zero_seed_resources_mean_zero_pools() -> None:
    for msg in (
        api_pb2.NodeListAndWatchResourcesResponse(),
        _seed(),
        _seed(v1alpha2.NamedResourcesInstance(name="NOT_MAPPABLE")),
    ):
        inv, _ = from_seed("drv", "node-a", msg)
        assert inv.pools == []
