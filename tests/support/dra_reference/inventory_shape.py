"""The plain-Python reference of `nodeagent._native.native_message_error`.

Shape rules of a native `nodeagent.device.v1alpha1.Inventory` message.

These are the checks that make a message unusable as a whole (a value missing from a oneof,
duplicate names, lists over the v1 size limits, unparsable quantities, including those of request
policies and node-allocatable resources); the resource-level rules (qualified names, DNS labels,
semver, taint effects, the request policy's and binding conditions' rules:
rust/src/inventory/rules.rs) are the publisher's, which names the device and the rule in an
Event. Either way the plugin's last good inventory stays published.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from nodeagent.plugins.handler import InvalidMessage
from tests.support.quantity import QuantityError, check_quantity_syntax

if TYPE_CHECKING:
    from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2

__all__ = ["validate_inventory_message"]

# The resource.k8s.io/v1 limits (ResourceSlice validation); the message size is bounded by the
# bridge's max_message_bytes before decoding.
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_TAINTS = 16
MAX_COUNTERS = 32
MAX_BINDING_CONDITIONS = 4
MAX_COMPATIBILITY_GROUPS = 2
MAX_VALID_VALUES = 10


def validate_inventory_message(message: device_pb2.Inventory) -> None:
    """Raise InvalidMessage naming the first broken rule's field path and value."""
    pool_names: set[str] = set()
    for i, pool in enumerate(message.pools):
        where = f"pools[{i}]"
        if not pool.name:
            raise InvalidMessage(f"{where}.name: must not be empty")
        if pool.name in pool_names:
            raise InvalidMessage(f"{where}.name: {pool.name!r}: duplicate pool name")
        pool_names.add(pool.name)
        # No limit on a pool's counter sets: the publisher lays them out 8 to a slice.
        set_names: set[str] = set()
        for j, counter_set in enumerate(pool.shared_counters):
            at = f"{where}.shared_counters[{j}]"
            if not counter_set.name:
                raise InvalidMessage(f"{at}.name: must not be empty")
            if counter_set.name in set_names:
                raise InvalidMessage(f"{at}.name: {counter_set.name!r}: duplicate counter set")
            set_names.add(counter_set.name)
            _counters(f"{at}.counters", counter_set.counters)
        device_names: set[str] = set()
        for j, device in enumerate(pool.devices):
            _device(f"{where}.devices[{j}]", device, device_names)


def _device(at: str, device: device_pb2.Device, seen: set[str]) -> None:
    if not device.name:
        raise InvalidMessage(f"{at}.name: must not be empty")
    if device.name in seen:
        raise InvalidMessage(f"{at}.name: {device.name!r}: duplicate device name in the pool")
    seen.add(device.name)
    at = f"{at} ({device.name})"
    n = len(device.attributes) + len(device.capacity)
    if n > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise InvalidMessage(
            f"{at}: {n} attributes and capacities, at most {MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for key, attribute in device.attributes.items():
        if not key:
            raise InvalidMessage(f"{at}.attributes: empty attribute name")
        if attribute.WhichOneof("value") is None:
            raise InvalidMessage(f"{at}.attributes[{key!r}]: exactly one value must be set")
    for key, capacity in device.capacity.items():
        if not key:
            raise InvalidMessage(f"{at}.capacity: empty capacity name")
        _quantity(f"{at}.capacity[{key!r}].value", capacity.value)
        if capacity.HasField("request_policy"):
            _request_policy(f"{at}.capacity[{key!r}].request_policy", capacity.request_policy)
    for name in ("binding_conditions", "binding_failure_conditions"):
        conditions = getattr(device, name)
        if len(conditions) > MAX_BINDING_CONDITIONS:
            raise InvalidMessage(
                f"{at}.{name}: {len(conditions)} conditions, at most {MAX_BINDING_CONDITIONS}"
            )
    for key, resource in device.node_allocatable_resources.items():
        here = f"{at}.node_allocatable_resources[{key!r}]"
        m, o = resource.mapping, resource.overhead
        _optional_quantity(f"{here}.mapping.capacity_multiplier", m.capacity_multiplier)
        _optional_quantity(f"{here}.mapping.device_multiplier", m.device_multiplier)
        _optional_quantity(f"{here}.overhead.per_pod", o.per_pod)
        _optional_quantity(f"{here}.overhead.per_container", o.per_container)
    if len(device.taints) > MAX_TAINTS:
        raise InvalidMessage(f"{at}.taints: {len(device.taints)} taints, at most {MAX_TAINTS}")
    for k, taint in enumerate(device.taints):
        if not taint.key:
            raise InvalidMessage(f"{at}.taints[{k}].key: must not be empty")
    for k, consumption in enumerate(device.consumes_counters):
        here = f"{at}.consumes_counters[{k}]"
        if not consumption.counter_set:
            raise InvalidMessage(f"{here}.counter_set: must not be empty")
        _counters(f"{here}.counters", consumption.counters)
        if len(consumption.compatibility_groups) > MAX_COMPATIBILITY_GROUPS:
            raise InvalidMessage(
                f"{here}.compatibility_groups: {len(consumption.compatibility_groups)} groups, "
                f"at most {MAX_COMPATIBILITY_GROUPS}"
            )


def _request_policy(at: str, policy: device_pb2.CapacityRequestPolicy) -> None:
    _optional_quantity(f"{at}.default", policy.default)
    if len(policy.valid_values) > MAX_VALID_VALUES:
        raise InvalidMessage(
            f"{at}.valid_values: {len(policy.valid_values)} values, at most {MAX_VALID_VALUES}"
        )
    for i, value in enumerate(policy.valid_values):
        _quantity(f"{at}.valid_values[{i}]", value)
    r = policy.valid_range
    for name in ("min", "max", "step"):
        _optional_quantity(f"{at}.valid_range.{name}", getattr(r, name))


def _optional_quantity(at: str, value: str) -> None:
    if value:  # empty: unset
        _quantity(at, value)


def _counters(at: str, counters: Mapping[str, device_pb2.Counter]) -> None:
    if len(counters) > MAX_COUNTERS:
        raise InvalidMessage(f"{at}: {len(counters)} counters, at most {MAX_COUNTERS}")
    for name, counter in counters.items():
        if not name:
            raise InvalidMessage(f"{at}: empty counter name")
        _quantity(f"{at}[{name!r}].value", counter.value)


def _quantity(at: str, value: str) -> None:
    # The grammar only: a value out of range is the publisher's to report, for its device.
    try:
        check_quantity_syntax(value)
    except QuantityError:
        raise InvalidMessage(f"{at}: {value!r}: not a valid quantity") from None
