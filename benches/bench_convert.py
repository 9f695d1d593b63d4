"""Converting and validating one plugin inventory: the Rust path production runs
(`InventoryTracker.convert`: `_native.inventory_native` / `inventory_seed`, the GIL released,
then msgspec decoding the inventory) against the plain-Python reference it replaced
(tests/support/dra_reference: `from_native` / `from_seed` then `validate_inventory`), side by
side in one run.

Inventories: 1,024 devices of 16 attributes and one capacity (the shape of bench_looplag), as a
native message and as a seed message; and a native one using the newer fields (request policies,
taints, counters), 1,024 devices.

Target (issue 24 s1): ours at least 10x faster than the Python reference.

Then the desired slices of each converted inventory (what the publisher plans with, once per
inventory): `model.desired_specs`, one Rust call writing every pool's spec bytes, against the
Python canonicalisation and split it replaced (tests/support/dra_reference/desired.py, then
`msgspec.json.encode` of each spec), side by side.

Then the whole path per inventory, message to validated inventory and desired slices: ours is
`InventoryTracker.convert` alone (one Rust call writes the desired slices from the model it
converted, so the inventory is not encoded again for Rust to read back), the reference its
conversion, validation, canonicalisation and split.

Run: .venv/bin/python -m pytest benches/bench_convert.py --benchmark-only
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from benches.report import Rounds, print_uncaptured
from nodeagent.protos.dra.v1alpha3 import api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources.inventory import InventoryTracker
from nodeagent.resources.model import Inventory, desired_specs
from tests.support.dra_reference import convert as ref_convert
from tests.support.dra_reference import desired as ref_desired
from tests.support.dra_reference import validation as ref_validation

DEVICES = 1024
ATTRIBUTES = 16
DRIVER = "drv.example.com"
NODE = "node-a"

RESULTS: dict[str, float] = {}
# Best CPU time of the rounds (this thread): steadier than wall time on a shared machine.
CPU: dict[str, float] = {}


def native_plain() -> device_pb2.Inventory:
    def attrs(k: int) -> dict[str, device_pb2.DeviceAttribute]:
        out = {
            f"attr{j}": device_pb2.DeviceAttribute(string=f"value-{j}-{k}")
            for j in range(ATTRIBUTES - 2)
        }
        out["index"] = device_pb2.DeviceAttribute(int=k)
        out["driverVersion"] = device_pb2.DeviceAttribute(version="1.4.2")
        return out

    return device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name="pool-0",
                devices=[
                    device_pb2.Device(
                        name=f"dev-{k}",
                        attributes=attrs(k),
                        capacity={"memory": device_pb2.DeviceCapacity(value="80Gi")},
                    )
                    for k in range(DEVICES)
                ],
            )
        ]
    )


def native_rich() -> device_pb2.Inventory:
    policy = device_pb2.CapacityRequestPolicy(
        default="1Gi",
        valid_range=device_pb2.CapacityRequestPolicyRange(min="1Gi", max="64Gi", step="1Gi"),
    )
    return device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name="pool-0",
                shared_counters=[
                    device_pb2.CounterSet(
                        name=f"set-{s}",
                        counters={
                            "memory": device_pb2.Counter(value="80Gi"),
                            "cores": device_pb2.Counter(value="128"),
                        },
                    )
                    for s in range(8)
                ],
                devices=[
                    device_pb2.Device(
                        name=f"dev-{k}",
                        attributes={
                            "model": device_pb2.DeviceAttribute(string="x100"),
                            "index": device_pb2.DeviceAttribute(int=k),
                        },
                        capacity={
                            "memory": device_pb2.DeviceCapacity(value="64Gi", request_policy=policy)
                        },
                        allow_multiple_allocations=True,
                        taints=[device_pb2.DeviceTaint(key="example.com/t", effect="NoSchedule")],
                        consumes_counters=[
                            device_pb2.DeviceCounterConsumption(
                                counter_set=f"set-{k % 8}",
                                counters={"memory": device_pb2.Counter(value="10Gi")},
                            )
                        ],
                    )
                    for k in range(DEVICES)
                ],
            )
        ]
    )


def seed() -> api_pb2.NodeListAndWatchResourcesResponse:
    def attrs(k: int) -> list[v1alpha2.NamedResourcesAttribute]:
        out = [
            v1alpha2.NamedResourcesAttribute(
                name=f"attr{j}",
                attributeValue=v1alpha2.NamedResourcesAttributeValue(string=f"value-{j}-{k}"),
            )
            for j in range(ATTRIBUTES - 2)
        ]
        out.append(
            v1alpha2.NamedResourcesAttribute(
                name="index", attributeValue=v1alpha2.NamedResourcesAttributeValue(int=k)
            )
        )
        q = v1alpha2.NamedResourcesAttributeValue()
        q.quantity.string = "80Gi"
        out.append(v1alpha2.NamedResourcesAttribute(name="memory", attributeValue=q))
        return out

    instances = [
        v1alpha2.NamedResourcesInstance(name=f"gpu.{k}", attributes=attrs(k))
        for k in range(DEVICES)
    ]
    return api_pb2.NodeListAndWatchResourcesResponse(
        resources=[
            v1alpha2.ResourceModel(
                namedResources=v1alpha2.NamedResourcesResources(instances=instances)
            )
        ]
    )


MESSAGES: dict[str, Callable[[], Any]] = {
    "native": native_plain,
    "native-rich": native_rich,
    "seed": seed,
}


def ours(message: Any) -> None:
    done = InventoryTracker(NODE).convert(DRIVER, message)
    assert done.error is None and done.inventory is not None and done.specs is not None


def reference(message: Any) -> None:
    if isinstance(message, device_pb2.Inventory):
        inventory = ref_convert.from_native(DRIVER, message)
    else:
        inventory, _ = ref_convert.from_seed(DRIVER, NODE, message)
    ref_validation.validate_inventory(inventory)


@pytest.fixture(scope="module", autouse=True)
def _report(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_uncaptured(request, print_results)


def print_results(write: Callable[[str], None]) -> None:
    for what, prefix, target in [
        ("convert + validate", "", " (target >= 10x)"),
        ("desired slices", "desired-", ""),
        ("message -> validated inventory and its desired slices", "path-", ""),
    ]:
        write("")
        write(f"{what}, {DEVICES} devices (best of the rounds; wall, then CPU)")
        for name in MESSAGES:
            o, r = RESULTS.get(f"{prefix}ours-{name}"), RESULTS.get(f"{prefix}python-{name}")
            oc, rc = CPU.get(f"{prefix}ours-{name}"), CPU.get(f"{prefix}python-{name}")
            if o is None or r is None or oc is None or rc is None:
                continue
            write(
                f"  {name:<12}: rust {o * 1e3:6.2f} ms  python reference {r * 1e3:7.2f} ms  "
                f"ratio {r / o:5.1f}x | CPU {oc * 1e3:6.2f} / {rc * 1e3:7.2f} ms  "
                f"ratio {rc / oc:5.1f}x{target}"
            )


def _timed(benchmark: Any, key: str, fn: Callable[[], object], rounds: int) -> None:
    fn()  # the first call's imports are not timed

    def timed() -> None:
        t = time.thread_time()
        fn()
        CPU[key] = min(CPU.get(key, float("inf")), time.thread_time() - t)

    calls = Rounds(timed)
    benchmark.pedantic(calls, rounds=rounds, iterations=1)
    RESULTS[key] = min(calls.seconds)


@pytest.mark.parametrize("impl", ["ours", "python"])
@pytest.mark.parametrize("name", list(MESSAGES))
def test_convert(benchmark: Any, name: str, impl: str) -> None:
    benchmark.group = f"convert {name}"
    message = MESSAGES[name]()
    fn = ours if impl == "ours" else reference
    _timed(benchmark, f"{impl}-{name}", lambda: fn(message), 15 if impl == "ours" else 5)


def desired_reference(inventory: Inventory) -> list[list[bytes]]:
    """What the publisher ran before: the Python canonicalisation and split, then an encode of
    each spec."""
    return [
        [msgspec.json.encode(s) for s in ref_desired.desired_slices(inventory.driver, p, NODE)]
        for p in inventory.pools
    ]


@pytest.mark.parametrize("impl", ["ours", "python"])
@pytest.mark.parametrize("name", list(MESSAGES))
def test_desired_slices(benchmark: Any, name: str, impl: str) -> None:
    benchmark.group = f"desired slices {name}"
    inventory = InventoryTracker(NODE).convert(DRIVER, MESSAGES[name]()).inventory
    assert inventory is not None
    assert desired_specs(inventory, NODE) == desired_reference(inventory)
    if impl == "ours":
        _timed(benchmark, f"desired-ours-{name}", lambda: desired_specs(inventory, NODE), 15)
    else:
        _timed(benchmark, f"desired-python-{name}", lambda: desired_reference(inventory), 5)


@pytest.mark.parametrize("impl", ["ours", "python"])
@pytest.mark.parametrize("name", list(MESSAGES))
def test_message_to_desired_slices(benchmark: Any, name: str, impl: str) -> None:
    benchmark.group = f"message to desired slices {name}"
    message = MESSAGES[name]()
    if impl == "ours":
        _timed(benchmark, f"path-ours-{name}", lambda: ours(message), 15)
        return

    def python() -> None:
        if isinstance(message, device_pb2.Inventory):
            inventory = ref_convert.from_native(DRIVER, message)
        else:
            inventory, _ = ref_convert.from_seed(DRIVER, NODE, message)
        ref_validation.validate_inventory(inventory)
        desired_reference(inventory)

    _timed(benchmark, f"path-python-{name}", python, 5)
