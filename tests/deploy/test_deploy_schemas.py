"""Every shipped manifest (deploy/crds, deploy/kubernetes, and the example DRA driver's DaemonSet
examples/dra_gpu_driver-daemonset.yaml) validated offline against the OpenAPI schemas of the
Kubernetes version the test harness runs, strictly (an unknown field is an error):
kubernetes-validate, installed by scripts/deploy-tools. The server-side dry-run on the real
apiserver (test_deploy_daemonset.py) is the check that counts; this one names the field and
needs no cluster."""

from __future__ import annotations

import copy
import re
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # no stubs or py.typed
import pytest

import nodeagent
from tests.deploy.manifests import all_manifest_files, daemonset_container
from tests.support.apiserver import newest_release
from tests.support.crds import REPO_ROOT, load_manifest

GO_MOD = REPO_ROOT / "tests" / "harness" / "apiserver" / "releases" / newest_release() / "go.mod"


def harness_version() -> str:
    """The harness's Kubernetes minor version (kubernetes-validate's schemas are per minor)."""
    match = re.search(r"^\s*k8s\.io/kubernetes v(\d+)\.(\d+)\.\d+", GO_MOD.read_text(), re.M)
    assert match, f"no k8s.io/kubernetes in {GO_MOD}"
    return f"{match[1]}.{match[2]}.0"


MANIFESTS = [(path, doc) for path in all_manifest_files() for doc in load_manifest(path)]
# A DRA driver's own DaemonSet beside the agent (docs/operating/deploying.md).
DRIVER_DAEMONSET = REPO_ROOT / "examples" / "dra_gpu_driver-daemonset.yaml"
EXAMPLES = [(DRIVER_DAEMONSET, doc) for doc in load_manifest(DRIVER_DAEMONSET)]
DOCS = [
    pytest.param(doc, id=f"{path.name}:{doc['kind']}/{doc['metadata']['name']}")
    for path, doc in MANIFESTS + EXAMPLES
]


def test_the_schemas_are_the_harness_version() -> None:
    assert harness_version() == "1.37.0"


@pytest.mark.parametrize("doc", DOCS)
def test_manifest_is_valid_for_the_harness_version(doc: dict[str, Any]) -> None:
    validated = kubernetes_validate.validate(doc, harness_version(), strict=True)
    assert validated == harness_version().rsplit(".", 1)[0]


def test_strict_validation_names_an_unknown_field() -> None:
    (daemonset,) = [doc for _, doc in MANIFESTS if doc["kind"] == "DaemonSet"]
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecond"] = 3
    with pytest.raises(kubernetes_validate.ValidationError) as refused:
        kubernetes_validate.validate(broken, harness_version(), strict=True)
    assert "periodSecond" in refused.value.message


def test_the_daemonset_runs_the_image_of_this_version() -> None:
    # deploy/image/build.sh tags the image with the package version.
    assert daemonset_container()["image"] == f"nodeagent:{nodeagent.__version__}"


def _driver(kind: str) -> dict[str, Any]:
    (doc,) = [doc for _, doc in EXAMPLES if doc["kind"] == kind]
    return doc


def test_the_example_driver_runs_beside_the_agent() -> None:
    """examples/dra_gpu_driver-daemonset.yaml: the agent's image and security context, the
    example script from its ConfigMap, both registrations' and the CDI directories as hostPaths
    at the same paths, and a ServiceAccount that may get ResourceClaims (nothing else)."""
    daemonset = _driver("DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    agent = daemonset_container()
    assert container["image"] == agent["image"] == f"nodeagent:{nodeagent.__version__}"
    assert container["securityContext"] == agent["securityContext"]
    assert container["securityContext"]["runAsUser"] == 0
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["command"] == [
        "python",
        "/app/dra_gpu_driver.py",
        "--registry-dir",
        "/var/lib/nodeagent/plugins_registry",
        "--kubelet-dir",
        "/var/lib/kubelet",
        "--cdi-dir",
        "/var/run/cdi",
    ]
    assert container["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    host_paths = {
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/nodeagent/plugins_registry",
        "/var/run/cdi",
    }
    for path in host_paths:
        assert mounts[path]["hostPath"] == {"path": path, "type": "DirectoryOrCreate"}
    assert {p for p, v in mounts.items() if "hostPath" in v} == host_paths
    assert mounts["/app"]["configMap"]["name"] == "dra-gpu-driver"  # kubectl create configmap
    assert mounts["/tmp"]["emptyDir"]["medium"] == "Memory"
    account = _driver("ServiceAccount")["metadata"]
    assert spec["serviceAccountName"] == account["name"]
    assert _driver("ClusterRole")["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]}
    ]
    binding = _driver("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == _driver("ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    assert account["namespace"] == daemonset["metadata"]["namespace"]
