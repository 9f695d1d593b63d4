"""Kubernetes API client on httpx + msgspec, Trio-native.

async with KubeClient(load_kubeconfig(path)) as client:
    cm = await client.get(CONFIGMAPS, "name", "ns", into=ConfigMap)
"""

from nodeagent.kube.client import KubeClient, ListPage, ListResult, WriteEvent
from nodeagent.kube.informer import Event, Informer, ObjectCache, relist_diff
from nodeagent.kube.kubeconfig import ClusterConfig, in_cluster_config, load_kubeconfig
from nodeagent.kube.resource import (
    CONFIGMAPS,
    CORE_EVENTS,
    CUSTOMRESOURCEDEFINITIONS,
    EVENTS,
    LEASES,
    NAMESPACES,
    NODES,
    RESOURCESLICES,
    Resource,
)
from nodeagent.kube.settings import KubeSettings, load_client
from nodeagent.kube.watch import FeedResult, WatchError, WatchSink

__all__ = [
    "CONFIGMAPS",
    "CORE_EVENTS",
    "CUSTOMRESOURCEDEFINITIONS",
    "EVENTS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "RESOURCESLICES",
    "ClusterConfig",
    "Event",
    "FeedResult",
    "Informer",
    "KubeClient",
    "KubeSettings",
    "ListPage",
    "ListResult",
    "ObjectCache",
    "Resource",
    "WatchError",
    "WatchSink",
    "WriteEvent",
    "in_cluster_config",
    "load_client",
    "load_kubeconfig",
    "relist_diff",
]
