"""The API requests this process's kube clients sent, read from the client's own metric."""

from __future__ import annotations

from nodeagent.kube.metrics import API_REQUESTS

__all__ = ["api_writes"]

WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def api_writes() -> float:
    """ResourceSlice write requests every client of this process has sent, answered or not."""
    total = 0.0
    for metric in API_REQUESTS.collect():
        for sample in metric.samples:
            labels = sample.labels
            if (
                sample.name.endswith("_total")
                and labels["resource"] == "resourceslices"
                and labels["verb"] in WRITE_VERBS
            ):
                total += sample.value
    return total
