"""NodeAgentConfig objects and which one targets this node.

The agent picks its target itself, as Katalyst's config controller does, in three levels:
1. the unique object whose ``spec.nodeNames`` lists this node;
2. else the unique highest-priority object whose ``spec.nodeSelector`` matches the node's labels;
3. else the unique object with neither (a global default).
More than one candidate at the deciding level is a tie: no target, the names in the reason, and
the caller keeps the config it runs (a tie is an operator's error, never resolved by guessing).

Decisions:
- A paused object is out of the selection, as if absent (the next level may then target the
  node). To freeze what a node runs, leave its object unchanged rather than pausing it.
- An object with ``nodeNames`` targets only those nodes: its selector is not consulted (the CRD
  refuses both at once).
- A selector with no requirements (``{}``) targets nothing more than a global object does, so it
  counts as "neither" (level 3) rather than matching every node at level 2.
- A selector the agent cannot evaluate (an unknown operator, ``In`` without values) matches no
  node; the object is listed in ``Selection.invalid`` so the caller reports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from nodeagent.core.errors import ConfigError
from nodeagent.rollout.api import RolloutSpec, RolloutStatus, decode_status

__all__ = [
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "LabelSelector",
    "LabelSelectorRequirement",
    "NodeAgentConfig",
    "NodeAgentConfigMeta",
    "NodeAgentConfigSpec",
    "NodeAgentConfigStatus",
    "Selection",
    "decode_object",
    "select_target",
    "selector_error",
    "selector_matches",
]

GROUP = "nodeagent.io"
VERSION = "v1alpha1"
KIND = "NodeAgentConfig"
PLURAL = "nodeagentconfigs"


class LabelSelectorRequirement(msgspec.Struct, kw_only=True, rename="camel"):
    key: str
    operator: str
    values: list[str] = msgspec.field(default_factory=list)


class LabelSelector(msgspec.Struct, kw_only=True, rename="camel"):
    match_labels: dict[str, str] = msgspec.field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = msgspec.field(default_factory=list)

    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


class NodeAgentConfigMeta(msgspec.Struct, kw_only=True, rename="camel"):
    name: str
    uid: str = ""
    generation: int = 0
    resource_version: str = ""


class NodeAgentConfigSpec(msgspec.Struct, kw_only=True, rename="camel"):
    node_names: list[str] = msgspec.field(default_factory=list)
    node_selector: LabelSelector | None = None
    priority: int = 0
    paused: bool = False
    # The dynamic part of the agent's configuration, TOML-shaped ({table: {field: value}}); the
    # service overlays it (nodeagent.dynconfig.overlay) and validates it as it does the file.
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    # Opting in to a rollout (issue 31, even {}): a node takes a new config only once
    # status.rollout admits it (nodeagent.rollout.rank.admission). None: at once, as before.
    rollout: RolloutSpec | None = None


class NodeAgentConfigStatus(msgspec.Struct, kw_only=True):
    # Kept raw and decoded leniently (`NodeAgentConfig.rollout_status`): a status the agent
    # cannot read admits nobody, it does not make the object unreadable.
    rollout: dict[str, Any] | None = None


class NodeAgentConfig(msgspec.Struct, kw_only=True):
    """The fields of a NodeAgentConfig the agent reads (the rest of the object is ignored)."""

    metadata: NodeAgentConfigMeta
    spec: NodeAgentConfigSpec = msgspec.field(default_factory=NodeAgentConfigSpec)
    status: NodeAgentConfigStatus = msgspec.field(default_factory=NodeAgentConfigStatus)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def rollout_status(self) -> RolloutStatus | None:
        """``status.rollout`` as the rollout controller wrote it (None: none, or unreadable)."""
        return decode_status(self.status.rollout)


def decode_object(obj: Mapping[str, Any]) -> NodeAgentConfig:
    """The view of one object as served; ConfigError naming the object and the field otherwise
    (the CRD's schema makes this rare: only a CRD older or looser than the agent's)."""
    try:
        return msgspec.convert(obj, NodeAgentConfig)
    except msgspec.ValidationError as exc:
        name = (obj.get("metadata") or {}).get("name", "?")
        rule, _, at = str(exc).partition(" - at `$")
        where = at.rstrip("`").lstrip(".")
        raise ConfigError(f"NodeAgentConfig {name} {where}".rstrip(), None, rule) from None


_OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist"}


def _requirement_error(req: LabelSelectorRequirement) -> str | None:
    if req.operator not in _OPERATORS:
        return f"matchExpressions key {req.key!r}: unknown operator {req.operator!r}"
    if req.operator in ("In", "NotIn") and not req.values:
        return f"matchExpressions key {req.key!r}: {req.operator} needs values"
    if req.operator in ("Exists", "DoesNotExist") and req.values:
        return f"matchExpressions key {req.key!r}: {req.operator} takes no values"
    return None


def _requirement_matches(req: LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    if req.operator == "In":
        return req.key in labels and labels[req.key] in req.values
    if req.operator == "NotIn":  # as Kubernetes: a node without the label matches NotIn
        return req.key not in labels or labels[req.key] not in req.values
    if req.operator == "Exists":
        return req.key in labels
    return req.key not in labels  # DoesNotExist


def selector_error(selector: LabelSelector) -> str | None:
    """Why the agent cannot evaluate ``selector`` (None: it can)."""
    for req in selector.match_expressions:
        error = _requirement_error(req)
        if error:
            return error
    return None


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics: every matchLabels pair and every matchExpressions
    requirement holds (an invalid selector matches nothing)."""
    if selector_error(selector) is not None:
        return False
    if any(labels.get(k) != v for k, v in selector.match_labels.items()):
        return False
    return all(_requirement_matches(req, labels) for req in selector.match_expressions)


@dataclass(frozen=True, slots=True)
class Selection:
    """The outcome of targeting: the object this node takes (None: none or a tie), why, the
    names that tie (empty unless a tie) and objects whose selector could not be evaluated."""

    target: NodeAgentConfig | None
    reason: str
    tie: list[str] = field(default_factory=list)
    invalid: list[tuple[str, str]] = field(default_factory=list)


def _has_selector(obj: NodeAgentConfig) -> bool:
    return obj.spec.node_selector is not None and not obj.spec.node_selector.empty()


def _pick(
    candidates: Sequence[NodeAgentConfig], level: str, invalid: list[tuple[str, str]]
) -> Selection:
    if len(candidates) == 1:
        return Selection(candidates[0], f"{level}: {candidates[0].name}", invalid=invalid)
    names = sorted(c.name for c in candidates)
    reason = f"tie {level}: " + ", ".join(names) + " (config kept until one remains)"
    return Selection(None, reason, tie=names, invalid=invalid)


def select_target(
    objects: Iterable[NodeAgentConfig], node_name: str, node_labels: Mapping[str, str]
) -> Selection:
    """The object targeting node ``node_name`` (labels ``node_labels``), by the three levels."""
    live = [o for o in objects if not o.spec.paused]
    invalid: list[tuple[str, str]] = []
    by_name = [o for o in live if node_name in o.spec.node_names]
    if by_name:
        return _pick(by_name, "naming this node", invalid)
    matching: list[NodeAgentConfig] = []
    for obj in live:
        if obj.spec.node_names or not _has_selector(obj):
            continue
        selector = obj.spec.node_selector
        assert selector is not None
        error = selector_error(selector)
        if error is not None:
            invalid.append((obj.name, error))
        elif selector_matches(selector, node_labels):
            matching.append(obj)
    if matching:
        top = max(o.spec.priority for o in matching)
        best = [o for o in matching if o.spec.priority == top]
        return _pick(best, f"selector matching this node at priority {top}", invalid)
    global_ = [o for o in live if not o.spec.node_names and not _has_selector(o)]
    if global_:
        return _pick(global_, "global (no nodeNames, no nodeSelector)", invalid)
    return Selection(None, "no NodeAgentConfig targets this node", invalid=invalid)
