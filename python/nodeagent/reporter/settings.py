"""Configuration of the reporter manager (the ``[reporter]`` table of the agent's TOML)."""

from __future__ import annotations

import math

import msgspec

from nodeagent.core.errors import ConfigError

__all__ = ["ReporterSettings"]


class ReporterSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Seconds between two unary GetReportContent polls of every registered reporter plugin
    # (Katalyst's --reporter-collect-interval): a plugin that only answers the unary call, or
    # whose stream ended, still reports.
    sync_interval: float = 5.0
    # Seconds one poll may take before the plugin's last report is kept instead (Katalyst: 10 s).
    sync_timeout: float = 10.0
    # Seconds a plugin that deregistered, whose stream ended, or that was restored from the
    # checkpoint keeps its report before it is dropped (Katalyst: 5 min).
    grace: float = 300.0
    # The in-tree system reporter (node resource properties and the Socket -> Numa topology from
    # /proc and /sys), as Katalyst's system-reporter-plugin.
    system_reporter: bool = True
    # Report the cpu flags property (long; off by default as in Katalyst).
    cpu_flags: bool = False

    def validate(self) -> None:
        """Raise ConfigError naming the first field that breaks a rule."""
        for name in ("sync_interval", "sync_timeout"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"reporter.{name}", value, "must be a finite number > 0")
        if not math.isfinite(self.grace) or self.grace < 0:
            raise ConfigError("reporter.grace", self.grace, "must be a finite number >= 0")
