"""What the report store publishes: each reporter plugin's last report and its lifecycle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nodeagent.protos.reporterplugin.v1alpha1.api_pb2 import GetReportContentResponse

__all__ = ["PluginReport"]


@dataclass(frozen=True)
class PluginReport:
    """One reporter plugin's last valid report.

    `running` is False once the plugin deregistered or its stream ended (or it was restored from a
    checkpoint and has not re-registered yet); its report is kept until the grace runs out, then
    the plugin is absent from the published mapping. `stopped_at` is the wall-clock second it
    stopped (None while running).
    """

    plugin: str
    response: GetReportContentResponse
    running: bool
    stopped_at: float | None
