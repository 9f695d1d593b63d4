"""Pools exercising the rules of the DRA device fields added since taints and counters, each
with what kube-apiserver v1.37 (DRAFractionalCapacityRange at its default, on) answers. Most
request-policy cases are upstream's `validation_device_capacity_test.go` scenarios. The unit test
checks `validate_inventory` against the expectation; the integration test sends every pool to
the real apiserver (dry run) and checks that it agrees."""

from __future__ import annotations

from dataclasses import dataclass, field

from nodeagent.resources.model import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    Counter,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceCounterConsumption,
    NodeAllocatableMapping,
    NodeAllocatableOverhead,
    NodeAllocatableResource,
    Pool,
)

DRIVER = "gpu.example.com"


@dataclass(frozen=True)
class Case:
    name: str
    pool: Pool
    valid: bool
    # A part of the agent's message (when invalid); None: only the verdict is checked.
    message: str | None = None
    # The newest release's gates this case needs beyond the defaults (alpha).
    alpha: tuple[str, ...] = field(default=())
    # Releases before 1.37 (no DRAFractionalCapacityRange: integer arithmetic via Value(),
    # which rounds up) answer otherwise: their verdict, or "panic" (an unguarded division by
    # zero that 1.37 fixed).
    before_137: bool | str | None = None


def _policy(
    default: str | None = None,
    values: list[str] | None = None,
    lo: str | None = None,
    hi: str | None = None,
    step: str | None = None,
    *,
    ranged: bool = False,
) -> CapacityRequestPolicy:
    rng = CapacityRequestPolicyRange(min=lo, max=hi, step=step) if ranged else None
    return CapacityRequestPolicy(default=default, valid_values=values or [], valid_range=rng)


def _cap(value: str, policy: CapacityRequestPolicy | None, *, multi: bool = True) -> Pool:
    device = Device(
        name="d",
        capacity={"c": DeviceCapacity(value=value, request_policy=policy)},
        allow_multiple_allocations=True if multi else None,
    )
    return Pool(name="node-a", devices=[device])


def _device(**kw: object) -> Pool:
    return Pool(name="node-a", devices=[Device(name="d", **kw)])  # type: ignore[arg-type]


_PROFILE = DeviceAttribute(string="1g")


def _partitions(
    *,
    groups: list[str] | None = None,
    attr: str | None = None,
    profile: DeviceAttribute | None = _PROFILE,
    attr_key: str = "gpu.example.com/profile",
) -> Pool:
    attrs = {attr_key: profile} if profile is not None else {}
    use = DeviceCounterConsumption(
        counter_set="gpu-0",
        counters={"mem": Counter(value="1Gi")},
        compatibility_groups=groups or [],
    )
    return Pool(
        name="node-a",
        devices=[Device(name="p0", attributes=attrs, consumes_counters=[use])],
        shared_counters=[CounterSet(name="gpu-0", counters={"mem": Counter(value="2Gi")})],
        partition_type_attribute=attr,
    )


CPU_ALLOC = "DRANodeAllocatableResources"

CASES: list[Case] = [
    # --- consumable capacity (upstream scenarios) ---
    Case("no-policy", _cap("1Gi", None), True),
    Case("policy-without-default", _cap("1Gi", _policy()), True),
    Case(
        "policy-needs-multiple-allocations",
        _cap("1Gi", _policy("1"), multi=False),
        False,
        "needs allowMultipleAllocations true",
    ),
    Case(
        "valid-values-without-default",
        _cap("1Gi", _policy(values=["1Gi"])),
        False,
        "default: required when validValues is set",
    ),
    Case(
        "valid-range-without-default",
        _cap("1Gi", _policy(lo="1Gi", ranged=True)),
        False,
        "default: required when validRange is set",
    ),
    Case(
        "valid-range-without-min", _cap("1Gi", _policy("1Gi", ranged=True)), False, "min: required"
    ),
    Case("valid-simple-range", _cap("10Gi", _policy("1Gi", lo="1Gi", ranged=True)), True),
    Case(
        "valid-range-with-max", _cap("10Gi", _policy("1Gi", lo="1Gi", hi="10Gi", ranged=True)), True
    ),
    Case(
        "valid-range-with-step",
        _cap("10Gi", _policy("1Gi", lo="1Gi", step="1Gi", ranged=True)),
        True,
    ),
    Case(
        "valid-range-max-step",
        _cap("10Gi", _policy("1Gi", lo="1Gi", hi="10Gi", step="1Gi", ranged=True)),
        True,
    ),
    Case("valid-single-option", _cap("10Gi", _policy("1Gi", ["1Gi"])), True),
    Case("valid-two-options", _cap("10Gi", _policy("1Gi", ["1Gi", "10Gi"])), True),
    Case("default-without-policy", _cap("10Gi", _policy("1Gi")), True),
    Case(
        "more-than-one-policy",
        _cap("10Gi", _policy("1Gi", ["1Gi"], lo="1Gi", ranged=True)),
        False,
        "validValues and validRange are exclusive",
    ),
    Case(
        "option-over-capacity",
        _cap("10Gi", _policy("1Gi", ["20Gi"])),
        False,
        "larger than the capacity's value",
    ),
    Case(
        "valid-fractional-values",
        _cap("10Gi", _policy("100m", ["100m", "200m", "1"])),
        True,
        before_137=False,
    ),
    Case("duplicate-options", _cap("10Gi", _policy("1Gi", ["1Gi", "1Gi"])), False, "duplicate"),
    Case("duplicate-normalized", _cap("10Gi", _policy("1Ki", ["1Ki", "1024"])), False, "duplicate"),
    Case("unsorted-options", _cap("10Gi", _policy("1Gi", ["2Gi", "1Gi"])), False, "ascending"),
    Case(
        "eleven-options",
        _cap("100", _policy("1", [str(i) for i in range(1, 12)])),
        False,
        "at most 10",
    ),
    Case("ten-options", _cap("100", _policy("1", [str(i) for i in range(1, 11)])), True),
    Case(
        "range-min-over-max",
        _cap("10Gi", _policy("2Gi", lo="20Gi", hi="1Gi", ranged=True)),
        False,
        "larger than max",
    ),
    Case(
        "range-max-over-capacity",
        _cap("10Gi", _policy("1Gi", lo="1Gi", hi="20Gi", ranged=True)),
        False,
        "max: 20Gi is larger than the capacity's value",
    ),
    Case(
        "range-off-step",
        _cap("10Gi", _policy("2Gi", lo="1Gi", hi="10Gi", step="2Gi", ranged=True)),
        False,
        "not min + a multiple of step",
    ),
    Case(
        "range-step-2^64",
        _cap(
            "18446744073709551616", _policy("0", lo="0", step="18446744073709551616", ranged=True)
        ),
        False,
        "must be in [0, 9223372036854775807]",
        before_137="panic",
    ),
    Case(
        "range-step-int64-max",
        _cap("9223372036854775807", _policy("0", lo="0", step="9223372036854775807", ranged=True)),
        True,
    ),
    Case(
        "range-negative-min-with-step",
        _cap("10Gi", _policy("0", lo="-1", step="1Gi", ranged=True)),
        False,
        "must be in [0",
    ),
    Case("range-negative-without-step", _cap("10Gi", _policy("-1", lo="-1", ranged=True)), True),
    Case(
        "fractional-default-integer-range",
        _cap("10Gi", _policy("100m", lo="0", step="1", ranged=True)),
        False,
        "not min + a multiple",
        before_137=True,
    ),
    Case(
        "fractional-step",
        _cap("1", _policy("200m", lo="200m", hi="1", step="100m", ranged=True)),
        True,
    ),
    Case(
        "fractional-step-misaligned",
        _cap("1", _policy("250m", lo="200m", hi="1", step="100m", ranged=True)),
        False,
        "not min + a multiple",
        before_137=True,
    ),
    Case(
        "range-large-step",
        _cap("10Gi", _policy("1Gi", lo="1Gi", step="10Gi", ranged=True)),
        False,
        "min + step is larger",
    ),
    Case(
        "fractional-overflow",
        _cap("100P", _policy("20P", lo="10P", step="100m", ranged=True)),
        False,
        "cannot be represented in milli-units",
        before_137=True,
    ),
    Case(
        "fractional-too-fine",
        _cap("1", _policy("20u", lo="10u", ranged=True)),
        False,
        "cannot be represented in milli-units",
        before_137=True,
    ),
    # --- binding conditions ---
    Case(
        "binding",
        _device(
            binding_conditions=["a.example.com/ready", "b"],
            binding_failure_conditions=["failed"],
            binds_to_node=True,
        ),
        True,
    ),
    Case("binds-to-node-alone", _device(binds_to_node=True), True),
    Case(
        "binding-without-failure",
        _device(binding_conditions=["ready"]),
        False,
        "must be set together",
    ),
    Case(
        "failure-without-binding",
        _device(binding_failure_conditions=["x"]),
        False,
        "must be set together",
    ),
    Case(
        "five-binding-conditions",
        _device(binding_conditions=list("abcde"), binding_failure_conditions=["f"]),
        False,
        "at most 4",
    ),
    Case(
        "overlapping-conditions",
        _device(binding_conditions=["a"], binding_failure_conditions=["a"]),
        False,
        "also a binding condition",
    ),
    Case(
        "duplicate-condition",
        _device(binding_conditions=["a", "a"], binding_failure_conditions=["b"]),
        False,
        "duplicate",
    ),
    Case(
        "bad-condition-name",
        _device(binding_conditions=["-bad-"], binding_failure_conditions=["b"]),
        False,
        "qualified name",
    ),
    # --- node allocatable resources (alpha) ---
    Case(
        "cpu-by-capacity",
        _device(
            capacity={"cores": DeviceCapacity(value="8")},
            node_allocatable_resources={
                "cpu": NodeAllocatableResource(
                    mapping=NodeAllocatableMapping(capacity_key="cores", capacity_multiplier="2")
                )
            },
        ),
        True,
        alpha=(CPU_ALLOC,),
    ),
    Case(
        "memory-by-device-and-overhead",
        _device(
            node_allocatable_resources={
                "memory": NodeAllocatableResource(
                    mapping=NodeAllocatableMapping(device_multiplier="1Gi"),
                    overhead=NodeAllocatableOverhead(per_pod="0", per_container="1Mi"),
                ),
                "hugepages-2Mi": NodeAllocatableResource(
                    overhead=NodeAllocatableOverhead(per_pod="2Mi")
                ),
            }
        ),
        True,
        alpha=(CPU_ALLOC,),
    ),
    Case(
        "not-node-allocatable",
        _device(
            node_allocatable_resources={
                "example.com/gpu": NodeAllocatableResource(
                    overhead=NodeAllocatableOverhead(per_pod="1")
                )
            }
        ),
        False,
        "must be cpu, memory or hugepages",
        alpha=(CPU_ALLOC,),
    ),
    Case(
        "neither-mapping-nor-overhead",
        _device(node_allocatable_resources={"cpu": NodeAllocatableResource()}),
        False,
        "at least one of mapping and overhead",
        alpha=(CPU_ALLOC,),
    ),
    Case(
        "unknown-capacity-key",
        _device(
            node_allocatable_resources={
                "cpu": NodeAllocatableResource(
                    mapping=NodeAllocatableMapping(capacity_key="cores", capacity_multiplier="1")
                )
            }
        ),
        False,
        "not a capacity of the device",
        alpha=(CPU_ALLOC,),
    ),
    Case(
        "key-without-multiplier",
        _device(
            capacity={"cores": DeviceCapacity(value="8")},
            node_allocatable_resources={
                "cpu": NodeAllocatableResource(mapping=NodeAllocatableMapping(capacity_key="cores"))
            },
        ),
        False,
        "capacityMultiplier: required",
        alpha=(CPU_ALLOC,),
    ),
    Case(
        "key-and-device-multiplier",
        _device(
            capacity={"cores": DeviceCapacity(value="8")},
            node_allocatable_resources={
                "cpu": NodeAllocatableResource(
                    mapping=NodeAllocatableMapping(
                        capacity_key="cores", capacity_multiplier="1", device_multiplier="1"
                    )
                )
            },
        ),
        False,
        "exactly one of capacityKey and deviceMultiplier",
        alpha=(CPU_ALLOC,),
    ),
    Case(
        "zero-multiplier",
        _device(
            node_allocatable_resources={
                "cpu": NodeAllocatableResource(
                    mapping=NodeAllocatableMapping(device_multiplier="0")
                )
            }
        ),
        False,
        "must be positive",
        alpha=(CPU_ALLOC,),
    ),
    Case(
        "empty-overhead",
        _device(
            node_allocatable_resources={
                "cpu": NodeAllocatableResource(overhead=NodeAllocatableOverhead())
            }
        ),
        False,
        "at least one of perPod and perContainer",
        alpha=(CPU_ALLOC,),
    ),
    Case(
        "negative-overhead",
        _device(
            node_allocatable_resources={
                "cpu": NodeAllocatableResource(overhead=NodeAllocatableOverhead(per_container="-1"))
            }
        ),
        False,
        "must be non-negative",
        alpha=(CPU_ALLOC,),
    ),
    # --- compatibility groups (alpha) ---
    Case("groups", _partitions(groups=["a", "b"]), True, alpha=("DRADeviceCompatibilityGroups",)),
    Case(
        "three-groups",
        _partitions(groups=["a", "b", "c"]),
        False,
        "at most 2",
        alpha=("DRADeviceCompatibilityGroups",),
    ),
    Case(
        "duplicate-groups",
        _partitions(groups=["a", "a"]),
        False,
        "duplicate group",
        alpha=("DRADeviceCompatibilityGroups",),
    ),
    Case(
        "group-not-a-label",
        _partitions(groups=["A_b"]),
        False,
        "DNS label",
        alpha=("DRADeviceCompatibilityGroups",),
    ),
    # --- the slice's partition type attribute and skipped operations (alpha) ---
    Case(
        "partition-type",
        _partitions(attr="gpu.example.com/profile"),
        True,
        alpha=("DRAPartitionableDevicesType", "DRAResourcePoolStatus"),
    ),
    Case(
        "partition-type-bare-in-driver-domain",
        _partitions(attr="gpu.example.com/profile", attr_key="profile"),
        True,
        alpha=("DRAPartitionableDevicesType", "DRAResourcePoolStatus"),
    ),
    Case(
        "partition-type-not-qualified",
        _partitions(attr="profile"),
        False,
        "fully qualified",
        alpha=("DRAPartitionableDevicesType", "DRAResourcePoolStatus"),
    ),
    Case(
        "partition-type-missing-on-a-device",
        _partitions(attr="gpu.example.com/profile", profile=None),
        False,
        "needs attribute",
        alpha=("DRAPartitionableDevicesType", "DRAResourcePoolStatus"),
    ),
    Case(
        "partition-type-not-a-string",
        _partitions(attr="gpu.example.com/profile", profile=DeviceAttribute(int_=1)),
        False,
        "must be a string",
        alpha=("DRAPartitionableDevicesType", "DRAResourcePoolStatus"),
    ),
    Case(
        "skip-unprepare",
        Pool(
            name="node-a",
            devices=[Device(name="d")],
            skip_node_operations=["NodeUnprepareResources"],
        ),
        True,
        alpha=("DRAOptionalNodeOperations",),
    ),
    Case(
        "skip-both",
        Pool(
            name="node-a",
            devices=[Device(name="d")],
            skip_node_operations=["NodePrepareResources", "NodeUnprepareResources"],
        ),
        True,
        alpha=("DRAOptionalNodeOperations",),
    ),
    Case(
        "skip-all",
        Pool(name="node-a", devices=[Device(name="d")], skip_node_operations=["*"]),
        True,
        alpha=("DRAOptionalNodeOperations",),
    ),
    Case(
        "skip-prepare-alone",
        Pool(
            name="node-a", devices=[Device(name="d")], skip_node_operations=["NodePrepareResources"]
        ),
        False,
        "only with NodeUnprepareResources",
        alpha=("DRAOptionalNodeOperations",),
    ),
    Case(
        "skip-unknown",
        Pool(name="node-a", devices=[Device(name="d")], skip_node_operations=["Nope"]),
        False,
        "must be one of",
        alpha=("DRAOptionalNodeOperations",),
    ),
    Case(
        "skip-duplicate",
        Pool(name="node-a", devices=[Device(name="d")], skip_node_operations=["*", "*"]),
        False,
        "duplicate",
        alpha=("DRAOptionalNodeOperations",),
    ),
]
