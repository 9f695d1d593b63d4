"""Kubernetes API client on httpx + msgspec, Trio-native.

async with KubeClient(load_kubeconfig(path)) as client:
    cm = await client.get(CONFIGMAPS, "name", "ns", into=ConfigMap)
    await run_watch(client, WatchRequest(CONFIGMAPS, namespace="ns"), sink)  # raw bytes to sink
"""

from nodeagent.kube.client import KubeClient, ListPage, ListResult, WatchOptions, WriteEvent
from nodeagent.kube.dryrun import DryRun, not_dry_run_view
from nodeagent.kube.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
)
from nodeagent.kube.events import NODE_EVENTS, EventRecorder, EventSink, Involved
from nodeagent.kube.kubeconfig import ClusterConfig, in_cluster_config, load_kubeconfig
from nodeagent.kube.lookup import KindLookup, lookup_kind
from nodeagent.kube.resource import (
    CONFIGMAPS,
    CORE_EVENTS,
    CUSTOMRESOURCEDEFINITIONS,
    EVENTS,
    LEASES,
    NAMESPACES,
    NODES,
    RESOURCECLAIMS,
    RESOURCESLICES,
    Resource,
)
from nodeagent.kube.settings import KubeSettings, load_client
from nodeagent.kube.watch import (
    FeedResult,
    GapSink,
    ListFailureSink,
    WatchError,
    WatchRequest,
    WatchSink,
    run_watch,
)

__all__ = [
    "CONFIGMAPS",
    "CORE_EVENTS",
    "CUSTOMRESOURCEDEFINITIONS",
    "EVENTS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "NODE_EVENTS",
    "RESOURCECLAIMS",
    "RESOURCESLICES",
    "ApiError",
    "BadRequest",
    "ClusterConfig",
    "Conflict",
    "DryRun",
    "EventRecorder",
    "EventSink",
    "FeedResult",
    "Forbidden",
    "GapSink",
    "Invalid",
    "Involved",
    "KindLookup",
    "KubeClient",
    "KubeError",
    "KubeSettings",
    "ListFailureSink",
    "ListPage",
    "ListResult",
    "NotFound",
    "Resource",
    "WatchError",
    "WatchOptions",
    "WatchRequest",
    "WatchSink",
    "WriteEvent",
    "in_cluster_config",
    "load_client",
    "load_kubeconfig",
    "lookup_kind",
    "not_dry_run_view",
    "run_watch",
]
