"""ResourceSlice (`resource.k8s.io/v1`) models, the internal inventory model, its validation and
the split of a pool's devices into slice specs.

The inventory model is the v1 device itself: both plugin APIs convert into it, so the publisher
has one shape to validate, split and plan, and the native API maps onto v1 one-to-one.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from nodeagent import _native
from nodeagent._native import quantity_canonical as canonicalize
from nodeagent.resources.device_fields import canonical_capacity, canonical_node_allocatable

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"

# The limits of kube-apiserver v1.37 (`k8s.io/kubernetes/pkg/apis/resource`), the same in 1.35
# and 1.36.
MAX_DEVICES_PER_SLICE = 128
# Taints and counter consumption make devices larger; upstream halves the limit for them
# (`ResourceSliceMaxDevicesWithAdvancedFeatures`).
MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_TAINTS = 16
# Counter sets per slice: a pool may have more, spread over several counter slices.
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_COUNTER_CONSUMPTIONS = 2  # consumesCounters entries per device
# Bytes of UTF-8, as the server counts them (Go's len of a string).
MAX_ATTRIBUTE_STRING = 64


# Inventories hold tens of thousands of these records; they are trees built from plugin
# messages and never form reference cycles, so the cycle collector need not track them
# (its full passes would otherwise grow with the inventory and stall the event loop).
class _Base(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel", gc=False):
    pass


class DeviceAttribute(_Base):
    """Exactly one of the values is set."""

    int_: int | None = msgspec.field(default=None, name="int")
    bool_: bool | None = msgspec.field(default=None, name="bool")
    string: str | None = None
    version: str | None = None


class CapacityRequestPolicyRange(_Base):
    min: str | None = None
    max: str | None = None
    step: str | None = None


class CapacityRequestPolicy(_Base):
    default: str | None = None
    valid_values: list[str] = []
    valid_range: CapacityRequestPolicyRange | None = None


class DeviceCapacity(_Base):
    value: str
    request_policy: CapacityRequestPolicy | None = None


class Counter(_Base):
    value: str


class CounterSet(_Base):
    name: str
    counters: dict[str, Counter] = {}


class DeviceCounterConsumption(_Base):
    counter_set: str
    counters: dict[str, Counter] = {}
    compatibility_groups: list[str] = []


class DeviceTaint(_Base):
    key: str
    effect: str
    value: str = ""
    time_added: str | None = None


class NodeAllocatableMapping(_Base):
    capacity_key: str | None = None
    capacity_multiplier: str | None = None
    device_multiplier: str | None = None


class NodeAllocatableOverhead(_Base):
    per_pod: str | None = None
    per_container: str | None = None


class NodeAllocatableResource(_Base):
    mapping: NodeAllocatableMapping | None = None
    overhead: NodeAllocatableOverhead | None = None


class Device(_Base):
    name: str
    attributes: dict[str, DeviceAttribute] = {}
    capacity: dict[str, DeviceCapacity] = {}
    consumes_counters: list[DeviceCounterConsumption] = []
    taints: list[DeviceTaint] = []
    # Pointers upstream; the agent never publishes false (the same as unset to every consumer).
    binds_to_node: bool | None = None
    binding_conditions: list[str] = []
    binding_failure_conditions: list[str] = []
    allow_multiple_allocations: bool | None = None
    node_allocatable_resources: dict[str, NodeAllocatableResource] = {}


class ResourcePool(_Base):
    name: str
    generation: int = 0
    resource_slice_count: int = 0


class ResourceSliceSpec(_Base):
    driver: str
    pool: ResourcePool
    node_name: str | None = None
    devices: list[Device] = []
    shared_counters: list[CounterSet] = []
    partition_type_attribute: str | None = None
    skip_node_operations: list[str] = []


class OwnerReference(_Base):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(_Base):
    name: str = ""
    generate_name: str = ""
    uid: str = ""
    resource_version: str = ""
    owner_references: list[OwnerReference] = []


class ResourceSlice(msgspec.Struct, kw_only=True, rename="camel"):
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta
    spec: ResourceSliceSpec


# --- the internal inventory model -------------------------------------------------------------


class Pool(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    name: str
    devices: list[Device] = []
    shared_counters: list[CounterSet] = []
    # Slice-level fields the pool's slices carry (see desired_slices).
    partition_type_attribute: str | None = None
    skip_node_operations: list[str] = []


class Inventory(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """One plugin's whole inventory: every message replaces the previous one."""

    driver: str
    pools: list[Pool] = []


class InvalidInventory(ValueError):
    """An inventory broke rules; each error names the device (or pool) and the rule."""

    def __init__(self, driver: str, errors: list[str]) -> None:
        self.driver = driver
        self.errors = errors
        super().__init__(f"invalid inventory of driver {driver!r}: " + "; ".join(errors))


def inventory_errors(inv: Inventory) -> list[str]:
    """Every broken v1 rule of the inventory (empty when it may be published): limits and shapes
    of names, attributes and capacities, taints, counter sets and counters, duplicate pools,
    counter sets and devices, and the fields of `device_fields`. In Rust
    (rust/src/inventory/rules.rs), the one implementation; the plain-Python reference is
    tests/support/dra_reference/validation.py."""
    return _native.inventory_errors(msgspec.json.encode(inv), MAX_ATTRIBUTE_STRING)


def validate_inventory(inv: Inventory) -> None:
    """Raises InvalidInventory listing every broken rule."""
    errors = inventory_errors(inv)
    if errors:
        raise InvalidInventory(inv.driver, errors)


# --- desired slices -----------------------------------------------------------------------------


def _canonical_counters(counters: dict[str, Counter]) -> dict[str, Counter]:
    return {k: Counter(value=canonicalize(c.value)) for k, c in counters.items()}


def _canonical_device(d: Device) -> Device:
    return msgspec.structs.replace(
        d,
        capacity={k: canonical_capacity(c) for k, c in d.capacity.items()},
        node_allocatable_resources={
            k: canonical_node_allocatable(r) for k, r in d.node_allocatable_resources.items()
        },
        consumes_counters=[
            msgspec.structs.replace(u, counters=_canonical_counters(u.counters))
            for u in d.consumes_counters
        ],
    )


def _heavy(d: Device) -> bool:
    return bool(d.taints or d.consumes_counters)


def split_devices(devices: Iterable[Device]) -> list[list[Device]]:
    """Consecutive chunks of at most 128 devices, 64 in a chunk holding a tainted or
    counter-consuming device; always at least one chunk."""
    chunks: list[list[Device]] = [[]]
    heavy = False
    for d in devices:
        now_heavy = heavy or _heavy(d)
        limit = (
            MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS if now_heavy else MAX_DEVICES_PER_SLICE
        )
        if len(chunks[-1]) + 1 > limit:
            chunks.append([])
            now_heavy = _heavy(d)
        chunks[-1].append(d)
        heavy = now_heavy
    return chunks


def desired_slices(driver: str, pool: Pool, node_name: str) -> list[ResourceSliceSpec]:
    """The pool's slice specs, quantities in canonical form; the planner fills in the pool's
    generation, and `resourceSliceCount` counts every slice of the pool.

    Shared counters go into slices of their own (upstream refuses a slice holding both
    `sharedCounters` and `devices` since DRAPartitionableDevices went beta), at most
    `MAX_COUNTER_SETS` sets each, ahead of the device slices; a device may consume counters
    of a set in any slice of its pool. A pool with neither devices nor counters is one empty
    slice (it still says the pool exists and is empty)."""
    shared = [
        msgspec.structs.replace(cs, counters=_canonical_counters(cs.counters))
        for cs in pool.shared_counters
    ]
    counter_chunks = [
        shared[i : i + MAX_COUNTER_SETS] for i in range(0, len(shared), MAX_COUNTER_SETS)
    ]
    device_chunks = split_devices(_canonical_device(d) for d in pool.devices)
    if counter_chunks and not device_chunks[0]:
        device_chunks = []
    count = len(counter_chunks) + len(device_chunks)
    out = [
        ResourceSliceSpec(
            driver=driver,
            pool=ResourcePool(name=pool.name, resource_slice_count=count),
            node_name=node_name,
            shared_counters=chunk,
        )
        for chunk in counter_chunks
    ]
    out += [
        ResourceSliceSpec(
            driver=driver,
            pool=ResourcePool(name=pool.name, resource_slice_count=count),
            node_name=node_name,
            devices=chunk,
            # Upstream refuses the attribute on a slice without counter-consuming devices.
            partition_type_attribute=pool.partition_type_attribute
            if any(d.consumes_counters for d in chunk)
            else None,
            skip_node_operations=pool.skip_node_operations,
        )
        for chunk in device_chunks
    ]
    return out
