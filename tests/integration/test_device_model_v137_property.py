"""The rules of the newer device fields (rust/src/inventory/rules.rs) against the real
kube-apiserver's answers: hypothesis generates devices near every rule of consumable capacity
(request-policy defaults, valid values, ranges with integer and fractional bounds), binding
conditions, node-allocatable resources and compatibility groups, and pools with a partition type
attribute and skipped node operations; each verdict of `validate_inventory` is compared with
dry-run creates of the pool's slices on the newest release with every DRA gate on (the rules the
agent applies are that release's)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nodeagent.resources import model
from nodeagent.resources.model import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    Counter,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceCounterConsumption,
    InvalidInventory,
    Inventory,
    NodeAllocatableMapping,
    NodeAllocatableOverhead,
    NodeAllocatableResource,
    Pool,
)
from tests.support.apiserver import ApiServer, newest_release, start_apiserver
from tests.support.dra_reference import desired as reference
from tests.support.quantity import parse_quantity

pytestmark = pytest.mark.integration

DRIVER = "gpu.example.com"
NODE = "node-a"
PATH = "/apis/resource.k8s.io/v1/resourceslices?dryRun=All"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    srv = start_apiserver(
        tmp_path_factory.mktemp("device-model"), release=newest_release(), gates="all-dra"
    )
    try:
        # NodeDeclaredFeatures admission: nodeAllocatableResources need the node to declare it.
        status, answer = srv.request("POST", "/api/v1/nodes", {"metadata": {"name": NODE}})
        assert status in (201, 409), answer
        patch = {"status": {"declaredFeatures": ["DRANodeAllocatableResources"]}}
        status, answer = srv.request("PATCH", f"/api/v1/nodes/{NODE}/status", patch)
        assert status == 200, answer
        probe = _body(
            {
                "driver": DRIVER,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "nodeName": NODE,
                "devices": [
                    {
                        "name": "d",
                        "nodeAllocatableResources": {"cpu": {"overhead": {"perPod": "1"}}},
                    }
                ],
            }
        )
        deadline = time.monotonic() + 20
        while srv.request("POST", PATH, probe)[0] == 403:  # the admission cache catching up
            assert time.monotonic() < deadline, "the node's declared feature never admitted"
            time.sleep(0.05)
        yield srv
    finally:
        srv.close()


def sometimes(valid: list[Any], invalid: list[Any]) -> st.SearchStrategy[Any]:
    """Valid values the more frequent: each example holds many values."""
    return st.sampled_from(valid * (1 + 20 * len(invalid) // max(len(valid), 1)) + invalid)


# Small integers and a few fractions, so that defaults, bounds and steps line up often.
QUANTITIES = st.sampled_from(
    ["0", "1", "2", "3", "4", "6", "8", "10", "16", "100m", "250m", "500m", "1500m", "20u", "-1"]
)
CAPACITIES = st.sampled_from(["1", "8", "16", "100", "10Gi", "100", "10Gi"])
CONDITIONS = sometimes(["ready", "example.com/attached", "b"], ["-bad-", "a/b/c", "x" * 64])


@st.composite
def aligned(draw: st.DrawFn) -> CapacityRequestPolicy:
    """A range whose default and max lie on a step from min (mostly valid; fractional steps
    and 1.37's milli-unit arithmetic included)."""
    unit = draw(st.sampled_from([1, 1000, 250, 100, 1]))  # in milli-units
    lo, k, m = draw(st.integers(0, 4)), draw(st.integers(0, 3)), draw(st.integers(0, 4))
    step = unit * draw(st.integers(1, 3))
    q = lambda milli: f"{milli}m"  # noqa: E731
    return CapacityRequestPolicy(
        default=q(lo * unit + k * step),
        valid_range=CapacityRequestPolicyRange(
            min=q(lo * unit), max=q(lo * unit + max(k, m) * step), step=q(step)
        ),
    )


@st.composite
def policies(draw: st.DrawFn) -> CapacityRequestPolicy:
    if draw(st.booleans()):
        return draw(aligned())
    kind = draw(st.sampled_from(["values", "range", "range", "default", "both"]))
    default = draw(st.one_of(st.none(), QUANTITIES)) if draw(st.integers(0, 5)) == 0 else None
    if default is None and kind != "default":
        default = draw(QUANTITIES)
    values: list[str] = []
    rng = None
    if kind in ("values", "both"):
        values = draw(st.lists(QUANTITIES, min_size=1, max_size=4))
        if draw(st.booleans()):
            values = sorted(values, key=lambda q: parse_quantity(q).nanos)
        if draw(st.integers(0, 9)) == 0:
            values = [str(i) for i in range(1, draw(st.integers(10, 11)) + 1)]
        if draw(st.booleans()) and default is not None and default not in values:
            values = sorted([*values, default], key=lambda q: parse_quantity(q).nanos)
    if kind in ("range", "both"):
        rng = CapacityRequestPolicyRange(
            min=draw(st.one_of(QUANTITIES, QUANTITIES, st.none())),
            max=draw(st.one_of(st.none(), QUANTITIES)),
            step=draw(st.one_of(st.none(), QUANTITIES)),
        )
    return CapacityRequestPolicy(
        default=default if kind != "default" or draw(st.booleans()) else draw(QUANTITIES),
        valid_values=values,
        valid_range=rng,
    )


@st.composite
def node_allocatable(draw: st.DrawFn) -> NodeAllocatableResource:
    mapping = None
    if draw(st.booleans()):
        by_key = draw(st.booleans())
        mapping = NodeAllocatableMapping(
            capacity_key=draw(sometimes(["c"], ["missing"])) if by_key else None,
            capacity_multiplier=draw(sometimes(["2", "500m"], ["0", "-1", None]))
            if by_key
            else draw(sometimes([None], ["2"])),
            device_multiplier=None if by_key else draw(sometimes(["1", "1Gi"], ["0", None])),
        )
    overhead = None
    if draw(st.booleans()) or mapping is None:
        overhead = NodeAllocatableOverhead(
            per_pod=draw(sometimes(["0", "64Mi", None], ["-1"])),
            per_container=draw(sometimes(["1Mi", None], ["-1Mi"])),
        )
    if draw(st.integers(0, 19)) == 0:
        mapping = overhead = None
    return NodeAllocatableResource(mapping=mapping, overhead=overhead)


@st.composite
def devices(draw: st.DrawFn, i: int) -> Device:
    multi = draw(sometimes([True], [False]))
    capacity = {"c": DeviceCapacity(value=draw(CAPACITIES))}
    if draw(st.integers(0, 3)) > 0:
        capacity["c"] = DeviceCapacity(value=capacity["c"].value, request_policy=draw(policies()))
    binding: list[str] = []
    failure: list[str] = []
    if draw(st.integers(0, 2)) == 0:
        sizes = sometimes([1, 2], [0, 5])
        binding = draw(st.lists(CONDITIONS, min_size=draw(sizes), max_size=5))[:4]
        failure = draw(st.lists(CONDITIONS, min_size=draw(sizes), max_size=5))[:4]
        if draw(st.integers(0, 9)) == 0:
            binding = [*binding, "extra-1", "extra-2", "extra-3", "extra-4"]
    alloc: dict[str, NodeAllocatableResource] = {}
    if draw(st.integers(0, 2)) == 0:
        key = draw(sometimes(["cpu", "memory", "hugepages-2Mi"], ["example.com/gpu", "pods"]))
        alloc[key] = draw(node_allocatable())
    uses = []
    attrs = {}
    if draw(st.booleans()):
        groups = draw(
            st.lists(
                sometimes(["a", "mig"], ["A_b", "x" * 64]),
                max_size=draw(sometimes([2], [3])),
                unique=draw(sometimes([True], [False])),
            )
        )
        uses = [
            DeviceCounterConsumption(
                counter_set="s", counters={"m": Counter(value="1")}, compatibility_groups=groups
            )
        ]
        profile = draw(sometimes([DeviceAttribute(string="1g")], [None, DeviceAttribute(int_=1)]))
        if profile is not None:
            attrs[draw(sometimes(["gpu.example.com/profile", "profile"], ["other"]))] = profile
    return Device(
        name=f"d{i}",
        attributes=attrs,
        capacity=capacity,
        allow_multiple_allocations=True if multi else None,
        binding_conditions=binding,
        binding_failure_conditions=failure,
        binds_to_node=draw(st.sampled_from([None, True])),
        node_allocatable_resources=alloc,
        consumes_counters=uses,
    )


@st.composite
def pools(draw: st.DrawFn) -> Pool:
    devs = [draw(devices(i)) for i in range(draw(st.integers(1, 3)))]
    # Deliberately stricter than the server (docs): a partition type in a pool without
    # counter-consuming devices is refused, where the server never sees it; not generated.
    partition_type = None
    if any(d.consumes_counters for d in devs):
        partition_type = draw(
            sometimes([None, "gpu.example.com/profile"], ["profile", "example.com/x"])
        )
    return Pool(
        name=NODE,
        devices=devs,
        shared_counters=[CounterSet(name="s", counters={"m": Counter(value="4")})],
        partition_type_attribute=partition_type,
        skip_node_operations=draw(
            st.lists(
                sometimes(["NodeUnprepareResources", "*"], ["NodePrepareResources", "Nope"]),
                max_size=2,
                unique=draw(sometimes([True], [False])),
            )
        ),
    )


def _body(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "device-model-"},
        "spec": spec,
    }


def _field(verdict: str) -> str:
    """The field of a verdict's first error ("-" when valid), for hypothesis' statistics."""
    if not verdict:
        return "-"
    parts = verdict.split("; ")[0].split(": ")
    return parts[1].split("[")[0].split(".")[0] if len(parts) > 1 else parts[0]


def agent_verdict(pool: Pool) -> str:
    try:
        model.validate_inventory(Inventory(driver=DRIVER, pools=[pool]))
    except InvalidInventory as exc:
        return "; ".join(exc.errors)
    return ""


def server_verdict(server: ApiServer, pool: Pool) -> str:
    # Sent as the plugin gave it: an invalid inventory is never canonicalised (an empty policy
    # is then sent as {} too, as upstream would see it).
    specs = reference.desired_slices(DRIVER, pool, NODE, canonical=False)
    refusals = []
    for spec in specs:
        body = msgspec.to_builtins(spec)
        body["pool"]["generation"] = 1
        status, answer = server.request("POST", PATH, _body(body))
        if status != 201:
            assert status in (400, 422), (status, answer)
            refusals.append(answer.get("message", "") if isinstance(answer, dict) else answer)
    return "; ".join(refusals)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(pool=pools())
def test_the_agent_and_the_apiserver_agree(server: ApiServer, pool: Pool) -> None:
    agent = agent_verdict(pool)
    apiserver = server_verdict(server, pool)
    event("refused" if apiserver else "accepted")
    event(f"first rule: {_field(agent)}")
    assert bool(agent) == bool(apiserver), (
        f"agent: {agent or 'valid'}\napiserver: {apiserver or 'valid'}"
    )
