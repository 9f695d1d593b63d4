"""The rollout controller's metrics (docs/operating/metrics.md, "Rollout controller")."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

PLANS = Counter(
    "nodeagent_rollout_plans_total",
    "Rollout steps planned (one per NodeAgentConfig with spec.rollout per change seen), by the "
    "leader only.",
)
STATUS_WRITES = Counter(
    "nodeagent_rollout_status_writes_total",
    "Writes of status.rollout through the status subresource, by result: ok, conflict (409: "
    "replanned from a fresh read), failed.",
    ["result"],
)
CONFLICTS = Counter(
    "nodeagent_rollout_conflicts_total",
    "Status writes refused with 409 (the object changed since it was planned from): replanned.",
)
EVENTS = Counter(
    "nodeagent_rollout_events_total",
    "Events on NodeAgentConfigs by result, counted by the recorder (kube.events) as "
    "nodeagent_node_events_total: created, updated, aggregated, failed, dropped.",
    ["result"],
)
PHASE = Gauge(
    "nodeagent_rollout_phase",
    "1 for the phase each rolled-out NodeAgentConfig is in (Progressing, Paused, Halted, "
    "Aborted, Complete), 0 for the others, as the leader last wrote or read it.",
    ["object", "phase"],
)
ADMITTED = Gauge(
    "nodeagent_rollout_admitted_nodes",
    "Targeted nodes admitted to each NodeAgentConfig's rollout.",
    ["object"],
)
TARGETED = Gauge(
    "nodeagent_rollout_targeted_nodes",
    "Nodes each rolled-out NodeAgentConfig targets.",
    ["object"],
)
LEADER = Gauge(
    "nodeagent_rollout_leader",
    "1 while this controller holds the Lease and may write (renewed within renewDeadline).",
)
INVALID = Gauge(
    "nodeagent_rollout_invalid_objects",
    "NodeAgentConfigs with spec.rollout the controller cannot read (left alone, a Warning Event "
    "RolloutInvalid on each).",
)
