"""What the controller sees: the rolled-out NodeAgentConfigs, the nodes each one targets (by the
agent's own selection, `dynconfig.source.select_target`) and what each node does with the
config, read from its NodeAgentConfigOK condition (`node_state`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from nodeagent.dynconfig.overlay import config_hash
from nodeagent.dynconfig.source import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    LabelSelector,
    NodeAgentConfig,
    decode_object,
    select_target,
    selector_matches,
)
from nodeagent.kube import Resource
from nodeagent.rollout.api import RolloutSpec, RolloutStatus, decode_spec, decode_status
from nodeagent.rollout.plan import Node, NodeState, Revision

__all__ = [
    "CONDITION_TYPE",
    "NODEAGENTCONFIGS",
    "NodeView",
    "Rollout",
    "node_state",
    "rollouts",
]

CONDITION_TYPE = "NodeAgentConfigOK"
NODEAGENTCONFIGS = Resource(
    group=GROUP, version=VERSION, plural=PLURAL, kind=KIND, namespaced=False
)

# The agent's contract (docs/architecture/rollout.md): the FIRST "NodeAgentConfig <name> (hash
# <hash>)" in the condition's message names the config its reason is about.
_SUBJECT = re.compile(r"NodeAgentConfig (\S+) \(hash ([^)\s]+)\)")
_STATES = {
    "OnTrial": NodeState.ON_TRIAL,
    "Active": NodeState.ACTIVE,
    "RolledBack": NodeState.ROLLED_BACK,
    "ConfigInvalid": NodeState.FAILED,
    "ConfigVetoed": NodeState.FAILED,
}


def node_state(condition: Mapping[str, Any] | None, name: str, hash_: str) -> NodeState:
    """What a node does with config ``hash_`` of object ``name``, from its NodeAgentConfigOK
    condition: the reason counts only when the condition is about that very config; anything
    else (no condition, another config, a waiting reason) is WAITING."""
    if not condition:
        return NodeState.WAITING
    state = _STATES.get(str(condition.get("reason") or ""))
    match = _SUBJECT.search(str(condition.get("message") or ""))
    if state is None or match is None or match.groups() != (name, hash_):
        return NodeState.WAITING
    return state


class _Condition(msgspec.Struct):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""


class _NodeMeta(msgspec.Struct):
    name: str
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class _NodeStatus(msgspec.Struct):
    conditions: list[_Condition] = msgspec.field(default_factory=list)


class NodeView(msgspec.Struct):
    """A Node as the controller keeps it: its name, labels and NodeAgentConfigOK condition only
    (the accumulator's transform: memory per node is a few strings, not the whole Node)."""

    metadata: _NodeMeta
    status: _NodeStatus = msgspec.field(default_factory=_NodeStatus)

    def __post_init__(self) -> None:
        self.status.conditions = [c for c in self.status.conditions if c.type == CONDITION_TYPE]

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def condition(self) -> dict[str, Any] | None:
        conditions = self.status.conditions
        return msgspec.structs.asdict(conditions[0]) if conditions else None


@dataclass(frozen=True, slots=True)
class Rollout:
    """One NodeAgentConfig with spec.rollout, observed: what `rollout.plan.plan` needs, and the
    object as read (the status write carries it back with its resourceVersion)."""

    name: str
    obj: dict[str, Any]
    resource_version: str
    spec: RolloutSpec
    revision: Revision
    nodes: tuple[Node, ...]
    status: RolloutStatus | None


def _canary_selector(spec: RolloutSpec) -> LabelSelector | None:
    raw = spec.canary.selector
    return None if raw is None else msgspec.convert(raw, LabelSelector)


def rollouts(
    objects: Sequence[Mapping[str, Any]],
    nodes: Iterable[NodeView],
    problems: dict[str, str] | None = None,
) -> list[Rollout]:
    """Every object with ``spec.rollout``, with its targeted nodes. An object that does not
    decode is left out, named in ``problems`` (it still takes part in targeting if it can)."""
    decoded: list[tuple[Mapping[str, Any], NodeAgentConfig]] = []
    for obj in objects:
        try:
            decoded.append((obj, decode_object(obj)))
        except Exception as exc:  # a looser CRD than the agent's: reported, others go on
            if problems is not None:
                problems[str((obj.get("metadata") or {}).get("name", "?"))] = str(exc)
    configs = [config for _, config in decoded]
    targeted: dict[str, list[NodeView]] = {}
    for node in nodes:
        target = select_target(configs, node.name, node.metadata.labels).target
        if target is not None:
            targeted.setdefault(target.name, []).append(node)
    out: list[Rollout] = []
    for obj, config in decoded:
        spec_raw = obj.get("spec") or {}
        if "rollout" not in spec_raw:
            continue  # not opted in: the agents take it at once, nothing to write
        try:
            spec = decode_spec(spec_raw.get("rollout"))
            selector = _canary_selector(spec)
        except (msgspec.ValidationError, TypeError) as exc:
            if problems is not None:
                problems[config.name] = f"spec.rollout: {exc}"
            continue
        hash_ = config_hash(config.spec.config)
        views = targeted.get(config.name, [])
        status = decode_status((obj.get("status") or {}).get("rollout"))
        out.append(
            Rollout(
                name=config.name,
                obj=dict(obj),
                resource_version=config.metadata.resource_version,
                spec=spec,
                revision=Revision(config.metadata.uid, config.metadata.generation, hash_),
                nodes=tuple(
                    Node(
                        view.name,
                        selector is not None and selector_matches(selector, view.metadata.labels),
                        node_state(view.condition, config.name, hash_),
                    )
                    for view in views
                ),
                status=status,
            )
        )
    return out
