"""The status the controller writes: ``status.rollout`` and the ``RolledOut`` condition
(metav1.Condition: True once Complete, the reason is the phase), merged into the object's
status as read so nothing else in it is lost."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from nodeagent.rollout.api import Phase, RolloutStatus

__all__ = ["CONDITION_TYPE", "rolled_out", "status_document"]

CONDITION_TYPE = "RolledOut"
# What makes two RolledOut conditions the same (the timestamp follows from them).
_SAME = ("status", "reason", "message", "observedGeneration")


def rolled_out(rollout: RolloutStatus, generation: int) -> dict[str, Any]:
    """The condition's content, without lastTransitionTime."""
    return {
        "type": CONDITION_TYPE,
        "status": "True" if rollout.phase == Phase.COMPLETE else "False",
        "reason": str(rollout.phase),
        "message": rollout.message or str(rollout.phase),
        "observedGeneration": generation,
    }


def status_document(
    stored: dict[str, Any] | None, rollout: RolloutStatus, generation: int, now: float
) -> dict[str, Any] | None:
    """The object's next ``status`` (the stored one with status.rollout and RolledOut
    replaced), or None when the stored one already says this (no write)."""
    status = dict(stored or {})
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    old = next((c for c in conditions if c.get("type") == CONDITION_TYPE), None)
    want = rolled_out(rollout, generation)
    same_condition = old is not None and all(old.get(k) == want[k] for k in _SAME)
    stored_rollout = status.get("rollout")
    try:
        same_rollout = (
            stored_rollout is not None and msgspec.convert(stored_rollout, RolloutStatus) == rollout
        )
    except msgspec.ValidationError:
        same_rollout = False
    if same_condition and same_rollout:
        return None
    if old is not None and old.get("status") == want["status"]:
        want["lastTransitionTime"] = old.get("lastTransitionTime")
    else:
        want["lastTransitionTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    status["conditions"] = [c for c in conditions if c is not old] + [want]
    status["rollout"] = msgspec.to_builtins(rollout)
    return status
