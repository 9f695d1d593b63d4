"""Configuration of dynamic node configuration (the ``[dynconfig]`` table of the agent's TOML).

The table itself is static: trial and rollback must not be switched off by the very remote
config they guard.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from nodeagent.core.errors import ConfigError
from nodeagent.core.rules import check_constraints, check_seconds, count

__all__ = ["DynconfigSettings"]


class DynconfigSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Watch NodeAgentConfig objects and apply the one targeting this node (cluster mode only;
    # standalone there is nothing to watch).
    enabled: bool = True
    # Seconds a newly applied config is on trial: unhealthy meanwhile rolls it back, surviving
    # promotes it to last-known-good (the kubelet's KEP-281 used 10 min too).
    trial_duration: float = 600.0
    # Seconds a checkpointed config stays usable at a start without the apiserver, counted from
    # the last time the apiserver confirmed it (older: the defaults and file are used).
    checkpoint_grace: float = 7200.0
    # During a trial: a component not ready for longer than this makes the agent unhealthy.
    unready_bound: float = 60.0
    # During a trial: a component restarted this many times since the trial began is
    # crash-looping (the supervisor's backoff makes 3 restarts take about 7 s at least).
    crashloop_restarts: Annotated[int, count(ge=1, rule="must be an integer >= 1")] = 3
    # During a trial: the watchdog not kicked for this many seconds makes the agent unhealthy.
    watchdog_bound: float = 60.0
    # Seconds between two health checks during a trial.
    health_interval: float = 5.0
    # Seconds the NodeAgentConfigOK condition (a Node status write) may keep failing before the
    # dynconfig component turns not ready (longer than a brief control-plane restart).
    status_write_bound: float = 120.0

    def validate(self) -> None:
        """Raise ConfigError naming the first field that breaks a rule."""
        for name in (
            "trial_duration",
            "checkpoint_grace",
            "unready_bound",
            "watchdog_bound",
            "health_interval",
            "status_write_bound",
        ):
            check_seconds(f"dynconfig.{name}", getattr(self, name))
        check_constraints(self, "dynconfig")
        if self.health_interval > self.trial_duration:
            raise ConfigError(
                "dynconfig.health_interval", self.health_interval, "must be <= trial_duration"
            )
