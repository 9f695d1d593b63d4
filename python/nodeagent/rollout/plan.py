"""The rollout controller's step, as a pure function: from the policy, the targeted nodes and
what each does with the config, the current ``status.rollout`` and the time, the next status and
the Events to post. No I/O, no clock, no memory but the status: a controller that restarts (or a
second one that takes the lease) replans from the stored status and reaches the same answer.

Rules, in order (each a decision; docs/architecture/rollout.md has the state machine):
1. a config the status does not roll out starts a new rollout: nobody admitted, the canary first;
2. ``spec.rollout.abort``, or failures at the failure policy's limit with ``revert``: Aborted,
   nobody admitted (every node that took the config returns to its previous one);
3. failures at the limit, or failed nodes filling ``maxUnavailable`` (they stay failed, so
   nobody could be admitted again): Halted, admission frozen where it is;
4. ``spec.rollout.paused``: Paused, admission frozen where it is;
5. else Progressing: admit, in rank order, up to the current wave's share while at most
   ``maxUnavailable`` admitted nodes are not through their trial; a wave whose nodes all passed
   (or failed, under the limit) starts the pause, after which the next wave opens; the last
   wave done is Complete.
The threshold only moves forward (further in the rank order), except to ``none`` on abort.
"""

from __future__ import annotations

import calendar
import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from nodeagent.rollout.api import (
    ALL,
    NONE,
    Counts,
    Phase,
    RolloutSpec,
    RolloutStatus,
    canary_size,
    failure_limit,
    max_unavailable,
)
from nodeagent.rollout.rank import rank_key

__all__ = ["Event", "Node", "NodeState", "Plan", "Revision", "plan", "wave_targets"]


class NodeState(enum.StrEnum):
    """What a targeted node does with the rolled-out config (from its NodeAgentConfigOK)."""

    WAITING = "waiting"  # runs something else (not admitted yet, or admitted and not started)
    ON_TRIAL = "on-trial"
    ACTIVE = "active"  # through the trial
    ROLLED_BACK = "rolled-back"  # unhealthy or crashed during the trial, went back
    FAILED = "failed"  # refused it: invalid or vetoed


_FAILED = (NodeState.ROLLED_BACK, NodeState.FAILED)


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    canary: bool  # its labels match spec.rollout.canary.selector
    state: NodeState = NodeState.WAITING


@dataclass(frozen=True, slots=True)
class Revision:
    """The object as it is now: its uid, generation and config hash."""

    uid: str
    generation: int
    config_hash: str


@dataclass(frozen=True, slots=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Plan:
    status: RolloutStatus
    events: tuple[Event, ...]


def _stamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


def _parse(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def wave_targets(spec: RolloutSpec, targeted: int) -> list[tuple[int, int]]:
    """``[(wave, nodes admitted once it is open)]``: the canary (wave 0, if any) and each wave's
    cumulative share (rounded up), never fewer than the wave before; the last is every node."""
    out: list[tuple[int, int]] = []
    canary = canary_size(spec, targeted)
    if canary > 0:
        out.append((0, canary))
    floor = canary
    for index, percent in enumerate(spec.waves, start=1):
        floor = max(floor, min(targeted, -(-percent * targeted // 100)))
        out.append((index, floor))
    if not out or out[-1][1] < targeted:  # waves not ending at 100 (a looser CRD): finish
        out.append((len(spec.waves) + 1, targeted))
    return out


def _counts(nodes: Sequence[Node]) -> Counts:
    by = {state: sum(1 for n in nodes if n.state == state) for state in NodeState}
    return Counts(
        targeted=len(nodes),
        updated=by[NodeState.ON_TRIAL] + by[NodeState.ACTIVE],
        on_trial=by[NodeState.ON_TRIAL],
        active=by[NodeState.ACTIVE],
        rolled_back=by[NodeState.ROLLED_BACK],
        failed=by[NodeState.FAILED],
    )


def _admits(threshold: str, key: str) -> bool:
    return threshold == ALL or (threshold != NONE and key <= threshold)


def plan(
    spec: RolloutSpec,
    revision: Revision,
    nodes: Sequence[Node],
    status: RolloutStatus | None,
    now: float,
) -> Plan:
    """The next status.rollout and the Events of the transition (none when nothing changed)."""
    fresh = status is None or status.config_hash != revision.config_hash
    prev = (
        RolloutStatus(config_hash=revision.config_hash, generation=revision.generation)
        if fresh or status is None
        else status
    )
    ranked = sorted((rank_key(n.name, revision.uid, prev.generation, n.canary), n) for n in nodes)
    keys = [key for key, _ in ranked]
    ok = [node.state == NodeState.ACTIVE for _, node in ranked]
    bad = [node.state in _FAILED for _, node in ranked]
    counts = _counts(nodes)
    targets = wave_targets(spec, len(nodes))
    failures = counts.rolled_back + counts.failed
    limit = failure_limit(spec, len(nodes))
    budget = max_unavailable(spec, len(nodes))
    base = msgspec.structs.replace(prev, observed_generation=revision.generation, counts=counts)

    if spec.abort or (failures >= limit and spec.failure_policy.revert):
        why = "spec.rollout.abort" if spec.abort else _failed(failures, limit) + ", revert"
        nxt = msgspec.structs.replace(
            base,
            phase=Phase.ABORTED,
            admitted_through=NONE,
            admitted=0,
            wave=targets[0][0],
            wave_complete_at="",
            halted_reason=why,
            message=f"aborted ({why}): every node returns to its previous config",
        )
    elif failures >= limit:
        why = _failed(failures, limit)
        nxt = msgspec.structs.replace(
            base,
            phase=Phase.HALTED,
            admitted=_admitted_count(keys, prev.admitted_through),
            halted_reason=why,
            message=f"halted at wave {prev.wave}: {why}",
        )
    elif _stuck(keys, bad, prev.admitted_through, budget):
        # Failures under the limit are tolerated, but a failed node stays failed (its agent
        # does not retry a config it judged bad), so once they fill maxUnavailable nobody can
        # ever be admitted again: say so rather than show a rollout that never moves.
        why = f"failed nodes use all of maxUnavailable ({budget})"
        nxt = msgspec.structs.replace(
            base,
            phase=Phase.HALTED,
            admitted=_admitted_count(keys, prev.admitted_through),
            halted_reason=why,
            message=f"halted at wave {prev.wave}: {why}; raise it or change the config",
        )
    elif spec.paused:
        nxt = msgspec.structs.replace(
            base,
            phase=Phase.PAUSED,
            admitted=_admitted_count(keys, prev.admitted_through),
            halted_reason="",
            message=f"paused at wave {prev.wave} (spec.rollout.paused)",
        )
    else:
        nxt = _progress(spec, base, keys, ok, bad, targets, now)
    return Plan(nxt, tuple(_events(None if fresh else status, nxt)))


def _failed(failures: int, limit: int) -> str:
    return f"{failures} node(s) rolled back or refused the config (limit {limit})"


def _stuck(keys: Sequence[str], bad: Sequence[bool], threshold: str, budget: int) -> bool:
    admitted = _admitted_count(keys, threshold)
    return admitted < len(keys) and sum(bad[:admitted]) >= budget


def _admitted_count(keys: Sequence[str], threshold: str) -> int:
    return sum(1 for key in keys if _admits(threshold, key))


def _progress(
    spec: RolloutSpec,
    base: RolloutStatus,
    keys: Sequence[str],
    ok: Sequence[bool],
    bad: Sequence[bool],
    targets: Sequence[tuple[int, int]],
    now: float,
) -> RolloutStatus:
    threshold = base.admitted_through
    budget = max_unavailable(spec, len(keys))
    # The wave to work on: the status's, or the first one after an abort was lifted.
    index = next((i for i, (wave, _) in enumerate(targets) if wave >= base.wave), 0)
    complete_at = base.wave_complete_at
    if threshold == NONE:
        index, complete_at = 0, ""
    while True:
        admitted = _admitted_count(keys, threshold)
        # Admitted in rank order: the first `admitted` keys (a node admitted by an "all"
        # threshold after it joined counts too).
        passed = sum(ok[:admitted])
        wave, target = targets[index]
        while threshold != ALL:
            grow = min(target, passed + budget)
            if grow <= admitted:
                break
            threshold, admitted = keys[grow - 1], grow
            # A node admitted already through its trial (it ran the config before an abort)
            # counts as through at once: one plan reaches the fixed point a replan would.
            passed = sum(ok[:admitted])
        # Done with the wave: every admitted node through its trial or failed (a failure under
        # the failure policy's limit is tolerated; it still uses maxUnavailable).
        finished = sum(o or b for o, b in zip(ok[:admitted], bad[:admitted], strict=True))
        if admitted < target or finished < admitted:
            break  # the wave is still being admitted or tried
        if index == len(targets) - 1:
            return msgspec.structs.replace(
                base,
                phase=Phase.COMPLETE,
                admitted_through=ALL,
                admitted=len(keys),
                wave=wave,
                wave_complete_at=complete_at or _stamp(now),
                halted_reason="",
                message=f"complete: {sum(ok)} of {len(keys)} node(s) run the config",
            )
        if not complete_at:
            complete_at = _stamp(now)
        if now < _parse(complete_at) + spec.pause_seconds:
            break  # the pause between waves
        index, complete_at = index + 1, ""
    wave = targets[index][0]
    return msgspec.structs.replace(
        base,
        phase=Phase.PROGRESSING,
        admitted_through=threshold,
        admitted=admitted,
        wave=wave,
        wave_complete_at=complete_at,
        halted_reason="",
        message=(
            f"wave {wave}: {admitted} of {len(keys)} node(s) admitted, "
            f"{sum(ok)} through their trial"
        ),
    )


def _events(prev: RolloutStatus | None, nxt: RolloutStatus) -> list[Event]:
    """An Event per transition: a new rollout, a wave opened, a halt, a pause or resume, an
    abort, the end. Replaying a status that already holds the transition posts nothing."""
    events: list[Event] = []
    if prev is None:
        events.append(
            Event("Normal", "RolloutStarted", f"rollout of config {nxt.config_hash} started")
        )
    before = prev.phase if prev is not None else Phase.PROGRESSING
    if nxt.phase != before or prev is None:
        if nxt.phase == Phase.HALTED:
            events.append(Event("Warning", "RolloutHalted", nxt.message))
        elif nxt.phase == Phase.ABORTED:
            events.append(Event("Warning", "RolloutAborted", nxt.message))
        elif nxt.phase == Phase.PAUSED:
            events.append(Event("Normal", "RolloutPaused", nxt.message))
        elif nxt.phase == Phase.COMPLETE:
            events.append(Event("Normal", "RolloutComplete", nxt.message))
        elif prev is not None:
            events.append(Event("Normal", "RolloutResumed", nxt.message))
    if nxt.phase == Phase.PROGRESSING and (prev is None or nxt.wave != prev.wave):
        events.append(Event("Normal", "WaveStarted", nxt.message))
    return events
