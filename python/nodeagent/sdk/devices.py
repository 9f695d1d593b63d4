"""The SDK's device model, and the messages it becomes on either DRA plugin API.

One `Device` type serves both APIs, so the same devices publish the same ResourceSlices either
way: on the native API `Quantity` attributes become capacity (as the agent maps seed quantity
attributes), and on the seed API capacity becomes quantity attributes. What an API cannot carry
(lists on the native API; taints and counters on the seed API) is refused with ValueError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nodeagent.protos.dra.v1alpha3 import api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2

__all__ = [
    "CounterConsumption",
    "CounterSet",
    "Device",
    "Pool",
    "Quantity",
    "SemVer",
    "Taint",
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
    """Counters a device draws from one of its pool's shared counter sets (native API only)."""

    counter_set: str
    counters: Mapping[str, QuantityValue]


@dataclass(frozen=True)
class Device:
    """One device. `attributes` of type Quantity are capacity too (the seed API's spelling)."""

    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, QuantityValue] = field(default_factory=dict)
    taints: Sequence[Taint] = ()
    consumes_counters: Sequence[CounterConsumption] = ()


@dataclass(frozen=True)
class CounterSet:
    """A pool's shared counters (native API only)."""

    name: str
    counters: Mapping[str, QuantityValue]


@dataclass(frozen=True)
class Pool:
    """A pool of devices (native API). Name: DNS subdomains joined by '/'."""

    name: str
    devices: Sequence[Device]
    shared_counters: Sequence[CounterSet] = ()


def _quantity(value: QuantityValue) -> str:
    return value.value if isinstance(value, Quantity) else value


# -- native (nodeagent.device.v1alpha1) ------------------------------------------------------


def _native_device(device: Device) -> device_pb2.Device:
    out = device_pb2.Device(name=device.name)
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
                f"device {device.name!r}: attribute {key!r}: list values have no "
                "resource.k8s.io/v1 equivalent (use the seed API or separate attributes)"
            )
    for key, quantity in device.capacity.items():
        if key in out.capacity:
            raise ValueError(f"device {device.name!r}: capacity {key!r} given twice")
        out.capacity[key].value = _quantity(quantity)
    out.taints.extend(
        device_pb2.DeviceTaint(key=t.key, value=t.value, effect=t.effect, time_added=t.time_added)
        for t in device.taints
    )
    for consumption in device.consumes_counters:
        c = out.consumes_counters.add(counter_set=consumption.counter_set)
        for name, value in consumption.counters.items():
            c.counters[name].value = _quantity(value)
    return out


def build_inventory(pools: Sequence[Pool]) -> device_pb2.Inventory:
    """The native message: the plugin's whole inventory."""
    out = device_pb2.Inventory()
    for pool in pools:
        p = out.pools.add(name=pool.name)
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
    if device.taints or device.consumes_counters:
        raise ValueError(
            f"device {device.name!r}: taints and counters need the native API (the seed API "
            "has no such fields)"
        )
    values: dict[str, AttributeValue] = dict(device.attributes)
    for key, quantity in device.capacity.items():
        if key in values:
            raise ValueError(f"device {device.name!r}: {key!r} is an attribute and a capacity")
        values[key] = Quantity(_quantity(quantity))
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
