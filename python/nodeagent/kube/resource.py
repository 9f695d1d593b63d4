"""Resource descriptors: which URL path serves a kind."""

from __future__ import annotations

from urllib.parse import quote

import msgspec


class Resource(msgspec.Struct, frozen=True, kw_only=True):
    """One API resource: ``group`` is "" for the core group."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The request path; a namespaced resource without a namespace means all namespaces."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        elif not self.namespaced and namespace:
            raise ValueError(f"{self.plural} is cluster-scoped: namespace {namespace!r} given")
        base += f"/{self.plural}"
        if name is not None:
            if not name:
                raise ValueError(f"{self.plural}: empty object name")
            base += f"/{quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base


NODES = Resource(group="", version="v1", plural="nodes", kind="Node", namespaced=False)
CONFIGMAPS = Resource(
    group="", version="v1", plural="configmaps", kind="ConfigMap", namespaced=True
)
NAMESPACES = Resource(
    group="", version="v1", plural="namespaces", kind="Namespace", namespaced=False
)
EVENTS = Resource(
    group="events.k8s.io", version="v1", plural="events", kind="Event", namespaced=True
)
CORE_EVENTS = Resource(group="", version="v1", plural="events", kind="Event", namespaced=True)
RESOURCESLICES = Resource(
    group="resource.k8s.io",
    version="v1",
    plural="resourceslices",
    kind="ResourceSlice",
    namespaced=False,
)
RESOURCECLAIMS = Resource(
    group="resource.k8s.io",
    version="v1",
    plural="resourceclaims",
    kind="ResourceClaim",
    namespaced=True,
)
CUSTOMRESOURCEDEFINITIONS = Resource(
    group="apiextensions.k8s.io",
    version="v1",
    plural="customresourcedefinitions",
    kind="CustomResourceDefinition",
    namespaced=False,
)
LEASES = Resource(
    group="coordination.k8s.io", version="v1", plural="leases", kind="Lease", namespaced=True
)
