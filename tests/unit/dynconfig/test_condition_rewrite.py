"""The NodeAgentConfigOK condition is written again when the observed Node no longer carries it
(a Node deleted and re-created by its kubelet starts without it). Found by the fault matrix
(tests/faults, "Node deleted and re-created"): the condition stayed lost until the next config
change, since the component only wrote it when the controller's condition changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from tests.support.nodeagentconfig import NAC
from tests.support.wait import wait_until
from tests.unit.accumulator.test_accumulator import synced
from tests.unit.dynconfig.test_component import NODE, running


def node(uid: str, rv: int, *conditions: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": NODE, "uid": uid, "resourceVersion": str(rv)},
        "status": {"conditions": [{"type": "Ready", "status": "True"}, *conditions]},
    }


LOCAL = {"type": "NodeAgentConfigOK", "status": "True", "reason": "Local"}


async def test_a_recreated_node_gets_the_condition_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as rig:
        rig.client.node_uid = "n1"  # what the condition patches return, as the server does
        nodes = await rig.client.sink("nodes")
        await synced(nodes, node("n1", 1))
        await synced(await rig.client.sink(NAC.plural))
        await wait_until(
            lambda: rig.component.condition.written == rig.controller.condition(),
            "the condition written",
        )
        assert (
            rig.component.condition.written is not None
            and rig.component.condition.written.reason == "Local"
        )
        await trio.sleep(5)
        base = rig.component.condition.writes

        # The Node shows it (and the kubelet's heartbeats change the Node): nothing more.
        await synced(nodes, node("n1", 2, LOCAL), rv=2)
        await synced(nodes, node("n1", 3, LOCAL, {"type": "MemoryPressure"}), rv=3)
        await trio.sleep(5)
        assert rig.component.condition.writes == base

        # Deleted: nothing to write to. Re-created without the condition: written again, once.
        await synced(nodes, rv=4)
        await trio.sleep(5)
        assert rig.component.condition.writes == base
        rig.client.node_uid = "n2"
        await synced(nodes, node("n2", 5), rv=5)
        await wait_until(lambda: rig.component.condition.writes == base + 1, "written again")
        await synced(nodes, node("n2", 6, LOCAL), rv=6)
        await trio.sleep(5)
        assert rig.component.condition.writes == base + 1
