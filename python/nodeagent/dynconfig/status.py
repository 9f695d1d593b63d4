"""How dynamic configuration shows itself: the NodeAgentConfigOK condition and its texts, the
Events it posts on the Node, and the /v1/config view (assigned / active / last-known-good and
why they differ)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nodeagent.dynconfig.state import LOCAL_HASH, Assignment, Bad, BadKind, Known, State, Trial

if TYPE_CHECKING:
    from nodeagent.dynconfig.admission import Gate

__all__ = [
    "CONDITION_TYPE",
    "Condition",
    "ConfigEvent",
    "bad_condition",
    "condition_patch",
    "config_view",
    "deferred_condition",
    "describe",
    "describe_file",
    "describe_trial",
    "resting_condition",
]

CONDITION_TYPE = "NodeAgentConfigOK"

# The condition's reason, the Event's reason and the verb of the message, per kind of bad config.
REASON = {
    BadKind.INVALID: "ConfigInvalid",
    BadKind.VETO: "ConfigVetoed",
    BadKind.UNHEALTHY: "RolledBack",
    BadKind.CRASH: "RolledBack",
}
EVENT = {BadKind.INVALID: "ConfigInvalid", BadKind.VETO: "ConfigVetoed"}
VERB = {BadKind.INVALID: "rejected as invalid", BadKind.VETO: "vetoed"}


@dataclass(frozen=True, slots=True)
class ConfigEvent:
    """An Event the service posts on the Node (type Normal or Warning)."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Condition:
    status: bool
    reason: str
    message: str


def condition_patch(
    condition: Condition, now: float, *, transitioned: str | None = None
) -> dict[str, Any]:
    """The strategic-merge patch of nodes/<name>/status setting the agent's condition (the
    conditions list merges by type, so the kubelet's own conditions are untouched).
    `transitioned`: the lastTransitionTime the Node shows for the same status, kept (the
    time the status last changed, as the kubelet keeps it), else now."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {
        "status": {
            "conditions": [
                {
                    "type": CONDITION_TYPE,
                    "status": "True" if condition.status else "False",
                    "reason": condition.reason,
                    "message": condition.message,
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": transitioned or stamp,
                }
            ]
        }
    }


def describe(name: str, hash_: str) -> str:
    if hash_ == LOCAL_HASH:
        return "the local config"
    return f"NodeAgentConfig {name} (hash {hash_})"


def describe_known(known: Known) -> str:
    return describe(known.name, known.hash)


def describe_file(hash_: str) -> str:
    return f"the config file (hash {hash_})"


def describe_trial(trial: Trial) -> str:
    parts = [describe(trial.name, trial.hash)] if trial.remote else []
    if trial.file_hash:
        parts.append("the reloaded " + describe_file(trial.file_hash)[4:])
    return " and ".join(parts)


def bad_condition(bad: Bad, active: Known) -> Condition:
    """The condition while `bad` is the assigned config: one text whether it is written when
    the config is refused or rolled back, at a start, or at the next relist (a relist that
    changes nothing must write nothing)."""
    subject, running = describe(bad.name, bad.hash), describe_known(active)
    if bad.kind in VERB:
        text = f"{subject} {VERB[bad.kind]}: {bad.reason}; keeping {running}"
    else:
        text = f"{subject} rolled back: {bad.reason}; running {running}"
    return Condition(False, REASON[bad.kind], text)


def deferred_condition(target: Assignment, active: Known, problem: str) -> Condition:
    """The condition while `target`'s trial cannot be recorded (its marker not written to the
    checkpoint: a read-only or full state directory): not applied, tried again."""
    return Condition(
        False,
        "TrialDeferred",
        f"{describe(target.name, target.hash)} not applied yet: its trial cannot be recorded "
        f"({problem}); keeping {describe_known(active)}; tried again until the state directory "
        "is writable",
    )


def resting_condition(state: State, active: Known, kept: tuple[str, str] | None) -> Condition:
    """The condition once nothing is being decided: what the watch could not choose (`kept`:
    reason, text), the assigned config's error, the trial under way, or what runs."""
    running = describe_known(active)
    if kept is not None:
        # Until the watch selects again, what it could not choose is what the Node shows
        # (a trial ending meanwhile does not make a tie go away).
        reason, text = kept
        return Condition(False, reason, f"{text}; keeping {running}")
    assigned = state.assigned
    bad = None if assigned is None or assigned.hash == active.hash else state.bad_for(assigned)
    if bad is not None:
        # The kubelet's rule: the assigned config's error stays on the condition while it is
        # assigned (a trial of what runs ending meanwhile included).
        return bad_condition(bad, active)
    if state.trial is not None:
        return Condition(True, "OnTrial", f"{describe_trial(state.trial)} applied, on trial")
    if state.assigned is None:
        return Condition(
            True, "Local", "no NodeAgentConfig targets the node; running the local config"
        )
    passed = state.passed
    if passed is not None and passed.hash == active.hash:
        # Through its trial, held short of last-known-good until its rollout is Complete.
        lkg = "the local config" if state.lkg is None else describe_known(state.lkg)
        return Condition(
            True,
            "Active",
            f"{running} active, through its trial; last-known-good stays {lkg} until its "
            "rollout is Complete",
        )
    return Condition(True, "Active", f"{running} active and last-known-good")


def config_view(
    state: State,
    *,
    active: Known,
    active_source: str,
    active_since: float,
    boot: tuple[str, str],
    file_hash: str,
    remaining: float | None,
    condition: Condition,
    not_blamed: Mapping[str, str] | None = None,
    waiting: Gate | None = None,
) -> dict[str, Any]:
    """The /v1/config view: assigned / active / last-known-good and why they differ (`boot`:
    source, reason; `remaining`: seconds of the trial left; `waiting`: the assigned config's
    rollout does not admit this node)."""
    assigned = state.assigned
    lkg = state.lkg
    trial = state.trial
    differ: list[str] = []
    if assigned is not None and assigned.hash != active.hash:
        bad = state.bad_for(assigned)
        why = "not applied yet"
        if bad is not None:
            why = f"{bad.kind}: {bad.reason}"
        elif waiting is not None:
            why = f"its rollout does not admit this node ({waiting.reason})"
        differ.append(f"assigned {assigned.hash} not active: {why}")
    if lkg is not None and lkg.hash != active.hash:
        held = state.passed is not None and state.passed.hash == active.hash
        differ.append(
            f"active {active.hash} not last-known-good: "
            + ("on trial" if trial else "its rollout not Complete" if held else "not promoted")
        )
    if trial is not None and trial.file_hash:
        differ.append(f"the reloaded config file (hash {trial.file_hash}) on trial")
    bad_file = state.bad_file
    if bad_file is not None:
        differ.append(
            f"the config file (hash {bad_file.hash}) rolled back ({bad_file.kind}: "
            f"{bad_file.reason}); a reload is retried once the file changes"
        )
    return {
        "boot": {"source": boot[0], "reason": boot[1]},
        "assigned": None
        if assigned is None
        else {
            "name": assigned.name,
            "uid": assigned.uid,
            "generation": assigned.generation,
            "hash": assigned.hash,
            "since": stamp(state.assigned_at),
        },
        "active": {
            "name": active.name,
            "hash": active.hash,
            "source": active_source,
            "since": stamp(active_since),
        },
        "last_known_good": None
        if lkg is None
        else {"name": lkg.name, "hash": lkg.hash, "since": stamp(state.lkg_at)},
        # Whether the node waits for the assigned config's rollout (issue 31): its reason and
        # message, as the condition says them.
        "rollout": {
            "waiting": waiting is not None,
            "reason": "" if waiting is None else waiting.reason,
            "message": "" if waiting is None else waiting.message,
        },
        "file": {
            "hash": file_hash,
            "on_trial": trial is not None and bool(trial.file_hash),
            "rolled_back": None
            if bad_file is None
            else {
                "hash": bad_file.hash,
                "kind": bad_file.kind.value,
                "reason": bad_file.reason,
            },
        },
        "trial": None
        if trial is None
        else {
            "name": trial.name,
            "hash": trial.hash,
            "remote": trial.remote,
            "file_hash": trial.file_hash or None,
            "since": stamp(trial.started_at),
            "remaining": remaining,
            "restarts": trial.restarts,
            # The fields it changed (None: not known) and the signals past their bound it
            # cannot cause: reported, not held against it.
            "changed": trial.changed,
            "not_blamed": dict(not_blamed or {}),
        },
        "bad": [
            {"name": b.name, "hash": b.hash, "kind": b.kind.value, "reason": b.reason}
            for b in state.bad
        ],
        "differ": differ,
        "condition": {
            "type": CONDITION_TYPE,
            "status": condition.status,
            "reason": condition.reason,
            "message": condition.message,
        },
    }


def stamp(at: float | None) -> str | None:
    return None if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
