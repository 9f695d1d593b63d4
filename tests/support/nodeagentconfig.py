"""Install the shipped NodeAgentConfig CRD on a test apiserver (the file in ``deploy/crds/``
itself, as an operator installs it), and build NodeAgentConfig bodies::

    await install_nodeagentconfig_crd(admin)  # the CRD, Established and served
    await admin.create(NAC, nodeagentconfig("web", spec={"priority": 5, "config": {...}}))
"""

from __future__ import annotations

from typing import Any

import msgspec

from nodeagent.dynconfig.source import GROUP, KIND, PLURAL, VERSION
from nodeagent.kube import KubeClient, Resource
from tests.support.crds import REPO_ROOT, _until_established, _until_served, apply_manifest
from tests.support.resources import CRDS

__all__ = [
    "NAC",
    "NAC_CRD_FILE",
    "NAC_CRD_NAME",
    "install_nodeagentconfig_crd",
    "loosen_nodeagentconfig_crd",
    "nodeagentconfig",
]

NAC_CRD_FILE = REPO_ROOT / "deploy" / "crds" / "nodeagent.io_nodeagentconfigs.yaml"
NAC_CRD_NAME = f"{PLURAL}.{GROUP}"
NAC = Resource(group=GROUP, version=VERSION, plural=PLURAL, kind=KIND, namespaced=False)


def nodeagentconfig(name: str, **fields: Any) -> dict[str, Any]:
    """A NodeAgentConfig body named ``name`` with ``spec``/``metadata`` extras."""
    meta = {"name": name, **fields.pop("metadata", {})}
    return {"apiVersion": NAC.api_version, "kind": NAC.kind, "metadata": meta, **fields}


async def install_nodeagentconfig_crd(client: KubeClient) -> None:
    """Apply the NodeAgentConfig CRD (idempotent) and return once it is Established and its
    resource answers."""
    await apply_manifest(client, NAC_CRD_FILE)
    await _until_established(client, NAC_CRD_NAME)
    await _until_served(client, NAC)


async def loosen_nodeagentconfig_crd(client: KubeClient) -> None:
    """Make the installed CRD looser than the agent's (an older or edited CRD): `spec.config`
    kept as written, so only the agent's own validation stands between a bad config (a static
    field, a misspelt one) and the node."""
    crd = msgspec.json.decode(await client.get(CRDS, NAC_CRD_NAME))
    for version in crd["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec["properties"]["config"] = {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
    await client.update(CRDS, crd)
