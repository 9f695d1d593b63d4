"""Configuration of the ResourceSlice publisher (the ``[resources]`` table of the agent's TOML)."""

from __future__ import annotations

import msgspec

from nodeagent.core.errors import ConfigError
from nodeagent.core.rules import Count, NonNegative, check_constraints, check_seconds

__all__ = ["ResourcesSettings"]


class ResourcesSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Seconds a disconnected plugin's slices stay published before they are deleted (the
    # kubelet wipes after 30 s as well), so a plugin restart does not churn the pool.
    disconnect_grace: NonNegative = 30.0
    # Seconds after start-up before slices of plugins that have not re-registered are deleted;
    # nothing is deleted up front, so a restart with unchanged plugins makes no writes.
    startup_grace: NonNegative = 30.0
    # Per-pool retry backoff after a failed sync: initial delay doubling up to the cap
    # (upstream workqueue: 5 ms .. 1000 s).
    retry_backoff_initial: float = 0.005
    retry_backoff_max: float = 1000.0
    # Seconds between two syncs of one pool: an isolated change is written at once, a storm of
    # changes (a flapping plugin) at most once per interval, the latest inventory winning.
    min_sync_interval: NonNegative = 0.1
    # Plugin messages of at least this many bytes (together, per update) are converted and
    # split into slices in a worker thread, so the event loop stays responsive; 0: never.
    thread_threshold: Count = 65536
    # Seconds before a pool the API server refused (422 Invalid, 400 BadRequest: a permanent
    # answer for the same request) is tried again with an unchanged inventory; a new inventory
    # is tried at once.
    invalid_retry_interval: float = 600.0
    # Seconds a pool may stay unpublished (its writes failing, or its changes held back) after
    # it was last published before `resources` turns not ready; longer than a brief
    # control-plane restart, which must not flip readiness.
    publish_failure_bound: float = 120.0

    def validate(self) -> None:
        """Raise ConfigError naming the first field that breaks a rule."""
        check_constraints(self, "resources")
        for name in (
            "retry_backoff_initial",
            "retry_backoff_max",
            "invalid_retry_interval",
            "publish_failure_bound",
        ):
            check_seconds(f"resources.{name}", getattr(self, name))
        if self.retry_backoff_max < self.retry_backoff_initial:
            raise ConfigError(
                "resources.retry_backoff_max",
                self.retry_backoff_max,
                "must be >= resources.retry_backoff_initial",
            )
