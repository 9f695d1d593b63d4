"""Prometheus metrics of the reporter manager."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

PLUGINS = Gauge(
    "nodeagent_reporter_plugins",
    "Reporter plugins whose report is kept, by state (running, stopped: within the grace).",
    ["state"],
)
EXPIRED = Counter(
    "nodeagent_reporter_reports_expired_total",
    "Stopped reporter plugins whose report was dropped after reporter.grace.",
)
IN_TREE_ERRORS = Counter(
    "nodeagent_reporter_in_tree_errors_total",
    "Failed collections of an in-tree reporter (its last report is kept), by plugin.",
    ["plugin"],
)
CHECKPOINT_INVALID = Counter(
    "nodeagent_reporter_checkpoint_invalid_total",
    "Reporter checkpoints that could not be used (unreadable, or content that does not parse); "
    "the store started fresh. Corrupt files are counted by nodeagent_checkpoint_corrupt_total.",
)
