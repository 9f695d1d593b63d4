"""The dynamic-config state machine: assigned, active, last-known-good, bad hashes and the trial.

Lessons of the kubelet's KEP-281 designed against:
- last-known-good is promoted at run time when a trial ends, never at a restart, so a rollback
  never skips past a good config (kubernetes#57808);
- a trial marker in the checkpoint tells a process that died during a trial (marker found at
  start: roll back, mark the hash bad) from a reboot after a trial (no marker) (kubernetes#50216);
- the agent boots from the checkpointed last-known-good without the apiserver, within a grace
  (kubernetes#71518).

The controller holds no task of its own besides `run_trials`; the service calls `boot`, `assign`,
`keep` and `confirm` from its watch of NodeAgentConfig objects, and gives it the hub to apply
through (`propose`), a builder (remote dict -> effective config, raising ConfigError) and a
hasher. Everything it decides is reported through `on_event`, the metrics and `condition()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import trio

from nodeagent.checkpoint import CheckpointState, CheckpointStore
from nodeagent.core.errors import ConfigError
from nodeagent.dynconfig.metrics import (
    ACTIVE_INFO,
    ASSIGNED_INFO,
    LKG_INFO,
    REJECTED,
    ROLLBACKS,
    VETOES,
    set_info,
)
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.log import get_logger

__all__ = [
    "CHECKPOINT_NAME",
    "CONDITION_TYPE",
    "LOCAL_HASH",
    "Assignment",
    "BootResult",
    "Condition",
    "ConfigEvent",
    "Controller",
    "HealthTracker",
    "condition_patch",
]

log = get_logger(__name__)

CHECKPOINT_NAME = "dynconfig_state"
CONDITION_TYPE = "NodeAgentConfigOK"
# The hash shown for the local config (defaults, file and flags without a remote overlay).
LOCAL_HASH = "local"
_FORMAT = 1

C = TypeVar("C")
C_contra = TypeVar("C_contra", contravariant=True)


class ApplyResultLike(Protocol):
    @property
    def applied(self) -> bool: ...
    @property
    def vetoes(self) -> Sequence[tuple[str, str]]: ...
    @property
    def changed(self) -> Sequence[str]: ...


class HubLike(Protocol[C_contra]):
    """What the controller uses of the service's ConfigHub."""

    def propose(self, new: C_contra, source: str) -> ApplyResultLike: ...


class ComponentHealth(Protocol):
    """What the controller reads of the supervisor's ComponentReport."""

    @property
    def name(self) -> str: ...
    @property
    def ready(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def restarts(self) -> int: ...


# ---- checkpointed state -------------------------------------------------------------------


class Assignment(msgspec.Struct, frozen=True, kw_only=True):
    """The remote config this node's target object assigns (its ``spec.config``)."""

    name: str
    uid: str
    generation: int
    config: dict[str, Any]
    hash: str = ""

    @property
    def object_key(self) -> str:
        # A bad hash is retried once the object changes: another object, or a new generation.
        return f"{self.uid}/{self.generation}"


class Known(msgspec.Struct, frozen=True, kw_only=True):
    """A config the agent ran (active or last-known-good); `config` None is the local one."""

    hash: str
    name: str
    config: dict[str, Any] | None = None


class Bad(msgspec.Struct, frozen=True, kw_only=True):
    hash: str
    object_key: str
    name: str
    kind: str  # invalid, veto, unhealthy, crash
    reason: str
    at: float


class Trial(msgspec.Struct, frozen=True, kw_only=True):
    hash: str
    name: str
    started_at: float  # wall clock, for the status
    # What is on trial: the remote config (`hash`, not yet last-known-good), a reloaded file
    # (`file_hash`, SIGHUP), or both; a rollback reverts both and marks both bad.
    remote: bool = True
    file_hash: str = ""
    # Seconds of the trial left when the agent stopped cleanly (SIGTERM, SIGINT): the next
    # start resumes the trial for that long. None while running: found at start, the agent died.
    remaining: float | None = None
    # Clean restarts during this trial (a failing liveness probe stops the agent cleanly too:
    # crashloop_restarts of them count as a crash).
    restarts: int = 0
    # The remote config on trial, recorded by a clean stop: the assignment may have moved on
    # meanwhile (an edit rejected as invalid keeps the trial running).
    config: dict[str, Any] | None = None


class State(msgspec.Struct, kw_only=True):
    version: int = _FORMAT
    assigned: Assignment | None = None
    assigned_at: float | None = None
    lkg: Known | None = None
    lkg_at: float | None = None
    bad: list[Bad] = msgspec.field(default_factory=list)
    # Written when a trial starts, cleared when it ends: found at start, the process died
    # during the trial.
    trial: Trial | None = None
    # The last time the apiserver confirmed the assignment: the checkpoint grace counts from it.
    confirmed_at: float | None = None
    # A reloaded file rolled back during its trial: a reload of the same content is refused
    # until the file changes.
    bad_file: Bad | None = None


# ---- status --------------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class BootResult(Generic[C]):
    config: C
    # checkpoint, defaults (no/expired/corrupt checkpoint), rollback (died during a trial)
    source: str
    reason: str


def condition_patch(condition: Condition, now: float) -> dict[str, Any]:
    """The strategic-merge patch of nodes/<name>/status setting the agent's condition (the
    conditions list merges by type, so the kubelet's own conditions are untouched)."""
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
                    "lastTransitionTime": stamp,
                }
            ]
        }
    }


# ---- health --------------------------------------------------------------------------------


@dataclass(slots=True)
class HealthTracker:
    """Tells "unhealthy because ..." from the supervisor's reports during a trial."""

    settings: DynconfigSettings
    _unready_since: dict[str, float] = field(default_factory=dict)
    _restarts_at_start: dict[str, int] = field(default_factory=dict)

    def start(self, reports: Sequence[ComponentHealth]) -> None:
        """A trial begins: restarts are counted from here, readiness timed afresh."""
        self._unready_since.clear()
        self._restarts_at_start = {r.name: r.restarts for r in reports}

    def observe(
        self, reports: Sequence[ComponentHealth], now: float, watchdog_age: float | None = None
    ) -> str | None:
        for report in reports:
            restarts = report.restarts - self._restarts_at_start.setdefault(
                report.name, report.restarts
            )
            if restarts >= self.settings.crashloop_restarts:
                return (
                    f"component {report.name} crash-looping: restarted {restarts} times "
                    f"during the trial ({report.reason})"
                )
            if report.ready:
                self._unready_since.pop(report.name, None)
                continue
            since = self._unready_since.setdefault(report.name, now)
            if now - since > self.settings.unready_bound:
                return (
                    f"component {report.name} not ready for {now - since:.0f}s "
                    f"(bound {self.settings.unready_bound:g}s): {report.reason}"
                )
        if watchdog_age is not None and watchdog_age > self.settings.watchdog_bound:
            return (
                f"watchdog not kicked for {watchdog_age:.0f}s "
                f"(bound {self.settings.watchdog_bound:g}s)"
            )
        return None


# ---- the controller ------------------------------------------------------------------------


class Controller(Generic[C]):
    def __init__(
        self,
        settings: DynconfigSettings,
        store: CheckpointStore,
        build: Callable[[Mapping[str, Any] | None], C],
        hasher: Callable[[Mapping[str, Any]], str],
        *,
        on_event: Callable[[ConfigEvent], None] = lambda event: None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.build = build
        self.hasher = hasher
        self.on_event = on_event
        self.wall = wall
        self.hub: HubLike[C] | None = None
        self.state = State()
        self.active = Known(hash=LOCAL_HASH, name="local")
        # Where the active config came from (local, remote, checkpoint) and since when (wall).
        self.active_source = ""
        self.active_since = wall()
        self.boot_source = "defaults"
        self.boot_reason = "not booted"
        self.trial_deadline: float | None = None  # trio time
        # A trial resumed at boot (a clean restart): its seconds left, armed by run_trials.
        self._resume_for: float | None = None
        # Why the watch could not select (a tie, an unreadable list or target), until it
        # selects again: (condition reason, text).
        self._kept: tuple[str, str] | None = None
        self.condition_ = Condition(True, "Local", "running the local config")
        self.changed = trio.Event()
        self.health = HealthTracker(settings)
        # The local file (and flags) the running config is built from, by hash; while a reload
        # is on trial, `_file_undo` restores the file it replaced (the rollback target) and
        # `on_file_rollback` tells the reload's owner why it was undone.
        self.file_hash = ""
        self._proven_file = ""
        self._file_undo: Callable[[], None] | None = None
        self.on_file_rollback: Callable[[str], None] = lambda message: None

    # -- boot --

    def boot(self) -> BootResult[C]:
        """The config to start with, before the apiserver answers (raises nothing: a broken
        checkpoint falls back to the local config and says why)."""
        loaded = self._load()
        if isinstance(loaded, str):
            return self._boot_local("defaults", loaded)
        self.state = loaded
        now = self.wall()
        why = "the agent died during its trial"
        trial = self.state.trial
        if trial is not None and trial.remaining is not None:
            restarts = trial.restarts + 1
            if restarts < self.settings.crashloop_restarts:
                resumed = self._resume(trial, restarts, now)
                if resumed is not None:
                    return resumed
                trial = self.state.trial
            else:
                why = f"the agent restarted {restarts} times during its trial"
        if trial is not None and not trial.remote:
            self._died_on_file_trial(trial)
            self.state.trial = trial = None
            self._save()
        if trial is not None:
            # The process died during a trial: that config is what killed it.
            self.state.trial = None
            if trial.file_hash:
                self._died_on_file_trial(trial)
            key = self.state.assigned.object_key if self.state.assigned else ""
            self._mark_bad(trial.hash, key, trial.name, "crash", why)
            ROLLBACKS.inc()
            self.on_event(
                ConfigEvent(
                    "Warning",
                    "ConfigRolledBack",
                    f"{_describe(trial.name, trial.hash)} rolled back at start: {why}",
                )
            )
            result = self._boot_from_lkg(
                "rollback", f"{why}: {_describe(trial.name, trial.hash)}", now
            )
            self._save()
            self.condition_ = Condition(
                False,
                "RolledBack",
                f"{_describe(trial.name, trial.hash)} rolled back: {why}; running "
                f"{_describe(self.active.name, self.active.hash)}",
            )
            return result
        return self._boot_from_lkg("checkpoint", "checkpointed last-known-good", now)

    def _resume(self, trial: Trial, restarts: int, now: float) -> BootResult[C] | None:
        """The agent stopped cleanly during `trial`: start on the config on trial and run the
        rest of the trial (None: it cannot be resumed, and is dropped without blame)."""
        remaining = trial.remaining or 0.0
        if trial.file_hash:
            # A start reads the file as it is now (a reload's trial is not a start's).
            log.info("dynconfig reload trial ended by a clean stop", hash=trial.file_hash)
        if not trial.remote:
            self.state.trial = None
            self._save()
            return None
        confirmed = self.state.confirmed_at if self.state.confirmed_at is not None else 0.0
        problem = None
        if trial.config is None:
            problem = "the checkpoint does not hold the config on trial"
        elif now - confirmed > self.settings.checkpoint_grace:
            problem = (
                f"checkpoint expired ({now - confirmed:.0f}s since the apiserver confirmed it, "
                f"grace {self.settings.checkpoint_grace:g}s)"
            )
        config = None
        if problem is None:
            try:
                config = self.build(trial.config)
            except ConfigError as exc:
                problem = f"the config on trial no longer builds: {exc}"
        if problem is not None or config is None:
            log.info("dynconfig trial not resumed", name=trial.name, reason=problem)
            self.state.trial = None
            self._save()
            return None
        self.state.trial = msgspec.structs.replace(
            trial, file_hash="", remaining=None, restarts=restarts, config=None
        )
        self._save()  # the marker armed again: a crash during the rest of the trial rolls back
        self._resume_for = remaining
        self._set_active(
            Known(hash=trial.hash, name=trial.name, config=trial.config), source="checkpoint"
        )
        self.boot_source = "resumed"
        self.boot_reason = (
            f"the agent stopped cleanly during the trial of {_describe(trial.name, trial.hash)}: "
            f"resumed, {remaining:.0f}s left"
        )
        self.condition_ = Condition(
            True,
            "OnTrial",
            f"{_describe(trial.name, trial.hash)} on trial, resumed after a clean restart "
            f"({remaining:.0f}s left)",
        )
        log.info("dynconfig boot", source="resumed", reason=self.boot_reason, hash=trial.hash)
        return BootResult(config, "resumed", self.boot_reason)

    def stop_clean(self) -> None:
        """The agent is stopping on request (SIGTERM, SIGINT), nothing of it running any more: a
        trial under way is recorded as interrupted, not died, with the time it has left."""
        trial = self.state.trial
        if trial is None:
            return
        if self.trial_deadline is not None:
            remaining = max(0.0, self.trial_deadline - trio.current_time())
        elif self._resume_for is not None:
            remaining = self._resume_for
        else:
            remaining = self.settings.trial_duration
        self.state.trial = msgspec.structs.replace(
            trial, remaining=remaining, config=self.active.config
        )
        self.trial_deadline = self._resume_for = None  # no tick may end it from here
        self._save()
        log.info("dynconfig trial interrupted by a clean stop", name=trial.name, left=remaining)

    def _died_on_file_trial(self, trial: Trial) -> None:
        # Unlike a remote config, the file is not rolled back at start: a start reads the file
        # the operator wrote (and refuses an invalid one); a reload of the same content is
        # refused until the file changes.
        reason = "the agent died during its trial"
        self.state.bad_file = _bad_file(trial.file_hash, "crash", reason, self.wall())
        message = (
            f"{_describe_file(trial.file_hash)}: {reason}; started again on the file as it is "
            "now (a reload of the same file is refused until it changes)"
        )
        log.warning("dynconfig file trial died", hash=trial.file_hash)
        self.on_event(ConfigEvent("Warning", "ConfigTrialFailed", message))

    def _boot_from_lkg(self, source: str, reason: str, now: float) -> BootResult[C]:
        lkg = self.state.lkg
        if lkg is None or lkg.config is None:
            return self._boot_local(
                "defaults" if source == "checkpoint" else source,
                f"{reason}; no remote last-known-good",
            )
        confirmed = self.state.confirmed_at if self.state.confirmed_at is not None else 0.0
        age = now - confirmed
        if age > self.settings.checkpoint_grace:
            # The last-known-good is what a rollback goes back to; booted local, that is the
            # local config (kept, the same config assigned again would be on trial with itself
            # as its rollback target).
            self._forget_lkg()
            return self._boot_local(
                "defaults",
                f"{reason}; checkpoint expired ({age:.0f}s since the apiserver confirmed it, "
                f"grace {self.settings.checkpoint_grace:g}s)",
            )
        try:
            config = self.build(lkg.config)
        except ConfigError as exc:
            self._forget_lkg()
            return self._boot_local("defaults", f"checkpointed config invalid: {exc}")
        self._set_active(lkg, source="checkpoint")
        self.boot_source, self.boot_reason = source, f"{reason} ({age:.0f}s old)"
        self.condition_ = Condition(
            True, "Checkpoint", f"running {_describe(lkg.name, lkg.hash)} from the checkpoint"
        )
        log.info("dynconfig boot", source=source, reason=self.boot_reason, hash=lkg.hash)
        return BootResult(config, source, self.boot_reason)

    def _forget_lkg(self) -> None:
        self.state.lkg, self.state.lkg_at = None, None
        self._save()

    def _boot_local(self, source: str, reason: str) -> BootResult[C]:
        self._set_active(Known(hash=LOCAL_HASH, name="local"))
        self.boot_source, self.boot_reason = source, reason
        self.condition_ = Condition(True, "Local", f"running the local config: {reason}")
        log.info("dynconfig boot", source=source, reason=reason)
        return BootResult(self.build(None), source, reason)

    def _load(self) -> State | str:
        read = self.store.read(CHECKPOINT_NAME)
        if read.state is CheckpointState.NOT_FOUND:
            return "no checkpoint"
        if read.state is CheckpointState.FOREIGN:
            return f"checkpoint of another node refused ({read.reason})"
        if read.state is CheckpointState.CORRUPT or read.data is None:
            return f"checkpoint corrupt ({read.reason})"
        try:
            state = msgspec.json.decode(read.data, type=State)
        except msgspec.DecodeError as exc:
            return f"checkpoint unreadable: {exc}"
        if state.version != _FORMAT:
            return f"checkpoint format {state.version} unknown"
        return state

    # -- inputs from the watch --

    def attach(self, hub: HubLike[C]) -> None:
        self.hub = hub

    def assign(self, target: Assignment | None, reports: Sequence[ComponentHealth] = ()) -> None:
        """The watch selected `target` (None: no object targets this node: the local config)."""
        self._kept = None
        if target is None:
            self._assign_local()
            return
        target = msgspec.structs.replace(target, hash=self.hasher(target.config))
        if target == self.state.assigned:
            # A re-list or an unrelated change of the object: no checkpoint write per watch
            # event, only the grace's refresh.
            self.confirm()
        else:
            self.state.assigned, self.state.assigned_at = target, self.wall()
            self.state.confirmed_at = self.state.assigned_at
            set_info(ASSIGNED_INFO, hash=target.hash, name=target.name)
            self._save()
        if target.hash == self.active.hash:
            self._refresh_condition()
            return
        bad = self._bad(target)
        if bad is not None:
            self._set_condition(
                Condition(
                    False,
                    _REASON[bad.kind],
                    f"{_describe(target.name, target.hash)} not applied ({bad.kind}: "
                    f"{bad.reason}); running {_describe(self.active.name, self.active.hash)}",
                )
            )
            return
        lkg = self.state.lkg
        if lkg is not None and lkg.hash == target.hash:
            # Back to the last-known-good (a trial cut short by the operator's revert): it ran
            # to the end of a trial already, and on trial it would be its own rollback target.
            self._return_to_lkg(target, lkg)
            return
        self._apply(target, reports)

    def keep(self, reason: str) -> None:
        """The watch could not select (a tie): the running config is kept and the reason shown."""
        self._kept = ("NoUniqueTarget", reason)
        self._refresh_condition()

    def unreadable(self, name: str, reason: str) -> None:
        """This node's target object can no longer be read (it fails to decode): what runs is
        kept, last-known-good too, and the condition says why (as the kubelet did for an
        assigned config it could not load), instead of the node dropping silently to the next
        match or the local config."""
        self._kept = (
            "TargetUnreadable",
            f"NodeAgentConfig {name}, this node's target, cannot be read ({reason})",
        )
        self._refresh_condition()

    def confirm(self) -> None:
        """The apiserver still assigns what runs: refresh the grace's start, at most every quarter
        grace (the grace then counts the time unconfirmed, bounded writes)."""
        now = self.wall()
        last = self.state.confirmed_at
        if last is None or now - last >= self.settings.checkpoint_grace / 4:
            self.state.confirmed_at = now
            self._save()

    def _assign_local(self) -> None:
        self.state.assigned, self.state.assigned_at = None, self.wall()
        self.state.confirmed_at = self.state.assigned_at
        ASSIGNED_INFO.clear()
        if self.active.hash != LOCAL_HASH:
            self._switch(
                Known(hash=LOCAL_HASH, name="local"), "no NodeAgentConfig targets the node"
            )
        trial = self.state.trial
        if trial is not None and trial.file_hash:
            # A reloaded file stays on trial; only the remote part of the trial ended.
            self.state.trial = msgspec.structs.replace(
                trial, hash=LOCAL_HASH, name="local", remote=False
            )
        else:
            self._end_trial()
        self.state.lkg, self.state.lkg_at = None, self.wall()
        LKG_INFO.clear()
        self._save()
        self._refresh_condition()

    def _return_to_lkg(self, target: Assignment, lkg: Known) -> None:
        if not self._switch(lkg, f"NodeAgentConfig/{target.name}"):
            self._reject(target, "veto", "the last-known-good config was not applied")
            return
        trial = self.state.trial
        if trial is not None and trial.file_hash:
            self.state.trial = msgspec.structs.replace(
                trial, hash=lkg.hash, name=lkg.name, remote=False
            )
        else:
            self._end_trial()
        self._save()
        self.on_event(
            ConfigEvent(
                "Normal",
                "ConfigApplied",
                f"{_describe(lkg.name, lkg.hash)} applied: the last-known-good, no trial",
            )
        )
        self._refresh_condition()

    def _apply(self, target: Assignment, reports: Sequence[ComponentHealth]) -> None:
        try:
            config = self.build(target.config)
        except ConfigError as exc:
            REJECTED.inc()
            self._reject(target, "invalid", str(exc))
            return
        assert self.hub is not None, "attach(hub) before assign()"
        result = self.hub.propose(config, f"NodeAgentConfig/{target.name}")
        if not result.applied:
            VETOES.inc()
            vetoes = "; ".join(f"{who}: {why}" for who, why in result.vetoes) or "not applied"
            self._reject(target, "veto", vetoes)
            return
        if self.state.lkg is None:
            # The config running before the first remote one is what a rollback goes back to.
            self.state.lkg = Known(
                hash=self.active.hash, name=self.active.name, config=self.active.config
            )
            self.state.lkg_at = self.wall()
        self._set_active(Known(hash=target.hash, name=target.name, config=target.config))
        running = self.state.trial
        self.state.trial = Trial(
            hash=target.hash,
            name=target.name,
            started_at=self.wall(),
            file_hash=running.file_hash if running is not None else "",
        )
        self.trial_deadline = trio.current_time() + self.settings.trial_duration
        self.health.start(reports)
        self._save()
        self.on_event(
            ConfigEvent(
                "Normal",
                "ConfigApplied",
                f"{_describe(target.name, target.hash)} applied, on trial for "
                f"{self.settings.trial_duration:g}s",
            )
        )
        self._refresh_condition()

    def _reject(self, target: Assignment, kind: str, reason: str) -> None:
        self._mark_bad(target.hash, target.object_key, target.name, kind, reason)
        self._save()
        message = (
            f"{_describe(target.name, target.hash)} {_VERB[kind]}: {reason}; keeping "
            f"{_describe(self.active.name, self.active.hash)}"
        )
        log.warning(
            "dynconfig rejected", kind=kind, name=target.name, hash=target.hash, reason=reason
        )
        self.on_event(ConfigEvent("Warning", _EVENT[kind], message))
        self.condition_ = Condition(False, _REASON[kind], message)
        self.changed.set()
        self.changed = trio.Event()

    # -- the trial --

    def tick(self, unhealthy: str | None) -> None:
        """One trial check: roll back if unhealthy, promote once the trial is survived."""
        trial = self.state.trial
        if trial is None or self.trial_deadline is None:
            return
        if unhealthy is not None:
            self._rollback(trial, unhealthy)
        elif trio.current_time() >= self.trial_deadline:
            self._promote(trial)

    def _promote(self, trial: Trial) -> None:
        if trial.remote:
            self.state.lkg, self.state.lkg_at = self.active, self.wall()
        if trial.file_hash:
            self._proven_file, self._file_undo = trial.file_hash, None
        self._end_trial()
        self._save()
        log.info("dynconfig promoted", name=trial.name, hash=trial.hash)
        self._refresh_condition()

    def _rollback(self, trial: Trial, reason: str) -> None:
        target = self.active
        if trial.remote:
            key = self.state.assigned.object_key if self.state.assigned else ""
            self._mark_bad(trial.hash, key, trial.name, "unhealthy", reason)
            target = self.state.lkg or Known(hash=LOCAL_HASH, name="local")
            if target.hash == trial.hash:  # never a "rollback" to the config on trial itself
                target = Known(hash=LOCAL_HASH, name="local")
        if trial.file_hash:
            # The file the running config replaced is built again (with the remote target).
            self.state.bad_file = _bad_file(trial.file_hash, "unhealthy", reason, self.wall())
            if self._file_undo is not None:
                self._file_undo()
            self.file_hash, self._file_undo = self._proven_file, None
        self._end_trial()
        ROLLBACKS.inc()
        subject = _describe_trial(trial)
        applied = self._switch(target, f"rollback of {subject}")
        self._save()
        message = (
            f"{subject} rolled back: {reason}; running "
            f"{_describe(self.active.name, self.active.hash)}"
        )
        if trial.file_hash:
            message += f" with {_describe_file(self.file_hash)}"
        if not applied:
            message += f" (the rollback to {_describe(target.name, target.hash)} failed)"
        log.warning(
            "dynconfig rolled back",
            name=trial.name,
            hash=trial.hash,
            file=trial.file_hash,
            reason=reason,
        )
        self.on_event(ConfigEvent("Warning", "ConfigRolledBack", message))
        self.condition_ = Condition(False, "RolledBack", message)
        if trial.file_hash:
            self.on_file_rollback(message)
        self.changed.set()
        self.changed = trio.Event()

    # -- a reloaded local file (SIGHUP) --

    def propose_local(
        self,
        file_hash: str,
        undo: Callable[[], None],
        reports: Sequence[ComponentHealth] = (),
    ) -> tuple[str, str]:
        """The file was re-read: the builder now builds from it (`file_hash`), and `undo`
        restores the file the running config was built from. Apply it under the active remote
        overlay, on trial like a remote change: the running config is the rollback target.
        Returns (result, message), result one of applied, unchanged, invalid, refused; anything
        but applied has been undone."""
        bad = self.state.bad_file
        if bad is not None and bad.hash != file_hash:
            self.state.bad_file = None  # the file changed: what failed is forgotten
        elif bad is not None:
            undo()
            return "refused", (
                f"{_describe_file(file_hash)} was rolled back ({bad.kind}: {bad.reason}); "
                "not retried until the file changes"
            )
        try:
            config = self.build(self.active.config)
        except ConfigError as exc:
            undo()
            return "invalid", str(exc)
        assert self.hub is not None, "attach(hub) before propose_local()"
        result = self.hub.propose(config, "SIGHUP")
        if not result.applied:
            undo()
            return "refused", "; ".join(f"{who}: {why}" for who, why in result.vetoes)
        previous, self.file_hash = self.file_hash, file_hash
        if not result.changed:
            self._save()
            return "unchanged", "no field changed"
        running = self.state.trial
        if running is None or not running.file_hash:
            # The first reload on trial: the file before it is what a rollback restores
            # (a later reload during the trial keeps that target).
            self._proven_file, self._file_undo = previous, undo
        self.state.trial = Trial(
            hash=self.active.hash,
            name=self.active.name,
            started_at=self.wall(),
            remote=running is not None and running.remote,
            file_hash=file_hash,
        )
        self.trial_deadline = trio.current_time() + self.settings.trial_duration
        self.health.start(reports)
        self._save()
        message = (
            f"changed: {', '.join(result.changed)}; on trial for {self.settings.trial_duration:g}s"
        )
        self.on_event(
            ConfigEvent("Normal", "ConfigApplied", f"{_describe_file(file_hash)} {message}")
        )
        self._refresh_condition()
        return "applied", message

    def _switch(self, target: Known, source: str) -> bool:
        assert self.hub is not None, "attach(hub) before assign()"
        try:
            config = self.build(target.config)
        except ConfigError as exc:
            # The file changed under a checkpointed overlay (SIGHUP): keep running what runs.
            log.warning("dynconfig switch not built", target=target.hash, error=str(exc))
            return False
        result = self.hub.propose(config, source)
        if result.applied:
            self._set_active(target)
        return result.applied

    def _end_trial(self) -> None:
        self.state.trial = None
        self.trial_deadline = None
        self._resume_for = None

    async def run_trials(
        self,
        reports: Callable[[], Sequence[ComponentHealth]],
        watchdog_age: Callable[[], float | None] = lambda: None,
    ) -> None:
        """Check the health every health_interval while a trial runs; promote at its end."""
        while True:
            if self._resume_for is not None:
                if self.state.trial is not None and self.trial_deadline is None:
                    self.trial_deadline = trio.current_time() + self._resume_for
                    self.health.start(reports())
                self._resume_for = None
            if self.trial_deadline is None:
                await self.changed.wait()
                continue
            now = trio.current_time()
            unhealthy = self.health.observe(reports(), now, watchdog_age())
            self.tick(unhealthy)
            if self.trial_deadline is not None:
                wake = min(now + self.settings.health_interval, self.trial_deadline)
                with trio.move_on_at(wake):
                    await self.changed.wait()

    # -- bookkeeping --

    def _bad(self, target: Assignment) -> Bad | None:
        for bad in self.state.bad:
            if bad.hash == target.hash and bad.object_key == target.object_key:
                return bad
        return None

    def _mark_bad(self, hash_: str, key: str, name: str, kind: str, reason: str) -> None:
        kept = [b for b in self.state.bad if b.hash != hash_]
        # Bounded: only the newest bad entries matter (a retried object has a new key anyway).
        self.state.bad = [
            *kept[-31:],
            Bad(hash=hash_, object_key=key, name=name, kind=kind, reason=reason, at=self.wall()),
        ]

    def _set_active(self, known: Known, source: str = "") -> None:
        if known != self.active or not self.active_source:
            self.active_since = self.wall()
        self.active = known
        self.active_source = source or ("local" if known.hash == LOCAL_HASH else "remote")
        set_info(ACTIVE_INFO, hash=known.hash, name=known.name)
        lkg = self.state.lkg
        if lkg is None:
            LKG_INFO.clear()
        else:
            set_info(LKG_INFO, hash=lkg.hash, name=lkg.name)

    def _save(self) -> None:
        lkg = self.state.lkg
        if lkg is None:
            LKG_INFO.clear()
        else:
            set_info(LKG_INFO, hash=lkg.hash, name=lkg.name)
        try:
            self.store.write(CHECKPOINT_NAME, msgspec.json.encode(self.state))
        except OSError as exc:
            # The store logged and counted it; the running state stays right, only a restart
            # would see the older checkpoint.
            log.warning("dynconfig checkpoint not written", error=str(exc))
        self.changed.set()
        self.changed = trio.Event()

    def _refresh_condition(self) -> None:
        assigned = self.state.assigned
        active = _describe(self.active.name, self.active.hash)
        if self._kept is not None:
            # Until the watch selects again, what it could not choose is what the Node shows
            # (a trial ending meanwhile does not make a tie go away).
            reason, text = self._kept
            self._set_condition(Condition(False, reason, f"{text}; keeping {active}"))
        elif self.state.trial is not None:
            subject = _describe_trial(self.state.trial)
            self._set_condition(Condition(True, "OnTrial", f"{subject} applied, on trial"))
        elif assigned is None:
            self._set_condition(
                Condition(
                    True, "Local", "no NodeAgentConfig targets the node; running the local config"
                )
            )
        else:
            self._set_condition(Condition(True, "Active", f"{active} active and last-known-good"))

    def _set_condition(self, condition: Condition) -> None:
        # A new condition wakes its writer even when no checkpoint is written (a tie clearing
        # to the target already assigned: the Node must not keep NoUniqueTarget).
        if condition == self.condition_:
            return
        self.condition_ = condition
        self.changed.set()
        self.changed = trio.Event()

    def condition(self) -> Condition:
        return self.condition_

    def status(self) -> dict[str, Any]:
        """The /v1/config view: assigned / active / last-known-good and why they differ."""
        assigned = self.state.assigned
        lkg = self.state.lkg
        differ: list[str] = []
        if assigned is not None and assigned.hash != self.active.hash:
            bad = self._bad(assigned)
            differ.append(
                f"assigned {assigned.hash} not active: "
                + (f"{bad.kind}: {bad.reason}" if bad else "not applied yet")
            )
        if lkg is not None and lkg.hash != self.active.hash:
            differ.append(
                f"active {self.active.hash} not last-known-good: "
                + ("on trial" if self.state.trial else "not promoted")
            )
        trial = self.state.trial
        if trial is not None and trial.file_hash:
            differ.append(f"the reloaded config file (hash {trial.file_hash}) on trial")
        bad_file = self.state.bad_file
        if bad_file is not None:
            differ.append(
                f"the config file (hash {bad_file.hash}) rolled back ({bad_file.kind}: "
                f"{bad_file.reason}); a reload is retried once the file changes"
            )
        return {
            "boot": {"source": self.boot_source, "reason": self.boot_reason},
            "assigned": None
            if assigned is None
            else {
                "name": assigned.name,
                "uid": assigned.uid,
                "generation": assigned.generation,
                "hash": assigned.hash,
                "since": _stamp(self.state.assigned_at),
            },
            "active": {
                "name": self.active.name,
                "hash": self.active.hash,
                "source": self.active_source,
                "since": _stamp(self.active_since),
            },
            "last_known_good": None
            if lkg is None
            else {"name": lkg.name, "hash": lkg.hash, "since": _stamp(self.state.lkg_at)},
            "file": {
                "hash": self.file_hash,
                "on_trial": trial is not None and bool(trial.file_hash),
                "rolled_back": None
                if bad_file is None
                else {"hash": bad_file.hash, "kind": bad_file.kind, "reason": bad_file.reason},
            },
            "trial": None
            if trial is None
            else {
                "name": trial.name,
                "hash": trial.hash,
                "remote": trial.remote,
                "file_hash": trial.file_hash or None,
                "since": _stamp(trial.started_at),
                "remaining": self._resume_for
                if self.trial_deadline is None
                else max(0.0, self.trial_deadline - trio.current_time()),
                "restarts": trial.restarts,
            },
            "bad": [
                {"name": b.name, "hash": b.hash, "kind": b.kind, "reason": b.reason}
                for b in self.state.bad
            ],
            "differ": differ,
            "condition": {
                "type": CONDITION_TYPE,
                "status": self.condition_.status,
                "reason": self.condition_.reason,
                "message": self.condition_.message,
            },
        }


_REASON = {
    "invalid": "ConfigInvalid",
    "veto": "ConfigVetoed",
    "unhealthy": "RolledBack",
    "crash": "RolledBack",
}
_EVENT = {"invalid": "ConfigInvalid", "veto": "ConfigVetoed"}
_VERB = {"invalid": "rejected as invalid", "veto": "vetoed"}


def _describe(name: str, hash_: str) -> str:
    if hash_ == LOCAL_HASH:
        return "the local config"
    return f"NodeAgentConfig {name} (hash {hash_})"


def _stamp(at: float | None) -> str | None:
    return None if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _describe_file(hash_: str) -> str:
    return f"the config file (hash {hash_})"


def _describe_trial(trial: Trial) -> str:
    parts = [_describe(trial.name, trial.hash)] if trial.remote else []
    if trial.file_hash:
        parts.append("the reloaded " + _describe_file(trial.file_hash)[4:])
    return " and ".join(parts)


def _bad_file(hash_: str, kind: str, reason: str, at: float) -> Bad:
    return Bad(hash=hash_, object_key="file", name="file", kind=kind, reason=reason, at=at)
