"""What the target object's rollout (issue 31) says of its config on this node: admitted or
why not, Complete, Aborted. Decided by `nodeagent.rollout.rank.admission`, the code the rollout
controller plans with; an object without ``spec.rollout`` has no gate (its config is taken at
once, as before)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from nodeagent.dynconfig.source import LabelSelector, NodeAgentConfig, selector_matches
from nodeagent.rollout.api import Phase
from nodeagent.rollout.rank import ROLLOUT_ABORTED, admission

__all__ = ["Gate", "gate"]


@dataclass(frozen=True, slots=True)
class Gate:
    """The rollout's word on the config ``hash`` for this node."""

    hash: str
    admitted: bool
    reason: str  # the condition's reason while not admitted ("" when admitted)
    message: str  # starts with "NodeAgentConfig <name> (hash <hash>)"
    # status.rollout.phase is Complete for this hash: a config through its trial becomes
    # last-known-good (until then the previous one stays, so an abort has where to go back).
    complete: bool

    @property
    def aborted(self) -> bool:
        return self.reason == ROLLOUT_ABORTED


def _canary(obj: NodeAgentConfig, labels: Mapping[str, str]) -> bool:
    rollout = obj.spec.rollout
    raw = None if rollout is None else rollout.canary.selector
    if not raw:
        return False
    try:
        selector = msgspec.convert(raw, LabelSelector)
    except msgspec.ValidationError:
        return False  # the CRD refuses it; a selector that cannot be read selects nobody
    return selector_matches(selector, labels)


def gate(
    obj: NodeAgentConfig, node: str, labels: Mapping[str, str], config_hash: str
) -> Gate | None:
    """The gate of ``obj``'s config (hash ``config_hash``) on node ``node`` with ``labels``
    (None: the object has no ``spec.rollout``)."""
    if obj.spec.rollout is None:
        return None
    status = obj.rollout_status
    answer = admission(
        node, _canary(obj, labels), obj.metadata.uid, config_hash, status, name=obj.name
    )
    complete = (
        status is not None and status.config_hash == config_hash and status.phase == Phase.COMPLETE
    )
    return Gate(config_hash, answer.admitted, answer.reason, answer.message, complete)
