"""The Rust conversion and validation of plugin inventories (`nodeagent._native.inventory_*`,
what production runs) against the plain-Python reference (tests/support/dra_reference/) on
generated messages, valid and invalid: the same inventory (byte for byte once encoded, map order
included), the same seed drops with the same reasons, the same v1 errors in the same order, the
same first shape error of a native message."""

from __future__ import annotations

import hashlib

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent import _native
from nodeagent.plugins.handler import InvalidMessage
from nodeagent.plugins.inventory_shape import validate_inventory_message
from nodeagent.protos.dra.v1alpha3 import api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources import model
from nodeagent.resources.convert import convert_native, convert_seed, seed_device_name
from tests.support.dra_reference import convert as ref_convert
from tests.support.dra_reference import inventory_shape as ref_inventory_shape
from tests.support.dra_reference import validation as ref_validation

_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

# Valid and invalid spellings side by side, so that every rule both passes and fails.
NAMES = st.sampled_from(
    [
        "gpu-0",
        "gpu-1",
        "a",
        "",
        "GPU",
        "gpu.0",
        "gpu_0",
        "-a",
        "x" * 64,
        "it's",
        'q"uote',
        "é",
        "\u212a8s.io/x",
        "a\nb",
    ]
) | st.text(max_size=4)
ATTR_NAMES = st.sampled_from(
    [
        "model",
        "index",
        "example.com/model",
        "Example.COM/model",
        "drv.example.com/profile",
        "profile",
        "/x",
        "a/b/c",
        "1bad",
        "x" * 33,
        "",
        "é",
        # Issue 29 item 12: the domain's bytes as written, lowered as Go lowers it.
        "a" * 60 + "\u212a/x",
        "a" * 61 + "\u212a/x",
        "\u0130.example.com/x",
        "\u0131.example.com/x",
    ]
)
QUANTITIES = st.sampled_from(
    [
        "1",
        "2",
        "10",
        "0",
        "-1",
        "1Gi",
        "80Gi",
        "1.5",
        "500m",
        "0.0001",
        "1e3",
        "1e40",
        "9223372036854775807",
        "9223372036854775808",
        "1Q",
        "abc",
        "",
        "1.0001m",
        "4",
        "3",
        " 1Gi ",
        "\u00a02",
        "1\t",
        "1 2",
    ]
)
OPT = st.one_of(st.just(""), QUANTITIES)
LABELS = st.sampled_from(
    ["ok", "example.com/ok", "Bad Key", "", "a/", "x" * 64, "v1.2", "-x", "é", "a_b"]
)
VERSIONS = st.sampled_from(["1.0.0", "1.4.2-rc.1+b.5", "v1", "1.0", "1.0.0-01", "x" * 65])
TIMES = st.sampled_from(
    [
        "",
        "2024-05-01T10:00:00Z",
        "2024-05-01T10:00:00.5+02:00",
        "nope",
        "2024-02-30T00:00:00Z",
        "2024-01-01T24:00:00Z",
        "2024-01-01T00:00:60Z",
        "2024-01-01T00:00:00+25:00",
        "2024-01-01T00:00:00.1234567891Z",
        "2024-01-01T1:00:00,5+24:00",
    ]
)
EFFECTS = st.sampled_from(["NoSchedule", "NoExecute", "None", "Bad", ""])
GROUPS = st.sampled_from(["g1", "g2", "Bad_Group", ""])
OPS = st.sampled_from(["NodePrepareResources", "NodeUnprepareResources", "*", "Other"])
NAR_KEYS = st.sampled_from(["cpu", "memory", "hugepages-2Mi", "gpu", ""])


@st.composite
def attribute(draw: st.DrawFn) -> device_pb2.DeviceAttribute:
    kind = draw(st.sampled_from(["int", "bool", "string", "version", "none"]))
    if kind == "int":
        return device_pb2.DeviceAttribute(int=draw(st.integers(-(2**63), 2**63 - 1)))
    if kind == "bool":
        return device_pb2.DeviceAttribute(bool=draw(st.booleans()))
    if kind == "string":
        text = draw(st.sampled_from(["a", "x" * 64, "é" * 40]) | st.text(max_size=8))
        return device_pb2.DeviceAttribute(string=text)
    if kind == "version":
        return device_pb2.DeviceAttribute(version=draw(VERSIONS))
    return device_pb2.DeviceAttribute()


@st.composite
def capacity(draw: st.DrawFn) -> device_pb2.DeviceCapacity:
    c = device_pb2.DeviceCapacity(value=draw(QUANTITIES))
    if draw(st.booleans()):
        p = device_pb2.CapacityRequestPolicy(
            default=draw(OPT), valid_values=draw(st.lists(QUANTITIES, max_size=12))
        )
        if draw(st.booleans()):
            p.valid_range.CopyFrom(
                device_pb2.CapacityRequestPolicyRange(min=draw(OPT), max=draw(OPT), step=draw(OPT))
            )
        c.request_policy.CopyFrom(p)
    return c


def counters(draw: st.DrawFn, names: st.SearchStrategy[str]) -> dict[str, device_pb2.Counter]:
    keys = draw(st.lists(names, max_size=4))
    if draw(st.integers(0, 9)) == 0:
        keys += [f"c{i}" for i in range(33)]
    return {k: device_pb2.Counter(value=draw(QUANTITIES)) for k in keys}


COUNTER_NAMES = st.sampled_from(["c0", "c1", "c2", "Bad", ""])
SET_NAMES = st.sampled_from(["set-a", "set-b", "Bad_Set", ""])


@st.composite
def device(draw: st.DrawFn) -> device_pb2.Device:
    d = device_pb2.Device(name=draw(NAMES))
    for k in draw(st.lists(ATTR_NAMES, max_size=4)):
        d.attributes[k].CopyFrom(draw(attribute()))
    for k in draw(st.lists(ATTR_NAMES, max_size=2)):
        d.capacity[k].CopyFrom(draw(capacity()))
    if draw(st.integers(0, 9)) == 0:
        for i in range(33):
            d.attributes[f"a{i}"].int = i
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 17]))):
        d.taints.append(
            device_pb2.DeviceTaint(
                key=draw(LABELS), value=draw(LABELS), effect=draw(EFFECTS), time_added=draw(TIMES)
            )
        )
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):
        d.consumes_counters.append(
            device_pb2.DeviceCounterConsumption(
                counter_set=draw(SET_NAMES),
                counters=counters(draw, COUNTER_NAMES),
                compatibility_groups=draw(st.lists(GROUPS, max_size=3)),
            )
        )
    d.binds_to_node = draw(st.booleans())
    d.allow_multiple_allocations = draw(st.booleans())
    conditions = st.lists(LABELS, max_size=5)
    d.binding_conditions.extend(draw(conditions))
    d.binding_failure_conditions.extend(draw(conditions))
    for k in draw(st.lists(NAR_KEYS, max_size=2)):
        r = d.node_allocatable_resources[k]
        if draw(st.booleans()):
            r.mapping.CopyFrom(
                device_pb2.NodeAllocatableMapping(
                    capacity_key=draw(st.one_of(st.just(""), ATTR_NAMES)),
                    capacity_multiplier=draw(OPT),
                    device_multiplier=draw(OPT),
                )
            )
        if draw(st.booleans()):
            r.overhead.CopyFrom(
                device_pb2.NodeAllocatableOverhead(per_pod=draw(OPT), per_container=draw(OPT))
            )
    return d


@st.composite
def native_message(draw: st.DrawFn) -> device_pb2.Inventory:
    pools = []
    for _ in range(draw(st.integers(0, 3))):
        p = device_pb2.Pool(
            name=draw(st.sampled_from(["pool-a", "pool-b", "a/b", "Bad", "", "a//b"])),
            devices=draw(st.lists(device(), max_size=4)),
            partition_type_attribute=draw(
                st.sampled_from(["", "drv.example.com/profile", "profile", "x.io/y", "/bad"])
            ),
            skip_node_operations=draw(st.lists(OPS, max_size=3)),
        )
        for _ in range(draw(st.sampled_from([0, 1, 2, 9]))):
            p.shared_counters.append(
                device_pb2.CounterSet(name=draw(SET_NAMES), counters=counters(draw, COUNTER_NAMES))
            )
        pools.append(p)
    return device_pb2.Inventory(pools=pools)


DRIVERS = st.sampled_from(["drv.example.com", "Bad_Driver", "x" * 64, ""])


def _single_keyed(inv: model.Inventory) -> bool:
    """Whether every map of the inventory has at most one key. Python's protobuf (upb) iterates
    a map in the order of its hash table, which is neither the wire order nor stable across a
    re-parse; Rust reads the wire order. With one key per map both orders are the same."""
    return all(
        max(len(d.attributes), len(d.capacity), len(d.node_allocatable_resources), 1) == 1
        and all(len(u.counters) <= 1 for u in d.consumes_counters)
        for p in inv.pools
        for d in p.devices
    ) and all(len(c.counters) <= 1 for p in inv.pools for c in p.shared_counters)


def _same_inventory(a: model.Inventory, b: model.Inventory) -> None:
    assert a == b  # dicts compare without their order
    if _single_keyed(b):
        assert msgspec.json.encode(a) == msgspec.json.encode(b)


def _same_errors(got: list[str], expected: list[str], inv: model.Inventory) -> None:
    """The same errors; in the same order too unless a map's order differs (see above)."""
    assert sorted(got) == sorted(expected)
    if _single_keyed(inv):
        assert got == expected


@_SETTINGS
@given(DRIVERS, native_message())
def test_native_conversion_and_rules_match_the_reference(
    driver: str, message: device_pb2.Inventory
) -> None:
    expected = ref_convert.from_native(driver, message)
    inventory, errors = convert_native(driver, message)
    _same_inventory(inventory, expected)
    reference = ref_validation.inventory_errors(expected)
    _same_errors(errors, reference, expected)
    # The same rules on an inventory given as such (tests, the integration harness): the dicts'
    # order is the reference's here, so the order of the errors is too.
    assert model.inventory_errors(expected) == reference


def _shape_error(check: object, message: device_pb2.Inventory) -> str | None:
    try:
        check(message)  # type: ignore[operator]
    except InvalidMessage as exc:
        return str(exc)
    return None


@_SETTINGS
@given(native_message())
def test_native_message_shape_rules_match_the_reference(message: device_pb2.Inventory) -> None:
    got = _shape_error(validate_inventory_message, message)
    expected = _shape_error(ref_inventory_shape.validate_inventory_message, message)
    assert (got is None) == (expected is None)
    if _single_keyed(ref_convert.from_native("d", message)):
        # The first error found: the same one when both walk the maps in the same order.
        assert got == expected


SEED_NAMES = st.sampled_from(
    ["gpu-0", "gpu.0", "gpu-0-5f0c1a3e", "GPU", "", "a" * 70 + ".b", "x." * 120 + "y", "é"]
) | st.from_regex(r"[a-z0-9][a-z0-9.-]{0,70}[a-z0-9]", fullmatch=True)


@st.composite
def seed_value(draw: st.DrawFn) -> v1alpha2.NamedResourcesAttributeValue:
    v = v1alpha2.NamedResourcesAttributeValue()
    for kind in draw(
        st.lists(
            st.sampled_from(
                ["bool", "int", "string", "version", "quantity", "intSlice", "stringSlice"]
            ),
            max_size=2,
        )
    ):
        if kind == "bool":
            v.bool = draw(st.booleans())
        elif kind == "int":
            v.int = draw(st.integers(-(2**63), 2**63 - 1))
        elif kind == "string":
            v.string = draw(st.sampled_from(["a", "x" * 65, ""]))
        elif kind == "version":
            v.version = draw(VERSIONS)
        elif kind == "quantity":
            v.quantity.string = draw(QUANTITIES)
        elif kind == "intSlice":
            v.intSlice.ints.extend(draw(st.lists(st.integers(0, 9), max_size=2)))
        else:
            v.stringSlice.strings.extend(draw(st.lists(st.text(max_size=2), max_size=2)))
    return v


@st.composite
def seed_message(draw: st.DrawFn) -> api_pb2.NodeListAndWatchResourcesResponse:
    resources = []
    for _ in range(draw(st.integers(0, 2))):
        instances = [
            v1alpha2.NamedResourcesInstance(
                name=draw(SEED_NAMES),
                attributes=[
                    v1alpha2.NamedResourcesAttribute(
                        name=draw(ATTR_NAMES), attributeValue=draw(seed_value())
                    )
                    for _ in range(draw(st.integers(0, 4)))
                ],
            )
            for _ in range(draw(st.integers(0, 4)))
        ]
        resources.append(
            v1alpha2.ResourceModel(
                namedResources=v1alpha2.NamedResourcesResources(instances=instances)
            )
        )
    return api_pb2.NodeListAndWatchResourcesResponse(resources=resources)


@_SETTINGS
@given(DRIVERS, st.sampled_from(["node-a", "Bad_Node"]), seed_message())
def test_seed_conversion_drops_and_rules_match_the_reference(
    driver: str, node: str, message: api_pb2.NodeListAndWatchResourcesResponse
) -> None:
    expected, expected_rejected = ref_convert.from_seed(driver, node, message)
    inventory, rejected, errors = convert_seed(driver, node, message)
    _same_inventory(inventory, expected)
    assert msgspec.json.encode(inventory) == msgspec.json.encode(expected)  # no maps in seed
    assert rejected == expected_rejected
    assert errors == ref_validation.inventory_errors(expected)


@settings(max_examples=500, deadline=None)
@given(SEED_NAMES | st.text(max_size=80))
def test_seed_device_names_match_the_reference(name: str) -> None:
    assert seed_device_name(name) == ref_convert.seed_device_name(name)


def test_the_seed_name_hash_is_sha256() -> None:
    name = "gpu.0"
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    assert _native.seed_device_name(name) == f"gpu-0-{digest}"


@pytest.mark.parametrize("limit", [64, 1000])
def test_the_attribute_string_limit_is_the_models(
    limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`model.MAX_ATTRIBUTE_STRING` is read at each call (a test lifts it to let the server
    judge a value the agent would refuse)."""
    monkeypatch.setattr(model, "MAX_ATTRIBUTE_STRING", limit)
    message = device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name="p",
                devices=[
                    device_pb2.Device(
                        name="d", attributes={"x": device_pb2.DeviceAttribute(string="é" * 40)}
                    )
                ],
            )
        ]
    )
    _, errors = convert_native("drv.example.com", message)
    expected = ref_validation.inventory_errors(ref_convert.from_native("drv.example.com", message))
    assert errors == expected
    assert bool(errors) == (limit == 64)


def test_devices_decoded_in_batches_keep_their_pools_and_order() -> None:
    """Rust hands the devices over in batches of 128 (short GIL holds): pools of 0, 1, 128,
    129 and 300 devices come back whole, in order, and a pool without devices stays empty."""
    sizes = [0, 1, 128, 129, 300]
    message = device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name=f"pool-{p}",
                devices=[
                    device_pb2.Device(
                        name=f"dev-{k}", attributes={"index": device_pb2.DeviceAttribute(int=k)}
                    )
                    for k in range(n)
                ],
                shared_counters=[
                    device_pb2.CounterSet(name="set", counters={"c": device_pb2.Counter(value="1")})
                ],
            )
            for p, n in enumerate(sizes)
        ]
    )
    inventory, errors = convert_native("drv.example.com", message)
    assert errors == []
    assert [len(p.devices) for p in inventory.pools] == sizes
    assert msgspec.json.encode(inventory) == msgspec.json.encode(
        ref_convert.from_native("drv.example.com", message)
    )
