"""An SDK DRA driver's kubelet side against the real kube-apiserver, over real unix sockets.

The driver reads the ResourceClaims the kubelet names from the harness's apiserver (the claims
are allocated the way the scheduler does it: a status update with `status.allocation`), and is
called through the kubelet's DRAPlugin API (v1 and v1beta1) on its endpoint. What the kubelet
itself and a container runtime do with it is proven on a real node (tests/realnode); here every
path of prepare and unprepare is driven one by one, the failures included.

The credentials question (issue 28): the Node authorizer lets a node read a ResourceClaim only
once a pod bound to that node references it; an upstream driver reads with its own
ServiceAccount, which needs `get` on resourceclaims. Both are shown below.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from nodeagent.kube import RESOURCECLAIMS as CLAIMS
from nodeagent.kube import KubeClient, Resource
from nodeagent.protos.dra.v1 import api_grpc as v1_grpc
from nodeagent.protos.dra.v1 import api_pb2 as v1
from nodeagent.protos.dra.v1beta1 import api_grpc as v1beta1_grpc
from nodeagent.protos.dra.v1beta1 import api_pb2 as v1beta1
from nodeagent.protos.dra_health.v1 import api_grpc as health_grpc
from nodeagent.protos.dra_health.v1 import api_pb2 as health_pb
from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.rpc.bridge import GrpcBridge, open_grpc_bridge
from nodeagent.sdk import (
    Claim,
    ClaimRef,
    ContainerEdits,
    Device,
    DevicePlugin,
    Health,
    KubeletPlugin,
    PreparedDevice,
)
from tests.integration.conftest import client_for
from tests.support.apiserver import ApiServer
from tests.support.wait import wait_until

DRIVER = "gpu.example.com"
NODE = "node-a"
PODS = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
NAMESPACES = Resource(
    group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False
)


async def allocated_claim(
    admin: KubeClient,
    ns: str,
    name: str,
    devices: Sequence[str],
    *,
    class_params: Any = None,
    claim_params: Any = None,
) -> dict[str, Any]:
    """A claim with one request `gpu` of len(devices) devices, allocated from pool node-a as
    the scheduler would write it (class config first, then the claim's)."""
    config = []
    if claim_params is not None:
        config.append(
            {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": claim_params}}
        )
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "allocationMode": "ExactCount",
                            "count": len(devices),
                        },
                    }
                ],
                "config": config,
            }
        },
    }
    created = json.loads(await admin.create(CLAIMS, body, ns))
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    allocation_config = []
    if class_params is not None:
        allocation_config.append(
            {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": class_params}}
        )
    if claim_params is not None:
        allocation_config.append(
            {
                "source": "FromClaim",
                "requests": ["gpu"],
                "opaque": {"driver": DRIVER, "parameters": claim_params},
            }
        )
    created["status"] = {
        "allocation": {
            "devices": {"results": results, "config": allocation_config},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    }
    return dict(json.loads(await admin.update(CLAIMS, created, ns, subresource="status")))


def claim_ref(claim: dict[str, Any]) -> v1.Claim:
    meta = claim["metadata"]
    return v1.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


class Author:
    """What a driver author writes: env per device, from the opaque config when there is one."""

    def __init__(self) -> None:
        self.prepared: list[Claim] = []
        self.unprepared: list[tuple[ClaimRef, int]] = []
        self.fail_prepare: set[str] = set()
        self.fail_unprepare: set[str] = set()

    async def prepare(self, claim: Claim) -> Sequence[PreparedDevice]:
        self.prepared.append(claim)
        if claim.name in self.fail_prepare:
            raise RuntimeError("the device is busy")
        out = []
        for d in claim.devices:
            env = {f"GPU_DEVICE_{d.device.replace('-', '_').upper()}": d.device}
            for config in d.config:  # class first, the claim's last: the claim wins
                env.update({"GPU_MODE": str(config.parameters.get("mode", ""))})
            out.append(PreparedDevice(d, ContainerEdits(env=env)))
        return out

    async def unprepare(self, ref: ClaimRef, devices: Sequence[PreparedDevice]) -> None:
        if ref.name in self.fail_unprepare:
            raise RuntimeError("the device did not reset")
        self.unprepared.append((ref, len(devices)))


@pytest.fixture
async def admin(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with client_for(apiserver, "admin") as client:
        yield client


@pytest.fixture
async def namespace(admin: KubeClient) -> str:
    name = f"dra-{uuid.uuid4().hex[:8]}"
    await admin.create(NAMESPACES, {"metadata": {"name": name}})
    return name


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short directory: socket paths must fit AF_UNIX's 108 bytes (pytest's are longer)."""
    path = Path(tempfile.mkdtemp(prefix="na-dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def bridge() -> AsyncIterator[GrpcBridge]:
    async with open_grpc_bridge() as b:
        yield b


class Driver:
    def __init__(self, tmp: Path, author: Author, client: KubeClient) -> None:
        self.tmp = tmp
        self.author = author
        self.options = KubeletPlugin(
            prepare=author.prepare,
            unprepare=author.unprepare,
            kubelet_dir=str(tmp / "kubelet"),
            cdi_dir=str(tmp / "cdi"),
            kube_client=client,
        )
        self.registration, self.endpoint, self.plugin_dir = self.options.paths(DRIVER)
        self.cdi_dir = tmp / "cdi"

    def serve(self, bridge: GrpcBridge) -> Any:
        return DevicePlugin.serve(
            name=DRIVER,
            registry_dir=str(self.tmp / "agent-registry"),
            pool=NODE,
            kubelet=self.options,
            bridge=bridge,
        )

    def specs(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.glob("*.json")) if self.cdi_dir.exists() else []


async def prepare(
    bridge: GrpcBridge, endpoint: str, *claims: v1.Claim
) -> v1.NodePrepareResourcesResponse:
    async with bridge.channel(endpoint) as channel:
        stub = channel.stub(v1_grpc.DRAPluginStub)
        request = v1.NodePrepareResourcesRequest(claims=list(claims))
        return await bridge.unary(stub.NodePrepareResources, request, timeout=30)


async def unprepare(
    bridge: GrpcBridge, endpoint: str, *claims: v1.Claim
) -> v1.NodeUnprepareResourcesResponse:
    async with bridge.channel(endpoint) as channel:
        stub = channel.stub(v1_grpc.DRAPluginStub)
        request = v1.NodeUnprepareResourcesRequest(claims=list(claims))
        return await bridge.unary(stub.NodeUnprepareResources, request, timeout=30)


async def test_registers_with_the_kubelet_as_upstream_drivers_do(
    tmp_path: Path, bridge: GrpcBridge, admin: KubeClient
) -> None:
    driver = Driver(tmp_path, Author(), admin)
    async with driver.serve(bridge) as plugin:
        assert driver.registration == str(
            tmp_path / "kubelet/plugins_registry" / f"{DRIVER}-reg.sock"
        )
        async with bridge.channel(driver.registration) as channel:
            stub = channel.stub(reg_grpc.RegistrationStub)
            info = await bridge.unary(stub.GetInfo, reg.InfoRequest(), timeout=10)
            assert (info.type, info.name) == ("DRAPlugin", DRIVER)
            assert info.endpoint == str(tmp_path / "kubelet/plugins" / DRIVER / "dra.sock")
            assert list(info.supported_versions) == [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth",
            ]
            status = reg.RegistrationStatus(plugin_registered=True)
            await bridge.unary(stub.NotifyRegistrationStatus, status, timeout=10)
        with trio.fail_after(10):
            await plugin.wait_kubelet_registered()
        # The agent's registration is its own socket, in its own registry, on the native API.
        assert (tmp_path / "agent-registry" / f"{DRIVER}-reg.sock").is_socket()
    assert not await trio.Path(driver.registration).exists()
    assert not await trio.Path(driver.endpoint).exists()


async def test_prepare_writes_a_cdi_spec_and_answers_the_devices(
    tmp_path: Path, bridge: GrpcBridge, admin: KubeClient, namespace: str
) -> None:
    claim = await allocated_claim(
        admin,
        namespace,
        "two",
        ["gpu-0", "gpu-1"],
        class_params={"mode": "a"},
        claim_params={"mode": "b"},
    )
    uid = claim["metadata"]["uid"]
    author = Author()
    driver = Driver(tmp_path, author, admin)
    async with driver.serve(bridge):
        response = await prepare(bridge, driver.endpoint, claim_ref(claim))
    entry = response.claims[uid]
    assert entry.error == ""
    kind = f"k8s.{DRIVER}/device"
    assert [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
        for d in entry.devices
    ] == [
        (["gpu"], NODE, "gpu-0", [f"{kind}={uid}-gpu-0"]),
        (["gpu"], NODE, "gpu-1", [f"{kind}={uid}-gpu-1"]),
    ]
    # The author saw this driver's devices and both configs, the class's first.
    (seen,) = author.prepared
    assert [d.device for d in seen.devices] == ["gpu-0", "gpu-1"]
    assert [(c.source, c.parameters) for c in seen.config] == [
        ("FromClass", {"mode": "a"}),
        ("FromClaim", {"mode": "b"}),
    ]
    assert driver.specs() == [f"k8s.{DRIVER}-device_{uid}.json"]
    spec = json.loads((driver.cdi_dir / driver.specs()[0]).read_text())
    assert (spec["kind"] == kind and spec["cdiVersion"] == "0.5.0") or not uid[0].isdigit()
    envs = {d["name"]: sorted(d["containerEdits"]["env"]) for d in spec["devices"]}
    assert envs == {
        f"{uid}-gpu-0": ["GPU_DEVICE_GPU_0=gpu-0", "GPU_MODE=b"],
        f"{uid}-gpu-1": ["GPU_DEVICE_GPU_1=gpu-1", "GPU_MODE=b"],
    }


async def test_a_repeated_prepare_after_a_restart_is_answered_from_the_checkpoint(
    tmp_path: Path, bridge: GrpcBridge, admin: KubeClient, namespace: str
) -> None:
    claim = await allocated_claim(admin, namespace, "repeat", ["gpu-0"])
    uid = claim["metadata"]["uid"]
    author = Author()
    driver = Driver(tmp_path, author, admin)
    async with driver.serve(bridge):
        first = await prepare(bridge, driver.endpoint, claim_ref(claim))
    # The claim is deleted: a second answer can only come from the checkpoint.
    await admin.delete(CLAIMS, "repeat", namespace)
    (driver.cdi_dir / driver.specs()[0]).unlink()  # and /var/run was cleaned by a reboot
    async with driver.serve(bridge):
        again = await prepare(bridge, driver.endpoint, claim_ref(claim))
    assert again == first and again.claims[uid].error == ""
    assert len(author.prepared) == 1  # the callback ran once
    assert driver.specs() == [f"k8s.{DRIVER}-device_{uid}.json"]  # written again


async def test_unprepare_removes_the_spec_and_an_unknown_claim_succeeds(
    tmp_path: Path, bridge: GrpcBridge, admin: KubeClient, namespace: str
) -> None:
    claim = await allocated_claim(admin, namespace, "gone", ["gpu-0"])
    uid = claim["metadata"]["uid"]
    author = Author()
    driver = Driver(tmp_path, author, admin)
    async with driver.serve(bridge):
        await prepare(bridge, driver.endpoint, claim_ref(claim))
    async with driver.serve(bridge):  # a restart between prepare and unprepare
        response = await unprepare(bridge, driver.endpoint, claim_ref(claim))
        assert response.claims[uid].error == ""
        assert driver.specs() == []
        assert [(ref.uid, n) for ref, n in author.unprepared] == [(uid, 1)]
        stranger = v1.Claim(namespace=namespace, name="never", uid=str(uuid.uuid4()))
        again = await unprepare(bridge, driver.endpoint, claim_ref(claim), stranger)
    assert {k: v.error for k, v in again.claims.items()} == {uid: "", stranger.uid: ""}
    assert len(author.unprepared) == 1  # nothing to undo the second time


async def test_each_claims_error_is_its_own(
    tmp_path: Path, bridge: GrpcBridge, admin: KubeClient, namespace: str
) -> None:
    good = await allocated_claim(admin, namespace, "good", ["gpu-0"])
    busy = await allocated_claim(admin, namespace, "busy", ["gpu-1"])
    pending = json.loads(
        await admin.create(
            CLAIMS,
            {
                "metadata": {"name": "pending"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]
                    }
                },
            },
            namespace,
        )
    )
    replaced = v1.Claim(namespace=namespace, name="good", uid=str(uuid.uuid4()))
    missing = v1.Claim(namespace=namespace, name="missing", uid=str(uuid.uuid4()))
    author = Author()
    author.fail_prepare.add("busy")
    driver = Driver(tmp_path, author, admin)
    async with driver.serve(bridge):
        response = await prepare(
            bridge,
            driver.endpoint,
            claim_ref(good),
            claim_ref(busy),
            claim_ref(pending),
            replaced,
            missing,
        )
        errors = {uid: entry.error for uid, entry in response.claims.items()}
        assert errors[good["metadata"]["uid"]] == ""
        assert errors[busy["metadata"]["uid"]] == f"prepare {namespace}/busy: the device is busy"
        assert errors[pending["metadata"]["uid"]] == f"claim {namespace}/pending is not allocated"
        assert "got replaced" in errors[replaced.uid]
        assert "missing" in errors[missing.uid] and "not found" in errors[missing.uid].lower()
        # Only the good claim is prepared and has a spec; the busy one is retried by the kubelet.
        assert driver.specs() == [f"k8s.{DRIVER}-device_{good['metadata']['uid']}.json"]
        author.fail_unprepare.add("good")
        failed = await unprepare(bridge, driver.endpoint, claim_ref(good))
        assert failed.claims[good["metadata"]["uid"]].error == (
            f"unprepare {namespace}/good: the device did not reset"
        )
        assert len(driver.specs()) == 1  # kept until an unprepare succeeds
        author.fail_unprepare.clear()
        done = await unprepare(bridge, driver.endpoint, claim_ref(good))
        assert done.claims[good["metadata"]["uid"]].error == ""
        assert driver.specs() == []


async def test_the_v1beta1_api_answers_the_same(
    tmp_path: Path, bridge: GrpcBridge, admin: KubeClient, namespace: str
) -> None:
    claim = await allocated_claim(admin, namespace, "beta", ["gpu-0"])
    uid = claim["metadata"]["uid"]
    driver = Driver(tmp_path, Author(), admin)
    async with driver.serve(bridge), bridge.channel(driver.endpoint) as channel:
        stub = channel.stub(v1beta1_grpc.DRAPluginStub)
        ref = v1beta1.Claim(namespace=namespace, name="beta", uid=uid)
        response = await bridge.unary(
            stub.NodePrepareResources, v1beta1.NodePrepareResourcesRequest(claims=[ref]), timeout=30
        )
        (device,) = response.claims[uid].devices
        assert (device.pool_name, device.device_name) == (NODE, "gpu-0")
        assert list(device.cdi_device_ids) == [f"k8s.{DRIVER}/device={uid}-gpu-0"]
        gone = await bridge.unary(
            stub.NodeUnprepareResources,
            v1beta1.NodeUnprepareResourcesRequest(claims=[ref]),
            timeout=30,
        )
        assert gone.claims[uid].error == ""


async def test_health_reaches_the_kubelet_stream_and_an_unhealthy_device_can_be_tainted(
    tmp_path: Path, bridge: GrpcBridge, admin: KubeClient
) -> None:
    driver = Driver(tmp_path, Author(), admin)
    async with driver.serve(bridge) as plugin:
        await plugin.publish([Device("gpu-0"), Device("gpu-1")])
        async with bridge.channel(driver.endpoint) as channel:
            stub = channel.stub(health_grpc.DRAResourceHealthStub)
            async with bridge.server_stream(
                stub.NodeWatchResources, health_pb.NodeWatchResourcesRequest()
            ) as stream:
                first = await anext(stream)
                assert list(first.devices) == []
                await plugin.report_health(
                    "gpu-1", Health.UNHEALTHY, message="ECC errors", taint=True
                )
                update = await anext(stream)
        (h,) = update.devices
        assert (h.device.pool_name, h.device.device_name, h.health, h.message) == (
            NODE,
            "gpu-1",
            health_pb.UNHEALTHY,
            "ECC errors",
        )
        inventory = plugin.latest.value
        assert inventory is not None
        (pool,) = inventory.pools
        taints = {d.name: [(t.key, t.effect) for t in d.taints] for d in pool.devices}
        assert taints == {"gpu-0": [], "gpu-1": [(f"{DRIVER}/unhealthy", "NoSchedule")]}
        await plugin.report_health("gpu-1", Health.HEALTHY)
        inventory = plugin.latest.value
        (pool,) = inventory.pools
        assert all(not d.taints for d in pool.devices)


async def test_node_credentials_read_a_claim_only_once_a_pod_on_the_node_uses_it(
    apiserver: ApiServer, admin: KubeClient, namespace: str
) -> None:
    """Which credentials a driver can read claims with: node-a's, for its own pods' claims."""
    claim = await allocated_claim(admin, namespace, "nodes", ["gpu-0"])
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/nodes"
    status, _ = apiserver.request("GET", path, identity=NODE)
    assert status == 403
    pod = {
        "metadata": {"name": "user"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "nodes"}],
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }
    await admin.create(PODS, pod, namespace)

    def readable() -> bool:
        status, body = apiserver.request("GET", path, identity=NODE)
        return status == 200 and body["metadata"]["uid"] == claim["metadata"]["uid"]

    # The Node authorizer's graph learns of the pod from its informer: wait for it.
    await wait_until(readable, "node-a may read the claim of its pod")
    status, _ = apiserver.request("GET", path, identity="node-b")
    assert status == 403
