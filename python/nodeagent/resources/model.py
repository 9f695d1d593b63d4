"""ResourceSlice (`resource.k8s.io/v1`) models, the internal inventory model, its validation and
its desired slice specs (both in Rust).

The inventory model is the v1 device itself: both plugin APIs convert into it, so the publisher
has one shape to validate, split and plan, and the native API maps onto v1 one-to-one.
"""

from __future__ import annotations

import msgspec

from nodeagent import _native

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"

# The limits of kube-apiserver v1.37 (`k8s.io/kubernetes/pkg/apis/resource`), the same in 1.35
# and 1.36; those of splitting a pool into slices are rust/src/inventory/desired.rs'.
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_TAINTS = 16
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
    # Slice-level fields the pool's slices carry (see desired_specs).
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
    counter sets and devices, and the fields DRA added since 1.34. In Rust
    (rust/src/inventory/rules.rs), the one implementation; the plain-Python reference is
    tests/support/dra_reference/validation.py."""
    return _native.inventory_errors(msgspec.json.encode(inv), MAX_ATTRIBUTE_STRING)


def validate_inventory(inv: Inventory) -> None:
    """Raises InvalidInventory listing every broken rule."""
    errors = inventory_errors(inv)
    if errors:
        raise InvalidInventory(inv.driver, errors)


# --- desired slices -----------------------------------------------------------------------------

_decode_spec = msgspec.json.Decoder(ResourceSliceSpec).decode


def desired_specs(inventory: Inventory, node_name: str) -> list[list[bytes]]:
    """Per pool of a validated inventory, its slice specs as JSON, in one Rust call
    (rust/src/inventory/desired.rs; its plain-Python reference is
    tests/support/dra_reference/desired.py).

    Each pool's devices are split into slices of at most 128 (64 holding a tainted or
    counter-consuming device), its shared counters go ahead in slices of their own (upstream
    refuses a slice holding both), and every quantity is in canonical form, as the API server
    would store it. The planner fills in the pool's generation; `resourceSliceCount` counts every
    slice of the pool. A pool with neither devices nor counters is one empty slice (it still
    says the pool exists and is empty). ValueError names a quantity that does not parse."""
    return _native.desired_slices(msgspec.json.encode(inventory), node_name)


def desired_slices(driver: str, pool: Pool, node_name: str) -> list[ResourceSliceSpec]:
    """One pool's desired slice specs (`desired_specs`) as structs, for reading."""
    (specs,) = desired_specs(Inventory(driver=driver, pools=[pool]), node_name)
    return [_decode_spec(s) for s in specs]
