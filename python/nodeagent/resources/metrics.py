"""Prometheus metrics of the ResourceSlice publisher."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from nodeagent.kube import NODE_EVENTS

SYNCS = Counter(
    "nodeagent_resourceslice_syncs_total",
    "Pool syncs by result (unchanged: no write needed, written, failed: API error, error: "
    "unexpected exception, refused: the pool holds slices nodeagent does not manage, invalid: "
    "the API server refuses a slice of the pool, deferred: waiting for a grace period, the "
    "observed state or the Node).",
    ["result"],
)
SYNC_SECONDS = Histogram(
    "nodeagent_resourceslice_sync_seconds",
    "Duration of one pool sync (plan and writes).",
)
PLAN_SECONDS = Histogram(
    "nodeagent_resourceslice_plan_seconds",
    "Duration of the Rust plan of one pool.",
    buckets=(0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0),
)
WRITES = Counter(
    "nodeagent_resourceslice_writes_total",
    "ResourceSlice API writes by verb (create, update, delete) and result (ok, conflict, "
    "not_found, error).",
    ["verb", "result"],
)
INVENTORIES_REJECTED = Counter(
    "nodeagent_resourceslice_inventories_rejected_total",
    "Plugin inventories rejected as invalid (the last valid one stays published).",
    ["driver"],
)
ATTRIBUTES_REJECTED = Counter(
    "nodeagent_resourceslice_attributes_rejected_total",
    "Seed-API attributes dropped (the rest of the device published): int and string slices, "
    "which resource.k8s.io/v1 cannot express, and values breaking a v1 attribute rule.",
    ["driver"],
)
DEVICES_REJECTED = Counter(
    "nodeagent_resourceslice_devices_rejected_total",
    "Seed-API instances dropped (the rest of the inventory published): a name with no v1 device "
    "name, or one already used by another instance.",
    ["driver"],
)
FIELDS_DROPPED = Counter(
    "nodeagent_resourceslice_fields_dropped_total",
    "Fields of a pool's slices the API server did not store (a feature gate off on the "
    "cluster), counted once per pool and field; /v1/status names the likely gate.",
    ["driver", "field"],
)
INVALID_POOLS = Gauge(
    "nodeagent_resourceslice_invalid_pools",
    "Pools the API server refuses (422 Invalid or 400 BadRequest): not retried until the "
    "inventory changes or resources.invalid_retry_interval has passed.",
)
QUEUE_DEPTH = Gauge(
    "nodeagent_resourceslice_queue_depth",
    "Pools waiting for a sync (including those backing off after a failure).",
)
DRY_RUNS = Counter(
    "nodeagent_resourceslice_dry_runs_total",
    "Dry-run writes (dryRun=All) before a new pool generation's writes, by result (ok, "
    "conflict, not_found, error): a slice the server refuses is found before any write.",
    ["result"],
)
DESIRED_SLICES = Gauge(
    "nodeagent_resourceslice_desired_slices",
    "ResourceSlices the agent wants published, over all drivers and pools.",
)
# The Events the publisher records are counted by the process's recorder.
EVENTS = NODE_EVENTS
REFUSED_POOLS = Gauge(
    "nodeagent_resourceslice_refused_pools",
    "Pools not published because they also hold ResourceSlices nodeagent does not manage.",
)
REOWNED = Counter(
    "nodeagent_resourceslice_reowned_total",
    "Slices whose owner reference was moved to the Node's new UID (Node re-created).",
)
