"""The reference (plain Python) of the Rust conversion in `rust/src/inventory/`: both plugin APIs
into the one inventory model.

- Native (`nodeagent.device.v1alpha1`): one-to-one onto v1 devices; an empty string of an
  optional quantity or name is unset, a false `bindsToNode` / `allowMultipleAllocations` too.
- Seed (`v1alpha3.Node/NodeListAndWatchResources`): named-resource instances become devices of one
  pool named after the node (none when there are no instances); instance names become DNS labels
  (`seed_device_name`); bool/int/string/version attributes become device attributes, quantity
  attributes capacity. What v1 cannot hold (int and string slices, an attribute without exactly
  one value, a name with no v1 form) is dropped on its own and reported: one attribute, or one
  device, never the whole inventory.

Native conversion never validates: `model.validate_inventory` does, on the converted inventory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from nodeagent.core.k8s import is_dns_label, is_dns_subdomain
from nodeagent.resources.convert import SeedRejection
from nodeagent.resources.model import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    Counter,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceCounterConsumption,
    DeviceTaint,
    Inventory,
    NodeAllocatableMapping,
    NodeAllocatableOverhead,
    NodeAllocatableResource,
    Pool,
)
from tests.support.dra_reference.validation import attribute_errors, capacity_errors

if TYPE_CHECKING:
    # Type hints only: the messages come from plugins, which load their modules.
    from nodeagent.protos.dra.v1alpha3 import api_pb2
    from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
    from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2


def _counters(counters: Mapping[str, device_pb2.Counter]) -> dict[str, Counter]:
    return {name: Counter(value=c.value) for name, c in counters.items()}


def _native_attribute(a: device_pb2.DeviceAttribute) -> DeviceAttribute:
    match a.WhichOneof("value"):
        case "int":
            return DeviceAttribute(int_=a.int)
        case "bool":
            return DeviceAttribute(bool_=a.bool)
        case "string":
            return DeviceAttribute(string=a.string)
        case "version":
            return DeviceAttribute(version=a.version)
    # No value: validation reports the device and the rule.
    return DeviceAttribute()


def _opt(text: str) -> str | None:
    """Proto3 strings have no presence: empty is unset (never a valid value of these fields)."""
    return text or None


def _native_capacity(c: device_pb2.DeviceCapacity) -> DeviceCapacity:
    if not c.HasField("request_policy"):
        return DeviceCapacity(value=c.value)
    p = c.request_policy
    valid_range = None
    if p.HasField("valid_range"):
        r = p.valid_range
        valid_range = CapacityRequestPolicyRange(
            min=_opt(r.min), max=_opt(r.max), step=_opt(r.step)
        )
    policy = CapacityRequestPolicy(
        default=_opt(p.default), valid_values=list(p.valid_values), valid_range=valid_range
    )
    return DeviceCapacity(value=c.value, request_policy=policy)


def _native_node_allocatable(r: device_pb2.NodeAllocatableResource) -> NodeAllocatableResource:
    mapping = overhead = None
    if r.HasField("mapping"):
        m = r.mapping
        mapping = NodeAllocatableMapping(
            capacity_key=_opt(m.capacity_key),
            capacity_multiplier=_opt(m.capacity_multiplier),
            device_multiplier=_opt(m.device_multiplier),
        )
    if r.HasField("overhead"):
        o = r.overhead
        overhead = NodeAllocatableOverhead(
            per_pod=_opt(o.per_pod), per_container=_opt(o.per_container)
        )
    return NodeAllocatableResource(mapping=mapping, overhead=overhead)


def _native_device(d: device_pb2.Device) -> Device:
    return Device(
        name=d.name,
        attributes={k: _native_attribute(v) for k, v in d.attributes.items()},
        capacity={k: _native_capacity(v) for k, v in d.capacity.items()},
        consumes_counters=[
            DeviceCounterConsumption(
                counter_set=c.counter_set,
                counters=_counters(c.counters),
                compatibility_groups=list(c.compatibility_groups),
            )
            for c in d.consumes_counters
        ],
        taints=[
            DeviceTaint(key=t.key, value=t.value, effect=t.effect, time_added=t.time_added or None)
            for t in d.taints
        ],
        # False is not published: upstream consumers read an unset pointer as false.
        binds_to_node=d.binds_to_node or None,
        binding_conditions=list(d.binding_conditions),
        binding_failure_conditions=list(d.binding_failure_conditions),
        allow_multiple_allocations=d.allow_multiple_allocations or None,
        node_allocatable_resources={
            k: _native_node_allocatable(v) for k, v in d.node_allocatable_resources.items()
        },
    )


def from_native(driver: str, message: device_pb2.Inventory) -> Inventory:
    return Inventory(
        driver=driver,
        pools=[
            Pool(
                name=p.name,
                devices=[_native_device(d) for d in p.devices],
                shared_counters=[
                    CounterSet(name=c.name, counters=_counters(c.counters))
                    for c in p.shared_counters
                ],
                partition_type_attribute=_opt(p.partition_type_attribute),
                skip_node_operations=list(p.skip_node_operations),
            )
            for p in message.pools
        ],
    )


_SLICE_RULE = "{kind} slices have no resource.k8s.io/v1 equivalent; the attribute is not published"

# Room for "-" and the 8 hex digits of the name's hash in a 63-character DNS label.
_MAPPED_PREFIX = 63 - 9


def seed_device_name(instance_name: str) -> str | None:
    """The v1 device name of a seed instance name, or None when it cannot have one.

    Seed names are DNS subdomains (`gpu.0`), v1 names DNS labels. A label is kept as it is; any
    other subdomain becomes its dots turned to dashes, cut to 54 characters, then `-` and the first
    8 hex digits of the SHA-256 of the original name. The hash keeps the mapping a pure function of
    the name (stable across restarts, plugins and agents) and keeps `gpu.0` apart from a device
    really named `gpu-0`.
    """
    if is_dns_label(instance_name):
        return instance_name
    if not is_dns_subdomain(instance_name):
        return None
    digest = hashlib.sha256(instance_name.encode()).hexdigest()[:8]
    prefix = instance_name.replace(".", "-")[:_MAPPED_PREFIX].rstrip("-")
    return f"{prefix}-{digest}"


def _seed_value(
    name: str, v: v1alpha2.NamedResourcesAttributeValue
) -> DeviceAttribute | DeviceCapacity | str:
    """The v1 form of one seed attribute value, or the rule that keeps it from being published."""
    set_fields = [f.name for f, _ in v.ListFields()]
    if len(set_fields) != 1:
        return f"exactly one value must be set, got {len(set_fields)}"
    value: DeviceAttribute | DeviceCapacity
    match set_fields[0]:
        case "bool":
            value = DeviceAttribute(bool_=v.bool)
        case "int":
            value = DeviceAttribute(int_=v.int)
        case "string":
            value = DeviceAttribute(string=v.string)
        case "version":
            value = DeviceAttribute(version=v.version)
        case "quantity":
            value = DeviceCapacity(value=v.quantity.string)
        case "intSlice":
            return _SLICE_RULE.format(kind="int")
        case "stringSlice":
            return _SLICE_RULE.format(kind="string")
        case other:
            return f"unknown value field {other!r}"
    if isinstance(value, DeviceCapacity):
        errors = capacity_errors(name, value)
    else:
        errors = attribute_errors(name, value)
    return "; ".join(errors) if errors else value


def _seed_device(
    instance: v1alpha2.NamedResourcesInstance, name: str, rejections: list[SeedRejection]
) -> Device:
    attributes: dict[str, DeviceAttribute] = {}
    capacity: dict[str, DeviceCapacity] = {}
    for a in instance.attributes:
        if a.name in attributes or a.name in capacity:
            rejections.append(SeedRejection(instance.name, a.name, "duplicate attribute name"))
            continue
        value = _seed_value(a.name, a.attributeValue)
        if isinstance(value, str):
            rejections.append(SeedRejection(instance.name, a.name, value))
        elif isinstance(value, DeviceCapacity):
            capacity[a.name] = value
        else:
            attributes[a.name] = value
    return Device(name=name, attributes=attributes, capacity=capacity)


def from_seed(
    driver: str, pool_name: str, message: api_pb2.NodeListAndWatchResourcesResponse
) -> tuple[Inventory, list[SeedRejection]]:
    """The seed message as one pool (named after the node, as node-local pools are), and what
    had to be left out of it: single attributes, or whole devices whose name has no v1 form.

    The first instance of a name wins; a later duplicate (or a name mapping onto one already
    used) is rejected on its own. No instances at all means no pool, hence no slices.
    """
    rejections: list[SeedRejection] = []
    devices: list[Device] = []
    used: set[str] = set()
    for model in message.resources:
        for instance in model.namedResources.instances:
            name = seed_device_name(instance.name)
            if name is None:
                rule = "name must be a DNS subdomain (lowercase alphanumerics, '-', '.'; <= 253)"
                rejections.append(SeedRejection(instance.name, None, rule))
                continue
            if name in used:
                rule = f"device name {name!r} is already used by another instance"
                rejections.append(SeedRejection(instance.name, None, rule))
                continue
            used.add(name)
            devices.append(_seed_device(instance, name, rejections))
    pools = [Pool(name=pool_name, devices=devices)] if devices else []
    return Inventory(driver=driver, pools=pools), rejections
