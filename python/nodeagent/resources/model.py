"""ResourceSlice (`resource.k8s.io/v1`) models, the internal inventory model, its validation and
the split of a pool's devices into slice specs.

The inventory model is the v1 device itself: both plugin APIs convert into it, so the publisher
has one shape to validate, split and plan, and the native API maps onto v1 one-to-one.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from nodeagent.core.k8s import (
    QuantityError,
    canonicalize,
    is_dns_label,
    is_dns_subdomain,
    is_label_key,
    is_label_value,
    is_qualified_name,
    is_rfc3339,
    is_semver,
)
from nodeagent.resources.device_fields import (
    canonical_capacity,
    canonical_node_allocatable,
    device_field_errors,
    pool_field_errors,
)

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


TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


def _counters(where: str, counters: dict[str, Counter], errors: list[str]) -> None:
    if not counters:
        errors.append(f"{where}: counters are required (at least one)")
    if len(counters) > MAX_COUNTERS:
        errors.append(f"{where}: {len(counters)} counters, at most {MAX_COUNTERS} allowed")
    for name, counter in counters.items():
        if not is_dns_label(name):
            errors.append(f"{where}: counter name {name!r} must be a DNS label")
        _quantity(f"{where}: counter {name!r}", counter.value, errors)


def _quantity(where: str, value: str, errors: list[str]) -> None:
    try:
        canonicalize(value)
    except QuantityError as exc:
        errors.append(f"{where}: {exc}")


def is_device_qualified_name(name: str) -> bool:
    """An attribute or capacity name as kube-apiserver checks it: a C identifier (<= 32), or a
    domain and one: the domain is a CSI driver name, which upstream checks case-insensitively
    (`GPU.example.com/model` is accepted)."""
    domain, sep, ident = name.rpartition("/")
    return is_qualified_name(f"{domain.lower()}{sep}{ident}")


def attribute_errors(name: str, attr: DeviceAttribute) -> list[str]:
    """What is wrong with one device attribute on its own (empty when it may be published)."""
    errors: list[str] = []
    if not is_device_qualified_name(name):
        errors.append("name must be a C identifier (<= 32) or domain/identifier")
    values = [v for v in (attr.int_, attr.bool_, attr.string, attr.version) if v is not None]
    if len(values) != 1:
        errors.append("exactly one of int, bool, string, version must be set")
    for text in (attr.string, attr.version):
        if text is not None and len(text.encode()) > MAX_ATTRIBUTE_STRING:
            errors.append(
                f"{len(text.encode())} bytes of UTF-8, at most {MAX_ATTRIBUTE_STRING} allowed"
            )
    if attr.version is not None and not is_semver(attr.version):
        errors.append(f"version {attr.version!r} is not semantic versioning 2.0.0")
    return errors


def capacity_errors(name: str, cap: DeviceCapacity) -> list[str]:
    """What is wrong with one device capacity on its own (empty when it may be published)."""
    errors: list[str] = []
    if not is_device_qualified_name(name):
        errors.append("name must be a C identifier (<= 32) or domain/identifier")
    try:
        canonicalize(cap.value)
    except QuantityError as exc:
        errors.append(str(exc))
    return errors


def _device(d: Device, counter_sets: dict[str, set[str]], errors: list[str]) -> None:
    at = f"device {d.name!r}"
    if not is_dns_label(d.name):
        errors.append(f"{at}: name must be a DNS label (lowercase alphanumerics and '-', <= 63)")
    n = len(d.attributes) + len(d.capacity)
    if n > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            f"{at}: {n} attributes and capacities, at most {MAX_ATTRIBUTES_AND_CAPACITIES} allowed"
        )
    for name, attr in d.attributes.items():
        here = f"{at}: attribute {name!r}"
        errors.extend(f"{here}: {e}" for e in attribute_errors(name, attr))
    for name, cap in d.capacity.items():
        errors.extend(f"{at}: capacity {name!r}: {e}" for e in capacity_errors(name, cap))
    if len(d.taints) > MAX_TAINTS:
        errors.append(f"{at}: {len(d.taints)} taints, at most {MAX_TAINTS} allowed")
    for i, taint in enumerate(d.taints):
        here = f"{at}: taint {i}"
        if not is_label_key(taint.key):
            errors.append(f"{here}: key {taint.key!r} must be a qualified label key")
        if not is_label_value(taint.value):
            errors.append(f"{here}: value {taint.value!r} must be a label value")
        if taint.effect not in TAINT_EFFECTS:
            errors.append(f"{here}: effect {taint.effect!r} must be one of {TAINT_EFFECTS}")
        if taint.time_added is not None and not is_rfc3339(taint.time_added):
            errors.append(f"{here}: timeAdded {taint.time_added!r} must be RFC 3339")
    if len(d.consumes_counters) > MAX_COUNTER_CONSUMPTIONS:
        errors.append(
            f"{at}: consumesCounters has {len(d.consumes_counters)} entries, "
            f"at most {MAX_COUNTER_CONSUMPTIONS} allowed"
        )
    used: set[str] = set()
    for use in d.consumes_counters:
        here = f"{at}: consumesCounters {use.counter_set!r}"
        if use.counter_set in used:
            errors.append(f"{here}: the counter set is named twice")
        used.add(use.counter_set)
        # Not a server rule (it does not look across slices): a device consuming a counter
        # nobody publishes could never be allocated, which is a plugin bug to report.
        known = counter_sets.get(use.counter_set)
        if known is None:
            errors.append(f"{here}: no such shared counter set in the pool")
        else:
            for name in use.counters:
                if name not in known:
                    errors.append(f"{here}: counter {name!r} is not in the set")
        _counters(here, use.counters, errors)
    errors.extend(f"{at}: {e}" for e in device_field_errors(d))


def validate_inventory(inv: Inventory) -> None:
    """Raises InvalidInventory listing every broken rule."""
    errors: list[str] = []
    if not is_dns_subdomain(inv.driver, 63):
        errors.append(f"driver {inv.driver!r}: must be a DNS subdomain of at most 63 characters")
    pools: set[str] = set()
    for pool in inv.pools:
        at = f"pool {pool.name!r}"
        parts = pool.name.split("/")
        if len(pool.name) > 253 or not all(is_dns_subdomain(p) for p in parts):
            errors.append(f"{at}: name must be DNS subdomains joined by '/', <= 253 characters")
        if pool.name in pools:
            errors.append(f"{at}: duplicate pool name")
        pools.add(pool.name)
        sets: dict[str, set[str]] = {}
        for cs in pool.shared_counters:
            if not is_dns_label(cs.name):
                errors.append(f"{at}: counter set {cs.name!r}: name must be a DNS label")
            if cs.name in sets:
                errors.append(f"{at}: counter set {cs.name!r}: duplicate name")
            sets[cs.name] = set(cs.counters)
            _counters(f"{at}: counter set {cs.name!r}", cs.counters, errors)
        errors.extend(f"{at}: {e}" for e in pool_field_errors(inv.driver, pool))
        names: set[str] = set()
        for d in pool.devices:
            if d.name in names:
                errors.append(f"device {d.name!r}: duplicate device name in {at}")
            names.add(d.name)
            _device(d, sets, errors)
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
