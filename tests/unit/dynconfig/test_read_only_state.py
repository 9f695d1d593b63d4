"""Dynamic configuration on a state directory that cannot be written (issue 29, what the soak's
seed 11 found, and the items of the brief around it), each failing on the old code:

- item 1: a clean stop during a trial with the state directory read-only could not be recorded,
  so the next start took it for a crash and rolled the good config back ("the agent died during
  its trial"); the state now goes to the runtime directory while the checkpoint cannot be
  written, and a real crash is still blamed;
- item 2: a failed write of the dynconfig checkpoint stayed failed (a stale problem, an old
  file) until the next config change; it is written again with a bounded backoff;
- item 3: a trial whose marker cannot be written is not started (a crash-inducing config would
  not be blamed at the next start: a crash loop); it is deferred and said on the condition;
- item 4: a full disk (ENOSPC) is treated as a read-only one (EROFS).

A read-only or full directory is simulated below the store (`Disk`): the tests run as root,
whom permission bits do not stop, and a read-only mount needs a mount namespace (the process
test, tests/process/test_dynconfig_read_only_state.py, uses one).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from nodeagent.checkpoint import CheckpointStore
from nodeagent.checkpoint import metrics as checkpoint_metrics
from nodeagent.checkpoint import store as store_module
from nodeagent.dynconfig import metrics
from nodeagent.dynconfig.admission import Gate
from nodeagent.dynconfig.boot import BootResult, boot
from nodeagent.dynconfig.controller import RETRY_MAX, Controller
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.dynconfig.state import CHECKPOINT_NAME, LOCAL_HASH, Saved, State, load, save
from nodeagent.dynconfig.status import ConfigEvent
from tests.support.fake_dynconfig import FakeHub, Report, Wall, build, hasher
from tests.support.wait import wait_until
from tests.unit.dynconfig.test_controller import target

# A read-only file system, and a full one.
ERRORS = [errno.EROFS, errno.ENOSPC]
TRIAL = 600.0


class Disk:
    """Directories whose checkpoint writes fail as on a read-only (EROFS: the temp file is not
    created) or full (ENOSPC) file system, by directory; the store's own error path runs."""

    def __init__(self) -> None:
        self.broken: dict[Path, int] = {}
        self._write = store_module._write_atomically

    def write(self, path: Path, content: bytes) -> None:
        code = self.broken.get(path.parent)
        if code is not None:
            raise OSError(code, os.strerror(code), str(path))
        self._write(path, content)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    broken = Disk()
    monkeypatch.setattr(store_module, "_write_atomically", broken.write)
    return broken


@dataclass
class Agent:
    """One agent process's dynamic configuration: booted from the state dir, then running."""

    booted: BootResult[dict[str, Any]]
    controller: Controller[dict[str, Any]]
    hub: FakeHub
    events: list[ConfigEvent]
    store: CheckpointStore
    runtime: CheckpointStore


def start(tmp_path: Path, wall: Wall) -> Agent:
    settings = DynconfigSettings(trial_duration=TRIAL)
    store = CheckpointStore(tmp_path / "state" / "checkpoints", node="n1")
    runtime = CheckpointStore(tmp_path / "run", node="n1")
    booted = boot(settings, store, build, wall=wall, runtime=runtime)
    hub = FakeHub(booted.config)
    events: list[ConfigEvent] = []
    controller = Controller(
        settings,
        store,
        build,
        hasher,
        hub,
        booted,
        on_event=events.append,
        wall=wall,
        runtime=runtime,
    )
    return Agent(booted, controller, hub, events, store, runtime)


def on_disk(store: CheckpointStore) -> State | None:
    loaded = load(store)
    return loaded if isinstance(loaded, State) else None


GOOD = {"interval": 7}
GOOD_HASH = hasher(GOOD)


@pytest.mark.parametrize("code", ERRORS)
@pytest.mark.parametrize("repaired", [False, True], ids=["still-broken", "repaired"])
async def test_a_clean_stop_with_the_state_dir_unwritable_resumes_the_trial(
    tmp_path: Path,
    disk: Disk,
    code: int,
    repaired: bool,
    autojump_clock: trio.testing.MockClock,
) -> None:
    wall = Wall()
    first = start(tmp_path, wall)
    first.controller.assign(target(GOOD), [Report("publisher")])
    marker = on_disk(first.store)
    assert marker is not None and marker.trial is not None  # recorded while writable
    disk.broken[first.store.directory] = code  # read-only (full) from now on
    await trio.sleep(100)
    first.controller.stop_clean()  # SIGTERM during the trial: not writable to the checkpoint
    assert first.store.problem is not None and os.strerror(code) in first.store.problem
    if repaired:
        disk.broken.clear()

    second = start(tmp_path, wall)
    assert second.booted.source == "resumed", second.booted.reason
    assert "runtime directory" in second.booted.reason
    assert second.controller.state.bad == []
    assert second.controller.active.hash == GOOD_HASH and second.hub.current["interval"] == 7
    trial = second.controller.state.trial
    assert trial is not None and trial.restarts == 1
    assert second.booted.resume_for == pytest.approx(TRIAL - 100)
    assert second.controller.condition().reason == "OnTrial"
    # Repaired: moved into the checkpoint, the runtime copy gone; else kept there, re-armed.
    assert (second.runtime.path(CHECKPOINT_NAME).exists()) is not repaired
    current = on_disk(second.runtime if not repaired else second.store)
    assert current is not None and current.trial is not None and current.trial.remaining is None


@pytest.mark.parametrize("code", ERRORS)
async def test_a_crash_after_the_state_dir_turned_unwritable_is_still_blamed(
    tmp_path: Path, disk: Disk, code: int, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = start(tmp_path, wall)
    first.controller.assign(target(GOOD), [Report("publisher")])
    disk.broken[first.store.directory] = code
    # A change saved only in the runtime directory (an invalid edit: the trial goes on).
    first.controller.assign(target({"bogus": 1}, generation=2), [Report("publisher")])
    assert first.runtime.path(CHECKPOINT_NAME).exists()
    # Killed (no stop_clean): the config on trial is blamed at the next start.
    second = start(tmp_path, wall)
    assert second.booted.source == "rollback", second.booted.reason
    assert "died during its trial" in second.booted.reason
    assert second.controller.active.hash == LOCAL_HASH
    assert {b.hash for b in second.controller.state.bad} == {GOOD_HASH, hasher({"bogus": 1})}


@pytest.mark.parametrize("code", ERRORS)
async def test_a_trial_survived_with_the_state_dir_unwritable_is_not_blamed_after_a_crash(
    tmp_path: Path, disk: Disk, code: int, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = start(tmp_path, wall)
    first.controller.assign(target(GOOD), [Report("publisher")])
    disk.broken[first.store.directory] = code
    await trio.sleep(TRIAL + 1)
    first.controller.tick(None)  # promoted: the checkpoint still holds the trial's marker
    assert first.controller.state.trial is None
    # Killed later, for another reason: the promoted config is not the one to blame.
    second = start(tmp_path, wall)
    assert second.booted.source == "checkpoint", second.booted.reason
    assert second.controller.state.bad == []
    assert second.controller.active.hash == GOOD_HASH
    lkg = second.controller.state.lkg
    assert lkg is not None and lkg.hash == GOOD_HASH


@pytest.mark.parametrize("code", ERRORS)
async def test_a_trial_that_cannot_be_recorded_is_deferred_until_it_can(
    tmp_path: Path, disk: Disk, code: int, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    agent = start(tmp_path, wall)
    c, reports = agent.controller, [Report("publisher")]
    disk.broken[agent.store.directory] = code
    deferred = metrics.TRIALS_DEFERRED._value.get()
    c.assign(target(GOOD), reports)
    # Not applied: a config that crashes the agent would not be found on trial at the next
    # start, and the node would crash-loop on it.
    assert agent.hub.proposals == [] and c.active.hash == LOCAL_HASH
    assert c.state.trial is None and c.state.lkg is None
    condition = c.condition()
    assert not condition.status and condition.reason == "TrialDeferred", condition
    assert GOOD_HASH in condition.message and os.strerror(code) in condition.message
    assert [e.reason for e in agent.events] == ["ConfigTrialDeferred"]
    assert metrics.TRIALS_DEFERRED._value.get() == deferred + 1
    c.assign(target(GOOD), reports)  # a relist: deferred again, said once
    assert [e.reason for e in agent.events] == ["ConfigTrialDeferred"]
    # A crash meanwhile: the next start runs what ran, blames nothing.
    again = start(tmp_path, wall)
    assert again.booted.source != "rollback" and again.controller.state.bad == []

    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_trials, lambda: reports)
        await trio.sleep(300)  # tries while still unwritable: nothing changes
        assert c.condition().reason == "TrialDeferred" and c.active.hash == LOCAL_HASH
        disk.broken.clear()
        await wait_until(
            lambda: c.active.hash == GOOD_HASH,
            "the deferred trial started",
            timeout=RETRY_MAX + 10,
        )
        nursery.cancel_scope.cancel()
    assert c.condition().reason == "OnTrial"
    marker = on_disk(agent.store)
    assert marker is not None and marker.trial is not None and marker.trial.hash == GOOD_HASH
    assert agent.store.problem is None
    assert [e.reason for e in agent.events] == ["ConfigTrialDeferred", "ConfigApplied"]


@pytest.mark.parametrize("code", ERRORS)
async def test_a_failed_state_write_is_retried_until_it_succeeds(
    tmp_path: Path, disk: Disk, code: int, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    agent = start(tmp_path, wall)
    c, reports = agent.controller, [Report("publisher")]
    c.assign(target(GOOD), reports)
    disk.broken[agent.store.directory] = code
    c.assign(target({"bogus": 1}, generation=2), reports)  # saved: fails, goes to the runtime
    assert agent.store.problem is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_trials, lambda: reports)
        await trio.sleep(200)
        assert agent.store.problem is not None  # still unwritable: tried, still failing
        disk.broken.clear()  # writable again, and no config change follows
        await wait_until(
            lambda: agent.store.problem is None,
            "the checkpoint written again",
            timeout=RETRY_MAX + 10,
        )
        nursery.cancel_scope.cancel()
    current = on_disk(agent.store)
    assert current is not None and len(current.bad) == 1  # the refused edit, as in memory
    assert not agent.runtime.path(CHECKPOINT_NAME).exists()


@pytest.mark.parametrize("code", ERRORS)
async def test_a_deferred_trial_dropped_meanwhile_still_clears_the_stores_problem(
    tmp_path: Path, disk: Disk, code: int, autojump_clock: trio.testing.MockClock
) -> None:
    """A config assigned while its rollout did not admit the node, admitted once the state
    directory is unwritable (its trial deferred: the marker not written), the trial dropped
    before the directory is writable again (the watch could not select: a relist): nothing
    was left to write, and the store kept saying `not written` although writable (found by
    the dynconfig model with rollout statuses)."""
    wall = Wall()
    agent = start(tmp_path, wall)
    c, reports = agent.controller, [Report("publisher")]
    waiting = Gate(GOOD_HASH, False, "WaitingForWave", "NodeAgentConfig fleet waits", False)
    c.assign(target(GOOD), reports, waiting)
    assert c.condition().reason == "WaitingForWave" and agent.store.problem is None
    disk.broken[agent.store.directory] = code
    admitted = Gate(GOOD_HASH, True, "", "", False)
    c.assign(target(GOOD), reports, admitted)  # the same assignment: only the trial's write
    assert c.condition().reason == "TrialDeferred" and agent.store.problem is not None
    c.keep("NodeAgentConfig objects not readable (a relist)")  # the trial dropped
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_trials, lambda: reports)
        disk.broken.clear()
        await wait_until(
            lambda: agent.store.problem is None,
            "the checkpoint written again",
            timeout=RETRY_MAX + 10,
        )
        nursery.cancel_scope.cancel()
    assert c.active.hash == LOCAL_HASH and c.state.trial is None  # nothing applied meanwhile


def test_a_full_disk_is_a_failed_write_like_a_read_only_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC where a full disk raises it (the data's fsync): reported like EROFS, the old
    checkpoint kept, no temp file left behind, the dynconfig state saved to the runtime copy."""
    store = CheckpointStore(tmp_path / "checkpoints")
    runtime = CheckpointStore(tmp_path / "run")
    store.write(CHECKPOINT_NAME, b"old")
    failures = checkpoint_metrics.WRITE_FAILURES.labels(CHECKPOINT_NAME)._value.get()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)  # the store calls os.fsync
    assert save(store, State(), runtime) is Saved.NOTHING  # the runtime directory is full too
    monkeypatch.undo()
    assert store.problem == f"checkpoint {CHECKPOINT_NAME} not written: No space left on device"
    # Both failed: the checkpoint's write and the runtime copy's (the same name).
    assert checkpoint_metrics.WRITE_FAILURES.labels(CHECKPOINT_NAME)._value.get() == failures + 2
    assert store.read(CHECKPOINT_NAME).data == b"old"
    assert [p.name for p in store.directory.iterdir()] == [CHECKPOINT_NAME]
    assert list(runtime.directory.iterdir()) == []
