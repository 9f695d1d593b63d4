"""The rollout's API on a NodeAgentConfig: ``spec.rollout`` (the policy, all optional) and
``status.rollout`` (the fleet view the controller writes and every agent reads).

The CRD (deploy/crds/nodeagent.io_nodeagentconfigs.yaml) refuses what the apiserver can judge
alone (count XOR percent, waves strictly increasing ending at 100, maxUnavailable >= 1 or a
percent); the defaults live here, once, so an object stored before a default changed follows the
agent's and controller's code rather than a value frozen into etcd.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = [
    "ALL",
    "DEFAULT_WAVES",
    "NONE",
    "Canary",
    "Counts",
    "FailurePolicy",
    "Phase",
    "RolloutSpec",
    "RolloutStatus",
    "canary_size",
    "decode_spec",
    "decode_status",
    "failure_limit",
    "max_unavailable",
]

# status.rollout.admittedThrough: nobody, everybody, or else the rank key of the last admitted
# node (rank.rank_key; keys start with "0-" or "1-", so they never equal these words).
NONE = "none"
ALL = "all"
DEFAULT_WAVES = (25, 50, 100)
_PERCENT = re.compile(r"^([1-9][0-9]?|100)%$")


class Phase(enum.StrEnum):
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    HALTED = "Halted"
    ABORTED = "Aborted"
    COMPLETE = "Complete"


class Canary(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """The first nodes to take a new config: ``count`` nodes or ``percent`` of the targeted ones
    (neither: one node; 0: no canary), preferring nodes whose labels match ``selector``."""

    count: int | None = None
    percent: int | None = None
    # A Kubernetes label selector ({matchLabels, matchExpressions}), kept raw: the caller
    # evaluates it with the same semantics as spec.nodeSelector (nodeagent.dynconfig.source).
    selector: dict[str, Any] | None = None


class FailurePolicy(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """When the rollout halts: ``maxFailures`` nodes rolled back or refusing the config (default
    1), or ``maxFailurePercent`` of the targeted nodes; ``revert``: a halt also aborts."""

    max_failures: int | None = None
    max_failure_percent: int | None = None
    revert: bool = False


class RolloutSpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    canary: Canary = msgspec.field(default_factory=Canary)
    # Cumulative shares of the targeted nodes after the canary, strictly increasing, ending at 100.
    waves: tuple[int, ...] = DEFAULT_WAVES
    # Admitted nodes not yet through their trial (waiting, on trial, rolled back, failed) at once:
    # a count >= 1 or "N%" of the targeted nodes (rounded down, at least 1).
    max_unavailable: int | str = 1
    # Seconds between a wave's last node passing its trial and the next wave's first admission.
    pause_seconds: int = 0
    failure_policy: FailurePolicy = msgspec.field(default_factory=FailurePolicy)
    paused: bool = False  # freeze admission where it is; nodes keep what they run
    abort: bool = False  # admit nobody: every node that took the config returns to its previous


class Counts(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Targeted nodes by what they do with the rolled-out config."""

    targeted: int = 0
    updated: int = 0  # running it: on trial or active
    on_trial: int = 0
    active: int = 0  # through the trial
    rolled_back: int = 0  # tried it and went back (unhealthy, crash)
    failed: int = 0  # refused it (invalid, vetoed)


class RolloutStatus(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """``status.rollout``: which config is rolled out and how far (the controller's only memory,
    so a restarted controller resumes from it)."""

    # The config rolled out: its hash (nodeagent.dynconfig.overlay.config_hash) and the object's
    # generation when that config first appeared (an edit of spec.rollout alone bumps
    # metadata.generation but keeps the rollout and its node order).
    config_hash: str = ""
    generation: int = 0
    observed_generation: int = 0
    phase: Phase = Phase.PROGRESSING
    admitted_through: str = NONE
    admitted: int = 0
    wave: int = 0  # 0: the canary; i: spec.rollout.waves[i - 1]
    # When the current wave's last admitted node passed its trial (RFC 3339; "" not yet): the
    # pause before the next wave counts from here.
    wave_complete_at: str = ""
    counts: Counts = msgspec.field(default_factory=Counts)
    halted_reason: str = ""
    message: str = ""


def decode_spec(raw: Mapping[str, Any] | None) -> RolloutSpec:
    """``spec.rollout`` as served (msgspec.ValidationError naming the field otherwise)."""
    return msgspec.convert(raw or {}, RolloutSpec)


def decode_status(raw: Mapping[str, Any] | None) -> RolloutStatus | None:
    """``status.rollout`` as served; None when absent or unreadable (a controller restarts the
    rollout from the canary rather than trust a status it cannot read)."""
    if not raw:
        return None
    try:
        return msgspec.convert(raw, RolloutStatus)
    except msgspec.ValidationError:
        return None


def _share(percent: int, targeted: int) -> int:
    return math.ceil(percent * targeted / 100)


def canary_size(spec: RolloutSpec, targeted: int) -> int:
    canary = spec.canary
    if canary.count is not None:
        return min(canary.count, targeted)
    if canary.percent is not None:
        return min(_share(canary.percent, targeted), targeted)
    return min(1, targeted)


def max_unavailable(spec: RolloutSpec, targeted: int) -> int:
    value = spec.max_unavailable
    if isinstance(value, int):
        return max(1, value)
    match = _PERCENT.match(value)
    percent = int(match.group(1)) if match else 0  # the CRD refuses anything else
    return max(1, percent * targeted // 100)


def failure_limit(spec: RolloutSpec, targeted: int) -> int:
    """Failed nodes (rolled back or refusing) that halt the rollout."""
    policy = spec.failure_policy
    if policy.max_failure_percent is not None:
        return max(1, _share(policy.max_failure_percent, targeted))
    return max(1, policy.max_failures if policy.max_failures is not None else 1)
