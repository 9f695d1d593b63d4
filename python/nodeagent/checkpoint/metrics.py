"""Prometheus metrics of the checkpoint store."""

from __future__ import annotations

from prometheus_client import Counter

CORRUPT = Counter(
    "nodeagent_checkpoint_corrupt_total",
    "Checkpoints found corrupt on read (moved aside as <name>.corrupt-<UTC time>), by name.",
    ["name"],
)
WRITE_FAILURES = Counter(
    "nodeagent_checkpoint_write_failures_total",
    "Checkpoint writes that failed (the previous checkpoint is kept), by name.",
    ["name"],
)
SWEEP_FAILURES = Counter(
    "nodeagent_checkpoint_sweep_failures_total",
    "Leftover temp files of a killed checkpoint write that could not be removed (a read-only "
    "or foreign state directory: checkpoints are still read), by name.",
    ["name"],
)
FOREIGN = Counter(
    "nodeagent_checkpoint_foreign_total",
    "Checkpoints refused on read because another node wrote them (a state directory reused "
    "under another node name), by name.",
    ["name"],
)
