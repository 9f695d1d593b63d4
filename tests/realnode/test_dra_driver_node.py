"""A pod uses a device of the example DRA driver on a real node (docs/testing/real-node.md).

Everything is the real thing: the harness's kube-apiserver, the kube-scheduler and a kubelet of
the same release, containerd with runc, the agent (`nodeagent run`, node-a's credentials)
publishing the driver's pool, and examples/dra_gpu_driver.py (two partitionable GPUs on counter
sets, GPU 1 tainted) preparing claims through the kubelet and CDI. The DeviceClass and the claim
are examples/dra_gpu_driver.yaml's. The harness runs no controller-manager, so the claim the
template describes for a pod is created by the test, as the resourceclaim controller would.

- a pod asking for half a GPU in "shared" mode runs, and its container sees the variables the
  CDI spec injects (GPU_DEVICE_0 = the allocated device, GPU_MODE = shared);
- a pod asking for a whole GPU stays pending: GPU 0 shares its counters with the allocated half,
  GPU 1 is tainted;
- the allocated device turning unhealthy shows in the pod's status (the kubelet's health stream)
  and taints it in the published slice;
- the driver SIGKILLed and restarted while the first pod runs does not disturb it, and the
  restarted driver unprepares its claim when the pod is deleted (the spec file goes).
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec.yaml
import pytest

from tests.support.apiserver import (
    ApiServer,
    harness_features,
    selected_release,
    start_apiserver,
)
from tests.support.realnode import RealNode, real_node_apiserver_kwargs, start_real_node
from tests.support.wait import NotYet, until

pytestmark = pytest.mark.skipif(
    os.environ.get("NODEAGENT_REAL_NODE") != "1",
    reason="real-node lane only: run scripts/test-real-node (sets NODEAGENT_REAL_NODE=1)",
)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.example.com"
NS = "default"
RESOURCECLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"


# What the example uses beyond basic DRA: counter sets, taints, device health. Off by default
# before 1.36: turned on in the apiserver, the scheduler and the kubelet alike where needed.
NEEDED_GATES = ("DRAPartitionableDevices", "DRADeviceTaints", "ResourceHealthStatus")


def needed_gates(release: str) -> dict[str, bool]:
    features = harness_features(release).features
    return {name: True for name in NEEDED_GATES if not features[name].default}


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    d = tmp_path_factory.mktemp("api")
    release = selected_release()
    srv = start_apiserver(
        d,
        release=release,
        gates="default",
        feature_gates=needed_gates(release),
        **real_node_apiserver_kwargs(d),
    )
    with srv:
        yield srv


@pytest.fixture(scope="module")
def node(apiserver: ApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    gates = needed_gates(apiserver.release)
    with start_real_node(apiserver, tmp_path_factory.mktemp("node"), feature_gates=gates) as rn:
        rn.load_images()
        yield rn


class Processes:
    """The agent and the driver as host processes (as systemd would run them)."""

    def __init__(self, apiserver: ApiServer, node: RealNode, work: Path) -> None:
        self.apiserver, self.node, self.work = apiserver, node, work
        self.registry = work / "agent-registry"
        self.health_dir = work / "health"  # the driver's fault injection: a file per sick device
        self.health_dir.mkdir()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.driver: subprocess.Popen[bytes] | None = None

    def _start(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "NODE_NAME": self.node.node_name}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        out = open(self.work / log, "ab")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        out.close()
        self.procs.append(proc)
        return proc

    def start_agent(self) -> None:
        self._start(
            [
                sys.executable, "-m", "nodeagent", "run",
                "--kubeconfig", str(self.apiserver.kubeconfig(self.node.node_name)),
                "--node-name", self.node.node_name,
                "--state-dir", str(self.work / "agent-state"),
                "--registry-dir", str(self.registry),
                "--ops-address", "127.0.0.1:0",
            ],
            "agent.log",
        )  # fmt: skip

    def start_driver(self) -> None:
        # The node's own credentials: the Node authorizer lets them read its pods' claims.
        self.driver = self._start(
            [
                sys.executable, str(ROOT / "examples" / "dra_gpu_driver.py"),
                "--registry-dir", str(self.registry),
                "--kubelet-dir", str(self.node.kubelet_root),
                "--cdi-dir", str(self.node.cdi_dir),
                "--kubeconfig", str(self.apiserver.kubeconfig(self.node.node_name)),
                "--gpus", "2",
                "--tainted", "1",
                "--health-dir", str(self.health_dir),
            ],
            "driver.log",
        )  # fmt: skip

    def kubelet_registrations(self) -> int:
        """How often the driver has said the kubelet registered it (its log, the driver's word)."""
        return (self.work / "driver.log").read_text().count("registered with the kubelet")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def running(
    apiserver: ApiServer, node: RealNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Processes]:
    procs = Processes(apiserver, node, tmp_path_factory.mktemp("procs"))
    try:
        procs.start_agent()
        procs.start_driver()
        yield procs
    finally:
        procs.close()


def example_objects() -> dict[str, dict[str, Any]]:
    """examples/dra_gpu_driver.yaml by kind (what the docs tell a user to apply)."""
    text = (ROOT / "examples" / "dra_gpu_driver.yaml").read_text()
    docs = [msgspec.yaml.decode(doc) for doc in text.split("\n---\n")]
    return {obj["kind"]: obj for obj in docs}


def whole_gpu_template(half: dict[str, Any]) -> dict[str, Any]:
    """The example's template, asking for a whole GPU instead of a half."""
    template = copy.deepcopy(half)
    template["metadata"]["name"] = "whole-gpu"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    request["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.attributes["{DRIVER}"].partition == "whole"'}}
    ]
    return template


def pod_from_example(name: str, template: str, pod_template: dict[str, Any]) -> dict[str, Any]:
    """The example's pod (its claim from `template`), with what the harness needs."""
    pod = copy.deepcopy(pod_template)
    pod["metadata"] = {"name": name, "namespace": NS}
    spec = pod["spec"]
    (claim,) = spec["resourceClaims"]
    claim["resourceClaimTemplateName"] = template
    spec["automountServiceAccountToken"] = False  # the harness runs no token controller
    spec["terminationGracePeriodSeconds"] = 5
    (container,) = spec["containers"]
    container["image"] = "localhost/busybox:e2e"  # built locally, no registry
    container["imagePullPolicy"] = "Never"
    container["command"] = [
        "/bin/sh",
        "-c",
        'env | grep ^GPU_ | sort; trap "exit 0" TERM; while :; do sleep 1; done',
    ]
    return pod


def claim_for_pod(apiserver: ApiServer, pod: dict[str, Any], template: dict[str, Any]) -> str:
    """What kube-controller-manager's resourceclaim controller does for a pod's template claim
    (the harness runs no controller-manager): the claim, owned by the pod, and its name in the
    pod's status, where the scheduler and the kubelet look it up."""
    (entry,) = pod["spec"]["resourceClaims"]
    name = f"{pod['metadata']['name']}-{entry['name']}"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "annotations": {"resource.kubernetes.io/pod-claim-name": entry["name"]},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": copy.deepcopy(template["spec"]["spec"]),
    }
    create(apiserver, RESOURCECLAIMS, claim)
    patch = {
        "status": {"resourceClaimStatuses": [{"name": entry["name"], "resourceClaimName": name}]}
    }
    status, body = apiserver.request(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status",
        json.dumps(patch).encode(),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert status == 200, body
    return name


def create(apiserver: ApiServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = apiserver.request("POST", path, body)
    assert status == 201, answer
    return dict(answer)


def specs(node: RealNode) -> list[str]:
    return sorted(p.name for p in node.cdi_dir.glob("*.json"))


def test_a_pod_runs_with_a_prepared_device_and_a_second_stays_pending(
    apiserver: ApiServer, node: RealNode, running: Processes
) -> None:
    objects = example_objects()

    def published() -> list[str] | None:
        status, body = apiserver.request(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver={DRIVER}"
        )
        names = (
            [d["name"] for s in body.get("items", []) for d in s["spec"].get("devices", [])]
            if status == 200
            else []
        )
        return names if len(names) == 6 else None

    until(published, "the agent to publish the driver's 6 devices", timeout=120)
    until(lambda: running.kubelet_registrations() == 1, "the kubelet to register the driver")
    half = objects["ResourceClaimTemplate"]
    whole = whole_gpu_template(half)
    create(apiserver, "/apis/resource.k8s.io/v1/deviceclasses", objects["DeviceClass"])
    for template in (half, whole):
        create(
            apiserver, f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates", template
        )

    # The first pod: half a GPU, "shared" mode (the template's config over the class's).
    t0 = time.monotonic()
    user = create(
        apiserver,
        f"/api/v1/namespaces/{NS}/pods",
        pod_from_example("half-user", half["metadata"]["name"], objects["Pod"]),
    )
    claim_name = claim_for_pod(apiserver, user, half)
    pod = node.wait_pod_phase("half-user", ["Running"], timeout=180, namespace=NS)
    took = time.monotonic() - t0
    status, claim = apiserver.request("GET", f"{RESOURCECLAIMS}/{claim_name}")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["device"] in {"gpu-0-a", "gpu-0-b"}  # GPU 1 is tainted
    assert pod["spec"]["nodeName"] == node.node_name

    def log() -> str | None:
        status, body = apiserver.request("GET", f"/api/v1/namespaces/{NS}/pods/half-user/log")
        return str(body) if status == 200 and "GPU_MODE" in str(body) else None

    lines = until(log, "the container's environment in its log").split()
    assert lines == [f"GPU_DEVICE_0={result['device']}", "GPU_MODE=shared"]
    uid = claim["metadata"]["uid"]
    assert specs(node) == [f"k8s.{DRIVER}-gpu_{uid}.json"]
    print(f"\npod created -> Running with a prepared device: {took:.1f} s")

    # The second: a whole GPU. gpu-0's counters are half used, gpu-1 is tainted: pending.
    other = create(
        apiserver,
        f"/api/v1/namespaces/{NS}/pods",
        pod_from_example("whole-user", "whole-gpu", objects["Pod"]),
    )
    claim_for_pod(apiserver, other, whole)

    def unschedulable() -> str | None:
        found = node.pod("whole-user", NS)
        conditions = {c["type"]: c for c in (found or {}).get("status", {}).get("conditions", [])}
        scheduled = conditions.get("PodScheduled", {})
        return scheduled.get("message") if scheduled.get("reason") == "Unschedulable" else None

    message = until(unschedulable, "the scheduler to find no device for the whole GPU", timeout=120)
    assert "cannot allocate all claims" in message or "resourceclaim" in message.lower(), message
    assert node.pod("whole-user", NS)["spec"].get("nodeName") is None  # type: ignore[index]

    # The allocated device fails: the kubelet shows it in the pod's status (DRAResourceHealth),
    # and the driver taints it in the published pool.
    (running.health_dir / result["device"]).write_text("ECC errors")

    def unhealthy_in_pod_status() -> list[Any] | NotYet:
        found = node.pod("half-user", NS) or {}
        statuses = found.get("status", {}).get("containerStatuses", [])
        resources = [
            r
            for c in statuses
            for a in c.get("allocatedResourcesStatus") or []
            for r in a.get("resources") or []
        ]
        # The kubelet names a resource by its CDI device ID (<kind>=<claim UID>-<device>).
        sick = [r for r in resources if r.get("resourceID", "").endswith("-" + result["device"])]
        if sick and sick[0].get("health") == "Unhealthy":
            return sick
        return NotYet([c.get("allocatedResourcesStatus") for c in statuses])

    until(unhealthy_in_pod_status, "the pod's status to show its device Unhealthy", timeout=120)

    def tainted() -> list[Any] | NotYet:
        _, body = apiserver.request(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver={DRIVER}"
        )
        devices = [d for s in body.get("items", []) for d in s["spec"].get("devices", [])]
        taints = [t for d in devices if d["name"] == result["device"] for t in d.get("taints", [])]
        return taints if any(t["key"] == f"{DRIVER}/unhealthy" for t in taints) else NotYet(taints)

    until(tainted, "the unhealthy device tainted in the published slice", timeout=60)
    (running.health_dir / result["device"]).unlink()

    # The driver killed and restarted while the pod runs: the pod is not disturbed.
    assert running.driver is not None
    running.driver.send_signal(signal.SIGKILL)
    running.driver.wait()
    running.start_driver()
    until(lambda: running.kubelet_registrations() == 2, "the kubelet to register it again")
    after = node.pod("half-user", NS)
    assert after is not None and after["status"]["phase"] == "Running"
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0

    # Deleted: the kubelet unprepares the claim through the restarted driver; the spec goes.
    status, body = apiserver.request("DELETE", f"/api/v1/namespaces/{NS}/pods/half-user")
    assert status == 200, body
    node.wait_pod_gone("half-user", timeout=120, namespace=NS)
    until(lambda: specs(node) == [], "the claim's CDI spec to be removed", timeout=120)
