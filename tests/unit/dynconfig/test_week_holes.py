"""Holes of dynamic configuration found in a normal week on a node (issue 29, items 3, 4, 5, 7
and 8), each reproduced with the rigs of test_component.py (the real accumulators and controller
over in-memory watches) or test_controller.py (the controller alone):

- item 3: a live, unchanged assignment was confirmed only when a selection ran, so after a few
  quiet hours a clean restart found its checkpoint expired;
- item 4: a condition write that failed while the wanted condition changed and changed back
  left the write error set (dynconfig not ready, a trial rolled back for it);
- item 5: the assigned config's error left the condition at a trial's end (``Active``) and came
  back at the next no-op relist; after a rollback a relist rewrote the message;
- item 7: a clean stop whose shutdown outlasted the trial's deadline counted as a restart of
  the trial (the third one rolled back);
- item 8: ``lastTransitionTime`` taken from a Node view older than our own last write, and a
  confirmation written during a forward wall-clock glitch stayed in the future.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import trio
import trio.testing

from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.checkpoint import CheckpointStore
from nodeagent.dynconfig.boot import boot
from nodeagent.dynconfig.component import DynconfigComponent, EventBuffer
from nodeagent.dynconfig.controller import Controller
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.dynconfig.state import CHECKPOINT_NAME, LOCAL_HASH
from nodeagent.kube import EventRecorder
from tests.support.fake_dynconfig import FakeHub, Report, build, hasher
from tests.support.nodeagentconfig import NAC
from tests.support.wait import wait_until
from tests.unit.accumulator.test_accumulator import synced
from tests.unit.dynconfig.test_component import NODE, Client, nac
from tests.unit.dynconfig.test_controller import make, saved, target

GRACE = 7200.0


@dataclass
class Rig:
    client: Client
    component: DynconfigComponent
    controller: Controller[dict[str, Any]]
    store: CheckpointStore
    answering: list[bool]


def trio_wall(base: float = 1_000_000.0) -> Callable[[], float]:
    """A wall clock that moves with the (autojump) Trio clock."""
    return lambda: base + trio.current_time()


@asynccontextmanager
async def running(tmp_path: Path, wall: Callable[[], float]) -> AsyncIterator[Rig]:
    client = Client()
    settings = DynconfigSettings(checkpoint_grace=GRACE)
    store = CheckpointStore(tmp_path / "checkpoints")
    booted = boot(settings, store, build, wall=wall)
    controller = Controller(
        settings, store, build, hasher, FakeHub(booted.config), booted, wall=wall
    )
    answering = [True]
    component = DynconfigComponent(
        node_name=NODE,
        controller=controller,
        events=EventBuffer(EventRecorder(NODE)),
        client=cast(Any, client),
        accumulator_settings=AccumulatorSettings(),
        reports=lambda: [Report("publisher")],
        answering=lambda: answering[0],
        watch=client.run_watch,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(component.run)
        yield Rig(client, component, controller, store, answering)
        nursery.cancel_scope.cancel()


def confirmed_at(store: CheckpointStore) -> float:
    data = store.read(CHECKPOINT_NAME).data
    assert data is not None
    return float(msgspec.json.decode(data)["confirmed_at"])


def node(rv: int, *conditions: dict[str, Any]) -> dict[str, Any]:
    meta = {"name": NODE, "uid": "n", "resourceVersion": str(rv)}
    return {"metadata": meta, "status": {"conditions": list(conditions)}}


async def fleet_applied(rig: Rig) -> None:
    """The Node and one NodeAgentConfig naming it listed, its config applied."""
    await synced(await rig.client.sink("nodes"), node(1))
    await synced(await rig.client.sink(NAC.plural), nac("fleet", {"interval": 7}))
    await wait_until(lambda: rig.controller.active.name == "fleet", "fleet applied")


# -- item 3 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("answering", [True, False])
async def test_a_quiet_live_assignment_stays_confirmed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, answering: bool
) -> None:
    """Three hours of live watches without a NodeAgentConfig event; not answering: the watches
    are kept, but the apiserver does not answer them (nothing confirms)."""
    wall = trio_wall()
    async with running(tmp_path, wall) as rig:
        await fleet_applied(rig)
        assigned = confirmed_at(rig.store)
        rig.answering[0] = answering
        await trio.sleep(3 * 3600)
        assert rig.controller.state.trial is None  # promoted
        confirmed = confirmed_at(rig.store)
        if answering:
            assert wall() - confirmed <= GRACE / 2, wall() - confirmed
        else:
            assert confirmed == assigned

    # A clean restart without the apiserver: the last-known-good (confirmed), else defaults.
    settings = DynconfigSettings(checkpoint_grace=GRACE)
    booted = boot(settings, CheckpointStore(tmp_path / "checkpoints"), build, wall=wall)
    assert booted.source == ("checkpoint" if answering else "defaults"), booted.reason
    assert (booted.state.lkg is not None) == answering


# -- item 4 ---------------------------------------------------------------------------------------


async def test_nothing_left_to_write_clears_a_condition_write_error(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, trio_wall()) as rig:
        await synced(await rig.client.sink("nodes"), node(1))
        await synced(await rig.client.sink(NAC.plural))
        await wait_until(
            lambda: (
                rig.component.condition.written == rig.controller.condition()
                and rig.controller.condition().reason == "Local"
            ),
            "the Local condition written",
        )
        rig.client.refuse = True
        rig.controller.keep("tie between a and b")  # a tie appears: the write fails
        await wait_until(lambda: rig.component.condition.error, "the write failed")
        rig.client.refuse = False
        rig.controller.assign(None)  # and clears: the condition wanted is the one written
        assert rig.component.condition.written == rig.controller.condition()
        await wait_until(lambda: rig.component.condition.error is None, "the error cleared")
        await trio.sleep(DynconfigSettings().status_write_bound + 10)
        assert rig.component.readiness()[0], rig.component.readiness()


# -- item 5 ---------------------------------------------------------------------------------------


async def test_an_invalid_assignment_stays_on_the_condition_past_the_trial(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path)
    c = rig.controller
    c.assign(target({"interval": 7}), [Report("publisher")])
    typo = target({"intervall": 7}, generation=2)
    c.assign(typo)  # edited with a typo during its trial: rejected, the trial goes on
    invalid = c.condition()
    assert invalid.reason == "ConfigInvalid" and c.state.trial is not None
    await trio.sleep(601)
    c.tick(None)  # the trial ends: promoted
    assert c.state.trial is None and c.state.lkg is not None
    assert c.condition() == invalid  # still the assigned config's error, unchanged
    c.assign(typo)  # a no-op relist
    assert c.condition() == invalid


async def test_a_relist_after_a_rollback_rewrites_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path)
    c = rig.controller
    c.assign(target({"interval": 7}), [Report("publisher")])
    c.tick("component publisher not ready for 61s")
    rolled_back = c.condition()
    assert rolled_back.reason == "RolledBack"
    c.assign(target({"interval": 7}))  # a no-op relist
    assert c.condition() == rolled_back


async def test_a_relist_after_a_rollback_at_start_rewrites_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    first = make(tmp_path)
    first.controller.assign(target({"interval": 7}), [Report("publisher")])
    second = make(tmp_path, first.wall)  # killed during the trial
    c = second.controller
    assert c.boot_source == "rollback"
    rolled_back = c.condition()
    c.assign(target({"interval": 7}))  # the first list after the start
    assert c.condition() == rolled_back


# -- item 7 ---------------------------------------------------------------------------------------


async def test_a_clean_stop_with_nothing_left_of_the_trial_promotes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path, crashloop_restarts=3, trial_duration=600.0)
    rig.controller.assign(target({"interval": 7}), [Report("publisher")])
    applied = hasher({"interval": 7})
    for _ in range(2):  # two clean restarts during the trial
        rig.controller.stop_clean()
        rig = make(tmp_path, rig.wall, crashloop_restarts=3, trial_duration=600.0)
        assert rig.controller.boot_source == "resumed"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rig.controller.run_trials, lambda: [Report("publisher")])
        await trio.sleep(590)
        nursery.cancel_scope.cancel()  # the third stop begins: its shutdown takes 20 s
    await trio.sleep(20)
    rig.controller.stop_clean()  # 0 s left: complete
    c = rig.controller
    assert c.state.trial is None and c.state.lkg is not None and c.state.lkg.hash == applied
    again = make(tmp_path, rig.wall, crashloop_restarts=3, trial_duration=600.0)
    assert again.controller.boot_source == "checkpoint", again.controller.boot_reason
    assert again.controller.active.hash == applied and again.controller.state.bad == []


# -- item 8 ---------------------------------------------------------------------------------------


async def test_a_confirmation_during_a_clock_glitch_does_not_stay_in_the_future(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path, checkpoint_grace=GRACE)
    c = rig.controller
    c.assign(target({"interval": 7}), [Report("publisher")])
    await trio.sleep(601)
    c.tick(None)
    await trio.sleep(GRACE / 4 + 1)
    rig.wall.now += 10 * 365 * 86400.0  # NTP steps the clock ten years ahead ...
    c.confirm()
    rig.wall.now -= 10 * 365 * 86400.0  # ... and back
    await trio.sleep(GRACE / 4 + 1)
    rig.wall.now += GRACE / 2
    c.confirm()  # measured on the monotonic clock: a quarter grace since the last one
    assert saved(rig)["confirmed_at"] == rig.wall.now


async def test_a_boot_on_a_confirmation_from_the_future_is_expired(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path, checkpoint_grace=GRACE)
    rig.controller.assign(target({"interval": 7}), [Report("publisher")])
    await trio.sleep(601)
    rig.controller.tick(None)
    rig.wall.now -= 10 * 365 * 86400.0  # the confirmation is ten years ahead of this start
    again = make(tmp_path, rig.wall, checkpoint_grace=GRACE)
    assert again.controller.boot_source == "defaults"
    assert "future" in again.controller.boot_reason, again.controller.boot_reason
    assert again.controller.active.hash == LOCAL_HASH


async def test_the_transition_time_follows_our_own_last_write(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path, trio_wall()) as rig:
        since = "2026-01-02T03:04:05Z"
        shown = {"type": "NodeAgentConfigOK", "status": "True", "reason": "Local"}
        # The Node shows a True condition of an earlier run; it is never seen again after
        # (the watch of the Node lags behind our own writes).
        await synced(
            await rig.client.sink("nodes"),
            node(1, {**shown, "message": "m", "lastTransitionTime": since}),
        )
        await synced(await rig.client.sink(NAC.plural))
        await wait_until(
            lambda: (
                rig.component.selection_reason != "not selected yet"
                and rig.component.condition.written == rig.controller.condition()
            ),
            "the Local condition written",
        )
        first = rig.client.bodies[-1]["status"]["conditions"][0]
        assert first["status"] == "True" and first["lastTransitionTime"] == since
        n = len(rig.client.bodies)
        rig.controller.keep("tie between a and b")  # True -> False
        await wait_until(lambda: len(rig.client.bodies) == n + 1, "False written")
        await trio.sleep(5)
        rig.controller.assign(None)  # False -> True
        await wait_until(lambda: len(rig.client.bodies) == n + 2, "True written")
        bodies = [b["status"]["conditions"][0] for b in rig.client.bodies[n:]]
        assert bodies[0]["status"] == "False" and bodies[1]["status"] == "True"
        assert bodies[1]["lastTransitionTime"] != since, bodies
