"""Holes of the dynamic-config state machine (issue 21, section 2), each reproduced with the rigs
of test_component.py (the real accumulators and controller over in-memory watches) or
test_controller.py (the controller alone):

- a change arriving while the other query relists was lost (the relist ended with the same
  objects, so neither input changed and selection never ran again);
- a tie (or an unreadable list) clearing to the target already assigned left the Node's
  condition at False/NoUniqueTarget;
- a boot past the checkpoint grace kept a last-known-good it did not run, so the same config
  assigned again went on trial with itself as last-known-good (a "rollback" to itself);
- an object that fails to decode while it is this node's target silently dropped the node to
  the local config; it keeps what runs and says so in the condition.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from nodeagent.dynconfig.state import LOCAL_HASH, Known
from tests.support.fake_dynconfig import Report, Wall, hasher
from tests.support.nodeagentconfig import NAC
from tests.support.wait import wait_until
from tests.unit.accumulator.helpers import page
from tests.unit.accumulator.test_accumulator import synced
from tests.unit.dynconfig.test_component import NODE, nac, running
from tests.unit.dynconfig.test_controller import make, target


def edited(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    """``obj`` as the server serves it after an edit (a new resourceVersion)."""
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


def node(rv: int, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": NODE, "uid": "n", "resourceVersion": str(rv), "labels": labels}}


def by_pool(name: str, pool: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1", "generation": 1},
        "spec": {"nodeSelector": {"matchLabels": {"pool": pool}}, "config": config},
    }


CONFIGS = (by_pool("a", "a", {"interval": 7}), by_pool("b", "b", {"interval": 8}))


async def test_labels_changed_while_the_configs_relist_are_not_lost(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as rig:
        nodes = await rig.client.sink("nodes")
        configs = await rig.client.sink(NAC.plural)
        await synced(nodes, node(1, pool="a"))
        await synced(configs, *CONFIGS)
        await wait_until(lambda: rig.controller.active.name == "a", "a applied")

        await configs.begin_list()  # a 410: the configs relist
        await synced(nodes, node(2, pool="b"), rv=2)  # meanwhile the node moves to pool b
        await trio.sleep(5)
        await configs.list_page(page(list(CONFIGS), 3))
        await configs.end_list("3")  # the same objects: no change in either input
        await wait_until(lambda: rig.controller.active.name == "b", "b applied after the relist")
        assert rig.hub.current["interval"] == 8
        await wait_until(lambda: rig.controller.condition().reason == "OnTrial", "the condition")


async def test_config_edited_while_the_node_relists_is_not_lost(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as rig:
        nodes = await rig.client.sink("nodes")
        configs = await rig.client.sink(NAC.plural)
        await synced(nodes, node(1, pool="a"))
        await synced(configs, nac("fleet", {"interval": 7}))
        await wait_until(lambda: rig.controller.active.name == "fleet", "fleet applied")

        await nodes.begin_list()
        await synced(configs, edited(nac("fleet", {"interval": 9}, generation=2), 2), rv=2)
        await trio.sleep(5)
        await nodes.list_page(page([node(1, pool="a")], 3))
        await nodes.end_list("3")
        await wait_until(
            lambda: rig.hub.current["interval"] == 9, "the edit applied after the relist"
        )


async def test_a_tie_clearing_to_the_assigned_target_rewrites_the_condition(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as rig:
        nodes = await rig.client.sink("nodes")
        configs = await rig.client.sink(NAC.plural)
        await synced(nodes, node(1))
        await synced(configs, nac("fleet", {"interval": 7}))
        await wait_until(lambda: rig.controller.active.name == "fleet", "fleet applied")
        await trio.sleep(601)  # promoted
        await wait_until(
            lambda: rig.component.condition.written == rig.controller.condition(), "Active"
        )
        assert rig.controller.condition().reason == "Active"

        await synced(configs, nac("fleet", {"interval": 7}), nac("other", {"interval": 8}), rv=2)
        await wait_until(
            lambda: (
                (rig.component.condition.written or rig.controller.condition()).reason
                == "NoUniqueTarget"
            ),
            "the tie written",
        )
        await synced(configs, nac("fleet", {"interval": 7}), rv=3)  # the tie clears
        await wait_until(
            lambda: (
                rig.component.condition.written is not None
                and rig.component.condition.written.reason == "Active"
            ),
            "the condition written back to Active",
        )


async def test_an_undecodable_target_keeps_what_runs_and_says_so(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as rig:
        nodes = await rig.client.sink("nodes")
        configs = await rig.client.sink(NAC.plural)
        await synced(nodes, node(1))
        await synced(configs, nac("fleet", {"interval": 7}), by_pool("spare", "x", {}))
        await wait_until(lambda: rig.controller.active.name == "fleet", "fleet applied")
        await trio.sleep(601)
        lkg = rig.controller.state.lkg

        broken = edited(nac("fleet", {"interval": 7}, generation=2), 2)
        broken["spec"]["priority"] = "high"  # a looser CRD let it through
        await synced(configs, broken, by_pool("spare", "x", {}), rv=2)
        await wait_until(lambda: rig.controller.condition().reason == "TargetUnreadable", "said")
        condition = rig.controller.condition()
        assert not condition.status
        assert "fleet" in condition.message and "priority" in condition.message
        assert rig.controller.active.name == "fleet" and rig.hub.current["interval"] == 7
        assert rig.controller.state.lkg == lkg
        await wait_until(
            lambda: rig.component.condition.written == condition, "written to the Node"
        )

        # Fixed: selected again, the condition back to Active (same config).
        await synced(configs, edited(nac("fleet", {"interval": 7}, generation=3), 3), rv=3)
        await wait_until(lambda: rig.controller.condition().reason == "Active", "readable again")
        assert rig.controller.active.name == "fleet"


async def test_a_boot_past_the_grace_keeps_no_last_known_good_it_did_not_run(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    first = make(tmp_path, wall, checkpoint_grace=3600.0)
    first.controller.assign(target({"interval": 7}))
    await trio.sleep(601)
    first.controller.tick(None)
    a = hasher({"interval": 7})
    assert first.controller.state.lkg is not None and first.controller.state.lkg.hash == a

    wall.now += 7200  # down for longer than the grace
    second = make(tmp_path, wall, checkpoint_grace=3600.0)
    c = second.controller
    assert c.boot_source == "defaults" and c.active.hash == LOCAL_HASH
    assert c.state.lkg is None or c.state.lkg.hash == LOCAL_HASH
    c.assign(target({"interval": 7}))  # the apiserver assigns A again: on trial
    assert c.active.hash == a and c.state.trial is not None
    assert c.state.lkg is not None and c.state.lkg.hash == LOCAL_HASH
    c.tick("component publisher not ready")
    # A real rollback, to what ran before: not "rolled back to A, running A".
    assert c.active.hash == LOCAL_HASH and second.hub.current["interval"] == 5
    assert "running the local config" in c.condition().message


async def test_a_last_known_good_equal_to_the_target_is_never_a_rollback_target(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A target equal to the last-known-good (an operator reverting a config on trial, or an
    older agent's checkpoint) is applied as the last-known-good it is: no trial with itself as
    the rollback target."""
    rig = make(tmp_path)
    c = rig.controller
    c.assign(target({"interval": 7}), [Report("publisher")])
    await trio.sleep(601)
    c.tick(None)
    a = hasher({"interval": 7})
    c.assign(target({"interval": 8}, generation=2))  # B on trial, last-known-good A
    assert c.state.trial is not None and c.state.trial.hash == hasher({"interval": 8})
    c.assign(target({"interval": 7}, generation=3))  # reverted to A during B's trial
    assert c.active.hash == a and rig.hub.current["interval"] == 7
    assert c.state.trial is None and c.state.lkg == Known(
        hash=a, name="fleet", config={"interval": 7}
    )
    assert c.condition().reason == "Active"
    c.tick("component publisher not ready")  # no trial: nothing to roll back
    assert c.active.hash == a and c.state.bad == []

    # An older agent's checkpoint: last-known-good A while the local config runs.
    c.assign(None)
    c.state.lkg = Known(hash=a, name="fleet", config={"interval": 7})
    c.assign(target({"interval": 7}, generation=4))
    assert c.active.hash == a and c.state.trial is None
    assert c.condition().reason == "Active"


# ---- found by the model-based test (test_model.py) ------------------------------------------


async def test_a_trial_whose_object_was_then_edited_invalid_resumes_after_a_clean_stop(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """An edit rejected as invalid keeps the trial running; the checkpoint's assignment is then
    the invalid edit, so the clean stop records the config on trial itself."""
    wall = Wall()
    first = make(tmp_path, wall)
    first.controller.assign(target({"interval": 6}))
    first.controller.assign(target({"bogus": 1}, generation=2))  # rejected: 6 stays on trial
    assert first.controller.state.trial is not None
    first.controller.stop_clean()
    second = make(tmp_path, wall)
    assert second.controller.boot_source == "resumed", second.controller.boot_reason
    assert second.hub.current["interval"] == 6
    assert second.controller.active.hash == hasher({"interval": 6})


async def test_a_tie_outlives_the_end_of_a_trial(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    rig = make(tmp_path)
    c = rig.controller
    c.assign(target({"interval": 7}))
    c.unreadable("fleet", "spec.priority: expected int")
    await trio.sleep(601)
    c.tick(None)  # promoted meanwhile
    assert c.state.lkg is not None and c.state.lkg.hash == hasher({"interval": 7})
    assert c.condition().reason == "TargetUnreadable"
    c.keep("tie selector matching this node at priority 0: a, b")
    assert c.condition().reason == "NoUniqueTarget"
    c.assign(target({"interval": 7}))  # the watch selects again
    assert c.condition().reason == "Active"
