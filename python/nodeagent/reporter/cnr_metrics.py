"""Prometheus metrics of the CNR reporter (merge and writes)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

MERGES = Counter("nodeagent_cnr_merges_total", "Merges of every plugin's report fields.")
MERGE_SECONDS = Histogram(
    "nodeagent_cnr_merge_seconds",
    "Duration of one merge.",
    buckets=(0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0),
)
WRITES = Counter(
    "nodeagent_cnr_writes_total",
    "CNR writes by verb (create, apply: labels, annotations and spec, status: the status "
    "subresource, none: a sync that found nothing to write) and result (ok, unchanged, or the "
    "API error's class).",
    ["verb", "result"],
)
BAD_FIELDS = Counter(
    "nodeagent_cnr_bad_fields_total",
    "Report fields skipped by the merge (unknown name, value not JSON of the field's type), "
    "counted once each time a plugin starts sending one, by plugin.",
    ["plugin"],
)
