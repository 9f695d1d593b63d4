"""Install the shipped CustomNodeResource CRD and node access manifests on a test apiserver.

The manifests are the files in ``deploy/`` themselves (applied document by document with
server-side apply), so a test that passes proves what an operator installs::

    await install_cnr_crd(admin)  # the CRD, Established and served
    await install_cnr_node_access(admin, node_a, "node-a")  # RBAC + admission policy, enforced
"""

from __future__ import annotations

import contextlib
import pathlib
import re
from collections.abc import Mapping
from typing import Any

import msgspec
import msgspec.yaml
import trio

from nodeagent.kube import (
    CUSTOMRESOURCEDEFINITIONS,
    KubeClient,
    Resource,
    WatchRequest,
    errors,
    run_watch,
)
from tests.support.watch import EventSink

__all__ = [
    "CNR",
    "CNR_CRD_FILE",
    "CNR_CRD_NAME",
    "CNR_NODE_ACCESS_FILE",
    "CNR_POLICY_NAME",
    "PROBE_INTERVAL",
    "REPO_ROOT",
    "WAIT_SECONDS",
    "apply_manifest",
    "cnr",
    "install_cnr_crd",
    "install_cnr_node_access",
    "load_manifest",
    "until_cnr_access_enforced",
]

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CNR_CRD_FILE = REPO_ROOT / "deploy" / "crds" / "node.katalyst.kubewharf.io_customnoderesources.yaml"
CNR_NODE_ACCESS_FILE = REPO_ROOT / "deploy" / "kubernetes" / "cnr-node-access.yaml"
CNR_CRD_NAME = "customnoderesources.node.katalyst.kubewharf.io"
CNR_POLICY_NAME = "nodeagent-cnr-own-node"
CNR = Resource(
    group="node.katalyst.kubewharf.io",
    version="v1alpha1",
    plural="customnoderesources",
    kind="CustomNodeResource",
    namespaced=False,
)
FIELD_MANAGER = "nodeagent-tests"
# Deadline of each wait on the apiserver (a CRD is established in well under a second; the
# margin is for a loaded 2-core machine).
WAIT_SECONDS = 60.0
# Pause between probes where the apiserver offers no event to wait on (see _until_served).
PROBE_INTERVAL = 0.05


def load_manifest(path: pathlib.Path) -> list[dict[str, Any]]:
    """The YAML documents of a manifest file (empty documents, e.g. a leading ``---``, dropped).

    Documents are split at ``---`` lines (msgspec decodes one document at a time), which holds for
    the files in ``deploy/``: none has such a line inside a block scalar."""
    text = path.read_text(encoding="utf-8")
    parts = (msgspec.yaml.decode(part) for part in re.split(r"^---[ \t]*$", text, flags=re.M))
    docs = [d for d in parts if d is not None]
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            raise ValueError(f"{path}: document {i} is not a Kubernetes object")
    return docs


async def apply_manifest(client: KubeClient, path: pathlib.Path) -> list[Resource]:
    """Server-side apply every object of ``path`` (forced: the tests own these objects); the
    resource of each object, in file order."""
    applied = []
    for doc in load_manifest(path):
        resource = await client.discover(doc["apiVersion"], doc["kind"])
        namespace = doc["metadata"].get("namespace") if resource.namespaced else None
        await client.apply(resource, doc, namespace, field_manager=FIELD_MANAGER, force=True)
        applied.append(resource)
    return applied


def cnr(name: str, **fields: Any) -> dict[str, Any]:
    """A CustomNodeResource body named ``name`` with ``spec``/``status``/``metadata`` extras."""
    meta = {"name": name, **fields.pop("metadata", {})}
    return {"apiVersion": CNR.api_version, "kind": CNR.kind, "metadata": meta, **fields}


class _Established(EventSink):
    """Sets ``established`` once the watched CRD carries Established=True."""

    def __init__(self) -> None:
        super().__init__()
        self.established = trio.Event()

    async def list_page(self, page: bytes) -> None:
        for item in msgspec.json.decode(page).get("items") or []:
            self.on_event("ADDED", item)

    def on_event(self, type: str, obj: dict[str, Any]) -> None:
        conditions = (obj.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            self.established.set()


async def _until_established(client: KubeClient, crd_name: str) -> None:
    sink = _Established()
    request = WatchRequest(CUSTOMRESOURCEDEFINITIONS, field_selector=f"metadata.name={crd_name}")
    with trio.fail_after(WAIT_SECONDS):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_watch, client, request, sink)
            await sink.established.wait()
            nursery.cancel_scope.cancel()


async def _until_served(client: KubeClient, resource: Resource) -> None:
    # Established is set by the apiserver's establishing controller; the handler that serves the
    # resource reads the CRD through its own informer, which may be a moment behind, and nothing
    # announces when it has caught up. So probe with a list until it answers.
    with trio.fail_after(WAIT_SECONDS):
        while True:
            with contextlib.suppress(errors.NotFound):
                await client.list(resource, page_size=1)
                return
            await trio.sleep(PROBE_INTERVAL)


async def install_cnr_crd(client: KubeClient) -> None:
    """Apply ``deploy/crds``'s CustomNodeResource CRD (idempotent: re-applying the same manifest
    changes nothing) and return once it is Established and its resource answers."""
    await apply_manifest(client, CNR_CRD_FILE)
    await _until_established(client, CNR_CRD_NAME)
    await _until_served(client, CNR)


async def _refused_by_policy(client: KubeClient, name: str, policy: str) -> bool:
    """Whether a dry-run create of CNR ``name`` by ``client`` is refused by ``policy`` (False if
    it is allowed, or refused for another reason such as RBAC not yet in force)."""
    try:
        await _dry_run_create(client, cnr(name))
    except errors.ApiError as exc:
        return policy in exc.message
    return False


async def _allowed_own(client: KubeClient, node: str) -> bool:
    try:
        await _dry_run_create(client, cnr(node))
    except errors.Forbidden:
        return False
    except errors.AlreadyExists:
        pass  # RBAC let the create through to storage, which is all this probe asks
    return True


async def _dry_run_create(client: KubeClient, body: Mapping[str, Any]) -> None:
    await client.request(
        "POST",
        CNR.path(),
        params={"dryRun": "All"},
        body=msgspec.json.encode(body),
        content_type="application/json",
        verb="create",
        resource=CNR.plural,
        idempotent=False,
    )


async def until_cnr_access_enforced(client: KubeClient, node: str, policy: str) -> None:
    """Return once ``client``, acting for ``node``, may create the CNR ``node`` (RBAC in force)
    and ``policy`` refuses it another name. The apiserver reads roles and admission policies
    through informers, with no event for "now enforced", so this probes with dry-run creates
    (nothing is written)."""
    with trio.fail_after(WAIT_SECONDS):
        while True:
            if await _allowed_own(client, node) and await _refused_by_policy(
                client, f"{node}-not-mine", policy
            ):
                return
            await trio.sleep(PROBE_INTERVAL)


async def install_cnr_node_access(admin: KubeClient, node_client: KubeClient, node: str) -> None:
    """Apply ``deploy/kubernetes/cnr-node-access.yaml`` and return once both halves are in force
    for ``node_client`` (user ``system:node:<node>``): RBAC lets it create its own CNR and the
    admission policy refuses another name."""
    await apply_manifest(admin, CNR_NODE_ACCESS_FILE)
    await until_cnr_access_enforced(node_client, node, CNR_POLICY_NAME)
