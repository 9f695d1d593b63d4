"""The plain-Python reference of rust/src/inventory/rules.rs' device-field rules.

The rules of the device and slice fields that DRA added after taints and counters (1.34-1.37):
consumable capacity (`allowMultipleAllocations`, capacity `requestPolicy`), binding conditions,
`bindsToNode`, `nodeAllocatableResources`, counter `compatibilityGroups`, and the slice's
`partitionTypeAttribute` and `skipNodeOperations`.

They are kube-apiserver v1.37's (`pkg/apis/resource/validation`, the declarative tags of
`k8s.io/api/resource/v1`), with `DRAFractionalCapacityRange` on as 1.37 defaults it: a range with
a fractional bound is checked in milli-units. `model.validate_inventory` calls
`device_field_errors` for each device and `pool_field_errors` for each pool; every message names
the field, and the caller prefixes the device or pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from nodeagent.core.k8s import is_dns_label, is_label_key, is_qualified_name
from tests.support.quantity import QuantityError, parse_quantity

if TYPE_CHECKING:
    from nodeagent.resources.model import (
        CapacityRequestPolicy,
        CapacityRequestPolicyRange,
        Device,
        DeviceCapacity,
        NodeAllocatableMapping,
        NodeAllocatableOverhead,
        Pool,
    )

__all__ = [
    "BINDING_CONDITIONS_MAX",
    "COMPATIBILITY_GROUPS_MAX",
    "REQUEST_POLICY_VALID_VALUES_MAX",
    "SKIP_NODE_OPERATIONS",
    "device_field_errors",
    "pool_field_errors",
]

BINDING_CONDITIONS_MAX = 4
COMPATIBILITY_GROUPS_MAX = 2
REQUEST_POLICY_VALID_VALUES_MAX = 10
SKIP_NODE_OPERATIONS = ("NodePrepareResources", "NodeUnprepareResources", "*")
_INT64_MAX = 2**63 - 1


def _q(where: str, text: str, errors: list[str]) -> Fraction | None:
    try:
        return parse_quantity(text).value
    except QuantityError as exc:
        errors.append(f"{where}: {exc}")
        return None


def _fractional(v: Fraction) -> bool:
    return v.denominator != 1


def _milli(v: Fraction) -> bool:
    """Whether upstream's int64 milli-value arithmetic holds the value exactly."""
    m = v * 1000
    return m.denominator == 1 and -(2**63) <= m <= _INT64_MAX


def _range_errors(
    at: str, default: Fraction, capacity: Fraction, r: CapacityRequestPolicyRange
) -> list[str]:
    errors: list[str] = []
    if r.min is None:
        return [f"{at}.min: required when validRange is set"]
    lo = _q(f"{at}.min", r.min, errors)
    hi = _q(f"{at}.max", r.max, errors) if r.max is not None else None
    step = _q(f"{at}.step", r.step, errors) if r.step is not None else None
    if errors or lo is None:
        return errors
    if lo > capacity:
        errors.append(f"{at}.min: {r.min} is larger than the capacity's value")
    if default < lo:
        errors.append(f"{at}: the default is less than min {r.min}")
    if hi is not None:
        if lo > hi:
            errors.append(f"{at}.max: min {r.min} is larger than max {r.max}")
        if hi > capacity:
            errors.append(f"{at}.max: {r.max} is larger than the capacity's value")
        if default > hi:
            errors.append(f"{at}: the default is more than max {r.max}")
    named = {"default": default, "min": lo, "max": hi, "step": step}
    milli = any(v is not None and _fractional(v) for v in named.values())
    if milli:
        bad = [n for n, v in named.items() if v is not None and not _milli(v)]
        if bad:
            return errors + [f"{at}.{n}: cannot be represented in milli-units" for n in bad]
    if step is None:
        return errors
    if step <= 0:
        return [*errors, f"{at}.step: {r.step} must be greater than zero"]
    if lo + step > capacity:
        errors.append(f"{at}.step: min + step is larger than the capacity's value")
    if not milli:
        # Upstream's integer arithmetic holds only in [0, MaxInt64].
        out = [n for n, v in named.items() if v is not None and not 0 <= v <= _INT64_MAX]
        if out:
            return errors + [f"{at}.{n}: must be in [0, {_INT64_MAX}]" for n in out]
    for name, value in (("default", default), ("max", hi)):
        if value is not None and ((value - lo) / step).denominator != 1:
            errors.append(f"{at}.step: {name} is not min + a multiple of step {r.step}")
    return errors


def _request_policy_errors(
    at: str, cap: DeviceCapacity, policy: CapacityRequestPolicy
) -> list[str]:
    errors: list[str] = []
    # A bad capacity value is reported by the capacity's own rule.
    capacity = _q("value", cap.value, [])
    default = _q(f"{at}.default", policy.default, errors) if policy.default is not None else None
    values = [_q(f"{at}.validValues[{i}]", v, errors) for i, v in enumerate(policy.valid_values)]
    if errors or capacity is None:
        return errors
    if policy.valid_values and policy.valid_range is not None:
        return [f"{at}: validValues and validRange are exclusive"]
    if policy.valid_values:
        if default is None:
            return [f"{at}.default: required when validValues is set"]
        nums = [v for v in values if v is not None]
        for i in range(1, len(nums)):
            if nums[i - 1] > nums[i]:
                errors.append(f"{at}.validValues[{i}]: values must be sorted in ascending order")
        if len(nums) > REQUEST_POLICY_VALID_VALUES_MAX:
            errors.append(
                f"{at}.validValues: {len(nums)} values, at most "
                f"{REQUEST_POLICY_VALID_VALUES_MAX} allowed"
            )
        seen: set[Fraction] = set()
        for i, v in enumerate(nums):
            if v in seen:
                errors.append(f"{at}.validValues[{i}]: duplicate value")
            seen.add(v)
            if v > capacity:
                errors.append(f"{at}.validValues[{i}]: larger than the capacity's value")
        if default not in seen:
            errors.append(f"{at}.default: {policy.default} is not one of validValues")
    elif policy.valid_range is not None:
        if default is None:
            return [f"{at}.default: required when validRange is set"]
        errors.extend(_range_errors(f"{at}.validRange", default, capacity, policy.valid_range))
    return errors


def _binding_errors(d: Device) -> list[str]:
    errors: list[str] = []
    for field, conditions in (
        ("bindingConditions", d.binding_conditions),
        ("bindingFailureConditions", d.binding_failure_conditions),
    ):
        if len(conditions) > BINDING_CONDITIONS_MAX:
            errors.append(
                f"{field}: {len(conditions)} conditions, at most {BINDING_CONDITIONS_MAX} allowed"
            )
        seen: set[str] = set()
        for i, c in enumerate(conditions):
            if not is_label_key(c):
                errors.append(f"{field}[{i}]: {c!r} must be a qualified name (a condition type)")
            if c in seen:
                errors.append(f"{field}[{i}]: duplicate {c!r}")
            seen.add(c)
    overlap = set(d.binding_conditions) & set(d.binding_failure_conditions)
    for c in sorted(overlap):
        errors.append(f"bindingFailureConditions: {c!r} is also a binding condition")
    if bool(d.binding_conditions) != bool(d.binding_failure_conditions):
        errors.append("bindingConditions and bindingFailureConditions must be set together")
    return errors


def _positive(at: str, text: str | None, errors: list[str], *, zero_ok: bool = False) -> None:
    if text is None:
        return
    v = _q(at, text, errors)
    if v is not None and (v < 0 if zero_ok else v <= 0):
        errors.append(f"{at}: {text} must be {'non-negative' if zero_ok else 'positive'}")


def _mapping_errors(at: str, m: NodeAllocatableMapping, d: Device) -> list[str]:
    errors: list[str] = []
    if (m.capacity_key is not None) == (m.device_multiplier is not None):
        errors.append(f"{at}: exactly one of capacityKey and deviceMultiplier must be set")
    if m.capacity_key is not None:
        if m.capacity_key not in d.capacity:
            errors.append(f"{at}.capacityKey: {m.capacity_key!r} is not a capacity of the device")
        if m.capacity_multiplier is None:
            errors.append(f"{at}.capacityMultiplier: required when capacityKey is set")
    elif m.capacity_multiplier is not None:
        errors.append(f"{at}.capacityKey: required when capacityMultiplier is set")
    _positive(f"{at}.capacityMultiplier", m.capacity_multiplier, errors)
    _positive(f"{at}.deviceMultiplier", m.device_multiplier, errors)
    return errors


def _overhead_errors(at: str, o: NodeAllocatableOverhead) -> list[str]:
    if o.per_pod is None and o.per_container is None:
        return [f"{at}: at least one of perPod and perContainer must be set"]
    errors: list[str] = []
    _positive(f"{at}.perPod", o.per_pod, errors, zero_ok=True)
    _positive(f"{at}.perContainer", o.per_container, errors, zero_ok=True)
    return errors


def is_node_allocatable_resource_name(name: str) -> bool:
    """cpu, memory or a huge page size (upstream `IsNodeAllocatableResourceName`)."""
    return name in ("cpu", "memory") or name.startswith("hugepages-")


def device_field_errors(d: Device) -> list[str]:
    """What is wrong with the device's consumable capacity, binding, node-allocatable and
    compatibility-group fields (empty when they may be published)."""
    errors: list[str] = []
    for name, cap in d.capacity.items():
        if cap.request_policy is None:
            continue
        at = f"capacity[{name!r}].requestPolicy"
        if not d.allow_multiple_allocations:
            errors.append(f"{at}: needs allowMultipleAllocations true")
        else:
            errors.extend(_request_policy_errors(at, cap, cap.request_policy))
    if d.binding_conditions or d.binding_failure_conditions:
        errors.extend(_binding_errors(d))
    for key, res in d.node_allocatable_resources.items():
        at = f"nodeAllocatableResources[{key!r}]"
        if not is_node_allocatable_resource_name(key):
            errors.append(f"{at}: must be cpu, memory or hugepages-<size>")
        if res.mapping is None and res.overhead is None:
            errors.append(f"{at}: at least one of mapping and overhead must be set")
        if res.mapping is not None:
            errors.extend(_mapping_errors(f"{at}.mapping", res.mapping, d))
        if res.overhead is not None:
            errors.extend(_overhead_errors(f"{at}.overhead", res.overhead))
    for use in d.consumes_counters:
        groups = use.compatibility_groups
        if not groups:
            continue
        at = f"consumesCounters[{use.counter_set!r}].compatibilityGroups"
        if len(groups) > COMPATIBILITY_GROUPS_MAX:
            errors.append(f"{at}: {len(groups)} groups, at most {COMPATIBILITY_GROUPS_MAX}")
        if len(set(groups)) != len(groups):
            errors.append(f"{at}: duplicate group")
        errors.extend(f"{at}: {g!r} must be a DNS label" for g in groups if not is_dns_label(g))
    return errors


def _skip_errors(ops: Sequence[str]) -> list[str]:
    errors = [
        f"skipNodeOperations: {op!r} must be one of {', '.join(SKIP_NODE_OPERATIONS)}"
        for op in ops
        if op not in SKIP_NODE_OPERATIONS
    ]
    if len(set(ops)) != len(ops):
        errors.append("skipNodeOperations: duplicate operation")
    if "NodePrepareResources" in ops and "NodeUnprepareResources" not in ops and "*" not in ops:
        errors.append(
            "skipNodeOperations: NodePrepareResources may be skipped only with "
            "NodeUnprepareResources"
        )
    return errors


def is_fully_qualified_name(name: str) -> bool:
    """`<DNS subdomain <= 63>/<C identifier <= 32>`: a qualified name with its domain."""
    return "/" in name and not name.startswith("/") and is_qualified_name(name)


def pool_field_errors(driver: str, pool: Pool) -> list[str]:
    """What is wrong with the pool's slice-level fields (empty when they may be published)."""
    errors = _skip_errors(pool.skip_node_operations)
    attr = pool.partition_type_attribute
    if attr is None:
        return errors
    if not is_fully_qualified_name(attr):
        errors.append(
            f"partitionTypeAttribute: {attr!r} must be <domain>/<C identifier> "
            "(a fully qualified attribute name)"
        )
        return errors
    consumers = [d for d in pool.devices if d.consumes_counters]
    if not consumers:
        errors.append("partitionTypeAttribute: no device of the pool consumes counters")
    # An attribute in the driver's own domain may also be declared bare.
    bare = attr.removeprefix(driver + "/") if attr.startswith(driver + "/") else ""
    for d in consumers:
        value = d.attributes.get(attr) or (d.attributes.get(bare) if bare else None)
        if value is None:
            errors.append(f"device {d.name!r}: consumes counters, so needs attribute {attr!r}")
        elif value.string is None:
            errors.append(f"device {d.name!r}: attribute {attr!r} must be a string value")
    return errors
