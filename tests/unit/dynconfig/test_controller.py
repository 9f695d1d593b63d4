"""The dynamic-config state machine with fakes for the hub, the builder and the supervisor's
reports; trial time on Trio's autojump clock, checkpoint age on a settable wall clock."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from nodeagent.checkpoint import CheckpointStore
from nodeagent.core.errors import ConfigError
from nodeagent.dynconfig import metrics
from nodeagent.dynconfig.boot import boot
from nodeagent.dynconfig.controller import Controller
from nodeagent.dynconfig.health import HealthTracker
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.dynconfig.state import CHECKPOINT_NAME, LOCAL_HASH, Assignment
from nodeagent.dynconfig.status import ConfigEvent, condition_patch
from tests.support.fake_dynconfig import LOCAL, FakeHub, Report, Wall, build, hasher


@dataclass
class Rig:
    controller: Controller[dict[str, Any]]
    hub: FakeHub
    events: list[ConfigEvent]
    wall: Wall
    store: CheckpointStore


def make(tmp_path: Path, wall: Wall | None = None, **settings: Any) -> Rig:
    wall = wall or Wall()
    events: list[ConfigEvent] = []
    store = CheckpointStore(tmp_path / "checkpoints")
    dynconfig = DynconfigSettings(**settings)
    booted = boot(dynconfig, store, build, wall=wall)
    hub = FakeHub(booted.config)
    controller = Controller(
        dynconfig, store, build, hasher, hub, booted, on_event=events.append, wall=wall
    )
    return Rig(controller, hub, events, wall, store)


def target(config: dict[str, Any], generation: int = 1, name: str = "fleet") -> Assignment:
    return Assignment(name=name, uid="uid-1", generation=generation, config=config)


def reasons(rig: Rig) -> list[str]:
    return [event.reason for event in rig.events]


def saved(rig: Rig) -> dict[str, Any]:
    data = rig.store.read(CHECKPOINT_NAME).data
    assert data is not None
    out: dict[str, Any] = msgspec.json.decode(data)
    return out


def gauge_hashes(gauge: Any) -> set[str]:
    return {
        sample.labels["hash"] for m in gauge.collect() for sample in m.samples if sample.value == 1
    }


async def test_graduation_to_last_known_good(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path)
    c = rig.controller
    reports = [Report("publisher")]
    c.assign(target({"interval": 7}), reports)
    applied = hasher({"interval": 7})
    assert rig.hub.current["interval"] == 7
    assert c.status()["trial"] is not None
    assert saved(rig)["trial"]["hash"] == applied  # the marker is on disk during the trial
    assert c.condition().reason == "OnTrial"
    assert reasons(rig) == ["ConfigApplied"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_trials, lambda: reports)
        await trio.sleep(599)
        assert c.state.lkg is not None and c.state.lkg.hash == LOCAL_HASH
        await trio.sleep(2)
        nursery.cancel_scope.cancel()
    assert c.state.lkg is not None and c.state.lkg.hash == applied
    assert saved(rig)["trial"] is None
    assert saved(rig)["lkg"]["hash"] == applied
    assert c.condition().status and c.condition().reason == "Active"
    assert gauge_hashes(metrics.LKG_INFO) == {applied}
    assert gauge_hashes(metrics.ACTIVE_INFO) == {applied}
    assert gauge_hashes(metrics.ASSIGNED_INFO) == {applied}
    assert c.status()["differ"] == []


async def test_unhealthy_during_trial_rolls_back_and_is_not_retried(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path, unready_bound=30.0)
    c = rig.controller
    # A first config graduates, so the rollback goes back to it, not to the local one.
    c.assign(target({"interval": 7}, generation=1), [Report("publisher")])
    await trio.sleep(601)
    c.tick(None)
    good = hasher({"interval": 7})
    assert c.state.lkg is not None and c.state.lkg.hash == good

    reports = [Report("publisher")]
    c.assign(target({"interval": 8}, generation=2), reports)
    bad = hasher({"interval": 8})
    assert c.active.hash == bad
    rollbacks = metrics.ROLLBACKS._value.get()
    reports[0] = Report("publisher", ready=False, reason="sync failing")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_trials, lambda: reports)
        await trio.sleep(30)
        assert c.active.hash == bad  # within the bound
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert c.active.hash == good
    assert rig.hub.current["interval"] == 7
    assert metrics.ROLLBACKS._value.get() == rollbacks + 1
    assert reasons(rig)[-1] == "ConfigRolledBack"
    condition = c.condition()
    assert not condition.status and condition.reason == "RolledBack"
    assert bad in condition.message and "publisher not ready" in condition.message
    assert [b["hash"] for b in saved(rig)["bad"]] == [bad]
    assert saved(rig)["trial"] is None
    status = c.status()
    assert status["differ"] and "unhealthy" in str(status["differ"])

    # The same object again (the watch re-lists): not retried.
    proposals = len(rig.hub.proposals)
    c.assign(target({"interval": 8}, generation=2), reports)
    assert len(rig.hub.proposals) == proposals and c.active.hash == good
    # The object changes (new generation, same content): retried.
    c.assign(target({"interval": 8}, generation=3), [Report("publisher")])
    assert c.active.hash == bad


async def test_crash_loop_during_trial_rolls_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path, crashloop_restarts=3)
    c = rig.controller
    restarts = [5]  # restarts before the trial do not count

    def reports() -> list[Report]:
        # A component the change can hurt (not in dynconfig.health.CAUSES: any change can).
        return [Report("publisher", restarts=restarts[0])]

    c.assign(target({"interval": 7}), reports())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_trials, reports)
        restarts[0] = 7
        await trio.sleep(20)
        assert c.active.hash != LOCAL_HASH
        restarts[0] = 8
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert c.active.hash == LOCAL_HASH
    assert "publisher crash-looping" in c.condition().message


def test_health_tracker_watchdog() -> None:
    tracker = HealthTracker(DynconfigSettings(watchdog_bound=60.0))
    tracker.start([])
    assert tracker.observe([], 0.0, watchdog_age=59.0) is None
    reason = tracker.observe([], 0.0, watchdog_age=61.0)
    assert reason is not None and "watchdog" in reason


async def test_veto_discards_and_is_not_retried_until_the_object_changes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path)
    rig.hub.veto = "interval below the publisher's minimum"
    c = rig.controller
    vetoes = metrics.VETOES._value.get()
    c.assign(target({"interval": 99}))
    assert c.active.hash == LOCAL_HASH and rig.hub.current == LOCAL
    assert metrics.VETOES._value.get() == vetoes + 1
    assert reasons(rig) == ["ConfigVetoed"]
    condition = c.condition()
    assert condition.reason == "ConfigVetoed" and "publisher" in condition.message
    assert hasher({"interval": 99}) in condition.message
    assert c.state.trial is None
    proposals = len(rig.hub.proposals)
    c.assign(target({"interval": 99}))
    assert len(rig.hub.proposals) == proposals
    assert reasons(rig) == ["ConfigVetoed"]
    # Another content is a changed object: applied.
    c.assign(target({"interval": 9}, generation=2))
    assert c.active.hash == hasher({"interval": 9})


async def test_invalid_remote_config_is_rejected_with_the_field(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path)
    c = rig.controller
    c.assign(target({"state_dir": "/x"}))
    assert c.active.hash == LOCAL_HASH and rig.hub.proposals == []
    assert c.condition().reason == "ConfigInvalid"
    assert "state_dir" in c.condition().message
    assert reasons(rig) == ["ConfigInvalid"]


async def test_died_during_trial_rolls_back_at_start(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = make(tmp_path, wall)
    first.controller.assign(target({"interval": 7}))
    await trio.sleep(601)
    first.controller.tick(None)
    first.controller.assign(target({"interval": 8}, generation=2))
    assert saved(first)["trial"] is not None
    # The process is killed here (nothing more runs); a new one starts from the checkpoint.
    wall.now += 30
    second = make(tmp_path, wall)
    c = second.controller
    assert c.boot_source == "rollback"
    assert c.active.hash == hasher({"interval": 7})
    assert second.hub.current["interval"] == 7
    assert reasons(second) == ["ConfigRolledBack"]
    assert c.condition().reason == "RolledBack"
    assert saved(second)["trial"] is None
    # The watch then lists the same object: the crashed config is not retried.
    c.assign(target({"interval": 8}, generation=2))
    assert second.hub.proposals == [] and c.active.hash == hasher({"interval": 7})


async def test_boot_from_fresh_and_expired_checkpoint(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = make(tmp_path, wall, checkpoint_grace=7200.0)
    assert first.controller.boot_source == "defaults"
    first.controller.assign(target({"interval": 7}))
    await trio.sleep(601)
    first.controller.tick(None)

    wall.now += 7000
    fresh = make(tmp_path, wall, checkpoint_grace=7200.0)
    assert fresh.controller.boot_source == "checkpoint"
    assert fresh.hub.current["interval"] == 7
    assert fresh.controller.condition().reason == "Checkpoint"
    assert fresh.controller.status()["boot"] == {
        "source": "checkpoint",
        "reason": fresh.controller.boot_reason,
    }

    wall.now += 300  # 7300 s since the apiserver last confirmed it
    expired = make(tmp_path, wall, checkpoint_grace=7200.0)
    assert expired.controller.boot_source == "defaults"
    assert "expired" in expired.controller.boot_reason
    assert expired.hub.current == LOCAL


async def test_confirm_refreshes_the_grace_at_most_every_quarter(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    rig = make(tmp_path, wall, checkpoint_grace=4000.0)
    rig.controller.assign(target({"interval": 7}))
    await trio.sleep(601)
    rig.controller.tick(None)
    confirmed = saved(rig)["confirmed_at"]
    # The quarter is measured on the monotonic clock (trio's) since this process confirmed.
    await trio.sleep(300)
    wall.now += 300
    rig.controller.confirm()
    assert saved(rig)["confirmed_at"] == confirmed  # no write within a quarter grace
    await trio.sleep(600)
    wall.now += 600
    rig.controller.confirm()
    assert saved(rig)["confirmed_at"] == wall.now
    # Up for long, restarted without the apiserver: the grace counts from the confirmation.
    wall.now += 3000
    again = make(tmp_path, wall, checkpoint_grace=4000.0)
    assert again.controller.boot_source == "checkpoint"


async def test_corrupt_checkpoint_boots_local(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = CheckpointStore(tmp_path / "checkpoints")
    store.write(CHECKPOINT_NAME, b"{not json")
    rig = make(tmp_path)
    assert rig.controller.boot_source == "defaults"
    assert "unreadable" in rig.controller.boot_reason


async def test_no_target_goes_back_to_local_and_tie_keeps(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path)
    c = rig.controller
    c.assign(target({"interval": 7}))
    c.keep("tie between a, b at priority 5")
    assert c.active.hash == hasher({"interval": 7})
    assert c.condition().reason == "NoUniqueTarget" and "a, b" in c.condition().message
    c.assign(None)
    assert c.active.hash == LOCAL_HASH and rig.hub.current == LOCAL
    assert c.state.trial is None and c.condition().reason == "Local"


def test_condition_patch_is_a_conditions_merge() -> None:
    controller_condition = (True, "Active", "NodeAgentConfig fleet (hash abc) active")
    from nodeagent.dynconfig.status import Condition

    patch = condition_patch(Condition(*controller_condition), 0.0)
    (cond,) = patch["status"]["conditions"]
    assert cond["type"] == "NodeAgentConfigOK" and cond["status"] == "True"
    assert cond["lastTransitionTime"] == "1970-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("trial_duration", 0.0),
        ("checkpoint_grace", float("inf")),
        ("unready_bound", -1.0),
        ("crashloop_restarts", 0),
        ("health_interval", 700.0),
    ],
)
def test_settings_name_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"dynconfig.{field}"):
        DynconfigSettings(**{field: value}).validate()


async def test_relisted_object_writes_no_checkpoint(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path)
    c = rig.controller
    c.assign(target({"interval": 7}))
    await trio.sleep(601)
    c.tick(None)
    path = rig.store.path(CHECKPOINT_NAME)
    before = path.stat().st_mtime_ns, path.read_bytes()
    rig.wall.now += 10
    for _ in range(5):
        c.assign(target({"interval": 7}))
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before


async def test_rollback_target_no_longer_valid_keeps_running(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path)
    c = rig.controller
    c.assign(target({"interval": 7}))
    await trio.sleep(601)
    c.tick(None)
    c.assign(target({"log_level": "debug"}, generation=2))
    # The file changed meanwhile so the last-known-good overlay no longer builds.
    assert c.state.lkg is not None
    c.state.lkg = msgspec.structs.replace(c.state.lkg, config={"gone": 1})
    c.tick("component publisher not ready")
    assert c.condition().reason == "RolledBack" and "failed" in c.condition().message
    assert c.active.hash == hasher({"log_level": "debug"})
    assert c.state.trial is None


# ---- a clean stop during a trial (issue 21, section 1) -----------------------------------


async def _survives(rig: Rig, seconds: float) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rig.controller.run_trials, lambda: [Report("publisher")])
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


async def test_a_clean_stop_during_a_trial_resumes_it_at_the_next_start(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = make(tmp_path, wall)
    first.controller.assign(target({"interval": 7}), [Report("publisher")])
    applied = hasher({"interval": 7})
    await _survives(first, 200)
    first.controller.stop_clean()  # SIGTERM: the agent records that it stopped cleanly
    assert saved(first)["trial"]["remaining"] == pytest.approx(400, abs=1)

    wall.now += 30  # a DaemonSet rollout
    second = make(tmp_path, wall)
    c = second.controller
    assert c.boot_source == "resumed", c.boot_reason
    assert c.active.hash == applied and second.hub.current["interval"] == 7
    assert c.state.bad == [] and reasons(second) == []
    assert c.condition().reason == "OnTrial" and "resumed" in c.condition().message
    # The marker is armed again: a crash during the rest of the trial still rolls back.
    assert saved(second)["trial"]["remaining"] is None
    assert c.state.lkg is not None and c.state.lkg.hash == LOCAL_HASH
    # The watch lists the same object: nothing re-applied, the trial goes on.
    c.assign(target({"interval": 7}))
    assert second.hub.proposals == [] and c.state.trial is not None
    await _survives(second, 399)
    assert c.state.trial is not None  # the remaining time, not a fresh trial nor none
    await _survives(second, 2)
    assert c.state.trial is None and c.state.lkg is not None and c.state.lkg.hash == applied
    assert c.condition().reason == "Active"


async def test_a_crash_after_a_clean_restart_during_the_trial_rolls_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = make(tmp_path, wall)
    first.controller.assign(target({"interval": 7}), [Report("publisher")])
    first.controller.stop_clean()
    second = make(tmp_path, wall)
    assert second.controller.boot_source == "resumed"
    await _survives(second, 10)
    # killed (no stop_clean): the next start rolls back as before.
    third = make(tmp_path, wall)
    assert third.controller.boot_source == "rollback"
    assert third.controller.active.hash == LOCAL_HASH and third.hub.current == LOCAL
    assert [b.kind for b in third.controller.state.bad] == ["crash"]


async def test_clean_restarts_in_a_loop_during_a_trial_roll_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A config whose agent is stopped again and again (a failing liveness probe: the kubelet
    sends SIGTERM) must not reach promotion by restarts: crashloop_restarts clean restarts
    during one trial count as a crash."""
    wall = Wall()
    rig = make(tmp_path, wall, crashloop_restarts=3)
    rig.controller.assign(target({"interval": 7}), [Report("publisher")])
    for _ in range(2):
        rig.controller.stop_clean()
        rig = make(tmp_path, wall, crashloop_restarts=3)
        assert rig.controller.boot_source == "resumed"
    rig.controller.stop_clean()
    rig = make(tmp_path, wall, crashloop_restarts=3)
    c = rig.controller
    assert c.boot_source == "rollback" and c.active.hash == LOCAL_HASH
    assert "restarted 3 times during its trial" in c.condition().message
    assert [b.kind for b in c.state.bad] == ["crash"]


async def test_a_clean_stop_past_the_grace_does_not_resume_nor_mark_bad(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = make(tmp_path, wall, checkpoint_grace=3600.0)
    first.controller.assign(target({"interval": 7}), [Report("publisher")])
    first.controller.stop_clean()
    wall.now += 7200
    second = make(tmp_path, wall, checkpoint_grace=3600.0)
    c = second.controller
    assert c.boot_source == "defaults" and c.active.hash == LOCAL_HASH
    assert c.state.trial is None and c.state.bad == []
    # Assigned again once the apiserver answers: a fresh trial.
    c.assign(target({"interval": 7}))
    assert c.active.hash == hasher({"interval": 7}) and c.state.trial is not None


async def test_a_clean_stop_during_a_reload_trial_forgets_the_file_trial(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = make(tmp_path, wall)
    first.hub.current = {}  # every field differs: the reload is applied, on trial
    result, _ = first.controller.propose_local("file-2", lambda: None)
    assert result == "applied"
    assert first.controller.state.trial is not None
    assert first.controller.state.trial.file_hash == "file-2"
    first.controller.stop_clean()
    second = make(tmp_path, wall)
    # The start reads the file as it is: not a crash of the reload, not marked bad.
    assert second.controller.state.bad_file is None and reasons(second) == []
    assert second.controller.state.trial is None and second.controller.boot_source == "defaults"
