"""The agent's verdict on a plugin's inventory against the real kube-apiserver's, along the path
a plugin's message takes: hypothesis generates native `Inventory` protobuf messages (the pools
of the model-object oracle, `test_resourceslice_validation`, plus the spellings where the two
sides disagreed in issue 29 item 12: domains holding a Kelvin sign or U+0130, taint `timeAdded`
values Go's time parser takes or refuses, quantities with white space around them, pools of
more than 8 counter sets), and the agent's verdict is its message check
(`validate_inventory_message`) and the Rust conversion's v1 rules (`convert_native`); the
server's is dry-run creates of the converted pool's slices, laid out as the publisher lays
them out and encoded as the agent encodes them (msgspec: raw UTF-8), on the newest release with
every DRA gate on. Each disagreement of item 12 is an explicit example."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from nodeagent.plugins.handler import InvalidMessage
from nodeagent.plugins.inventory_shape import validate_inventory_message
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources import model
from nodeagent.resources.convert import convert_native
from nodeagent.resources.model import Counter, CounterSet, Pool
from tests.integration.test_resourceslice_validation import (
    DRIVER,
    NODE,
    PATH,
    pools,
    slices_as_sent,
    sometimes,
)
from tests.support.apiserver import ApiServer, newest_release, start_apiserver

pytestmark = pytest.mark.integration

KELVIN, DOTTED_I = "\u212a", "\u0130"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    srv = start_apiserver(
        tmp_path_factory.mktemp("validation-plugin"), release=newest_release(), gates="all-dra"
    )
    try:
        yield srv
    finally:
        srv.close()


DOMAIN_NAMES = sometimes(
    [
        "a" * 60 + KELVIN + "/x",  # 63 bytes as written
        DOTTED_I + ".example.com/x",  # Go lowers U+0130 to "i"
        KELVIN + "8s.io/x",
        "GPU.Example.com/x",
    ],
    [
        "a" * 62 + KELVIN + "/x",  # 65 bytes, 63 once lowered
        "a" * 62 + DOTTED_I + "/x",  # 64 bytes
        "\u0131.com/x",  # dotless i: no ASCII lowercase
        "\u212b.com/x",  # Angstrom sign lowers to U+00E5
    ],
)
TIMES = sometimes(
    [
        "2024-01-01T00:00:00Z",
        "2024-02-29T00:00:00Z",
        "2024-01-01T00:00:00.1234567891Z",  # 10 fraction digits
        "2024-01-01T00:00:00,5Z",
        "2024-01-01T1:00:00Z",
        "0000-01-01T00:00:00Z",
        "2024-01-01T00:00:00+24:00",
        "2024-01-01T00:00:00-23:60",
    ],
    [
        "2024-02-30T00:00:00Z",
        "2023-02-29T00:00:00Z",
        "2024-01-01T24:00:00Z",
        "2024-01-01T23:60:00Z",
        "2024-01-01T23:59:60Z",
        "2024-01-01T00:00:00+25:00",
        "2024-01-01T00:00:00+23:61",
        "2024-01-01t00:00:00Z",
        "2024-01-01T00:00:00.Z",
    ],
)
# White space around a quantity: what the server trims (it reads the raw text between the
# quotes) and what it does not (msgspec escapes a tab, which the server then sees as '\t').
PADDING = sometimes(["", " ", "  ", "\u00a0", "\u3000"], ["\t", "\n", "\u200b"])


def message(pool: Pool) -> device_pb2.Inventory:
    """The pool as a plugin sends it (an attribute holds at most one value there: a oneof)."""
    data = msgspec.to_builtins(pool)
    for device in data.get("devices", []):
        for name, values in device.get("attributes", {}).items():
            device["attributes"][name] = dict(list(values.items())[:1])
    out = device_pb2.Inventory()
    json_format.ParseDict({"pools": [data]}, out)
    return out


@st.composite
def messages(draw: st.DrawFn) -> device_pb2.Inventory:
    pool = draw(pools())
    devices = list(pool.devices)
    if draw(st.booleans()) and devices:
        d = devices[0]
        devices[0] = msgspec.structs.replace(
            d,
            attributes={**d.attributes, draw(DOMAIN_NAMES): model.DeviceAttribute(int_=1)},
            taints=[msgspec.structs.replace(t, time_added=draw(TIMES)) for t in d.taints[:2]],
            capacity={
                k: msgspec.structs.replace(c, value=draw(PADDING) + c.value + draw(PADDING))
                for k, c in d.capacity.items()
            },
        )
    sets = list(pool.shared_counters)
    if draw(st.integers(0, 3)) == 0:
        # Around the 8 counter sets of one slice: a pool may have more.
        sets += [
            CounterSet(name=f"x{i}", counters={"c": Counter(value=draw(PADDING) + "1")})
            for i in range(draw(st.integers(6, 10)) - len(sets))
        ]
    return message(msgspec.structs.replace(pool, devices=devices, shared_counters=sets))


def agent_verdict(msg: device_pb2.Inventory) -> str:
    """What the plugin path says: the message check, then the conversion's v1 rules."""
    try:
        validate_inventory_message(msg)
    except InvalidMessage as exc:
        return str(exc)
    return "; ".join(convert_native(DRIVER, msg)[1])


def server_verdict(server: ApiServer, msg: device_pb2.Inventory) -> str:
    """The converted pool's slices as the publisher lays them out (quantities as the plugin
    sent them), encoded as the agent encodes them."""
    (pool,) = convert_native(DRIVER, msg)[0].pools
    refusals = []
    for body in slices_as_sent(pool):
        status, answer = server.request("POST", PATH, msgspec.json.encode(body))
        if status != 201:
            assert status in (400, 422), (status, answer)
            refusals.append(answer.get("message", "") if isinstance(answer, dict) else answer)
    return "; ".join(refusals)


def _device(**fields: Any) -> device_pb2.Inventory:
    return device_pb2.Inventory(
        pools=[device_pb2.Pool(name=NODE, devices=[device_pb2.Device(name="d", **fields)])]
    )


def _attribute(name: str) -> device_pb2.Inventory:
    return _device(attributes={name: device_pb2.DeviceAttribute(int=1)})


def _time_added(value: str) -> device_pb2.Inventory:
    return _device(taints=[device_pb2.DeviceTaint(key="k", effect="NoSchedule", time_added=value)])


# Issue 29 item 12, each disagreement found: accepted by the agent, refused by 1.37 ...
REFUSED = [
    _attribute("a" * 62 + KELVIN + "/x"),  # measured after lowering: 63 bytes out of 65
    _time_added("2024-02-30T00:00:00Z"),  # the right shape, no such day: 400, the whole pool
    _time_added("2024-01-01T24:00:00Z"),
    _time_added("2024-01-01T00:60:00Z"),
    _time_added("2024-01-01T00:00:60Z"),
    _time_added("2024-01-01T00:00:00+25:00"),
]
# ... and refused by the agent, accepted by the server.
ACCEPTED = [
    _attribute(DOTTED_I + ".example.com/x"),
    _device(capacity={"memory": device_pb2.DeviceCapacity(value=" 1Gi ")}),
    _time_added("2024-01-01T00:00:00.1234567891Z"),
    device_pb2.Inventory(  # laid out by the agent as 8 + 1
        pools=[
            device_pb2.Pool(
                name=NODE,
                shared_counters=[
                    device_pb2.CounterSet(
                        name=f"s{i}", counters={"c": device_pb2.Counter(value="1")}
                    )
                    for i in range(9)
                ],
            )
        ]
    ),
]


@pytest.mark.parametrize(
    ("msg", "refused"),
    [(m, True) for m in REFUSED] + [(m, False) for m in ACCEPTED],
    ids=[
        "kelvin-65-bytes",
        "feb-30",
        "hour-24",
        "minute-60",
        "second-60",
        "offset-25h",
        "dotted-capital-i",
        "spaced-quantity",
        "10-fraction-digits",
        "9-counter-sets",
    ],
)
def test_each_disagreement_of_issue_29_is_settled(
    server: ApiServer, msg: device_pb2.Inventory, refused: bool
) -> None:
    agent, apiserver = agent_verdict(msg), server_verdict(server, msg)
    assert bool(apiserver) == refused, apiserver  # the server's word, as found
    assert bool(agent) == bool(apiserver), (
        f"agent: {agent or 'valid'}\napiserver: {apiserver or 'valid'}"
    )


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(msg=messages())
@example(msg=REFUSED[0])
@example(msg=ACCEPTED[-1])
def test_the_plugin_path_and_the_apiserver_agree(
    server: ApiServer, msg: device_pb2.Inventory
) -> None:
    agent = agent_verdict(msg)
    apiserver = server_verdict(server, msg)
    event("refused" if apiserver else "accepted")
    assert bool(agent) == bool(apiserver), (
        f"agent: {agent or 'valid'}\napiserver: {apiserver or 'valid'}"
    )
