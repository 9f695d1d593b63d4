"""The SDK's device model, and the messages it becomes on either DRA plugin API.

One `Device` type serves both APIs, so the same devices publish the same ResourceSlices either
way: on the native API `Quantity` attributes become capacity (as the agent maps seed quantity
attributes), and on the seed API capacity becomes quantity attributes. What an API cannot carry
is refused with ValueError: list attributes on the native API; on the seed API everything newer
than plain attributes and capacity (taints, counters, consumable capacity, binding conditions,
node-allocatable resources, the pool's slice-level fields).

The newer fields reach a cluster only with their feature gate on (Kubernetes 1.37's default in
brackets); a server with the gate off drops the field from what it stores:
- `Device.taints`: DRADeviceTaints [GA];
- `CounterSet`, `Device.consumes_counters`: DRAPartitionableDevices [beta, on];
- `Device.allow_multiple_allocations`, `Capacity.request_policy`: DRAConsumableCapacity
  [beta, on];
- `Device.binding_conditions`, `binding_failure_conditions`, `binds_to_node`:
  DRADeviceBindingConditions and DRAResourceClaimDeviceStatus [beta, on];
- `Device.node_allocatable`: DRANodeAllocatableResources [alpha, off];
- `CounterConsumption.compatibility_groups`: DRADeviceCompatibilityGroups [alpha, off];
- `Pool.partition_type_attribute`: DRAPartitionableDevicesType and DRAResourcePoolStatus
  [alpha, off];
- `Pool.skip_node_operations`: DRAOptionalNodeOperations [alpha, off].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nodeagent.protos.dra.v1alpha3 import api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2

__all__ = [
    "Capacity",
    "CounterConsumption",
    "CounterSet",
    "Device",
    "NodeAllocatable",
    "Pool",
    "Quantity",
    "RequestPolicy",
    "SemVer",
    "Taint",
    "ValidRange",
    "build_inventory",
    "build_resources",
]


@dataclass(frozen=True)
class Quantity:
    """A Kubernetes quantity such as "40Gi" or "500m"."""

    value: str


@dataclass(frozen=True)
class SemVer:
    """A semantic version attribute such as "1.2.3"."""

    value: str


AttributeValue = bool | int | str | Quantity | SemVer | Sequence[int] | Sequence[str]
QuantityValue = str | Quantity


@dataclass(frozen=True)
class Taint:
    """A device taint (native API only). `effect`: NoSchedule, NoExecute or None."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"
    time_added: str = ""  # RFC 3339; empty lets the API server set it


@dataclass(frozen=True)
class CounterConsumption:
    """Counters a device draws from one of its pool's shared counter sets (native API only).

    `compatibility_groups`: at most 2 distinct DNS labels. Devices drawing on the same counter
    set may be allocated together only if they share a group; a device without groups only
    with others without."""

    counter_set: str
    counters: Mapping[str, QuantityValue]
    compatibility_groups: Sequence[str] = ()


@dataclass(frozen=True)
class ValidRange:
    """The amounts a request may consume: `min` (required, 0 <= min <= the capacity's value) up
    to `max` (default: the capacity's value), on steps of `step` from `min` (default: any
    amount; min + step <= the capacity's value; `max` and the policy's default on a step). A
    request below `min` is rounded up to it, one between steps to the next step."""

    min: QuantityValue
    max: QuantityValue | None = None
    step: QuantityValue | None = None


@dataclass(frozen=True)
class RequestPolicy:
    """How requests consume a capacity of a device with `allow_multiple_allocations`.

    `default`: what a request naming no amount of this capacity consumes (unset: all of it).
    At most one of `valid_values` (at most 10 distinct, ascending, each <= the capacity's value;
    a request is rounded up to the next one) and `valid_range`; either needs `default`, one of
    the values or inside the range."""

    default: QuantityValue | None = None
    valid_values: Sequence[QuantityValue] = ()
    valid_range: ValidRange | None = None


@dataclass(frozen=True)
class Capacity:
    """A capacity with a request policy (native API only). A plain capacity is its value alone:
    `capacity={"memory": "40Gi"}`."""

    value: QuantityValue
    request_policy: RequestPolicy | None = None


CapacityValue = QuantityValue | Capacity


@dataclass(frozen=True)
class NodeAllocatable:
    """How allocating the device accounts for a node resource in the pod's cgroups (native API
    only), keyed in `Device.node_allocatable` by "cpu", "memory" or "hugepages-<size>".

    A mapping, an overhead or both. The mapping is exactly one of `capacity_key` (a capacity of
    the device) with `capacity_multiplier` > 0 (the amount the claim consumes times it), or
    `device_multiplier` > 0 (the allocated device count times it). The overheads (>= 0) are
    added once per pod and per referencing container."""

    capacity_key: str | None = None
    capacity_multiplier: QuantityValue | None = None
    device_multiplier: QuantityValue | None = None
    per_pod: QuantityValue | None = None
    per_container: QuantityValue | None = None


@dataclass(frozen=True)
class Device:
    """One device. `attributes` of type Quantity are capacity too (the seed API's spelling).

    Native API only, besides `taints` and `consumes_counters`:
    - `capacity` values may be `Capacity` with a request policy, which needs
      `allow_multiple_allocations`: the device may be allocated to several requests at once and
      its capacities are consumed by amount;
    - `binding_conditions`, `binding_failure_conditions`: condition types (qualified names, at
      most 4 each, none in both, both lists or neither) the scheduler waits to be True in the
      claim's device status before binding the pod / that mean binding failed;
    - `binds_to_node`: an allocation is usable only on the node it was made for;
    - `node_allocatable`: see `NodeAllocatable`.
    """

    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, CapacityValue] = field(default_factory=dict)
    taints: Sequence[Taint] = ()
    consumes_counters: Sequence[CounterConsumption] = ()
    allow_multiple_allocations: bool = False
    binding_conditions: Sequence[str] = ()
    binding_failure_conditions: Sequence[str] = ()
    binds_to_node: bool = False
    node_allocatable: Mapping[str, NodeAllocatable] = field(default_factory=dict)

    def native_only_fields(self) -> list[str]:
        """The fields set here that only the native API carries."""
        return [
            name
            for name, used in (
                ("taints", bool(self.taints)),
                ("consumes_counters", bool(self.consumes_counters)),
                ("allow_multiple_allocations", self.allow_multiple_allocations),
                ("binding_conditions", bool(self.binding_conditions)),
                ("binding_failure_conditions", bool(self.binding_failure_conditions)),
                ("binds_to_node", self.binds_to_node),
                ("node_allocatable", bool(self.node_allocatable)),
                ("capacity request policies", _has_policy(self.capacity)),
            )
            if used
        ]


def _has_policy(capacity: Mapping[str, CapacityValue]) -> bool:
    return any(isinstance(c, Capacity) and c.request_policy for c in capacity.values())


@dataclass(frozen=True)
class CounterSet:
    """A pool's shared counters (native API only)."""

    name: str
    counters: Mapping[str, QuantityValue]


@dataclass(frozen=True)
class Pool:
    """A pool of devices (native API). Name: DNS subdomains joined by '/'.

    `partition_type_attribute`: `<domain>/<name>` of a string attribute every counter-consuming
    device of the pool carries, naming its partition type ("1g.10gb"); devices of one type
    must consume the same counters. The agent sets it on the slices holding such devices.
    `skip_node_operations`: node operations the kubelet may skip for the pool's devices:
    "NodeUnprepareResources", "NodePrepareResources" (only with the former) or "*"."""

    name: str
    devices: Sequence[Device]
    shared_counters: Sequence[CounterSet] = ()
    partition_type_attribute: str = ""
    skip_node_operations: Sequence[str] = ()


def _quantity(value: QuantityValue) -> str:
    return value.value if isinstance(value, Quantity) else value


def _opt_quantity(value: QuantityValue | None) -> str:
    """The wire's spelling of an optional quantity: empty is unset."""
    return "" if value is None else _quantity(value)


# -- native (nodeagent.device.v1alpha1) ------------------------------------------------------


def _native_capacity(capacity: Capacity) -> device_pb2.DeviceCapacity:
    out = device_pb2.DeviceCapacity(value=_quantity(capacity.value))
    policy = capacity.request_policy
    if policy is None:
        return out
    p = out.request_policy
    p.SetInParent()  # an empty policy is still a policy: the server rules on it
    p.default = _opt_quantity(policy.default)
    p.valid_values.extend(_quantity(v) for v in policy.valid_values)
    r = policy.valid_range
    if r is not None:
        p.valid_range.SetInParent()
        p.valid_range.min = _quantity(r.min)
        p.valid_range.max = _opt_quantity(r.max)
        p.valid_range.step = _opt_quantity(r.step)
    return out


def _native_node_allocatable(n: NodeAllocatable) -> device_pb2.NodeAllocatableResource:
    out = device_pb2.NodeAllocatableResource()
    if n.capacity_key is not None or n.capacity_multiplier is not None:
        out.mapping.capacity_key = n.capacity_key or ""
        out.mapping.capacity_multiplier = _opt_quantity(n.capacity_multiplier)
    if n.device_multiplier is not None:
        out.mapping.device_multiplier = _quantity(n.device_multiplier)
    if n.per_pod is not None or n.per_container is not None:
        out.overhead.per_pod = _opt_quantity(n.per_pod)
        out.overhead.per_container = _opt_quantity(n.per_container)
    return out


def _native_device(device: Device) -> device_pb2.Device:
    out = device_pb2.Device(
        name=device.name,
        allow_multiple_allocations=device.allow_multiple_allocations,
        binding_conditions=device.binding_conditions,
        binding_failure_conditions=device.binding_failure_conditions,
        binds_to_node=device.binds_to_node,
    )
    for key, value in device.attributes.items():
        if isinstance(value, bool):  # before int: bool is an int
            out.attributes[key].bool = value
        elif isinstance(value, int):
            out.attributes[key].int = value
        elif isinstance(value, str):
            out.attributes[key].string = value
        elif isinstance(value, SemVer):
            out.attributes[key].version = value.value
        elif isinstance(value, Quantity):
            out.capacity[key].value = value.value
        else:
            raise ValueError(
                f"device {device.name!r}: attribute {key!r}: list values are not carried by the "
                "native API (resource.k8s.io/v1 has them only behind the alpha "
                "DRAListTypeAttributes gate; use the seed API or separate attributes)"
            )
    for key, capacity in device.capacity.items():
        if key in out.capacity:
            raise ValueError(f"device {device.name!r}: capacity {key!r} given twice")
        if isinstance(capacity, Capacity):
            out.capacity[key].CopyFrom(_native_capacity(capacity))
        else:
            out.capacity[key].value = _quantity(capacity)
    out.taints.extend(
        device_pb2.DeviceTaint(key=t.key, value=t.value, effect=t.effect, time_added=t.time_added)
        for t in device.taints
    )
    for consumption in device.consumes_counters:
        c = out.consumes_counters.add(
            counter_set=consumption.counter_set,
            compatibility_groups=consumption.compatibility_groups,
        )
        for name, value in consumption.counters.items():
            c.counters[name].value = _quantity(value)
    for resource, n in device.node_allocatable.items():
        out.node_allocatable_resources[resource].CopyFrom(_native_node_allocatable(n))
    return out


def build_inventory(pools: Sequence[Pool]) -> device_pb2.Inventory:
    """The native message: the plugin's whole inventory."""
    out = device_pb2.Inventory()
    for pool in pools:
        p = out.pools.add(
            name=pool.name,
            partition_type_attribute=pool.partition_type_attribute,
            skip_node_operations=pool.skip_node_operations,
        )
        p.devices.extend(_native_device(d) for d in pool.devices)
        for counter_set in pool.shared_counters:
            s = p.shared_counters.add(name=counter_set.name)
            for name, value in counter_set.counters.items():
                s.counters[name].value = _quantity(value)
    return out


# -- seed (v1alpha3 named resources) ---------------------------------------------------------


def _seed_value(value: AttributeValue) -> v1alpha2.NamedResourcesAttributeValue:
    out = v1alpha2.NamedResourcesAttributeValue()
    if isinstance(value, bool):  # before int: bool is an int
        out.bool = value
    elif isinstance(value, int):
        out.int = value
    elif isinstance(value, str):
        out.string = value
    elif isinstance(value, Quantity):
        out.quantity.string = value.value
    elif isinstance(value, SemVer):
        out.version = value.value
    elif all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        out.intSlice.ints.extend(int(v) for v in value)
    elif all(isinstance(v, str) for v in value):
        out.stringSlice.strings.extend(str(v) for v in value)
    else:
        raise TypeError(f"unsupported attribute value {value!r}")
    return out


def _seed_instance(device: Device) -> v1alpha2.NamedResourcesInstance:
    native_only = device.native_only_fields()
    if native_only:
        raise ValueError(
            f"device {device.name!r}: {', '.join(native_only)} need the native API (the seed "
            "API has no such fields)"
        )
    values: dict[str, AttributeValue] = dict(device.attributes)
    for key, capacity in device.capacity.items():
        if key in values:
            raise ValueError(f"device {device.name!r}: {key!r} is an attribute and a capacity")
        values[key] = Quantity(
            _quantity(capacity.value if isinstance(capacity, Capacity) else capacity)
        )
    return v1alpha2.NamedResourcesInstance(
        name=device.name,
        attributes=[
            v1alpha2.NamedResourcesAttribute(name=key, attributeValue=_seed_value(value))
            for key, value in values.items()
        ],
    )


def build_resources(devices: Sequence[Device]) -> api_pb2.NodeListAndWatchResourcesResponse:
    """The seed message: one ResourceModel with every device as a named-resources instance."""
    model = v1alpha2.ResourceModel(
        namedResources=v1alpha2.NamedResourcesResources(
            instances=[_seed_instance(d) for d in devices]
        )
    )
    return api_pb2.NodeListAndWatchResourcesResponse(resources=[model])
