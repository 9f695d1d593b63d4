"""A reloaded file (SIGHUP) on trial like a remote change: the running config is the rollback
target, an unhealthy trial restores the previous file (under the active remote overlay), and the
bad file's hash is refused until the file changes; standalone outcomes reach the status."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import trio
import trio.testing

from nodeagent.checkpoint import CheckpointStore
from nodeagent.core.errors import ConfigError
from nodeagent.dynconfig import metrics
from nodeagent.dynconfig.controller import LOCAL_HASH, ConfigEvent, Controller
from nodeagent.dynconfig.settings import DynconfigSettings
from tests.unit.dynconfig.test_controller import (
    FakeHub,
    Report,
    Wall,
    hasher,
    target,
)


class FileBuilder:
    """The agent's ConfigBuilder in small: the file's fields, then the remote overlay."""

    def __init__(self) -> None:
        self.raw: dict[str, Any] = {"log_level": "info", "interval": 5}

    def reread(self, raw: dict[str, Any]) -> Callable[[], None]:
        if not isinstance(raw.get("interval"), int):
            raise ConfigError("interval", raw.get("interval"), "expected int")
        previous, self.raw = self.raw, raw

        def undo() -> None:
            self.raw = previous

        return undo

    @property
    def file_hash(self) -> str:
        return hasher(self.raw)

    def __call__(self, remote: Mapping[str, Any] | None) -> dict[str, Any]:
        return {**self.raw, **(remote or {})}


class Rig:
    def __init__(self, tmp_path: Path, wall: Wall | None = None, **settings: Any) -> None:
        self.file = FileBuilder()
        self.events: list[ConfigEvent] = []
        self.rollbacks: list[str] = []
        self.controller = Controller(
            DynconfigSettings(**settings),
            CheckpointStore(tmp_path / "checkpoints"),
            self.file,
            hasher,
            on_event=self.events.append,
            wall=wall or Wall(),
        )
        self.controller.file_hash = self.file.file_hash
        self.controller.on_file_rollback = self.rollbacks.append
        self.hub = FakeHub(self.controller.boot().config)
        self.controller.attach(self.hub)

    def reload(self, **fields: Any) -> tuple[str, str]:
        undo = self.file.reread({**self.file.raw, **fields})
        return self.controller.propose_local(self.file.file_hash, undo, [Report("publisher")])


async def test_reloaded_file_survives_its_trial(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(tmp_path)
    c = rig.controller
    result, message = rig.reload(interval=7)
    assert result == "applied" and message == "changed: interval; on trial for 600s"
    assert rig.hub.current["interval"] == 7
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
    assert rig.hub.current["interval"] == 7 and rig.rollbacks == []
    # Unchanged content: nothing on trial.
    assert rig.reload() == ("unchanged", "no field changed")
    assert c.state.trial is None


async def test_unhealthy_reload_rolls_back_to_the_running_file_and_is_not_retried(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(tmp_path, unready_bound=10.0)
    c = rig.controller
    rig.reload(interval=6)
    c.tick(None)
    await trio.sleep(601)
    c.tick(None)  # interval 6 survived: it is the running, proven file
    good = rig.file.file_hash
    rollbacks = metrics.ROLLBACKS._value.get()

    assert rig.reload(interval=66)[0] == "applied"
    bad = rig.file.file_hash
    # A second reload during the trial: the rollback target stays the proven file.
    assert rig.reload(interval=67, log_level="debug")[0] == "applied"
    bad = rig.file.file_hash
    reports = [Report("publisher", ready=False, reason="sync failing")]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_trials, lambda: reports)
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert rig.hub.current == {"log_level": "info", "interval": 6}
    assert rig.file.raw == {"log_level": "info", "interval": 6}
    assert c.file_hash == good
    assert metrics.ROLLBACKS._value.get() == rollbacks + 1
    assert c.condition().reason == "RolledBack"
    assert bad in c.condition().message and "publisher not ready" in c.condition().message
    assert rig.rollbacks == [c.condition().message]
    assert [e.reason for e in rig.events][-1] == "ConfigRolledBack"
    assert c.status()["file"]["rolled_back"]["hash"] == bad
    assert c.state.trial is None

    # The same file again: refused, the running file kept.
    result, message = rig.reload(interval=67, log_level="debug")
    assert result == "refused" and "not retried until the file changes" in message
    assert rig.file.raw["interval"] == 6 and rig.hub.current["interval"] == 6
    # The file changes: tried again.
    assert rig.reload(interval=68)[0] == "applied"
    assert c.status()["file"]["rolled_back"] is None


async def test_invalid_or_vetoed_reload_keeps_the_running_file(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(tmp_path)
    c = rig.controller
    rig.hub.veto = "interval 99 is too slow"
    assert rig.reload(interval=99) == ("refused", "publisher: interval 99 is too slow")
    assert rig.file.raw["interval"] == 5 and c.state.trial is None
    assert c.file_hash == rig.file.file_hash


async def test_reload_under_a_remote_config_rolls_back_the_file_only(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(tmp_path, unready_bound=10.0)
    c = rig.controller
    c.assign(target({"log_level": "debug"}), [Report("publisher")])
    await trio.sleep(601)
    c.tick(None)
    remote = hasher({"log_level": "debug"})
    assert c.state.lkg is not None and c.state.lkg.hash == remote

    assert rig.reload(interval=9)[0] == "applied"
    assert rig.hub.current == {"log_level": "debug", "interval": 9}  # the overlay stays
    assert c.state.trial is not None and not c.state.trial.remote
    c.health.observe([Report("publisher", ready=False)], trio.current_time())
    await trio.sleep(11)
    c.tick(c.health.observe([Report("publisher", ready=False)], trio.current_time()))
    assert rig.hub.current == {"log_level": "debug", "interval": 5}
    assert c.active.hash == remote and c.state.bad == []  # the remote config is not blamed


async def test_remote_change_during_a_file_trial_rolls_back_both(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = Rig(tmp_path)
    c = rig.controller
    rig.reload(interval=9)
    c.assign(target({"log_level": "debug"}), [Report("publisher")])
    trial = c.state.trial
    assert trial is not None and trial.remote and trial.file_hash == rig.file.file_hash
    c.tick("component publisher not ready for 61s")
    assert rig.hub.current == {"log_level": "info", "interval": 5}
    assert c.active.hash == LOCAL_HASH
    assert [b.hash for b in c.state.bad] == [hasher({"log_level": "debug"})]
    assert c.state.bad_file is not None
    assert "NodeAgentConfig fleet" in c.condition().message
    assert "reloaded config file" in c.condition().message


async def test_died_during_a_file_trial_is_reported_at_start(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = Rig(tmp_path, wall)
    first.reload(interval=9)
    died = first.file.file_hash
    # killed here; the new process reads the file as it is now (interval 9)
    events: list[ConfigEvent] = []
    second = Controller(
        DynconfigSettings(),
        CheckpointStore(tmp_path / "checkpoints"),
        first.file,
        hasher,
        on_event=events.append,
        wall=wall,
    )
    second.file_hash = died
    assert second.boot().config["interval"] == 9
    assert [e.reason for e in events] == ["ConfigTrialFailed"]
    assert second.state.trial is None and second.state.bad_file is not None
    assert second.state.bad_file.hash == died
