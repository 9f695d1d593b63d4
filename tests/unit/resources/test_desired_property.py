"""The Rust desired slices (`model.desired_specs`, `nodeagent._native.desired_slices`, what the
publisher plans with) against the plain-Python reference (tests/support/dra_reference/desired.py)
on generated pools: the same spec bytes as `msgspec.json.encode` writes for the reference's specs
(the split, the counter slices, every quantity's canonical form, map order and string escapes
included), and a quantity that does not parse refused by both."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    desired_slices,
    desired_specs,
)
from tests.support.dra_reference import desired as reference
from tests.support.quantity import QuantityError

_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))

# Spellings the server rewrites, ones it keeps, and one that does not parse.
QUANTITIES = st.sampled_from(
    ["1", "0", "2048Mi", "1Gi", "1000m", "1.5", "0.0001", "1e3", "1k", "1024Ki", "80Gi", "500m"]
)
BAD = "lots"
TEXT = st.sampled_from(["a", "gpu-0", 'q"uote', "back\\slash", "é", "tab\there", "nl\n", "\x01"])
OPT = st.none() | QUANTITIES


@st.composite
def capacity(draw: st.DrawFn) -> DeviceCapacity:
    policy = draw(
        st.none()
        | st.builds(
            CapacityRequestPolicy,
            default=OPT,
            valid_values=st.lists(QUANTITIES, max_size=2),
            valid_range=st.none()
            | st.builds(CapacityRequestPolicyRange, min=OPT, max=OPT, step=OPT),
        )
    )
    return DeviceCapacity(value=draw(QUANTITIES), request_policy=policy)


COUNTERS = st.dictionaries(TEXT, st.builds(Counter, value=QUANTITIES), max_size=2)


@st.composite
def device(draw: st.DrawFn, i: int) -> Device:
    return Device(
        name=f"d{i}",
        attributes=draw(
            st.dictionaries(
                TEXT,
                st.builds(DeviceAttribute, int_=st.integers(-(2**63), 2**63 - 1))
                | st.builds(DeviceAttribute, bool_=st.booleans())
                | st.builds(DeviceAttribute, string=TEXT)
                | st.builds(DeviceAttribute, version=st.just("1.2.3")),
                max_size=2,
            )
        ),
        capacity=draw(st.dictionaries(TEXT, capacity(), max_size=2)),
        consumes_counters=draw(
            st.lists(
                st.builds(
                    DeviceCounterConsumption,
                    counter_set=TEXT,
                    counters=COUNTERS,
                    compatibility_groups=st.lists(TEXT, max_size=1),
                ),
                max_size=1,
            )
        ),
        taints=draw(
            st.lists(
                st.builds(
                    DeviceTaint,
                    key=TEXT,
                    effect=st.just("NoSchedule"),
                    value=st.just("") | TEXT,
                    time_added=st.none() | st.just("2024-05-01T10:00:00Z"),
                ),
                max_size=1,
            )
        ),
        binds_to_node=draw(st.none() | st.booleans()),
        binding_conditions=draw(st.lists(TEXT, max_size=1)),
        allow_multiple_allocations=draw(st.none() | st.booleans()),
        node_allocatable_resources=draw(
            st.dictionaries(
                TEXT,
                st.builds(
                    NodeAllocatableResource,
                    mapping=st.none()
                    | st.builds(
                        NodeAllocatableMapping,
                        capacity_key=st.none() | TEXT,
                        capacity_multiplier=OPT,
                        device_multiplier=OPT,
                    ),
                    overhead=st.none()
                    | st.builds(NodeAllocatableOverhead, per_pod=OPT, per_container=OPT),
                ),
                max_size=1,
            )
        ),
    )


@st.composite
def pool(draw: st.DrawFn) -> Pool:
    n = draw(st.sampled_from([0, 1, 3, 64, 65, 128, 129, 300]))
    # Most devices plain (the split's 128), a few with every field, tainted or consuming
    # counters among them (the split's 64).
    rich = draw(st.sets(st.integers(0, n - 1), max_size=4)) if n else set()
    return Pool(
        name=draw(TEXT),
        devices=[draw(device(i)) if i in rich else Device(name=f"d{i}") for i in range(n)],
        shared_counters=draw(
            st.lists(st.builds(CounterSet, name=TEXT, counters=COUNTERS), max_size=17)
        ),
        partition_type_attribute=draw(st.none() | TEXT),
        skip_node_operations=draw(st.lists(st.sampled_from(["NodePrepareResources", "*"]))),
    )


@_SETTINGS
@given(pools=st.lists(pool(), max_size=3), node=TEXT)
def test_the_specs_are_the_references_byte_for_byte(pools: list[Pool], node: str) -> None:
    inventory = Inventory(driver="gpu.example.com", pools=pools)
    expected = [
        [msgspec.json.encode(s) for s in reference.desired_slices(inventory.driver, p, node)]
        for p in pools
    ]
    assert desired_specs(inventory, node) == expected


@_SETTINGS
@given(pool=pool(), where=st.sampled_from(["shared", "capacity", "policy", "overhead"]))
def test_a_quantity_that_does_not_parse_is_refused_by_both(pool: Pool, where: str) -> None:
    if where == "shared":
        pool = msgspec.structs.replace(
            pool, shared_counters=[CounterSet(name="s", counters={"c": Counter(value=BAD)})]
        )
    else:
        bad = Device(
            name="bad",
            capacity={"c": DeviceCapacity(value=BAD)}
            if where == "capacity"
            else {
                "c": DeviceCapacity(
                    value="1", request_policy=CapacityRequestPolicy(valid_values=[BAD])
                )
            },
        )
        if where == "overhead":
            bad = Device(
                name="bad",
                node_allocatable_resources={
                    "cpu": NodeAllocatableResource(overhead=NodeAllocatableOverhead(per_pod=BAD))
                },
            )
        pool = msgspec.structs.replace(pool, devices=[*pool.devices, bad])
    with pytest.raises(QuantityError):
        reference.desired_slices("d", pool, "n")
    with pytest.raises(ValueError, match=repr(BAD).replace("'", '"')):
        desired_slices("d", pool, "n")
