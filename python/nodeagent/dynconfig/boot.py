"""The config a dynamic-config agent starts with, decided from the checkpoint before the
apiserver answers and before anything runs (the hub is built from it; the controller then takes
over from the `BootResult`).

Lessons of the kubelet's KEP-281 designed against: a trial marker found at start tells a process
that died during a trial (roll back, mark the hash bad) from a reboot after a trial (no marker)
(kubernetes#50216); the agent boots from the checkpointed last-known-good without the apiserver,
within a grace (kubernetes#71518); last-known-good is never promoted at a restart
(kubernetes#57808)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from nodeagent.checkpoint import CheckpointStore
from nodeagent.core.errors import ConfigError
from nodeagent.dynconfig import state as persisted
from nodeagent.dynconfig.metrics import ACTIVE_INFO, LKG_INFO, ROLLBACKS, show
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.dynconfig.state import LOCAL, BadKind, Known, Saved, State, Trial
from nodeagent.dynconfig.status import (
    Condition,
    ConfigEvent,
    bad_condition,
    describe,
    describe_file,
    describe_known,
)
from nodeagent.log import get_logger

__all__ = ["BootResult", "boot"]

log = get_logger(__name__)

C = TypeVar("C")
# Seconds a checkpoint's confirmation may lie in the future of a start (a small step of the
# clock back by NTP) and still count as just confirmed.
FUTURE_SKEW = 60.0


@dataclass(slots=True)
class BootResult(Generic[C]):
    config: C
    # checkpoint, resumed (a clean stop during a trial), defaults (no/expired/corrupt
    # checkpoint), rollback (died during a trial)
    source: str
    reason: str
    state: State
    active: Known
    active_source: str
    active_since: float
    condition: Condition
    # A trial resumed (a clean restart): its seconds left, armed by the controller's trials.
    resume_for: float | None = None
    # What the start decided that the Node should see (posted once the controller runs).
    events: list[ConfigEvent] = field(default_factory=list)
    # The checkpoint is older than `state` (its last write at start failed): the controller
    # writes it again until it succeeds.
    behind: bool = False


def boot(
    settings: DynconfigSettings,
    store: CheckpointStore,
    build: Callable[[Mapping[str, Any] | None], C],
    *,
    wall: Callable[[], float] = time.time,
    runtime: CheckpointStore | None = None,
) -> BootResult[C]:
    """The config to start with (raises nothing: a broken checkpoint falls back to the local
    config and says why). `runtime`: the runtime directory's store, whose copy of the state,
    if any, is newer than the checkpoint (dynconfig.state)."""
    return _Boot(settings, store, build, wall, runtime).run()


class _Boot(Generic[C]):
    def __init__(
        self,
        settings: DynconfigSettings,
        store: CheckpointStore,
        build: Callable[[Mapping[str, Any] | None], C],
        wall: Callable[[], float],
        runtime: CheckpointStore | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.build = build
        self.wall = wall
        self.runtime = runtime
        self.state = State()
        self.events: list[ConfigEvent] = []
        self.behind = False
        # Where the state was read (said in a resumed trial's reason).
        self.read_from = "the checkpoint"

    def run(self) -> BootResult[C]:
        result = self._decide()
        result.behind = self.behind  # after the last write of the start
        return result

    def _decide(self) -> BootResult[C]:
        kept = None if self.runtime is None else persisted.load_runtime(self.runtime)
        loaded = persisted.load(self.store) if kept is None else kept
        if isinstance(loaded, str):
            return self._local("defaults", loaded)
        self.state = state = loaded
        if kept is not None:
            # The last run saved it only there (its state directory was not writable, also at
            # a clean stop): into the checkpoint now, if that can be written.
            self.read_from = "the runtime directory (the state directory was not writable)"
            self._save()
        now = self.wall()
        why = "the agent died during its trial"
        trial = state.trial
        if trial is not None and trial.remaining is not None:
            restarts = trial.restarts + 1
            if restarts < self.settings.crashloop_restarts:
                resumed = self._resume(trial, restarts, now)
                if resumed is not None:
                    return resumed
                trial = state.trial
            else:
                why = f"the agent restarted {restarts} times during its trial"
        if trial is not None and not trial.remote:
            self._died_on_file_trial(trial)
            state.trial = trial = None
            self._save()
        if trial is None:
            return self._from_lkg("checkpoint", "checkpointed last-known-good", now)
        # The process died during a trial: that config is what killed it.
        state.trial = None
        if trial.file_hash:
            self._died_on_file_trial(trial)
        key = state.assigned.object_key if state.assigned else ""
        state.mark_bad(trial.hash, key, trial.name, BadKind.CRASH, why, self.wall())
        ROLLBACKS.inc()
        subject = describe(trial.name, trial.hash)
        self.events.append(
            ConfigEvent("Warning", "ConfigRolledBack", f"{subject} rolled back at start: {why}")
        )
        result = self._from_lkg("rollback", f"{why}: {subject}", now)
        self._save()
        # The text a relist renders again for the assigned config rolled back: it writes nothing.
        result.condition = bad_condition(state.bad[-1], result.active)
        return result

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
        problem = None
        if trial.config is None:
            problem = "the checkpoint does not hold the config on trial"
        else:
            problem = self._expired(now)
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
        subject = describe(trial.name, trial.hash)
        reason = (
            f"the agent stopped cleanly during the trial of {subject} (recorded in "
            f"{self.read_from}): resumed, {remaining:.0f}s left"
        )
        condition = Condition(
            True,
            "OnTrial",
            f"{subject} on trial, resumed after a clean restart ({remaining:.0f}s left)",
        )
        log.info("dynconfig boot", source="resumed", reason=reason, hash=trial.hash)
        active = Known(hash=trial.hash, name=trial.name, config=trial.config)
        result = self._result(config, "resumed", reason, active, "checkpoint", condition)
        result.resume_for = remaining
        return result

    def _died_on_file_trial(self, trial: Trial) -> None:
        # Unlike a remote config, the file is not rolled back at start: a start reads the file
        # the operator wrote (and refuses an invalid one); a reload of the same content is
        # refused until the file changes.
        reason = "the agent died during its trial"
        self.state.bad_file = persisted.bad_file(
            trial.file_hash, BadKind.CRASH, reason, self.wall()
        )
        message = (
            f"{describe_file(trial.file_hash)}: {reason}; started again on the file as it is "
            "now (a reload of the same file is refused until it changes)"
        )
        log.warning("dynconfig file trial died", hash=trial.file_hash)
        self.events.append(ConfigEvent("Warning", "ConfigTrialFailed", message))

    def _from_lkg(self, source: str, reason: str, now: float) -> BootResult[C]:
        held = self._from_passed(source, now)
        if held is not None:
            return held
        lkg = self.state.lkg
        if lkg is None or lkg.config is None:
            return self._local(
                "defaults" if source == "checkpoint" else source,
                f"{reason}; no remote last-known-good",
            )
        expired = self._expired(now)
        if expired is not None:
            # The last-known-good is what a rollback goes back to; booted local, that is the
            # local config (kept, the same config assigned again would be on trial with itself
            # as its rollback target).
            self._forget_lkg()
            return self._local("defaults", f"{reason}; {expired}")
        age = max(0.0, now - (self.state.confirmed_at or 0.0))
        try:
            config = self.build(lkg.config)
        except ConfigError as exc:
            self._forget_lkg()
            return self._local("defaults", f"checkpointed config invalid: {exc}")
        reason = f"{reason} ({age:.0f}s old)"
        condition = Condition(
            True, "Checkpoint", f"running {describe_known(lkg)} from the checkpoint"
        )
        log.info("dynconfig boot", source=source, reason=reason, hash=lkg.hash)
        return self._result(config, source, reason, lkg, "checkpoint", condition)

    def _from_passed(self, source: str, now: float) -> BootResult[C] | None:
        """A config of a rollout that ran through its trial but is not last-known-good yet (its
        rollout not Complete, issue 31) is what ran: start on it again, within the grace, not on
        trial (None: there is none, or it cannot run: the start goes on from last-known-good)."""
        passed = self.state.passed
        if passed is None or source != "checkpoint":
            return None
        problem = self._expired(now)
        config = None
        if problem is None and passed.config is not None:
            try:
                config = self.build(passed.config)
            except ConfigError as exc:
                problem = f"it no longer builds: {exc}"
        if config is None:
            log.info("dynconfig held config not resumed", name=passed.name, reason=problem)
            self.state.passed = None
            self._save()
            return None
        age = max(0.0, now - (self.state.confirmed_at or 0.0))
        reason = (
            f"checkpointed {describe_known(passed)}, through its trial, its rollout not "
            f"Complete ({age:.0f}s old)"
        )
        condition = Condition(
            True, "Checkpoint", f"running {describe_known(passed)} from the checkpoint"
        )
        log.info("dynconfig boot", source=source, reason=reason, hash=passed.hash)
        return self._result(config, source, reason, passed, "checkpoint", condition)

    def _expired(self, now: float) -> str | None:
        """Why the checkpoint is past its grace (None: within it). A confirmation later than
        now by more than FUTURE_SKEW has no age to measure (the clock moved back since, or it
        was written during a forward glitch): taken as expired, never as for ever fresh."""
        confirmed = self.state.confirmed_at if self.state.confirmed_at is not None else 0.0
        age, grace = now - confirmed, self.settings.checkpoint_grace
        if age < -FUTURE_SKEW:
            return (
                f"checkpoint expired (confirmed {-age:.0f}s in the future: the wall clock "
                "moved; its age cannot be measured)"
            )
        if age > grace:
            return (
                f"checkpoint expired ({age:.0f}s since the apiserver confirmed it, "
                f"grace {grace:g}s)"
            )
        return None

    def _forget_lkg(self) -> None:
        self.state.lkg, self.state.lkg_at, self.state.passed = None, None, None
        self._save()

    def _local(self, source: str, reason: str) -> BootResult[C]:
        condition = Condition(True, "Local", f"running the local config: {reason}")
        log.info("dynconfig boot", source=source, reason=reason)
        return self._result(self.build(None), source, reason, LOCAL, "local", condition)

    def _result(
        self,
        config: C,
        source: str,
        reason: str,
        active: Known,
        active_source: str,
        condition: Condition,
    ) -> BootResult[C]:
        show(ACTIVE_INFO, active)
        show(LKG_INFO, self.state.lkg)
        return BootResult(
            config=config,
            source=source,
            reason=reason,
            state=self.state,
            active=active,
            active_source=active_source,
            active_since=self.wall(),
            condition=condition,
            events=self.events,
        )

    def _save(self) -> None:
        show(LKG_INFO, self.state.lkg)
        saved = persisted.save(self.store, self.state, self.runtime)
        self.behind = saved is not Saved.CHECKPOINT
