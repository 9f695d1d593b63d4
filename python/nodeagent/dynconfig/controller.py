"""The dynamic-config state machine: assigned, active, last-known-good, bad hashes and the trial.

Lessons of the kubelet's KEP-281 designed against:
- last-known-good is promoted at run time when a trial ends, never at a restart, so a rollback
  never skips past a good config (kubernetes#57808);
- a trial marker in the checkpoint tells a process that died during a trial from a reboot after
  a trial (`boot`, which decides the config the controller starts from).

The controller holds no task of its own besides `run_trials`; the service calls `assign`,
`keep` and `confirm` from its watch of NodeAgentConfig objects. It is built from the boot's
result and the hub it applies through (`propose`), a builder (remote dict -> effective config,
raising ConfigError) and a hasher. Everything it decides is reported through `on_event`, the
metrics and `condition()`; what it keeps across restarts is `state` (dynconfig.state), what it
shows is rendered by dynconfig.status.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import trio

from nodeagent.checkpoint import CheckpointStore
from nodeagent.core.backoff import Backoff
from nodeagent.core.errors import ConfigError
from nodeagent.dynconfig import state as persisted
from nodeagent.dynconfig.admission import Gate
from nodeagent.dynconfig.boot import BootResult
from nodeagent.dynconfig.health import ComponentHealth, HealthTracker
from nodeagent.dynconfig.metrics import (
    ACTIVE_INFO,
    ASSIGNED_INFO,
    LKG_INFO,
    REJECTED,
    ROLLBACKS,
    ROLLOUT_ABORT_FAILURES,
    ROLLOUT_WAITING,
    TRIALS_DEFERRED,
    VETOES,
    set_info,
    show,
)
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.dynconfig.state import (
    LOCAL,
    LOCAL_HASH,
    Assignment,
    BadKind,
    Known,
    Saved,
    Trial,
)
from nodeagent.dynconfig.status import (
    EVENT,
    VERB,
    Condition,
    ConfigEvent,
    config_view,
    deferred_condition,
    describe,
    describe_file,
    describe_known,
    describe_trial,
    resting_condition,
)
from nodeagent.log import get_logger

__all__ = ["Controller", "HubLike"]

log = get_logger(__name__)

C = TypeVar("C")
# Seconds between two tries at most of a checkpoint write that failed (a read-only or full state
# directory: each try costs a failed open and a log line); the first waits health_interval.
RETRY_MAX = 60.0
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


class Controller(Generic[C]):
    def __init__(
        self,
        settings: DynconfigSettings,
        store: CheckpointStore,
        build: Callable[[Mapping[str, Any] | None], C],
        hasher: Callable[[Mapping[str, Any]], str],
        hub: HubLike[C],
        booted: BootResult[C],
        *,
        on_event: Callable[[ConfigEvent], None] = lambda event: None,
        wall: Callable[[], float] = time.time,
        file_hash: str = "",
        on_file_rollback: Callable[[str], None] = lambda message: None,
        runtime: CheckpointStore | None = None,
    ) -> None:
        """`runtime`: the runtime directory's store, where the state goes while the checkpoint
        cannot be written (dynconfig.state; None: nowhere)."""
        self.settings = settings
        self.store = store
        self.runtime = runtime
        # The checkpoint holds an older state than this one (its last write failed): written
        # again by run_trials, with a bounded backoff, until it succeeds (issue 29: a stale
        # `checkpoint dynconfig_state not written` stayed until the next config change).
        self._behind = booted.behind
        # The assignment whose trial could not be recorded (its marker not written to the
        # checkpoint): not applied, tried again with the checkpoint's write.
        self._deferred: Assignment | None = None
        self._deferral = ""
        initial = min(settings.health_interval, RETRY_MAX)
        self._retry = Backoff(initial, RETRY_MAX)
        self._retry_at: float | None = None  # trio time
        self.build = build
        self.hasher = hasher
        self.hub = hub
        self.on_event = on_event
        self.wall = wall
        self.state = booted.state
        self.active = booted.active
        # Where the active config came from (local, remote, checkpoint) and since when (wall).
        self.active_source = booted.active_source
        self.active_since = booted.active_since
        self.boot_source = booted.source
        self.boot_reason = booted.reason
        self.trial_deadline: float | None = None  # trio time
        # When this process last confirmed the assignment, on the monotonic (trio) clock: the
        # quarter grace between two confirmations is measured on it, so that a wall-clock
        # glitch cannot leave a confirmation in the future unrefreshed (None: not yet).
        self._confirmed_mono: float | None = None
        # A trial resumed at boot (a clean restart): its seconds left, armed by run_trials.
        self._resume_for = booted.resume_for
        # Why the watch could not select (a tie, an unreadable list or target), until it
        # selects again: (condition reason, text).
        self._kept: tuple[str, str] | None = None
        # The rollout's word on the assigned config (issue 31; None: no spec.rollout), and
        # whether a selection gave it yet (before, a trial's own `rollout` flag decides).
        self._gate: Gate | None = None
        self._gated = False
        # The abort of the running config's rollout could not return to last-known-good: the
        # condition saying so, shown while that abort stands (every selection tries again).
        self._abort_failed: Condition | None = None
        self.condition_ = booted.condition
        self.changed = trio.Event()
        self.health = HealthTracker(settings)
        # The local file (and flags) the running config is built from, by hash; while a reload
        # is on trial, `_file_undo` restores the file it replaced (the rollback target) and
        # `on_file_rollback` tells the reload's owner why it was undone.
        self.file_hash = file_hash
        self._proven_file = ""
        self._file_undo: Callable[[], None] | None = None
        self.on_file_rollback = on_file_rollback
        for event in booted.events:
            on_event(event)

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
        if remaining <= 0:
            # The shutdown outlasted the trial: a trial with nothing left is complete, not a
            # restart during it (the crashloop_restarts-th would roll a good config back).
            self._promote(trial)
            return
        self.state.trial = msgspec.structs.replace(
            trial, remaining=remaining, config=self.active.config
        )
        self.trial_deadline = self._resume_for = None  # no tick may end it from here
        self._save()
        log.info("dynconfig trial interrupted by a clean stop", name=trial.name, left=remaining)

    # -- inputs from the watch --

    def assign(
        self,
        target: Assignment | None,
        reports: Sequence[ComponentHealth] = (),
        gate: Gate | None = None,
    ) -> None:
        """The watch selected `target` (None: no object targets this node: the local config);
        `gate`: what its rollout says of it on this node (None: the object has no rollout)."""
        self._kept = None
        self._gated = True
        if target is None:
            self._gate = None
            self._deferred = None
            self._assign_local()
            return
        target = msgspec.structs.replace(target, hash=self.hasher(target.config))
        self._gate = gate
        if target != self._deferred:
            self._deferred = None
        if target == self.state.assigned:
            # A re-list or an unrelated change of the object: no checkpoint write per watch
            # event, only the grace's refresh.
            self.confirm()
        else:
            self.state.assigned, self.state.assigned_at = target, self.wall()
            self._confirmed()
            set_info(ASSIGNED_INFO, hash=target.hash, name=target.name)
            self._save()
        if target.hash == self.active.hash:
            if gate is not None and gate.aborted:
                self._abort(target, gate)
                return
            self._promote_passed()
            self._refresh_condition()
            return
        if self.state.bad_for(target) is not None:
            # Its error stays on the condition as it was written: a relist writes nothing.
            self._refresh_condition()
            return
        lkg = self.state.lkg
        if lkg is not None and lkg.hash == target.hash:
            # Back to the last-known-good (a trial cut short by the operator's revert): it ran
            # to the end of a trial already, and on trial it would be its own rollback target.
            # Whatever its rollout says (issue 31): the operator's fast undo of a bad config
            # must not wait for the revert's canary and waves; the node returns to a config
            # it proved, as a rollback or an abort would.
            self._return_to_lkg(target, lkg)
            return
        if gate is not None and not gate.admitted:
            # Not this node's turn (issue 31): what runs keeps running; the condition says why.
            self._deferred = None
            self._refresh_condition()
            return
        self._apply(target, reports)

    def keep(self, reason: str) -> None:
        """The watch could not select (a tie): the running config is kept and the reason shown."""
        self._kept = ("NoUniqueTarget", reason)
        self._deferred = None  # the watch cannot say it is still the target
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
        self._deferred = None
        self._refresh_condition()

    def confirm(self) -> None:
        """The apiserver still assigns what runs: refresh the grace's start, at most every quarter
        grace (the grace then counts the time unconfirmed, bounded writes). The quarter is
        measured on the monotonic clock once this process confirmed; before, from the
        checkpoint's wall time, where one in the future (written during a clock glitch) is
        no reason to wait."""
        quarter = self.settings.checkpoint_grace / 4
        if self._confirmed_mono is not None:
            due = trio.current_time() - self._confirmed_mono >= quarter
        else:
            last = self.state.confirmed_at
            due = last is None or not 0 <= self.wall() - last < quarter
        if due:
            self._confirmed()
            self._save()

    def _confirmed(self) -> None:
        self.state.confirmed_at, self._confirmed_mono = self.wall(), trio.current_time()

    def _assign_local(self) -> None:
        self.state.assigned, self.state.assigned_at = None, self.wall()
        self._confirmed()
        ASSIGNED_INFO.clear()
        if self.active.hash != LOCAL_HASH:
            self._switch(LOCAL, "no NodeAgentConfig targets the node")
        trial = self.state.trial
        if trial is not None and trial.file_hash:
            # A reloaded file stays on trial; only the remote part of the trial ended.
            self.state.trial = msgspec.structs.replace(
                trial, hash=LOCAL_HASH, name="local", remote=False
            )
        else:
            self._end_trial()
        self.state.lkg, self.state.lkg_at, self.state.passed = None, self.wall(), None
        LKG_INFO.clear()
        self._save()
        self._refresh_condition()

    def _abort(self, target: Assignment, gate: Gate) -> None:
        """The rollout of the config this node runs was aborted: back to last-known-good (the
        previous config), as after a rollback but without marking it bad (it was never judged
        here); lifting the abort lets it be taken again."""
        lkg = self.state.lkg or LOCAL
        if lkg.hash == target.hash:
            # Aborted once Complete: nothing older is kept to go back to.
            self._refresh_condition()
            return
        error = self._switch(lkg, f"abort of the rollout of NodeAgentConfig/{target.name}")
        if error is not None:
            # Keep running what runs (the config is not judged bad), but say so where an
            # operator looks, once per failure rather than per selection.
            message = f"{gate.message}: the return to {describe_known(lkg)} failed: {error}"
            failed = Condition(False, "RolloutAbortFailed", message)
            if failed != self._abort_failed:
                ROLLOUT_ABORT_FAILURES.inc()
                log.warning(
                    "dynconfig rollout abort not applied",
                    name=target.name,
                    to=lkg.hash,
                    error=error,
                )
                self.on_event(ConfigEvent("Warning", "RolloutAbortFailed", message))
            self._abort_failed = failed
            self._refresh_condition()
            return
        trial = self.state.trial
        if trial is not None and trial.file_hash:
            self.state.trial = msgspec.structs.replace(
                trial, hash=lkg.hash, name=lkg.name, remote=False, rollout=False
            )
        else:
            self._end_trial()
        self.state.passed = None
        self._save()
        log.info("dynconfig rollout aborted", name=target.name, hash=target.hash, to=lkg.hash)
        message = f"{gate.message}: {describe_known(lkg)} applied"
        self.on_event(ConfigEvent("Normal", "RolloutAborted", message))
        self._refresh_condition()

    def _held(self, hash_: str, rollout: bool) -> bool:
        """Whether a config (of a rollout object: `rollout`) through its trial stays short of
        last-known-good: its rollout is not Complete."""
        assigned = self.state.assigned
        if self._gated and assigned is not None and assigned.hash == hash_:
            # The target object's word on it now (spec.rollout removed: no gate, not held).
            return self._gate is not None and not self._gate.complete
        # No selection since the start, or the object moved on to another config: as recorded
        # when its trial started.
        return rollout

    def _promote_passed(self) -> None:
        """The config held back through its trial (`state.passed`) becomes last-known-good once
        its rollout is Complete (or its object no longer has one)."""
        passed = self.state.passed
        if passed is None or passed.hash != self.active.hash or self._held(passed.hash, True):
            return
        self.state.lkg, self.state.lkg_at, self.state.passed = passed, self.wall(), None
        self._save()
        log.info("dynconfig promoted: its rollout is complete", name=passed.name, hash=passed.hash)

    def _return_to_lkg(self, target: Assignment, lkg: Known) -> None:
        if self._switch(lkg, f"NodeAgentConfig/{target.name}") is not None:
            self._reject(target, BadKind.VETO, "the last-known-good config was not applied")
            return
        self.state.passed = None
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
                f"{describe_known(lkg)} applied: the last-known-good, no trial",
            )
        )
        self._refresh_condition()

    def _apply(self, target: Assignment, reports: Sequence[ComponentHealth]) -> None:
        try:
            config = self.build(target.config)
        except ConfigError as exc:
            REJECTED.inc()
            self._reject(target, BadKind.INVALID, str(exc))
            return
        before = (self.state.lkg, self.state.lkg_at, self.state.trial)
        if self.state.lkg is None:
            # The config running before the first remote one is what a rollback goes back to.
            self.state.lkg = Known(
                hash=self.active.hash, name=self.active.name, config=self.active.config
            )
            self.state.lkg_at = self.wall()
        running = self.state.trial
        trial = Trial(
            hash=target.hash,
            name=target.name,
            started_at=self.wall(),
            file_hash=running.file_hash if running is not None else "",
            rollout=self._gate is not None,
        )
        passed = self.state.passed
        # A config held short of last-known-good stops running: the rollback target stays lkg.
        self.state.trial, self.state.passed = trial, None
        # The marker in the checkpoint before the config runs (issue 29 item 3): a config that
        # crashes the agent must be found on trial at the next start, or the node crash-loops
        # on it. Not written (a read-only or full state directory): not applied, deferred.
        # The runtime directory's copy is not enough: a reboot clears it.
        if persisted.save(self.store, self.state) is not Saved.CHECKPOINT:
            self.state.lkg, self.state.lkg_at, self.state.trial = before
            self.state.passed = passed
            # Written again once it can be, also if this trial is dropped meanwhile (a tie, an
            # unreadable target, a rollout no longer admitting it): the store's problem must
            # not outlive the read-only directory.
            self._behind = True
            self._defer(target)
            return
        result = self.hub.propose(config, f"NodeAgentConfig/{target.name}")
        if not result.applied:
            self.state.lkg, self.state.lkg_at, self.state.trial = before
            self.state.passed = passed
            VETOES.inc()
            vetoes = "; ".join(f"{who}: {why}" for who, why in result.vetoes) or "not applied"
            self._reject(target, BadKind.VETO, vetoes)  # written: the marker is gone
            return
        self._deferred = None
        self._set_active(Known(hash=target.hash, name=target.name, config=target.config))
        self.state.trial = msgspec.structs.replace(trial, changed=_changed(running, result.changed))
        self.trial_deadline = trio.current_time() + self.settings.trial_duration
        self.health.start(reports, self.state.trial.changed)
        self._save()
        self.on_event(
            ConfigEvent(
                "Normal",
                "ConfigApplied",
                f"{describe(target.name, target.hash)} applied, on trial for "
                f"{self.settings.trial_duration:g}s",
            )
        )
        self._refresh_condition()

    def _defer(self, target: Assignment) -> None:
        self._deferral = self.store.problem or "the checkpoint was not written"
        if target != self._deferred:  # said once per assignment, not per retry
            TRIALS_DEFERRED.inc()
            condition = deferred_condition(target, self.active, self._deferral)
            log.warning(
                "dynconfig trial deferred: its marker cannot be written",
                name=target.name,
                hash=target.hash,
                problem=self._deferral,
            )
            self.on_event(ConfigEvent("Warning", "ConfigTrialDeferred", condition.message))
        self._deferred = target
        self._refresh_condition()
        self._pulse()  # run_trials schedules the retry

    def _reject(self, target: Assignment, kind: BadKind, reason: str) -> None:
        self._deferred = None
        self.state.mark_bad(target.hash, target.object_key, target.name, kind, reason, self.wall())
        self._save()
        message = (
            f"{describe(target.name, target.hash)} {VERB[kind]}: {reason}; keeping "
            f"{describe_known(self.active)}"
        )
        log.warning(
            "dynconfig rejected", kind=kind, name=target.name, hash=target.hash, reason=reason
        )
        self.on_event(ConfigEvent("Warning", EVENT[kind], message))
        self._refresh_condition()  # the same text (status.bad_condition) as the message

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
        if trial.remote and self._held(trial.hash, trial.rollout):
            # Through its trial, but its rollout is not Complete (issue 31): it runs, and the
            # previous config stays last-known-good (an abort goes back to it).
            self.state.passed = self.active
        elif trial.remote:
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
            self.state.mark_bad(trial.hash, key, trial.name, BadKind.UNHEALTHY, reason, self.wall())
            target = self.state.lkg or LOCAL
            if target.hash == trial.hash:  # never a "rollback" to the config on trial itself
                target = LOCAL
        if trial.file_hash:
            # The file the running config replaced is built again (with the remote target).
            self.state.bad_file = persisted.bad_file(
                trial.file_hash, BadKind.UNHEALTHY, reason, self.wall()
            )
            if self._file_undo is not None:
                self._file_undo()
            self.file_hash, self._file_undo = self._proven_file, None
        self._end_trial()
        ROLLBACKS.inc()
        subject = describe_trial(trial)
        applied = self._switch(target, f"rollback of {subject}") is None
        self._save()
        message = f"{subject} rolled back: {reason}; running {describe_known(self.active)}"
        if trial.file_hash:
            message += f" with {describe_file(self.file_hash)}"
        if not applied:
            message += f" (the rollback to {describe_known(target)} failed)"
        log.warning(
            "dynconfig rolled back",
            name=trial.name,
            hash=trial.hash,
            file=trial.file_hash,
            reason=reason,
        )
        self.on_event(ConfigEvent("Warning", "ConfigRolledBack", message))
        if trial.file_hash or not applied:
            self.condition_ = Condition(False, "RolledBack", message)
        else:
            # The assigned config's error (this rollback's, status.bad_condition: the same
            # text a relist renders again) or a tie the watch still sees.
            self._refresh_condition()
        if trial.file_hash:
            self.on_file_rollback(message)
        self._pulse()

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
                f"{describe_file(file_hash)} was rolled back ({bad.kind}: {bad.reason}); "
                "not retried until the file changes"
            )
        try:
            config = self.build(self.active.config)
        except ConfigError as exc:
            undo()
            return "invalid", str(exc)
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
            changed=_changed(running, result.changed),
        )
        self.trial_deadline = trio.current_time() + self.settings.trial_duration
        self.health.start(reports, self.state.trial.changed)
        self._save()
        message = (
            f"changed: {', '.join(result.changed)}; on trial for {self.settings.trial_duration:g}s"
        )
        self.on_event(
            ConfigEvent("Normal", "ConfigApplied", f"{describe_file(file_hash)} {message}")
        )
        self._refresh_condition()
        return "applied", message

    def _switch(self, target: Known, source: str) -> str | None:
        """Run `target`'s config; None once applied, else why not (what runs keeps running)."""
        try:
            config = self.build(target.config)
        except ConfigError as exc:
            # The file changed under a checkpointed overlay (SIGHUP): keep running what runs.
            log.warning("dynconfig switch not built", target=target.hash, error=str(exc))
            return str(exc)
        result = self.hub.propose(config, source)
        if not result.applied:
            return "; ".join(f"{who}: {why}" for who, why in result.vetoes) or "not applied"
        self._set_active(target)
        return None

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
                    self.health.start(reports(), self.state.trial.changed)
                self._resume_for = None
            now = trio.current_time()
            if self._retry_at is not None and now >= self._retry_at:
                self._retry_at = None
                self._write_again(reports())
            if self.trial_deadline is not None:
                unhealthy = self.health.observe(reports(), now, watchdog_age())
                self.tick(unhealthy)
            wakes = [self._next_retry(now)]
            if self.trial_deadline is not None:
                wakes += [now + self.settings.health_interval, self.trial_deadline]
            wake = min((w for w in wakes if w is not None), default=None)
            if wake is None:
                await self.changed.wait()
                continue
            with trio.move_on_at(wake):
                await self.changed.wait()

    def _next_retry(self, now: float) -> float | None:
        """When the checkpoint's write is tried again (None: nothing to write)."""
        if not self._behind and self._deferred is None:
            self._retry.reset()
            self._retry_at = None
        elif self._retry_at is None:
            self._retry_at = now + self._retry.next()
        return self._retry_at

    def _write_again(self, reports: Sequence[ComponentHealth]) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None and deferred == self.state.assigned and self._kept is None:
            self._deferred = deferred  # kept while it is tried: deferred again, said once
            self._apply(deferred, reports)  # the marker written now: its trial starts
        elif self._behind:
            self._save()

    # -- bookkeeping --

    def _set_active(self, known: Known) -> None:
        if known != self.active:
            self.active_since = self.wall()
        self.active = known
        self.active_source = "local" if known.hash == LOCAL_HASH else "remote"
        show(ACTIVE_INFO, known)
        show(LKG_INFO, self.state.lkg)

    def _save(self) -> None:
        show(LKG_INFO, self.state.lkg)
        saved = persisted.save(self.store, self.state, self.runtime)
        self._behind = saved is not Saved.CHECKPOINT
        self._pulse()

    def _pulse(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def _waiting(self) -> Gate | None:
        """The assigned config's rollout holds it back from this node (not admitted, not
        running it): the gate saying why."""
        gate, assigned = self._gate, self.state.assigned
        if gate is None or gate.admitted or assigned is None or gate.hash != assigned.hash:
            return None
        if assigned.hash == self.active.hash or self.state.bad_for(assigned) is not None:
            return None
        return gate

    def _refresh_condition(self) -> None:
        gate = self._gate
        if gate is None or not gate.aborted or gate.hash != self.active.hash:
            self._abort_failed = None  # the abort went through, was lifted, or moved on
        waiting = self._waiting() if self._kept is None else None
        ROLLOUT_WAITING.clear()
        if waiting is not None:
            ROLLOUT_WAITING.labels(reason=waiting.reason).set(1)
        if self._kept is None and self._abort_failed is not None:
            self._set_condition(self._abort_failed)
            return
        if self._kept is None and self._deferred is not None:
            deferred = deferred_condition(self._deferred, self.active, self._deferral)
            self._set_condition(deferred)
            return
        if waiting is not None:
            # True: the node runs a good config; the message names the config waiting first.
            message = f"{waiting.message}; running {describe_known(self.active)}"
            self._set_condition(Condition(True, waiting.reason, message))
            return
        self._set_condition(resting_condition(self.state, self.active, self._kept))

    def _set_condition(self, condition: Condition) -> None:
        # A new condition wakes its writer even when no checkpoint is written (a tie clearing
        # to the target already assigned: the Node must not keep NoUniqueTarget).
        if condition == self.condition_:
            return
        self.condition_ = condition
        self._pulse()

    def condition(self) -> Condition:
        return self.condition_

    def status(self) -> dict[str, Any]:
        """The /v1/config view: assigned / active / last-known-good and why they differ."""
        remaining = self._resume_for
        if self.trial_deadline is not None:
            remaining = max(0.0, self.trial_deadline - trio.current_time())
        return config_view(
            self.state,
            active=self.active,
            active_source=self.active_source,
            active_since=self.active_since,
            boot=(self.boot_source, self.boot_reason),
            file_hash=self.file_hash,
            remaining=remaining,
            condition=self.condition_,
            not_blamed=self.health.not_blamed if self.state.trial is not None else {},
            waiting=self._waiting(),
        )


def _changed(running: Trial | None, changed: Sequence[str]) -> list[str] | None:
    """The fields a trial changed: `changed`, with those of the trial it extends (a reload
    during a remote trial, or the reverse: a rollback reverts both); None if those are not
    known."""
    if running is None:
        return sorted(changed)
    if running.changed is None:
        return None
    return sorted({*running.changed, *changed})
