"""A reloaded file (SIGHUP) on trial like a remote change, with the agent's own ConfigBuilder
(a real file) and ConfigHub: the running config is the rollback target, an unhealthy trial
restores the previous file (under the active remote overlay), and the bad file's hash is refused
until the file changes; standalone outcomes reach the status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from nodeagent.checkpoint import CheckpointStore
from nodeagent.dynconfig import metrics
from nodeagent.dynconfig.boot import boot
from nodeagent.dynconfig.controller import Controller
from nodeagent.dynconfig.overlay import config_hash
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.dynconfig.state import LOCAL_HASH
from nodeagent.dynconfig.status import ConfigEvent
from nodeagent.service.config import Config, ConfigBuilder
from nodeagent.service.confighub import ConfigHub
from tests.support.fake_dynconfig import Report, Wall
from tests.unit.dynconfig.test_controller import target

DEBUG = {"agent": {"log_level": "debug"}}


def toml(scan: float, level: str = "info") -> str:
    return f'[agent]\nlog_level = "{level}"\n[plugins]\nscan_interval = {scan}\n'


class Rig:
    def __init__(self, tmp_path: Path, wall: Wall | None = None, **settings: Any) -> None:
        self.path = tmp_path / "config.toml"
        if not self.path.exists():  # a second Rig is the same node restarted
            self.path.write_text(toml(5.0))
        self.file = ConfigBuilder(str(self.path))
        self.events: list[ConfigEvent] = []
        self.rollbacks: list[str] = []
        dynconfig = DynconfigSettings(**settings)
        store = CheckpointStore(tmp_path / "checkpoints")
        wall = wall or Wall()
        booted = boot(dynconfig, store, self.file, wall=wall)
        self.hub = ConfigHub(booted.config)
        self.controller: Controller[Config] = Controller(
            dynconfig,
            store,
            self.file,
            config_hash,
            self.hub,
            booted,
            on_event=self.events.append,
            wall=wall,
            file_hash=self.file.file_hash,
            on_file_rollback=self.rollbacks.append,
        )

    def reload(self, text: str) -> tuple[str, str]:
        self.path.write_text(text)
        undo = self.file.reread()
        return self.controller.propose_local(self.file.file_hash, undo, [Report("publisher")])

    @property
    def scan(self) -> float:
        value: float = self.hub.current.plugins.scan_interval
        return value

    @property
    def level(self) -> str:
        value: str = self.hub.current.agent.log_level
        return value


async def test_reloaded_file_survives_its_trial(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(tmp_path)
    c = rig.controller
    result, message = rig.reload(toml(7.0))
    assert result == "applied" and message == "changed: plugins.scan_interval; on trial for 600s"
    assert rig.scan == 7.0
    assert c.condition().reason == "OnTrial" and "config file" in c.condition().message
    status = c.status()
    assert status["file"]["on_trial"] and status["trial"]["file_hash"] == rig.file.file_hash
    assert [e.reason for e in rig.events] == ["ConfigApplied"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_trials, lambda: [Report("publisher")])
        await trio.sleep(601)
        nursery.cancel_scope.cancel()
    assert c.state.trial is None and not c.status()["file"]["on_trial"]
    assert c.state.lkg is None  # a file trial promotes no remote config
    assert rig.scan == 7.0 and rig.rollbacks == []
    # The same content again: nothing changes, nothing on trial.
    assert rig.reload(toml(7.0)) == ("unchanged", "no field changed")
    assert c.state.trial is None


async def test_unhealthy_reload_rolls_back_to_the_running_file_and_is_not_retried(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(tmp_path, unready_bound=10.0)
    c = rig.controller
    rig.reload(toml(6.0))
    await trio.sleep(601)
    c.tick(None)  # 6.0 survived: it is the running, proven file
    good = rig.file.file_hash
    rollbacks = metrics.ROLLBACKS._value.get()

    assert rig.reload(toml(66.0))[0] == "applied"
    # A second reload during the trial: the rollback target stays the proven file.
    assert rig.reload(toml(67.0, "debug"))[0] == "applied"
    bad = rig.file.file_hash
    reports = [Report("publisher", ready=False, reason="sync failing")]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_trials, lambda: reports)
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert (rig.scan, rig.level) == (6.0, "info")
    assert rig.file.file_hash == good == c.file_hash  # the builder is back on the good file
    assert metrics.ROLLBACKS._value.get() == rollbacks + 1
    assert c.condition().reason == "RolledBack"
    assert bad in c.condition().message and "publisher not ready" in c.condition().message
    assert rig.rollbacks == [c.condition().message]
    assert [e.reason for e in rig.events][-1] == "ConfigRolledBack"
    assert c.status()["file"]["rolled_back"]["hash"] == bad
    assert c.state.trial is None

    # The same file again: refused, the running file kept.
    result, message = rig.reload(toml(67.0, "debug"))
    assert result == "refused" and "not retried until the file changes" in message
    assert rig.file.file_hash == good and rig.scan == 6.0
    # The file changes: tried again.
    assert rig.reload(toml(68.0))[0] == "applied"
    assert c.status()["file"]["rolled_back"] is None


async def test_invalid_or_vetoed_reload_keeps_the_running_file(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(tmp_path)
    c = rig.controller
    rig.hub.plugins.subscribe(
        lambda old, new: "99 s is too slow" if new.scan_interval == 99 else None,
        name="publisher",
    )
    assert rig.reload(toml(99.0)) == ("refused", "publisher: 99 s is too slow")
    assert rig.scan == 5.0 and c.state.trial is None
    assert c.file_hash == rig.file.file_hash == config_hash(rig.file.raw)
    assert rig.file.raw["plugins"]["scan_interval"] == 5.0  # the builder was undone


async def test_reload_under_a_remote_config_rolls_back_the_file_only(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(tmp_path, unready_bound=10.0)
    c = rig.controller
    c.assign(target(DEBUG), [Report("publisher")])
    await trio.sleep(601)
    c.tick(None)
    remote = config_hash(DEBUG)
    assert c.state.lkg is not None and c.state.lkg.hash == remote

    assert rig.reload(toml(9.0))[0] == "applied"
    assert (rig.scan, rig.level) == (9.0, "debug")  # the overlay stays over the new file
    assert c.state.trial is not None and not c.state.trial.remote
    c.tick("component publisher not ready for 11s")
    assert (rig.scan, rig.level) == (5.0, "debug")
    assert c.active.hash == remote and c.state.bad == []  # the remote config is not blamed


async def test_remote_change_during_a_file_trial_rolls_back_both(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(tmp_path)
    c = rig.controller
    rig.reload(toml(9.0))
    c.assign(target(DEBUG), [Report("publisher")])
    trial = c.state.trial
    assert trial is not None and trial.remote and trial.file_hash == rig.file.file_hash
    c.tick("component publisher not ready for 61s")
    assert (rig.scan, rig.level) == (5.0, "info")
    assert c.active.hash == LOCAL_HASH
    assert [b.hash for b in c.state.bad] == [config_hash(DEBUG)]
    assert c.state.bad_file is not None
    assert "NodeAgentConfig fleet" in c.condition().message
    assert "reloaded config file" in c.condition().message


async def test_died_during_a_file_trial_is_reported_at_start(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = Rig(tmp_path, wall)
    first.reload(toml(9.0))
    died = first.file.file_hash
    # Killed here; the new process reads the file as it is now (9.0).
    second = Rig(tmp_path, wall)
    assert second.scan == 9.0 and second.controller.file_hash == died
    assert [e.reason for e in second.events] == ["ConfigTrialFailed"]
    state = second.controller.state
    assert state.trial is None and state.bad_file is not None and state.bad_file.hash == died
    # A reload of that same content is refused; an edited file is tried.
    assert second.reload(toml(9.0))[0] == "refused"
    assert second.reload(toml(8.0))[0] == "applied"
