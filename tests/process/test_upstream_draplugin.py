"""A DRA plugin no one here wrote: the seed-era (Kubernetes 1.30) plugin built from the upstream
Go helper `k8s.io/dynamic-resource-allocation/kubeletplugin` v0.30 (tests/harness/draplugin),
registered the upstream way (`<registry>/<driver>-reg.sock`, service socket
`<plugins>/<driver>/dra.sock` in a directory of its own), against `nodeagent run` with node-a's
credentials and the real kube-apiserver. Expected device names and attributes are computed here from
the rules (docs/architecture/resourceslices.md, seed conversion), not with the agent's code."""

from __future__ import annotations

import hashlib
import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from nodeagent.protos.dra.v1alpha3 import api_pb2 as dra
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from tests.process.conftest import AgentProcess, StartAgent
from tests.process.test_process_resourceslices import (  # noqa: F401 - node: a fixture
    NODE,
    node,
    node_slices,
)
from tests.support.apiserver import ApiServer
from tests.support.draplugin import DraPlugin, KubeletDirs, instance, kubelet_dirs, named_resources
from tests.support.wait import until

DRIVER = "gpu.upstream.example.com"
RPC_TIMEOUT = 10.0

# Seed names that are not DNS labels (mapped) and one that is (kept); a long one whose 54-character
# cut ends in '-' (stripped).
LONG = "n" * 53 + ".abc"


def seed_instance(name: str, index: int, model: str, memory: str) -> dict[str, Any]:
    """An instance with one attribute of every seed kind (the slices are dropped on conversion)."""
    return instance(
        name,
        {
            "healthy": {"bool": index % 2 == 0},
            "index": {"int": index},
            "model": {"string": model},
            "driverVersion": {"version": "1.2.3"},
            "memory": {"quantity": memory},
            "numaNodes": {"intSlice": {"ints": [0, index]}},
            "links": {"stringSlice": {"strings": ["nvlink", "pcie"]}},
        },
    )


FIRST = [
    named_resources(
        seed_instance("gpu.0", 0, "A100", "40Gi"),
        seed_instance("gpu.1", 1, "A100", "1024Mi"),  # published in canonical form: 1Gi
    ),
    named_resources(
        seed_instance("mig-2", 2, "A100-mig", "10Gi"), seed_instance(LONG, 3, "X", "1")
    ),
]
SECOND = [
    named_resources(
        seed_instance("gpu.0", 0, "H100", "80Gi"),
        seed_instance("gpu.7", 7, "H100", "81920Mi"),
    )
]


def v1_device_name(seed_name: str) -> str:
    """The mapping rule: a DNS label is kept; any other DNS subdomain becomes its dots turned to
    dashes, cut to 54 characters, trailing '-' stripped, then '-' and 8 hex digits of its
    SHA-256."""
    if len(seed_name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", seed_name):
        return seed_name
    digest = hashlib.sha256(seed_name.encode()).hexdigest()[:8]
    return f"{seed_name.replace('.', '-')[:54].rstrip('-')}-{digest}"


# Canonical quantity strings (resource.Quantity's CanonicalizeBytes) of the values above. The Go
# plugin's proto marshalling already sends this form: `1024Mi` in the file arrives as `1Gi`.
CANONICAL = {
    "40Gi": "40Gi",
    "1024Mi": "1Gi",
    "10Gi": "10Gi",
    "1": "1",
    "80Gi": "80Gi",
    "81920Mi": "80Gi",
}


def canonical(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`resources` with every quantity in canonical form."""
    out: list[dict[str, Any]] = json.loads(json.dumps(resources))
    for model in out:
        for inst in model["namedResources"]["instances"]:
            for attr in inst["attributes"]:
                if "quantity" in attr:
                    attr["quantity"] = CANONICAL[attr["quantity"]]
    return out


def expected_devices(resources: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """v1 devices by name: bool/int/string/version attributes kept, quantities as capacity,
    int/string slices dropped."""
    kinds = {"bool", "int", "string", "version"}
    devices: dict[str, dict[str, Any]] = {}
    for model in resources:
        for inst in model["namedResources"]["instances"]:
            attributes: dict[str, Any] = {}
            capacity: dict[str, Any] = {}
            for attr in inst["attributes"]:
                (kind,) = set(attr) - {"name"}
                if kind in kinds:
                    attributes[attr["name"]] = {kind: attr[kind]}
                elif kind == "quantity":
                    capacity[attr["name"]] = {"value": attr[kind]}
            name = v1_device_name(inst["name"])
            devices[name] = {"name": name, "attributes": attributes, "capacity": capacity}
    return devices


# --------------------------------------------------------------------------
# the plugin on its own: what it advertises and streams, straight from the upstream helper


def _rpc(channel: grpc.Channel, path: str, request: Message, reply: type[Message]) -> Any:
    call = channel.unary_unary(
        path,
        request_serializer=type(request).SerializeToString,
        response_deserializer=reply.FromString,
    )
    return call(request, timeout=RPC_TIMEOUT)


def _stream(channel: grpc.Channel) -> Iterator[dra.NodeListAndWatchResourcesResponse]:
    call = channel.unary_stream(
        "/v1alpha3.Node/NodeListAndWatchResources",
        request_serializer=dra.NodeListAndWatchResourcesRequest.SerializeToString,
        response_deserializer=dra.NodeListAndWatchResourcesResponse.FromString,
    )
    stream: Iterator[dra.NodeListAndWatchResourcesResponse] = call(
        dra.NodeListAndWatchResourcesRequest(), timeout=60
    )
    return stream


def _as_json(message: dra.NodeListAndWatchResourcesResponse) -> list[dict[str, Any]]:
    """The streamed message in the inventory file's JSON form (attribute values inline)."""
    out: list[dict[str, Any]] = []
    for model in message.resources:
        instances = []
        for inst in model.namedResources.instances:
            attributes = []
            for attr in inst.attributes:
                ((field, value),) = attr.attributeValue.ListFields()
                if field.name == "quantity":
                    value = value.string
                elif field.name in ("intSlice", "stringSlice"):
                    key = "ints" if field.name == "intSlice" else "strings"
                    value = {key: list(getattr(value, key))}
                attributes.append({"name": attr.name, field.name: value})
            instances.append({"name": inst.name, "attributes": attributes})
        out.append({"namedResources": {"instances": instances}})
    return out


@pytest.fixture
def dirs() -> Iterator[KubeletDirs]:
    made = kubelet_dirs()
    yield made
    made.remove()


def test_upstream_helper_registers_and_streams_like_a_1_30_driver(
    dirs: KubeletDirs, tmp_path: Path
) -> None:
    plugin = DraPlugin.start(DRIVER, dirs, FIRST, workdir=tmp_path)
    try:
        assert plugin.registration_socket == dirs.registry / f"{DRIVER}-reg.sock"
        assert plugin.endpoint == dirs.plugins / DRIVER / "dra.sock"
        with grpc.insecure_channel(f"unix://{plugin.registration_socket}") as channel:
            info = _rpc(
                channel,
                "/pluginregistration.Registration/GetInfo",
                reg.InfoRequest(),
                reg.PluginInfo,
            )
            assert (info.type, info.name, info.endpoint) == (
                "DRAPlugin",
                DRIVER,
                str(plugin.endpoint),
            )
            assert list(info.supported_versions) == ["1.0.0"]
            _rpc(
                channel,
                "/pluginregistration.Registration/NotifyRegistrationStatus",
                reg.RegistrationStatus(plugin_registered=True),
                reg.RegistrationStatusResponse,
            )
        with grpc.insecure_channel(f"unix://{plugin.endpoint}") as channel:
            stream = _stream(channel)
            assert _as_json(next(stream)) == canonical(FIRST)
            plugin.update(SECOND)
            assert _as_json(next(stream)) == canonical(SECOND)
            plugin.update([])
            assert _as_json(next(stream)) == []
            # A broken file is logged and the last good inventory kept (nothing is sent).
            plugin.inventory_path.write_text('[{"namedResources": {"instancez": []}}]')
            plugin.proc.send_signal(signal.SIGHUP)
            until(lambda: "inventory not reloaded" in plugin.log(), "the reload error")
            assert "unknown field" in plugin.log() and "instancez" in plugin.log()
            # Nothing was sent for it: the next message is the next good inventory.
            plugin.update(SECOND)
            assert _as_json(next(stream)) == canonical(SECOND)
            prepare = _rpc(
                channel,
                "/v1alpha3.Node/NodePrepareResources",
                dra.NodePrepareResourcesRequest(
                    claims=[dra.Claim(namespace="ns", uid="u1", name="c")]
                ),
                dra.NodePrepareResourcesResponse,
            )
            assert list(prepare.claims) == ["u1"] and not prepare.claims["u1"].error
        assert plugin.stop() == 0
        # The helper removes its sockets on the way out: that is how the kubelet sees it go.
        assert not plugin.registration_socket.exists() and not plugin.endpoint.exists()
    finally:
        plugin.close()


# --------------------------------------------------------------------------
# against `nodeagent run` and the real kube-apiserver


def start_cluster_agent(
    start_agent: StartAgent, apiserver: ApiServer, dirs: KubeletDirs
) -> AgentProcess:
    agent = start_agent(
        "--kubeconfig",
        str(apiserver.kubeconfig(NODE)),
        "--node-name",
        NODE,
        "--registry-dir",
        str(dirs.registry),
        # Short, so the deregistration's delete is seen within the test's deadline (a gone
        # plugin's slices are kept for the longer of the two graces).
        "--set",
        "resources.disconnect_grace=1",
        "--set",
        "resources.startup_grace=1",
    )
    agent.wait_ready()
    return agent


def all_plugins(agent: AgentProcess) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(agent.get("/v1/plugins")[1])
    return items


def plugins_view(agent: AgentProcess) -> list[dict[str, Any]]:
    return [item for item in all_plugins(agent) if item["name"] == DRIVER]


def driver_slices(apiserver: ApiServer) -> list[dict[str, Any]]:
    return [s for s in node_slices(apiserver) if s["spec"]["driver"] == DRIVER]


def wait_registered(agent: AgentProcess) -> dict[str, Any]:
    """The plugin's /v1/plugins entry once registered; a rejection fails at once, with why."""

    def check() -> dict[str, Any] | None:
        for entry in plugins_view(agent):
            assert entry["state"] != "rejected", f"the agent refused the plugin: {entry}"
            if entry["state"] == "registered":
                return entry
        return None

    try:
        return until(check, "the plugin to register")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nplugins: {json.dumps(plugins_view(agent), indent=1)}"
        ) from None


def wait_for_devices(
    apiserver: ApiServer, agent: AgentProcess, resources: list[dict[str, Any]]
) -> dict[str, Any]:
    """The one slice of the driver's pool once it holds exactly the devices `resources` maps to
    (the agent's plugin view in the failure message)."""
    want = expected_devices(canonical(resources))

    def check() -> dict[str, Any] | None:
        slices = driver_slices(apiserver)
        if len(slices) != 1:
            return None
        got = {d["name"]: d for d in slices[0]["spec"]["devices"]}
        return slices[0] if got == want else None

    try:
        return until(check, f"the devices {sorted(want)}")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nslices: {json.dumps(driver_slices(apiserver), indent=1)}\n"
            f"plugins: {json.dumps(plugins_view(agent), indent=1)}"
        ) from None


@pytest.fixture(params=["upstream-layout", "endpoint-in-registry"])
def layout(request: pytest.FixtureRequest) -> Iterator[KubeletDirs]:
    """The upstream layout (dra.sock in <plugins>/<driver>/, beside the registry), and the
    service socket inside the registry tree (<registry>/<driver>/dra.sock), where the agent
    must not take it for a plugin of its own."""
    made = kubelet_dirs(plugins_in_registry=request.param == "endpoint-in-registry")
    yield made
    made.remove()


@pytest.mark.usefixtures("node")
def test_upstream_plugin_publishes_through_nodeagent_run(
    apiserver: ApiServer,
    start_agent: StartAgent,
    layout: KubeletDirs,
    tmp_path: Path,
) -> None:
    dirs = layout
    agent = start_cluster_agent(start_agent, apiserver, dirs)
    plugin = DraPlugin.start(DRIVER, dirs, FIRST, workdir=tmp_path)
    try:
        entry = wait_registered(agent)
        assert entry["type"] == "DRAPlugin" and entry["versions"] == ["1.0.0"]
        assert entry["socket"] == str(plugin.registration_socket)
        assert entry["endpoint"] == str(plugin.endpoint)

        obj = wait_for_devices(apiserver, agent, FIRST)
        spec = obj["spec"]
        assert obj["apiVersion"] == "resource.k8s.io/v1"
        assert (spec["driver"], spec["nodeName"]) == (DRIVER, NODE)
        assert spec["pool"]["name"] == NODE and spec["pool"]["resourceSliceCount"] == 1
        status, node_obj = apiserver.request("GET", f"/api/v1/nodes/{NODE}")
        assert status == 200
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": NODE,
                "uid": node_obj["metadata"]["uid"],
                "controller": True,
            }
        ]

        # A changed inventory (one device changed, one gone, one new) lands in the same pool.
        plugin.update(SECOND)
        updated = wait_for_devices(apiserver, agent, SECOND)
        assert updated["spec"]["pool"]["name"] == NODE

        # Zero resources: zero slices (not one empty slice), the plugin still registered.
        plugin.update([])
        until(lambda: not driver_slices(apiserver), "the pool's slices to be deleted")
        assert [p["state"] for p in plugins_view(agent)] == ["registered"]

        plugin.update(FIRST)
        wait_for_devices(apiserver, agent, FIRST)
        # The service socket has existed for seconds (registry scans every second): it is this
        # plugin's endpoint, never probed as a plugin itself.
        assert [p["socket"] for p in all_plugins(agent)] == [str(plugin.registration_socket)]

        # The plugin goes away (its helper removes the registration socket): deregistered, and
        # its slices deleted after the disconnect grace.
        assert plugin.stop() == 0
        until(
            lambda: all(p["state"] != "registered" for p in plugins_view(agent)),
            "the plugin to be deregistered",
        )
        until(lambda: not driver_slices(apiserver), "the slices of the gone plugin to be deleted")
    finally:
        plugin.close()
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
