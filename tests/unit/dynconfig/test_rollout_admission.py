"""The agent's side of a rollout (issue 31, docs/architecture/rollout.md "What an agent does"):
the dynconfig component (real accumulators over fake watches, the real controller, a checkpoint
on disk) with NodeAgentConfig objects carrying ``spec.rollout`` and a hand-written
``status.rollout``, as the rollout controller would write it. A node takes the config only once
admitted (a status-only change admits it, without a restart); a config through its trial
becomes last-known-good only once the rollout is Complete (also across a restart); an abort
returns to the previous config without marking it bad; an object without ``spec.rollout``
behaves as before."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing
from prometheus_client import REGISTRY

from nodeagent.core.errors import ConfigError
from nodeagent.dynconfig.admission import Gate
from nodeagent.dynconfig.state import LOCAL_HASH
from nodeagent.dynconfig.status import condition_patch
from nodeagent.rollout.plan import NodeState
from nodeagent.rollout.rank import rank_key
from nodeagent.rollout_controller.observe import node_state
from nodeagent.service.cli_view import render
from tests.support.fake_dynconfig import build, hasher
from tests.support.nodeagentconfig import NAC
from tests.support.wait import wait_until
from tests.unit.accumulator.helpers import event
from tests.unit.accumulator.test_accumulator import synced
from tests.unit.dynconfig.test_component import NODE, Rig, running
from tests.unit.dynconfig.test_controller import make, reasons, target

OLD = {"interval": 6}
NEW = {"interval": 7}
TRIAL = 600.0  # DynconfigSettings' default trial
UID = "uid-fleet"
_rv = iter(range(10, 10_000))


def nac(
    config: dict[str, Any],
    *,
    rollout: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    generation: int = 1,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeNames": [NODE], "config": config}
    if rollout is not None:
        spec["rollout"] = rollout
    meta = {"name": "fleet", "uid": UID, "resourceVersion": str(next(_rv))}
    body: dict[str, Any] = {"metadata": {**meta, "generation": generation}, "spec": spec}
    if status is not None:
        body["status"] = {"rollout": status}
    return body


def rollout_status(
    config: dict[str, Any], through: str, phase: str = "Progressing", generation: int = 1
) -> dict[str, Any]:
    return {
        "configHash": hasher(config),
        "generation": generation,
        "observedGeneration": generation,
        "phase": phase,
        "admittedThrough": through,
        "admitted": 1,
        "wave": 0,
        "counts": {"targeted": 4},
    }


# A threshold admitting the canary's selector only (keys "0-..."): this node, unlabelled, sorts
# after it.
CANARY_ONLY = "0-" + "f" * 64


async def show(rig: Rig, body: dict[str, Any]) -> None:
    """The object changed (a watch event: a status-only change included)."""
    sink = await rig.client.sink(NAC.plural)
    await sink.feed(event("MODIFIED", body))


@asynccontextmanager
async def started(
    tmp_path: Path, first: dict[str, Any], labels: dict[str, str] | None = None
) -> AsyncIterator[Rig]:
    async with running(tmp_path) as rig:
        meta = {"name": NODE, "uid": "n", "resourceVersion": "1", "labels": labels or {}}
        node = {"metadata": meta}
        await synced(await rig.client.sink("nodes"), node)
        await synced(await rig.client.sink(NAC.plural), first)
        yield rig


def reason(rig: Rig) -> str:
    return rig.controller.condition().reason


def waiting_gauge(reason_: str) -> float | None:
    return REGISTRY.get_sample_value("nodeagent_config_rollout_waiting", {"reason": reason_})


async def test_without_spec_rollout_a_config_is_taken_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with started(tmp_path, nac(NEW)) as rig:
        await wait_until(lambda: reason(rig) == "OnTrial", "applied at once")
        assert rig.hub.current["interval"] == 7
        await trio.sleep(TRIAL + 10)
        await wait_until(lambda: reason(rig) == "Active", "through the trial")
        lkg = rig.controller.state.lkg
        assert lkg is not None and lkg.hash == hasher(NEW)  # last-known-good at once


async def test_not_admitted_keeps_what_runs_then_a_status_change_admits_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with started(tmp_path, nac(NEW, rollout={})) as rig:
        # No status: no controller has seen it, nobody takes it.
        await wait_until(lambda: reason(rig) == "WaitingForRolloutController", "waiting")
        condition = rig.controller.condition()
        assert condition.status is True
        assert condition.message.startswith(f"NodeAgentConfig fleet (hash {hasher(NEW)}) ")
        assert "running the local config" in condition.message
        assert rig.controller.active.hash == LOCAL_HASH and rig.hub.current["interval"] == 5
        assert waiting_gauge("WaitingForRolloutController") == 1
        view = rig.component.view()
        assert view["rollout"]["waiting"] and view["rollout"]["reason"] == condition.reason
        shown = render({"dynconfig": view}, [])
        why = view["rollout"]["message"]
        assert f"waiting for the rollout: WaitingForRolloutController: {why}" in shown

        await wait_until(
            lambda: rig.component.condition.written == condition, "the condition written"
        )

        # The controller starts the rollout: the canary only (this node is not in it).
        await show(rig, nac(NEW, rollout={}, status=rollout_status(NEW, CANARY_ONLY)))
        await wait_until(lambda: reason(rig) == "WaitingForWave", "its wave not yet")
        assert rig.controller.condition().message.startswith(
            f"NodeAgentConfig fleet (hash {hasher(NEW)}) waits for its wave"
        )
        assert rig.hub.current["interval"] == 5
        assert waiting_gauge("WaitingForRolloutController") is None
        assert waiting_gauge("WaitingForWave") == 1

        # Paused, then halted before this node: still waiting, the reason says why.
        await show(rig, nac(NEW, rollout={}, status=rollout_status(NEW, CANARY_ONLY, "Paused")))
        await wait_until(lambda: reason(rig) == "RolloutPaused", "paused")
        await show(rig, nac(NEW, rollout={}, status=rollout_status(NEW, CANARY_ONLY, "Halted")))
        await wait_until(lambda: reason(rig) == "RolloutHalted", "halted")
        assert rig.controller.active.hash == LOCAL_HASH and rig.hub.current["interval"] == 5

        # The threshold moves past this node: a status-only change, taken without a restart.
        key = rank_key(NODE, UID, 1, False)
        await show(rig, nac(NEW, rollout={}, status=rollout_status(NEW, key)))
        await wait_until(lambda: reason(rig) == "OnTrial", "admitted: on trial")
        assert rig.hub.current["interval"] == 7
        assert waiting_gauge("WaitingForWave") is None
        assert not rig.component.view()["rollout"]["waiting"]


async def test_through_its_trial_it_is_last_known_good_only_once_complete(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with started(tmp_path, nac(OLD)) as rig:
        await trio.sleep(TRIAL + 10)
        await wait_until(lambda: reason(rig) == "Active", "the old config last-known-good")
        await show(rig, nac(NEW, rollout={}, status=rollout_status(NEW, "all"), generation=2))
        await wait_until(lambda: reason(rig) == "OnTrial", "admitted")
        await trio.sleep(TRIAL + 10)
        await wait_until(lambda: rig.controller.state.trial is None, "through the trial")
        condition = rig.controller.condition()
        assert condition.reason == "Active" and rig.hub.current["interval"] == 7
        assert "active and last-known-good" not in condition.message
        assert condition.message.startswith(f"NodeAgentConfig fleet (hash {hasher(NEW)}) active")
        lkg = rig.controller.state.lkg
        assert lkg is not None and lkg.hash == hasher(OLD)  # the previous one stays

        # Complete (after the trial ended): promoted then.
        await show(
            rig,
            nac(NEW, rollout={}, status=rollout_status(NEW, "all", "Complete"), generation=2),
        )
        await wait_until(
            lambda: (g := rig.controller.state.lkg) is not None and g.hash == hasher(NEW),
            "promoted once Complete",
        )
        assert rig.controller.condition().message.endswith("active and last-known-good")
        assert rig.controller.state.passed is None


async def test_complete_during_the_trial_promotes_at_its_end(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with started(tmp_path, nac(NEW, rollout={})) as rig:
        await wait_until(lambda: reason(rig) == "WaitingForRolloutController", "waiting")
        await show(rig, nac(NEW, rollout={}, status=rollout_status(NEW, "all")))
        await wait_until(lambda: reason(rig) == "OnTrial", "admitted")
        await show(rig, nac(NEW, rollout={}, status=rollout_status(NEW, "all", "Complete")))
        await trio.sleep(TRIAL + 10)
        await wait_until(lambda: reason(rig) == "Active", "through the trial")
        lkg = rig.controller.state.lkg
        assert lkg is not None and lkg.hash == hasher(NEW)


async def test_a_config_held_short_of_last_known_good_survives_a_restart(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    status = rollout_status(NEW, "all")
    async with started(tmp_path, nac(OLD)) as rig:
        await trio.sleep(TRIAL + 10)
        await show(rig, nac(NEW, rollout={}, status=status, generation=2))
        await trio.sleep(TRIAL + 10)
        await wait_until(lambda: rig.controller.state.passed is not None, "through the trial")
    # A restart (the checkpoint kept): the same config runs, not on trial again, and the
    # previous one is still last-known-good.
    async with started(tmp_path, nac(NEW, rollout={}, status=status, generation=2)) as rig:
        assert rig.controller.active.hash == hasher(NEW) and rig.hub.current["interval"] == 7
        await wait_until(lambda: reason(rig) == "Active", "selected: active")
        assert rig.controller.state.trial is None
        assert all(config["interval"] != 6 for config, _ in rig.hub.proposals)
        lkg = rig.controller.state.lkg
        assert lkg is not None and lkg.hash == hasher(OLD)
        complete = rollout_status(NEW, "all", "Complete")
        await show(rig, nac(NEW, rollout={}, status=complete, generation=2))
        await wait_until(
            lambda: (g := rig.controller.state.lkg) is not None and g.hash == hasher(NEW),
            "promoted once Complete",
        )


async def test_abort_returns_to_the_previous_config_without_marking_it_bad(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with started(tmp_path, nac(OLD)) as rig:
        await trio.sleep(TRIAL + 10)
        await show(rig, nac(NEW, rollout={}, status=rollout_status(NEW, "all"), generation=2))
        await wait_until(lambda: reason(rig) == "OnTrial", "admitted")

        aborted = rollout_status(NEW, "none", "Aborted")
        await show(rig, nac(NEW, rollout={"abort": True}, status=aborted, generation=3))
        await wait_until(lambda: reason(rig) == "RolloutAborted", "aborted")
        condition = rig.controller.condition()
        assert condition.status is True
        assert condition.message.startswith(f"NodeAgentConfig fleet (hash {hasher(NEW)}) ")
        assert f"running NodeAgentConfig fleet (hash {hasher(OLD)})" in condition.message
        assert rig.controller.active.hash == hasher(OLD) and rig.hub.current["interval"] == 6
        assert rig.controller.state.bad == [] and rig.controller.state.trial is None
        assert waiting_gauge("RolloutAborted") == 1

        # The abort lifted: a new rollout admits it again, it is taken again.
        lifted = rollout_status(NEW, "all")
        await show(rig, nac(NEW, rollout={"abort": False}, status=lifted, generation=4))
        await wait_until(lambda: reason(rig) == "OnTrial", "taken again")
        assert rig.hub.current["interval"] == 7


async def test_a_node_matching_the_canary_selector_is_in_the_canary(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rollout = {"canary": {"selector": {"matchLabels": {"canary": "yes"}}}}
    body = nac(NEW, rollout=rollout, status=rollout_status(NEW, CANARY_ONLY))
    async with started(tmp_path, body, labels={"canary": "no"}) as rig:
        await wait_until(lambda: reason(rig) == "WaitingForWave", "not in the canary")
        assert rig.hub.current["interval"] == 5
        # Labelled into the canary (its own labels, the selector's semantics): admitted.
        meta = {"name": NODE, "uid": "n", "resourceVersion": "2", "labels": {"canary": "yes"}}
        await (await rig.client.sink("nodes")).feed(event("MODIFIED", {"metadata": meta}))
        await wait_until(lambda: reason(rig) == "OnTrial", "the canary is admitted")
        assert rig.hub.current["interval"] == 7


async def test_applying_the_last_known_good_again_is_taken_at_once_whatever_the_rollout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The operator's fast undo: spec.config set back to the config the node has as
    last-known-good is taken at once (no wave, no trial), before any controller has seen it
    and whatever status.rollout says of it, so that the nodes running the bad config do not
    keep it until the revert's canary and waves pass."""
    async with started(tmp_path, nac(OLD)) as rig:
        await trio.sleep(TRIAL + 10)
        await wait_until(lambda: reason(rig) == "Active", "the old config last-known-good")
        await show(rig, nac(NEW, rollout={}, status=rollout_status(NEW, "all"), generation=2))
        await trio.sleep(TRIAL + 10)
        await wait_until(lambda: rig.controller.state.passed is not None, "through its trial")
        assert rig.hub.current["interval"] == 7

        # The revert, the controller not yet there: status.rollout still names NEW.
        await show(rig, nac(OLD, rollout={}, status=rollout_status(NEW, "all"), generation=3))
        await wait_until(lambda: rig.controller.active.hash == hasher(OLD), "back at once")
        condition = rig.controller.condition()
        assert condition.reason == "Active" and condition.status is True
        assert (
            condition.message
            == f"NodeAgentConfig fleet (hash {hasher(OLD)}) active and last-known-good"
        )
        assert rig.hub.current["interval"] == 6
        state = rig.controller.state
        assert state.trial is None and state.passed is None and state.bad == []
        lkg = state.lkg
        assert lkg is not None and lkg.hash == hasher(OLD)
        assert waiting_gauge("WaitingForRolloutController") is None
        # The rollout controller reads this node as Active for the reverted config (the
        # revert's rollout then completes without waiting for it).
        (served,) = condition_patch(condition, 0.0)["status"]["conditions"]
        assert node_state(served, "fleet", hasher(OLD)) == NodeState.ACTIVE

        # The controller then plans the revert as a rollout of its own (the canary only): the
        # node, already running it, stays put.
        revert = rollout_status(OLD, CANARY_ONLY, generation=3)
        await show(rig, nac(OLD, rollout={}, status=revert, generation=3))
        await wait_until(
            lambda: (g := rig.controller._gate) is not None and g.reason == "WaitingForWave",
            "the revert's own rollout seen",
        )
        assert reason(rig) == "Active" and rig.controller.active.hash == hasher(OLD)


async def test_the_last_known_good_is_taken_at_once_also_while_the_rollout_waits_for_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The revert arrives while the bad config is still on trial, and the controller already
    planned the revert's rollout with this node outside its canary: taken at once all the same."""
    async with started(tmp_path, nac(OLD)) as rig:
        await trio.sleep(TRIAL + 10)
        await show(rig, nac(NEW, rollout={}, status=rollout_status(NEW, "all"), generation=2))
        await wait_until(lambda: reason(rig) == "OnTrial", "admitted")
        revert = rollout_status(OLD, CANARY_ONLY, generation=3)
        await show(rig, nac(OLD, rollout={}, status=revert, generation=3))
        await wait_until(lambda: rig.controller.active.hash == hasher(OLD), "back at once")
        assert reason(rig) == "Active" and rig.controller.state.trial is None
        assert rig.hub.current["interval"] == 6 and rig.controller.state.bad == []


def abort_failures() -> float:
    return REGISTRY.get_sample_value("nodeagent_config_rollout_abort_failures_total") or 0.0


async def test_an_abort_whose_return_fails_is_reported_and_what_runs_keeps_running(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The last-known-good no longer builds (a config-file reload since made it invalid): the
    abort cannot return to it. Reported where an operator looks (the condition False with the
    error, a Warning Event, a counter), once while it fails; what runs keeps running; the
    abort goes through once the last-known-good builds again."""
    rig = make(tmp_path)
    c = rig.controller
    c.assign(target(OLD))
    await trio.sleep(TRIAL + 10)
    c.tick(None)
    new = hasher(NEW)
    c.assign(target(NEW, 2), gate=Gate(new, True, "", "", False))
    assert rig.hub.current["interval"] == 7 and c.state.trial is not None

    def broken(remote: Mapping[str, Any] | None) -> dict[str, Any]:
        if (remote or {}).get("interval") == 6:
            raise ConfigError("interval", 6, "above the reloaded file's maximum")
        return build(remote)

    c.build = broken
    before = abort_failures()
    subject = f"NodeAgentConfig fleet (hash {new})"
    aborted = Gate(new, False, "RolloutAborted", f"{subject} rollout aborted", False)
    c.assign(target(NEW, 2), gate=aborted)
    condition = c.condition()
    assert (condition.status, condition.reason) == (False, "RolloutAbortFailed")
    assert condition.message.startswith(f"{subject} rollout aborted")
    assert "above the reloaded file's maximum" in condition.message
    assert f"NodeAgentConfig fleet (hash {hasher(OLD)})" in condition.message
    assert rig.hub.current["interval"] == 7 and c.active.hash == new  # keeps running
    assert c.state.bad == []
    (event,) = [e for e in rig.events if e.reason == "RolloutAbortFailed"]
    assert event.type == "Warning" and event.message == condition.message
    assert abort_failures() == before + 1

    # A relist: tried again, failing the same way: said once.
    c.assign(target(NEW, 2), gate=aborted)
    assert c.condition() == condition
    assert reasons(rig).count("RolloutAbortFailed") == 1 and abort_failures() == before + 1

    # The last-known-good builds again: the abort goes through.
    c.build = build
    c.assign(target(NEW, 2), gate=aborted)
    assert c.condition().reason == "RolloutAborted" and c.condition().status is True
    assert rig.hub.current["interval"] == 6
