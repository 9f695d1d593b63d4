"""The plain-Python reference of rust/src/inventory/desired.rs (`nodeagent._native.desired_slices`,
which production calls through `resources.model.desired_specs`): a pool's devices split into
slices, every quantity in canonical form. This was the production code until then;
tests/unit/resources/test_desired_property.py holds the two equal, byte for byte.

`canonical=False` builds the slices with the quantities as the plugin sent them, for the tests
that ask the real API server what it stores for a non-canonical spelling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from nodeagent.resources.model import (
    Counter,
    Device,
    DeviceCapacity,
    NodeAllocatableResource,
    Pool,
    ResourcePool,
    ResourceSliceSpec,
)
from tests.support.quantity import canonicalize

__all__ = [
    "MAX_COUNTER_SETS",
    "MAX_DEVICES_PER_SLICE",
    "MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS",
    "desired_slices",
    "split_devices",
]

# The limits of kube-apiserver v1.37 (`k8s.io/kubernetes/pkg/apis/resource`), the same in 1.35
# and 1.36.
MAX_DEVICES_PER_SLICE = 128
# Taints and counter consumption make devices larger; upstream halves the limit for them
# (`ResourceSliceMaxDevicesWithAdvancedFeatures`).
MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS = 64
# Counter sets per slice: a pool may have more, spread over several counter slices.
MAX_COUNTER_SETS = 8


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
        # An empty policy means what no policy means, and the server would store it as
        # `{"default": null}`, which the planner rightly tells apart from the `{}` sent.
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


def _unchanged(d: Device) -> Device:
    return d


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


def desired_slices(
    driver: str, pool: Pool, node_name: str, *, canonical: bool = True
) -> list[ResourceSliceSpec]:
    """The pool's slice specs; the planner fills in the pool's generation, and
    `resourceSliceCount` counts every slice of the pool.

    Shared counters go into slices of their own, at most `MAX_COUNTER_SETS` sets each, ahead of
    the device slices. A pool with neither devices nor counters is one empty slice."""
    counters: Callable[[dict[str, Counter]], dict[str, Counter]] = (
        _canonical_counters if canonical else dict
    )
    device: Callable[[Device], Device] = _canonical_device if canonical else _unchanged
    shared = [
        msgspec.structs.replace(cs, counters=counters(cs.counters)) for cs in pool.shared_counters
    ]
    counter_chunks = [
        shared[i : i + MAX_COUNTER_SETS] for i in range(0, len(shared), MAX_COUNTER_SETS)
    ]
    device_chunks = split_devices(device(d) for d in pool.devices)
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
