"""Prometheus metrics of dynamic configuration (the KEP-281 trio: assigned, active and
last-known-good, each an info gauge whose labels carry the hash)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

if TYPE_CHECKING:
    from nodeagent.dynconfig.state import Known

ASSIGNED_INFO = Gauge(
    "nodeagent_config_assigned_info",
    "The remote config this node's NodeAgentConfig assigns (value 1; none: no target).",
    ["hash", "name"],
)
ACTIVE_INFO = Gauge(
    "nodeagent_config_active_info",
    "The config the agent runs (value 1; hash 'local': defaults, file and flags only).",
    ["hash", "name"],
)
LKG_INFO = Gauge(
    "nodeagent_config_last_known_good_info",
    "The config a rollback goes back to (value 1; promoted when a trial is survived).",
    ["hash", "name"],
)
ROLLBACKS = Counter(
    "nodeagent_config_rollbacks_total",
    "Configs rolled back (unhealthy during the trial, or died during it): remote configs to "
    "last-known-good, reloaded files to the file they replaced.",
)
VETOES = Counter(
    "nodeagent_config_vetoes_total",
    "Remote configs discarded because a component vetoed the change.",
)
NOT_BLAMED = Counter(
    "nodeagent_config_trial_not_blamed_total",
    "Health signals past their bound during a trial that the change on trial cannot cause "
    "(the component reads no setting it changed): reported, not rolled back, once per trial.",
    ["component"],
)
TRIALS_DEFERRED = Counter(
    "nodeagent_config_trials_deferred_total",
    "Remote configs not applied because their trial could not be recorded (the trial marker not "
    "written: a read-only or full state directory); each is tried again until it can.",
)
REJECTED = Counter(
    "nodeagent_config_rejected_total",
    "Remote configs refused by the agent's validation (static or unknown field, bad value).",
)

ROLLOUT_ABORT_FAILURES = Counter(
    "nodeagent_config_rollout_abort_failures_total",
    "Aborts of the rollout of the running config whose return to last-known-good failed (it no "
    "longer builds, or a component vetoed it): the config running keeps running; counted once "
    "per failure, not per retry.",
)
ROLLOUT_WAITING = Gauge(
    "nodeagent_config_rollout_waiting",
    "The assigned config is not taken because its rollout does not admit this node yet (value 1 "
    "for the reason: WaitingForRolloutController, WaitingForWave, RolloutPaused, RolloutHalted, "
    "RolloutAborted; no sample: nothing waits).",
    ["reason"],
)


def set_info(gauge: Gauge, **labels: str) -> None:
    """Show exactly one label set (the previous hash disappears)."""
    gauge.clear()
    gauge.labels(**labels).set(1)


def show(gauge: Gauge, known: Known | None) -> None:
    """Show the config `known` (none: no label set at all)."""
    if known is None:
        gauge.clear()
    else:
        set_info(gauge, hash=known.hash, name=known.name)
