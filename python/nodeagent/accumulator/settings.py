"""Settings of the accumulator (``[accumulator]`` in the config file)."""

from __future__ import annotations

import msgspec

from nodeagent.core.rules import Count, check_constraints, check_seconds


class AccumulatorSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Under churn, at most one change notification per this many seconds (an isolated change
    # is offered at once). Static: each accumulator takes it when built, and it also paces the
    # watch that delivers remote configs (a remote value must not slow down its own fix).
    max_interval: float = 1.0
    # A query whose list is Forbidden stops the agent instead of counting as synced-empty.
    forbidden_fatal: bool = False
    # Seconds between attempts to list a Forbidden query again (RBAC may be fixed later).
    forbidden_retry: float = 60.0
    # Seconds a write made through the agent's client is shown without the watch confirming it.
    local_write_ttl: float = 60.0
    # Watch chunks and List pages at least this many bytes are parsed in a worker thread.
    thread_threshold: Count = 65536
    # Seconds a query may stay not known after it was known (relisting after a 410, its relist
    # failing) before the component it serves turns not ready: a watch that cannot be kept.
    # Longer than a brief control-plane restart. A Forbidden first list is reported at once; a
    # Forbidden relist of a query known before (a restarted apiserver's authorizer warming up)
    # keeps the last state and is retried (1 s, doubling, jittered, up to forbidden_retry)
    # until this bound, then served as empty.
    unknown_bound: float = 120.0

    def validate(self) -> None:
        # inf would be "never" (no notification under churn, no retry, own writes shown
        # forever) and nan compares false everywhere: both refused.
        for name in ("max_interval", "forbidden_retry", "local_write_ttl", "unknown_bound"):
            check_seconds(f"accumulator.{name}", getattr(self, name))
        check_constraints(self, "accumulator")
