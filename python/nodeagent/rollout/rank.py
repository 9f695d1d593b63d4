"""The node order of a rollout and an agent's own admission decision.

Each agent computes its rank key from what it knows (its name, its canary membership from its own
labels, the object's uid and the rollout's generation from ``status.rollout``); the controller,
which sees every targeted node, publishes the key of the last admitted node. So an agent decides
alone, with one comparison, and the status stays a few fields at any fleet size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from nodeagent.rollout.api import ALL, NONE, Phase, RolloutStatus

__all__ = [
    "ROLLOUT_ABORTED",
    "WAITING_FOR_CONTROLLER",
    "WAITING_FOR_WAVE",
    "Admission",
    "admission",
    "admitted",
    "rank_key",
]

WAITING_FOR_CONTROLLER = "WaitingForRolloutController"
WAITING_FOR_WAVE = "WaitingForWave"
ROLLOUT_ABORTED = "RolloutAborted"
_REASON = {Phase.PAUSED: "RolloutPaused", Phase.HALTED: "RolloutHalted"}


def rank_key(node: str, uid: str, generation: int, canary: bool) -> str:
    """``(not canary, sha256(node/uid/generation))`` as one string: the canary's selector
    matches first, then a stable hash an operator can recompute (the same node goes at the same
    point of the same rollout, and a new rollout reshuffles the fleet)."""
    digest = hashlib.sha256(f"{node}/{uid}/{generation}".encode()).hexdigest()
    return f"{0 if canary else 1}-{digest}"


def admitted(key: str, status: RolloutStatus | None, config_hash: str) -> bool:
    """Whether the node of rank ``key`` may run the config ``config_hash``: only a status that
    rolls out that very config and whose threshold reaches the key admits it (no status, or one
    about another config: nobody; a rollout never proceeds unobserved)."""
    if status is None or status.config_hash != config_hash:
        return False
    threshold = status.admitted_through
    return threshold == ALL or (threshold != NONE and key <= threshold)


@dataclass(frozen=True, slots=True)
class Admission:
    """An agent's answer: may it take the config, and if not the NodeAgentConfigOK condition's
    reason and message (`nodeagent status` shows the same)."""

    admitted: bool
    reason: str
    message: str


def admission(
    node: str,
    canary: bool,
    uid: str,
    config_hash: str,
    status: RolloutStatus | None,
    *,
    name: str,
) -> Admission:
    """Whether node ``node`` may take the config ``config_hash`` of the object ``name``; if not,
    the reason and message of its NodeAgentConfigOK condition. Each message starts with
    ``NodeAgentConfig <name> (hash <hash>)``, the subject the controller reads back from the
    condition (the agent's other condition messages name their config the same way)."""
    subject = f"NodeAgentConfig {name} (hash {config_hash})"
    if status is None or status.config_hash != config_hash:
        return Admission(
            False,
            WAITING_FOR_CONTROLLER,
            f"{subject} waits for the rollout controller to admit it",
        )
    key = rank_key(node, uid, status.generation, canary)
    if admitted(key, status, config_hash):
        return Admission(True, "", "")
    if status.phase == Phase.ABORTED:
        return Admission(False, ROLLOUT_ABORTED, f"{subject} rollout aborted")
    reason = _REASON.get(status.phase, WAITING_FOR_WAVE)
    return Admission(
        False,
        reason,
        f"{subject} waits for its wave ({status.phase}, wave {status.wave}, "
        f"{status.admitted} of {status.counts.targeted} admitted)",
    )
