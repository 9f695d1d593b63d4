"""Settings of the accumulator (``[accumulator]`` in the config file)."""

from __future__ import annotations

import msgspec

from nodeagent.core.errors import ConfigError


class AccumulatorSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Under churn, at most one change notification per this many seconds (an isolated change
    # is offered at once).
    max_interval: float = 1.0
    # A query whose list is Forbidden stops the agent instead of counting as synced-empty.
    forbidden_fatal: bool = False
    # Seconds between attempts to list a Forbidden query again (RBAC may be fixed later).
    forbidden_retry: float = 60.0
    # Seconds a write made through the agent's client is shown without the watch confirming it.
    local_write_ttl: float = 60.0
    # Watch chunks and List pages at least this many bytes are parsed in a worker thread.
    thread_threshold: int = 65536

    def validate(self) -> None:
        if not self.max_interval > 0:
            raise ConfigError("accumulator.max_interval", self.max_interval, "must be > 0")
        if not self.forbidden_retry > 0:
            raise ConfigError("accumulator.forbidden_retry", self.forbidden_retry, "must be > 0")
        if not self.local_write_ttl > 0:
            raise ConfigError("accumulator.local_write_ttl", self.local_write_ttl, "must be > 0")
        if self.thread_threshold < 0:
            raise ConfigError("accumulator.thread_threshold", self.thread_threshold, "must be >= 0")
