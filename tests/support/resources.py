"""Kinds the tests create or clean up that the agent itself never touches (the agent's own kinds
are in `nodeagent.kube.resource`)."""

from __future__ import annotations

from nodeagent.kube.resource import Resource

__all__ = [
    "CLUSTERROLEBINDINGS",
    "CLUSTERROLES",
    "CRDS",
    "PODS",
    "ROLEBINDINGS",
    "ROLES",
    "SECRETS",
    "SERVICEACCOUNTS",
]

_RBAC = "rbac.authorization.k8s.io"

SECRETS = Resource(group="", version="v1", plural="secrets", kind="Secret", namespaced=True)
PODS = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
SERVICEACCOUNTS = Resource(
    group="", version="v1", plural="serviceaccounts", kind="ServiceAccount", namespaced=True
)
ROLES = Resource(group=_RBAC, version="v1", plural="roles", kind="Role", namespaced=True)
ROLEBINDINGS = Resource(
    group=_RBAC, version="v1", plural="rolebindings", kind="RoleBinding", namespaced=True
)
CLUSTERROLES = Resource(
    group=_RBAC, version="v1", plural="clusterroles", kind="ClusterRole", namespaced=False
)
CLUSTERROLEBINDINGS = Resource(
    group=_RBAC,
    version="v1",
    plural="clusterrolebindings",
    kind="ClusterRoleBinding",
    namespaced=False,
)
CRDS = Resource(
    group="apiextensions.k8s.io",
    version="v1",
    plural="customresourcedefinitions",
    kind="CustomResourceDefinition",
    namespaced=False,
)
