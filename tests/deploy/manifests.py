"""The shipped manifests (deploy/crds, deploy/kubernetes) as objects, applied the way an operator
does (server-side apply, dry-run first), and the DaemonSet's pod identity made real on a test
apiserver: a Pod object bound to a node and a TokenRequest token bound to that Pod.

The same for the Helm chart's objects (deploy/helm/nodeagent rendered by `helm template`): an
:class:`Install` is one set of objects, the plain manifests (PLAIN, the default everywhere) or a
chart release (:func:`chart_install`), with its namespace, service account and names."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import trio

from nodeagent.kube import KubeClient, errors
from tests.support.crds import FIELD_MANAGER, REPO_ROOT, _until_established, load_manifest
from tests.support.resources import PODS

__all__ = [
    "CHART_RELEASE",
    "CHART_VALUES",
    "CONFIG_FILE",
    "CRD_DIR",
    "HOST_STATE",
    "KUBERNETES_DIR",
    "NAMESPACE",
    "PLAIN",
    "SERVICE_ACCOUNT",
    "Install",
    "all_manifest_files",
    "apply_all",
    "apply_docs",
    "chart_install",
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


# The container's hostPath volume.
HOST_STATE = "/var/lib/nodeagent"
# Where the chart mounts the agent's config file (values: config), when it has one.
CONFIG_FILE = "/etc/nodeagent/config.toml"
# The chart release the tests install next to (or instead of) the plain manifests, and its
# values: another release name, namespace, service account, host directory, ports and a config.
CHART_RELEASE = ("edge", "node-agents")
CHART_VALUES = pathlib.Path(__file__).parent / "helm-values-full.yaml"
# The Prometheus Operator's CRDs the chart's monitoring objects need.
MONITORING_CRDS = ("podmonitors.yaml", "servicemonitors.yaml", "prometheusrules.yaml")


@dataclasses.dataclass(frozen=True)
class Install:
    """One way of installing the agent: its objects (CRDs included) and the names a test needs."""

    name: str
    docs: tuple[dict[str, Any], ...]
    namespace: str
    service_account: str
    # The admission policies' names are "<prefix>-resourceslices-own-node-sa", ...
    policy_prefix: str

    def daemonset(self) -> dict[str, Any]:
        (daemonset,) = [doc for doc in self.docs if doc["kind"] == "DaemonSet"]
        return daemonset

    def host_state(self) -> str:
        return self.host_path("state")

    def host_runtime(self) -> str:
        """The runtime directory's hostPath (agent.runtime_dir through RUNTIME_DIRECTORY)."""
        return self.host_path("runtime")

    def host_path(self, volume: str) -> str:
        volumes = self.daemonset()["spec"]["template"]["spec"]["volumes"]
        (path,) = [v["hostPath"]["path"] for v in volumes if v["name"] == volume]
        assert isinstance(path, str)
        return path

    def config_toml(self) -> str | None:
        """The agent's config file the chart renders (its ConfigMap), None without one."""
        maps = [
            doc["data"]["config.toml"]
            for doc in self.docs
            if doc["kind"] == "ConfigMap" and "config.toml" in doc.get("data", {})
        ]
        assert len(maps) <= 1
        return maps[0] if maps else None


def _plain() -> Install:
    docs = tuple(doc for path in all_manifest_files() for doc in load_manifest(path))
    return Install("plain manifests", docs, NAMESPACE, SERVICE_ACCOUNT, "nodeagent")


PLAIN = _plain()


@functools.cache
def chart_install() -> Install:
    """The chart, release CHART_RELEASE rendered with CHART_VALUES (`helm template
    --include-crds`; the Namespace comes from the values, as `--create-namespace` would)."""
    from tests.support.helm import prometheus_operator_crds, template  # builds helm on first use

    release, namespace = CHART_RELEASE
    # The values enable the monitoring objects: the Prometheus Operator's CRDs come first.
    operator = [
        doc
        for path in prometheus_operator_crds()
        if path.name.split("_")[1] in MONITORING_CRDS
        for doc in load_manifest(path)
    ]
    docs = tuple(operator + template(release, namespace, [CHART_VALUES], include_crds=True))
    # The agent's account (the rollout controller has its own).
    (account,) = [
        d["spec"]["template"]["spec"]["serviceAccountName"]
        for d in docs
        if d["kind"] == "DaemonSet"
    ]
    return Install("chart", docs, namespace, account, f"{release}-nodeagent")


async def _apply(
    client: KubeClient, doc: Mapping[str, Any], *, dry_run: bool, strict: bool = False
) -> None:
    resource = await client.discover(doc["apiVersion"], doc["kind"])
    namespace = doc["metadata"].get("namespace") if resource.namespaced else None
    params = {"fieldManager": FIELD_MANAGER, "force": "true"}
    if dry_run:
        params["dryRun"] = "All"
    if strict:  # an unknown or duplicate field is an error, not a warning
        params["fieldValidation"] = "Strict"
    await client.request(
        "PATCH",
        resource.path(namespace, doc["metadata"]["name"]),
        params=params,
        body=msgspec.json.encode(doc),
        content_type="application/apply-patch+yaml",
        verb="apply",
        resource=resource.plural,
    )


async def _until_served(client: KubeClient, crd: Mapping[str, Any]) -> None:
    """Return once the CRD is Established and its kind is discovered and listed (the serving
    handler follows Established through an informer of its own, with no signal to wait for)."""
    await _until_established(client, crd["metadata"]["name"])
    (version,) = [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
    api_version = f"{crd['spec']['group']}/{version}"
    with trio.fail_after(60):
        while True:
            with contextlib.suppress(errors.NotFound):
                resource = await client.discover(api_version, crd["spec"]["names"]["kind"])
                await client.list(resource, page_size=1)
                return
            await trio.sleep(0.05)


async def apply_docs(
    client: KubeClient, docs: Sequence[Mapping[str, Any]], *, strict: bool = False
) -> list[tuple[str, str]]:
    """Server-side apply ``docs``, each dry-run first (a dry-run failure raises before that object
    is written): CRDs and Namespaces first, then the rest all dry-run before any is written;
    ``strict``: with fieldValidation=Strict. The (kind, name) of each, in apply order."""
    first = [d for d in docs if d["kind"] in _FIRST_KINDS]
    rest = [d for d in docs if d["kind"] not in _FIRST_KINDS]
    for doc in first:
        await _apply(client, doc, dry_run=True, strict=strict)
        await _apply(client, doc, dry_run=False, strict=strict)
    for doc in first:
        if doc["kind"] == "CustomResourceDefinition":
            await _until_served(client, doc)
    for doc in rest:
        await _apply(client, doc, dry_run=True, strict=strict)
    for doc in rest:
        await _apply(client, doc, dry_run=False, strict=strict)
    return [(d["kind"], d["metadata"]["name"]) for d in first + rest]


async def apply_all(client: KubeClient, install: Install = PLAIN) -> list[tuple[str, str]]:
    """Server-side apply every object of ``install`` (default: every shipped manifest), each
    dry-run first; the (kind, name) of each, in apply order."""
    return await apply_docs(client, install.docs)


def daemonset_pod_spec(install: Install = PLAIN) -> dict[str, Any]:
    """The pod template's spec of the DaemonSet (default: the one in deploy/kubernetes)."""
    spec: dict[str, Any] = install.daemonset()["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == install.service_account
    return spec


def daemonset_container(install: Install = PLAIN) -> dict[str, Any]:
    """The agent container of the DaemonSet."""
    (container,) = daemonset_pod_spec(install)["containers"]
    result: dict[str, Any] = container
    return result


def daemonset_args(
    state_root: str,
    ops_port: int,
    public_port: int,
    install: Install = PLAIN,
    config_file: str | None = None,
) -> list[str]:
    """The DaemonSet container's args as a test on the host's network runs them: the hostPath at
    ``state_root``, both listeners on loopback at the given ports (the manifest's full ops
    endpoint is on the pod's loopback already, which the assertion keeps), the chart's config
    file (mounted at CONFIG_FILE) at ``config_file``."""
    args = []
    for arg in daemonset_container(install)["args"]:
        if arg.startswith("--ops-address="):
            assert arg.startswith("--ops-address=127.0.0.1:"), (
                "the full ops endpoint stays in the pod"
            )
            arg = f"--ops-address=127.0.0.1:{ops_port}"
        elif arg.startswith("ops.public_address="):
            assert arg.startswith('ops.public_address="0.0.0.0:')
            arg = f'ops.public_address="127.0.0.1:{public_port}"'
        elif arg == f"--config={CONFIG_FILE}":
            assert config_file is not None, "the DaemonSet reads a config file"
            arg = f"--config={config_file}"
        args.append(arg.replace(install.host_state(), state_root))
    return args


async def create_pod(
    admin: KubeClient, name: str, node: str, install: Install = PLAIN
) -> dict[str, Any]:
    """The Pod the DaemonSet controller would create on ``node``: the DaemonSet's pod template (so
    the apiserver admits its spec: priority class, service account, security context, volumes)
    bound to the node. No kubelet runs it: it gives the token a pod to be bound to, and so a node
    to name."""
    template = install.daemonset()["spec"]["template"]
    pod = {
        "metadata": template["metadata"] | {"name": name},
        "spec": template["spec"] | {"nodeName": node},
    }
    answer = await admin.create(PODS, pod, install.namespace)
    created: dict[str, Any] = msgspec.json.decode(answer)
    return created


async def delete_pod(admin: KubeClient, name: str, install: Install = PLAIN) -> None:
    # No kubelet acknowledges a graceful delete: remove at once.
    with contextlib.suppress(errors.NotFound):
        await admin.delete(PODS, name, install.namespace, grace_period_seconds=0)


async def pod_token(
    admin: KubeClient,
    pod: Mapping[str, Any] | None,
    seconds: int = 3600,
    install: Install = PLAIN,
) -> str:
    """What the kubelet mounts into the pod: a TokenRequest token of the service account, bound
    to ``pod`` (so it carries the pod's node name); None: a token bound to nothing."""
    spec: dict[str, Any] = {"expirationSeconds": seconds}
    if pod is not None:
        ref = {"kind": "Pod", "apiVersion": "v1"}
        spec["boundObjectRef"] = ref | {k: pod["metadata"][k] for k in ("name", "uid")}
    body = {"apiVersion": "authentication.k8s.io/v1", "spec": spec}
    answer = await admin.request(
        "POST",
        f"/api/v1/namespaces/{install.namespace}/serviceaccounts/{install.service_account}/token",
        body=msgspec.json.encode(body),
        content_type="application/json",
        verb="create",
        resource="serviceaccounts",
        idempotent=False,
    )
    token: str = msgspec.json.decode(answer)["status"]["token"]
    return token
