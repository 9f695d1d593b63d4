"""The shipped manifests (deploy/crds, deploy/kubernetes) as objects, applied the way an operator
does (server-side apply, dry-run first), and the DaemonSet's pod identity made real on a test
apiserver: a Pod object bound to a node and a TokenRequest token bound to that Pod."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Mapping
from typing import Any

import msgspec

from nodeagent.kube import KubeClient, errors
from tests.support.crds import FIELD_MANAGER, REPO_ROOT, load_manifest
from tests.support.resources import PODS

__all__ = [
    "CRD_DIR",
    "HOST_STATE",
    "KUBERNETES_DIR",
    "NAMESPACE",
    "SERVICE_ACCOUNT",
    "all_manifest_files",
    "apply_all",
    "create_pod",
    "daemonset_args",
    "daemonset_container",
    "daemonset_pod_spec",
    "delete_pod",
    "pod_token",
]

CRD_DIR = REPO_ROOT / "deploy" / "crds"
KUBERNETES_DIR = REPO_ROOT / "deploy" / "kubernetes"
NAMESPACE = SERVICE_ACCOUNT = "nodeagent"
# Objects others depend on (a namespaced object's Namespace, a custom resource's CRD) are
# applied first, each right after its own dry-run; everything else is dry-run against them.
_FIRST_KINDS = ("CustomResourceDefinition", "Namespace")


def all_manifest_files() -> list[pathlib.Path]:
    """Every manifest an operator installs: the CRDs, then deploy/kubernetes."""
    return sorted(CRD_DIR.glob("*.yaml")) + sorted(KUBERNETES_DIR.glob("*.yaml"))


async def _apply(client: KubeClient, doc: Mapping[str, Any], *, dry_run: bool) -> None:
    resource = await client.discover(doc["apiVersion"], doc["kind"])
    namespace = doc["metadata"].get("namespace") if resource.namespaced else None
    params = {"fieldManager": FIELD_MANAGER, "force": "true"}
    if dry_run:
        params["dryRun"] = "All"
    await client.request(
        "PATCH",
        resource.path(namespace, doc["metadata"]["name"]),
        params=params,
        body=msgspec.json.encode(doc),
        content_type="application/apply-patch+yaml",
        verb="apply",
        resource=resource.plural,
    )


async def apply_all(client: KubeClient) -> list[tuple[str, str]]:
    """Server-side apply every object of every manifest, each dry-run first (a dry-run failure
    raises before that object is written); the (kind, name) of each, in apply order."""
    docs = [doc for path in all_manifest_files() for doc in load_manifest(path)]
    first = [d for d in docs if d["kind"] in _FIRST_KINDS]
    rest = [d for d in docs if d["kind"] not in _FIRST_KINDS]
    for doc in first:
        await _apply(client, doc, dry_run=True)
        await _apply(client, doc, dry_run=False)
    for doc in rest:
        await _apply(client, doc, dry_run=True)
    for doc in rest:
        await _apply(client, doc, dry_run=False)
    return [(d["kind"], d["metadata"]["name"]) for d in first + rest]


def _daemonset() -> dict[str, Any]:
    (daemonset,) = [
        doc
        for path in sorted(KUBERNETES_DIR.glob("*.yaml"))
        for doc in load_manifest(path)
        if doc["kind"] == "DaemonSet"
    ]
    return daemonset


def daemonset_pod_spec() -> dict[str, Any]:
    """The pod template's spec of the shipped DaemonSet (the one in deploy/kubernetes)."""
    spec: dict[str, Any] = _daemonset()["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == SERVICE_ACCOUNT
    return spec


def daemonset_container() -> dict[str, Any]:
    """The agent container of the shipped DaemonSet."""
    (container,) = daemonset_pod_spec()["containers"]
    result: dict[str, Any] = container
    return result


# The container's hostPath volume.
HOST_STATE = "/var/lib/nodeagent"


def daemonset_args(state_root: str, ops_port: int, public_port: int) -> list[str]:
    """The DaemonSet container's args as a test on the host's network runs them: the hostPath
    ``/var/lib/nodeagent`` at ``state_root``, both listeners on loopback at the given ports (the
    manifest's full ops endpoint is on the pod's loopback already, which the assertion keeps)."""
    args = []
    for arg in daemonset_container()["args"]:
        if arg.startswith("--ops-address="):
            assert arg == "--ops-address=127.0.0.1:9464", "the full ops endpoint stays in the pod"
            arg = f"--ops-address=127.0.0.1:{ops_port}"
        elif arg.startswith("ops.public_address="):
            assert arg == 'ops.public_address="0.0.0.0:9465"'
            arg = f'ops.public_address="127.0.0.1:{public_port}"'
        args.append(arg.replace(HOST_STATE, state_root))
    return args


async def create_pod(admin: KubeClient, name: str, node: str) -> dict[str, Any]:
    """The Pod the DaemonSet controller would create on ``node``: the shipped pod template (so
    the apiserver admits its spec: priority class, service account, security context, volumes)
    bound to the node. No kubelet runs it: it gives the token a pod to be bound to, and so a node
    to name."""
    template = _daemonset()["spec"]["template"]
    pod = {
        "metadata": template["metadata"] | {"name": name},
        "spec": template["spec"] | {"nodeName": node},
    }
    created: dict[str, Any] = msgspec.json.decode(await admin.create(PODS, pod, NAMESPACE))
    return created


async def delete_pod(admin: KubeClient, name: str) -> None:
    # No kubelet acknowledges a graceful delete: remove at once.
    with contextlib.suppress(errors.NotFound):
        await admin.delete(PODS, name, NAMESPACE, grace_period_seconds=0)


async def pod_token(admin: KubeClient, pod: Mapping[str, Any] | None, seconds: int = 3600) -> str:
    """What the kubelet mounts into the pod: a TokenRequest token of the service account, bound
    to ``pod`` (so it carries the pod's node name); None: a token bound to nothing."""
    spec: dict[str, Any] = {"expirationSeconds": seconds}
    if pod is not None:
        ref = {"kind": "Pod", "apiVersion": "v1"}
        spec["boundObjectRef"] = ref | {k: pod["metadata"][k] for k in ("name", "uid")}
    body = {"apiVersion": "authentication.k8s.io/v1", "spec": spec}
    answer = await admin.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{SERVICE_ACCOUNT}/token",
        body=msgspec.json.encode(body),
        content_type="application/json",
        verb="create",
        resource="serviceaccounts",
        idempotent=False,
    )
    token: str = msgspec.json.decode(answer)["status"]["token"]
    return token
