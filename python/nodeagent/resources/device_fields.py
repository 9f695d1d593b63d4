"""The device and slice fields that DRA added after taints and counters (1.34-1.37):
consumable capacity (`allowMultipleAllocations`, capacity `requestPolicy`), binding conditions,
`bindsToNode`, `nodeAllocatableResources`, counter `compatibilityGroups`, and the slice's
`partitionTypeAttribute` and `skipNodeOperations`: their canonical form for the desired slices.

Their rules (kube-apiserver v1.37's `pkg/apis/resource/validation`, with
`DRAFractionalCapacityRange` on as 1.37 defaults it) are checked with the rest of the inventory in
Rust (rust/src/inventory/rules.rs, `model.validate_inventory`); the plain-Python reference is
tests/support/dra_reference/device_fields.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from nodeagent._native import quantity_canonical as canonicalize

if TYPE_CHECKING:
    from nodeagent.resources.model import DeviceCapacity, NodeAllocatableResource

__all__ = ["canonical_capacity", "canonical_node_allocatable"]


# --- canonical form (after validation) ----------------------------------------------------------


def _canon(text: str | None) -> str | None:
    return None if text is None else canonicalize(text)


def canonical_capacity(c: DeviceCapacity) -> DeviceCapacity:
    """The capacity with every quantity (value and request policy) in canonical form."""
    policy = c.request_policy
    if (
        policy is not None
        and policy.default is None
        and not policy.valid_values
        and policy.valid_range is None
    ):
        # Validated already (the device allows multiple allocations): an empty policy means what
        # no policy means, and the server would store it as `{"default": null}`, which the
        # planner rightly tells apart from the `{}` sent, rewriting it every time.
        policy = None
    if policy is not None:
        r = policy.valid_range
        policy = msgspec.structs.replace(
            policy,
            default=_canon(policy.default),
            valid_values=[canonicalize(v) for v in policy.valid_values],
            valid_range=None
            if r is None
            else msgspec.structs.replace(
                r, min=_canon(r.min), max=_canon(r.max), step=_canon(r.step)
            ),
        )
    return msgspec.structs.replace(c, value=canonicalize(c.value), request_policy=policy)


def canonical_node_allocatable(r: NodeAllocatableResource) -> NodeAllocatableResource:
    """The mapping with its multipliers and overheads in canonical form."""
    m, o = r.mapping, r.overhead
    if m is not None:
        m = msgspec.structs.replace(
            m,
            capacity_multiplier=_canon(m.capacity_multiplier),
            device_multiplier=_canon(m.device_multiplier),
        )
    if o is not None:
        o = msgspec.structs.replace(
            o, per_pod=_canon(o.per_pod), per_container=_canon(o.per_container)
        )
    return msgspec.structs.replace(r, mapping=m, overhead=o)
