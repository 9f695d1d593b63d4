"""Prometheus metrics of the accumulator."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

OBJECTS = Gauge(
    "nodeagent_accumulator_objects",
    "Objects in the last snapshot, by query.",
    ["query"],
)
SYNCED = Gauge(
    "nodeagent_accumulator_synced",
    "1 when the query's list is complete (Forbidden counts, see forbidden), else 0.",
    ["query"],
)
FORBIDDEN = Gauge(
    "nodeagent_accumulator_forbidden",
    "1 while the query's list is Forbidden and the query is served as empty (until a list "
    "succeeds again).",
    ["query"],
)
LIST_FAILURES = Counter(
    "nodeagent_accumulator_list_failures_total",
    "Failed (re)list attempts of a query (retried with backoff; Forbidden not included).",
    ["query"],
)
MALFORMED = Counter(
    "nodeagent_accumulator_malformed_total",
    "Input rejected and skipped (last good state kept), by query and source "
    "(event, list_page, list_item, local_write, decode, predicate).",
    ["query", "source"],
)
NOTIFICATIONS = Counter(
    "nodeagent_accumulator_notifications_total",
    "Change notifications offered to the consumer.",
)
DELTAS = Counter(
    "nodeagent_accumulator_deltas_total",
    "Deltas delivered by update(), by query and type (add, update, delete).",
    ["query", "type"],
)
LOCAL_WRITES = Counter(
    "nodeagent_accumulator_local_writes_total",
    "Own writes applied to a query before the watch confirmed them, by query.",
    ["query"],
)
LOCAL_EXPIRED = Counter(
    "nodeagent_accumulator_local_expired_total",
    "Own writes dropped because the watch never confirmed them within the TTL, by query.",
    ["query"],
)
UPDATE_SECONDS = Histogram(
    "nodeagent_accumulator_update_seconds",
    "Time to produce a snapshot and its deltas (update()).",
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0),
)
