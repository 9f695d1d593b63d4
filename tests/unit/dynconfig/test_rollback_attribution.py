"""Rollback attribution per health signal (issue 29 item 2): a config on trial is rolled back
only for a signal its change can cause (the settings of that component changed on this trial,
dynconfig.health.CAUSES); the rest are reported (log, metric, /v1/config), not held against it.
Before, a plugin's dead socket or an apiserver outage rolled back a config that touched
neither."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from nodeagent.dynconfig import metrics
from nodeagent.dynconfig.component import DynconfigComponent
from nodeagent.dynconfig.health import CAUSES, HealthTracker
from nodeagent.dynconfig.overlay import DYNAMIC_FIELDS
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.plugins import PluginManager
from nodeagent.reporter.component import ReporterComponent
from nodeagent.resources.component import ResourcesComponent
from nodeagent.service.cluster import ClusterComponent
from nodeagent.service.config import Config
from tests.support.fake_dynconfig import FakeHub, Report, Result
from tests.unit.dynconfig.test_controller import Rig, make, target

FIELDS = sorted(DYNAMIC_FIELDS)


def test_the_table_names_the_components_and_tables_of_the_agent() -> None:
    """CAUSES is keyed by the supervised components' names and names the Config's tables (a
    renamed component or table would silently count every signal, or none)."""
    components = {
        c.name
        for c in (
            PluginManager,
            ResourcesComponent,
            ReporterComponent,
            ClusterComponent,
            DynconfigComponent,
        )
    }
    assert set(CAUSES) == components
    tables = {f.name for f in msgspec.structs.fields(Config)}
    assert set().union(*CAUSES.values()) <= tables
    # Every table a remote config or a reload can change is some component's cause.
    assert {path.partition(".")[0] for path in DYNAMIC_FIELDS} - set().union(*CAUSES.values()) == {
        "agent"
    }  # agent.log_level: the watchdog's only


@dataclass
class DottedHub(FakeHub):
    """Says which agent fields a change sets, as the service's ConfigHub does."""

    fields: list[str] = field(default_factory=list)

    def propose(self, new: dict[str, Any], source: str) -> Result:
        result = super().propose(new, source)
        return Result(result.applied, result.vetoes, list(self.fields) if result.changed else [])


def rig_changing(tmp_path: Path, *fields: str, **settings: Any) -> Rig:
    rig = make(tmp_path, unready_bound=30.0, **settings)
    hub = DottedHub(rig.hub.current, fields=list(fields))
    rig.controller.hub = hub
    rig.hub = hub
    return rig


def not_blamed(component: str) -> float:
    value = metrics.NOT_BLAMED.labels(component)._value.get()
    return float(value)


async def judge(rig: Rig, reports: list[Report], seconds: float) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rig.controller.run_trials, lambda: reports)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


async def test_an_outage_the_change_cannot_cause_is_reported_not_rolled_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = rig_changing(tmp_path, "reporter.grace")
    c = rig.controller
    c.assign(target({"interval": 7}), [Report("kube"), Report("reporter")])
    before = not_blamed("kube")
    reports = [Report("kube", ready=False, reason="apiserver unreachable"), Report("reporter")]
    await judge(rig, reports, 100)  # past unready_bound (30 s), the trial still on
    assert c.state.trial is not None and c.state.bad == []
    view = c.status()["trial"]
    assert view["changed"] == ["reporter.grace"]
    assert "apiserver unreachable" in view["not_blamed"]["kube"]
    assert not_blamed("kube") == before + 1  # once per trial, not per check
    await judge(rig, reports, 600)
    assert c.state.trial is None and c.state.lkg is not None
    assert c.state.lkg.hash == c.active.hash and c.condition().reason == "Active"


async def test_a_signal_of_a_component_whose_settings_changed_rolls_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = rig_changing(tmp_path, "plugins.stream_min_interval")
    c = rig.controller
    c.assign(target({"interval": 7}), [Report("resources")])
    # The pools are what the plugins stream: a plugins setting can hold them back.
    await judge(rig, [Report("resources", ready=False, reason="pool unpublished")], 100)
    assert c.state.trial is None and [b.kind for b in c.state.bad] == ["unhealthy"]
    assert "resources not ready" in c.condition().message


async def test_the_watchdog_counts_for_any_change(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = rig_changing(tmp_path, "agent.log_level", watchdog_bound=10.0)
    c = rig.controller
    c.assign(target({"interval": 7}), [])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.run_trials, lambda: [], lambda: 60.0)
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert "watchdog" in c.condition().message and c.state.trial is None


async def test_a_resumed_trial_keeps_what_it_changed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = rig_changing(tmp_path, "reporter.grace")
    rig.controller.assign(target({"interval": 7}), [Report("plugins")])
    rig.controller.stop_clean()
    again = make(tmp_path, rig.wall, unready_bound=30.0)  # a clean restart: resumed
    c = again.controller
    assert c.boot_source == "resumed"
    dead_socket = Report("plugins", ready=False, reason="plugin x unreachable")
    await judge(again, [dead_socket], 100)
    assert c.state.trial is not None and c.state.bad == []
    assert "plugins" in c.status()["trial"]["not_blamed"]


@given(
    component=st.sampled_from([*CAUSES, "debug-unready"]),
    changed=st.sets(st.sampled_from(FIELDS)),
    crash=st.booleans(),
)
def test_a_signal_rolls_back_exactly_when_its_settings_changed(
    component: str, changed: set[str], crash: bool
) -> None:
    tracker = HealthTracker(DynconfigSettings(unready_bound=30.0, crashloop_restarts=3))
    tracker.start([Report(component)], changed)
    sick = Report(component, restarts=3) if crash else Report(component, ready=False)
    tracker.observe([sick], 0.0)
    verdict = tracker.observe([sick], 31.0)
    tables = {path.partition(".")[0] for path in changed}
    causes = CAUSES.get(component)
    expected = bool(tables) if causes is None else bool(causes & tables)
    assert (verdict is not None) == expected, (verdict, tracker.not_blamed)
    assert (component in tracker.not_blamed) == (not expected)
