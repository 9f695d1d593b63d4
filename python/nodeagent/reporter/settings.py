"""Configuration of the reporter manager (the ``[reporter]`` table of the agent's TOML).

The poll of out-of-tree reporter plugins (unary GetReportContent) is the plugin layer's and is
configured in ``[plugins]`` (`report_poll_interval`, `report_poll_timeout`).
"""

from __future__ import annotations

import msgspec

from nodeagent.core.errors import ConfigError
from nodeagent.core.k8s import is_label_key, is_label_value
from nodeagent.core.rules import NonNegative, check_constraints, check_seconds

__all__ = ["ReporterSettings"]


class ReporterSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Seconds between two collections of the in-tree reporters (the system reporter re-reads
    # /proc and /sys), as Katalyst syncs its in-tree plugins every --reporter-collect-interval.
    sync_interval: float = 5.0
    # Seconds a plugin that deregistered, whose stream ended (and whose polls fail), or that was
    # restored from the checkpoint keeps its report before it is dropped (Katalyst: 5 min).
    grace: NonNegative = 300.0
    # The in-tree system reporter (node resource properties and the Socket -> Numa topology from
    # /proc and /sys), as Katalyst's system-reporter-plugin.
    system_reporter: bool = True
    # The system reporter also reports the cpu flags property (long; opt-in as in Katalyst).
    cpu_flags: bool = False
    # The system reporter also reports the cpu model name (`cpu_model`; opt-in).
    cpu_model: bool = False
    # Labels of the CustomNodeResource when the agent creates it (Katalyst's
    # --default-cnr-labels); set only at creation, never removed afterwards.
    cnr_default_labels: dict[str, str] = msgspec.field(default_factory=dict)
    # Seconds between two CNR writes at least: reports arriving meanwhile are merged into the
    # next write (a flapping plugin costs one write per interval, the latest merge wins).
    cnr_min_write_interval: NonNegative = 1.0
    # Backoff of a failed CNR write: first retry after this many seconds, doubling up to
    # cnr_retry_max (up to half shorter, jittered).
    cnr_retry_initial: float = 1.0
    cnr_retry_max: float = 60.0
    # Seconds CNR writes may keep failing, after the CNR was once in sync, before `reporter`
    # turns not ready (longer than a brief control-plane restart).
    cnr_failure_bound: float = 120.0

    def validate(self) -> None:
        """Raise ConfigError naming the first field that breaks a rule."""
        check_seconds("reporter.sync_interval", self.sync_interval)
        check_constraints(self, "reporter")
        for name in ("cnr_retry_initial", "cnr_retry_max", "cnr_failure_bound"):
            check_seconds(f"reporter.{name}", getattr(self, name))
        if self.cnr_retry_max < self.cnr_retry_initial:
            raise ConfigError(
                "reporter.cnr_retry_max", self.cnr_retry_max, "must be >= cnr_retry_initial"
            )
        for key, value in self.cnr_default_labels.items():
            if not is_label_key(key) or not is_label_value(value):
                raise ConfigError(
                    f"reporter.cnr_default_labels.{key}", value, "not a valid label key and value"
                )
