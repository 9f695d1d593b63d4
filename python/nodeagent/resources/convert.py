"""Both plugin APIs into the one inventory model.

- Native (`nodeagent.device.v1alpha1`): one-to-one onto v1 devices.
- Seed (`v1alpha3.Node/NodeListAndWatchResources`): named-resource instances become devices of one
  pool named after the node; bool/int/string/version attributes become device attributes,
  quantity attributes capacity. v1 has no list-valued attributes, so int and string slices are
  dropped per attribute and reported, and the rest of the device is published.

Conversion never validates: `model.validate_inventory` does, on the converted inventory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nodeagent.protos.dra.v1alpha3 import api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources.model import (
    Counter,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceCounterConsumption,
    DeviceTaint,
    Inventory,
    Pool,
)


@dataclass(frozen=True, slots=True)
class AttributeRejection:
    """A seed attribute that cannot be published; the rest of its device is."""

    device: str
    attribute: str
    rule: str

    def __str__(self) -> str:
        return f"device {self.device!r}: attribute {self.attribute!r}: {self.rule}"


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


def _native_device(d: device_pb2.Device) -> Device:
    return Device(
        name=d.name,
        attributes={k: _native_attribute(v) for k, v in d.attributes.items()},
        capacity={k: DeviceCapacity(value=v.value) for k, v in d.capacity.items()},
        consumes_counters=[
            DeviceCounterConsumption(counter_set=c.counter_set, counters=_counters(c.counters))
            for c in d.consumes_counters
        ],
        taints=[
            DeviceTaint(key=t.key, value=t.value, effect=t.effect, time_added=t.time_added or None)
            for t in d.taints
        ],
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
            )
            for p in message.pools
        ],
    )


_SLICE_RULE = "{kind} slices have no resource.k8s.io/v1 equivalent; the attribute is not published"


def _seed_device(
    instance: v1alpha2.NamedResourcesInstance, rejections: list[AttributeRejection]
) -> Device:
    attributes: dict[str, DeviceAttribute] = {}
    capacity: dict[str, DeviceCapacity] = {}
    for a in instance.attributes:
        v = a.attributeValue
        set_fields = [f.name for f, _ in v.ListFields()]
        if len(set_fields) != 1:
            rule = f"exactly one value must be set, got {len(set_fields)}"
            rejections.append(AttributeRejection(instance.name, a.name, rule))
            continue
        match set_fields[0]:
            case "bool":
                attributes[a.name] = DeviceAttribute(bool_=v.bool)
            case "int":
                attributes[a.name] = DeviceAttribute(int_=v.int)
            case "string":
                attributes[a.name] = DeviceAttribute(string=v.string)
            case "version":
                attributes[a.name] = DeviceAttribute(version=v.version)
            case "quantity":
                capacity[a.name] = DeviceCapacity(value=v.quantity.string)
            case "intSlice":
                rule = _SLICE_RULE.format(kind="int")
                rejections.append(AttributeRejection(instance.name, a.name, rule))
            case "stringSlice":
                rule = _SLICE_RULE.format(kind="string")
                rejections.append(AttributeRejection(instance.name, a.name, rule))
    return Device(name=instance.name, attributes=attributes, capacity=capacity)


def from_seed(
    driver: str, pool_name: str, message: api_pb2.NodeListAndWatchResourcesResponse
) -> tuple[Inventory, list[AttributeRejection]]:
    """The seed message as one pool (named after the node, as node-local pools are), and the
    attributes that had to be dropped."""
    rejections: list[AttributeRejection] = []
    devices = [
        _seed_device(instance, rejections)
        for model in message.resources
        for instance in model.namedResources.instances
    ]
    return Inventory(driver=driver, pools=[Pool(name=pool_name, devices=devices)]), rejections
