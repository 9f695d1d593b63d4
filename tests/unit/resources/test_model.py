"""ResourceSlice models, inventory validation and the split into slice specs."""

from __future__ import annotations

import gc

import msgspec
import pytest

from nodeagent.core.k8s import is_qualified_name
from nodeagent.resources.model import (
    Counter,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceCounterConsumption,
    DeviceTaint,
    InvalidInventory,
    Inventory,
    ObjectMeta,
    OwnerReference,
    Pool,
    ResourceSlice,
    desired_slices,
    validate_inventory,
)

ONE = {"c": Counter(value="1")}


def dev(name: str, **kw: object) -> Device:
    return Device(name=name, **kw)  # type: ignore[arg-type]


def errors_of(
    *devices: Device, pools: list[Pool] | None = None, driver: str = "gpu.example.com"
) -> list[str]:
    inv = Inventory(driver=driver, pools=pools or [Pool(name="p", devices=list(devices))])
    with pytest.raises(InvalidInventory) as exc:
        validate_inventory(inv)
    return exc.value.errors


def valid(*devices: Device, pools: list[Pool] | None = None) -> bool:
    inv = Inventory(
        driver="gpu.example.com", pools=pools or [Pool(name="p", devices=list(devices))]
    )
    validate_inventory(inv)
    return True


def test_valid_inventory_passes() -> None:
    validate_inventory(
        Inventory(
            driver="gpu.example.com",
            pools=[
                Pool(
                    name="node-a/numa-0",
                    devices=[
                        dev(
                            "gpu-0",
                            attributes={
                                "model": DeviceAttribute(string="A100"),
                                "gpu.example.com/index": DeviceAttribute(int_=0),
                                "driverVersion": DeviceAttribute(version="1.2.3-rc.1"),
                            },
                            capacity={"memory": DeviceCapacity(value="40Gi")},
                            taints=[DeviceTaint(key="example.com/unhealthy", effect="NoSchedule")],
                            consumes_counters=[
                                DeviceCounterConsumption(
                                    counter_set="mem", counters={"bytes": Counter(value="1Gi")}
                                )
                            ],
                        )
                    ],
                    shared_counters=[
                        CounterSet(name="mem", counters={"bytes": Counter(value="40Gi")})
                    ],
                )
            ],
        )
    )


@pytest.mark.parametrize(
    ("device", "message"),
    [
        (dev("GPU_0"), "device 'GPU_0': name must be a DNS label"),
        (dev("a" * 64), "name must be a DNS label"),
        (
            dev("d", attributes={"bad name": DeviceAttribute(int_=1)}),
            "device 'd': attribute 'bad name': name must be a C identifier",
        ),
        (
            dev("d", attributes={"bad_domain.com/x": DeviceAttribute(int_=1)}),
            "attribute 'bad_domain.com/x': name must be a C identifier",
        ),
        (
            dev("d", attributes={"x": DeviceAttribute()}),
            "exactly one of int, bool, string, version",
        ),
        (
            dev("d", attributes={"x": DeviceAttribute(int_=1, string="a")}),
            "exactly one of int, bool, string, version",
        ),
        (
            dev("d", attributes={"x": DeviceAttribute(string="a" * 65)}),
            "65 bytes of UTF-8, at most 64 allowed",
        ),
        # The server counts bytes: 40 characters of two bytes each are too long.
        (
            dev("d", attributes={"x": DeviceAttribute(string="é" * 40)}),
            "attribute 'x': 80 bytes of UTF-8, at most 64 allowed",
        ),
        (
            dev("d", attributes={"x": DeviceAttribute(version="1.0.0-" + "a" * 59)}),
            "65 bytes of UTF-8",
        ),
        (dev("d", attributes={"x": DeviceAttribute(version="1.2")}), "not semantic versioning"),
        (
            dev("d", capacity={"mem": DeviceCapacity(value="lots")}),
            "device 'd': capacity 'mem': invalid quantity \"lots\"",
        ),
        (
            dev(
                "d",
                attributes={f"a{i}": DeviceAttribute(int_=i) for i in range(20)},
                capacity={f"c{i}": DeviceCapacity(value="1") for i in range(13)},
            ),
            "device 'd': 33 attributes and capacities, at most 32 allowed",
        ),
        (
            dev("d", taints=[DeviceTaint(key="k", effect="NoSchedule")] * 17),
            "device 'd': 17 taints, at most 16 allowed",
        ),
        (dev("d", taints=[DeviceTaint(key="k", effect="Maybe")]), "taint 0: effect 'Maybe'"),
        (
            dev("d", taints=[DeviceTaint(key="k", effect="NoSchedule", time_added="today")]),
            "RFC 3339",
        ),
        (
            dev("d", consumes_counters=[DeviceCounterConsumption(counter_set="nope")]),
            "consumesCounters 'nope': no such shared counter set",
        ),
        (
            dev(
                "d",
                consumes_counters=[
                    DeviceCounterConsumption(counter_set=f"s{i}", counters=ONE) for i in range(3)
                ],
            ),
            "device 'd': consumesCounters has 3 entries, at most 2 allowed",
        ),
        (
            dev(
                "d",
                consumes_counters=[DeviceCounterConsumption(counter_set="s0", counters=ONE)] * 2,
            ),
            "consumesCounters 's0': the counter set is named twice",
        ),
        (
            dev("d", consumes_counters=[DeviceCounterConsumption(counter_set="s0")]),
            "consumesCounters 's0': counters are required",
        ),
    ],
)
def test_invalid_devices_are_named_with_the_rule(device: Device, message: str) -> None:
    assert any(message in e for e in errors_of(device)), errors_of(device)


def test_names_and_values_upstream_accepts_pass() -> None:
    """What kube-apiserver v1.37 accepts is not refused: an attribute and a capacity of the same
    name, an upper-case attribute domain (checked as a CSI driver name, case-insensitively),
    64 bytes of multi-byte text, more than 8 counter sets in a pool."""
    assert valid(
        dev(
            "d",
            attributes={
                "x": DeviceAttribute(int_=1),
                "GPU.Example.com/model": DeviceAttribute(string="é" * 32),
            },
            capacity={"x": DeviceCapacity(value="1"), "Example.com/mem": DeviceCapacity(value="1")},
        )
    )
    sets = [CounterSet(name=f"s{i}", counters=ONE) for i in range(20)]
    assert valid(pools=[Pool(name="p", shared_counters=sets)])


def test_a_counter_set_needs_counters() -> None:
    errors = errors_of(pools=[Pool(name="p", shared_counters=[CounterSet(name="s")])])
    assert errors == ["pool 'p': counter set 's': counters are required (at least one)"]


def test_duplicates_and_bad_names() -> None:
    errors = errors_of(dev("a"), dev("a"))
    assert errors == ["device 'a': duplicate device name in pool 'p'"]
    errors = errors_of(pools=[Pool(name="p"), Pool(name="p")])
    assert errors == ["pool 'p': duplicate pool name"]
    errors = errors_of(pools=[Pool(name="Bad Pool")])
    assert "pool 'Bad Pool': name must be DNS subdomains" in errors[0]
    errors = errors_of(dev("a"), driver="Not_A_Driver")
    assert "driver 'Not_A_Driver': must be a DNS subdomain" in errors[0]


def test_all_errors_are_reported_at_once() -> None:
    errors = errors_of(dev("A"), dev("b", capacity={"m": DeviceCapacity(value="x")}))
    assert len(errors) == 2


def test_qualified_names() -> None:
    assert is_qualified_name("memory")
    assert is_qualified_name("gpu.example.com/memory_2")
    assert not is_qualified_name("2memory")
    assert not is_qualified_name("a" * 33)
    assert not is_qualified_name("/x")
    assert not is_qualified_name("a/b/c")


def test_split_128_devices_per_slice_in_order() -> None:
    pool = Pool(name="p", devices=[dev(f"d{i}") for i in range(300)])
    slices = desired_slices("gpu.example.com", pool, "node-a")
    assert [len(s.devices) for s in slices] == [128, 128, 44]
    assert [d.name for s in slices for d in s.devices] == [f"d{i}" for i in range(300)]
    assert {(s.pool.name, s.pool.resource_slice_count, s.node_name) for s in slices} == {
        ("p", 3, "node-a")
    }


def test_split_64_where_taints_or_counters_are_used() -> None:
    taint = [DeviceTaint(key="k", effect="NoSchedule")]
    devices = [dev(f"d{i}", taints=taint if i == 100 else []) for i in range(200)]
    slices = desired_slices("drv", Pool(name="p", devices=devices), "n")
    # The first chunk has no tainted device; the second takes d100 and stops at 64.
    assert [len(s.devices) for s in slices] == [100, 64, 36]
    assert [len(s.devices) for s in desired_slices("drv", Pool(name="p"), "n")] == [0]


def test_counter_sets_go_into_slices_of_their_own() -> None:
    """Upstream: "only one of sharedCounters or devices is allowed" in a slice; at most 8 sets
    in one; resourceSliceCount counts the counter slices too."""
    sets = [CounterSet(name=f"s{i}", counters=ONE) for i in range(10)]
    devices = [
        dev(f"d{i}", consumes_counters=[DeviceCounterConsumption(counter_set="s0", counters=ONE)])
        for i in range(70)
    ]
    slices = desired_slices("drv", Pool(name="p", devices=devices, shared_counters=sets), "n")
    assert [(len(s.shared_counters), len(s.devices)) for s in slices] == [
        (8, 0),
        (2, 0),
        (0, 64),
        (0, 6),
    ]
    assert {s.pool.resource_slice_count for s in slices} == {4}
    assert [cs.name for s in slices for cs in s.shared_counters] == [f"s{i}" for i in range(10)]
    # Counters only: no empty device slice beside them.
    (only,) = desired_slices("drv", Pool(name="p", shared_counters=sets[:1]), "n")
    assert msgspec.to_builtins(only) == {
        "driver": "drv",
        "pool": {"name": "p", "resourceSliceCount": 1},
        "nodeName": "n",
        "sharedCounters": [{"name": "s0", "counters": {"c": {"value": "1"}}}],
    }


def test_desired_specs_carry_canonical_quantities_and_omit_defaults() -> None:
    pool = Pool(
        name="p",
        devices=[dev("d", capacity={"mem": DeviceCapacity(value="1024Mi")})],
        shared_counters=[CounterSet(name="s", counters={"c": Counter(value="1000m")})],
    )
    c, s = desired_slices("drv", pool, "node-a")
    assert msgspec.json.decode(msgspec.json.encode(c)) == {
        "driver": "drv",
        "pool": {"name": "p", "resourceSliceCount": 2},
        "nodeName": "node-a",
        "sharedCounters": [{"name": "s", "counters": {"c": {"value": "1"}}}],
    }
    assert msgspec.json.decode(msgspec.json.encode(s)) == {
        "driver": "drv",
        "pool": {"name": "p", "resourceSliceCount": 2},
        "nodeName": "node-a",
        "devices": [{"name": "d", "capacity": {"mem": {"value": "1Gi"}}}],
    }


def test_resource_slice_round_trip_with_wire_names() -> None:
    obj = ResourceSlice(
        metadata=ObjectMeta(
            generate_name="node-a-drv-",
            owner_references=[
                OwnerReference(
                    api_version="v1", kind="Node", name="node-a", uid="u", controller=True
                )
            ],
        ),
        spec=desired_slices(
            "drv",
            Pool(
                name="p",
                devices=[
                    dev(
                        "d",
                        attributes={
                            "i": DeviceAttribute(int_=0),
                            "b": DeviceAttribute(bool_=False),
                        },
                    )
                ],
            ),
            "node-a",
        )[0],
    )
    raw = msgspec.json.decode(msgspec.json.encode(obj))
    assert raw["apiVersion"] == "resource.k8s.io/v1" and raw["kind"] == "ResourceSlice"
    assert raw["metadata"] == {
        "generateName": "node-a-drv-",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "u", "controller": True}
        ],
    }
    assert raw["spec"]["devices"][0]["attributes"] == {"i": {"int": 0}, "b": {"bool": False}}
    assert msgspec.json.decode(msgspec.json.encode(obj), type=ResourceSlice) == obj


def test_inventory_records_are_not_tracked_by_the_cycle_collector() -> None:
    # Tens of thousands of them per inventory: tracked, they would lengthen every full
    # collection (event-loop lag, benches/bench_looplag.py).
    device = Device(
        name="d",
        attributes={"a": DeviceAttribute(int_=1)},
        capacity={"m": DeviceCapacity(value="1Gi")},
    )
    inventory = Inventory(driver="x", pools=[Pool(name="p", devices=[device])])
    for record in (device, device.attributes["a"], device.capacity["m"], inventory):
        assert not gc.is_tracked(record)
    assert not gc.is_tracked(inventory.pools[0])
