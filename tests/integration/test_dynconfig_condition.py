"""The controller's NodeAgentConfigOK condition is written with the node's own credentials: a
strategic-merge patch of nodes/<name>/status (the Node authorizer lets a node patch its own
status, not another node's), merged by type so the kubelet's conditions stay."""

from __future__ import annotations

import contextlib
import json

import pytest

from nodeagent.dynconfig.status import CONDITION_TYPE, Condition, condition_patch
from nodeagent.kube import NODES, KubeClient, errors

pytestmark = [pytest.mark.integration, pytest.mark.releases]


async def _ensure_node(admin: KubeClient, name: str) -> None:
    with contextlib.suppress(errors.AlreadyExists):
        await admin.create(NODES, {"metadata": {"name": name}})


def _conditions(raw: bytes) -> dict[str, dict[str, str]]:
    status = json.loads(raw).get("status", {})
    return {c["type"]: c for c in status.get("conditions", [])}


async def test_condition_written_with_node_credentials(
    admin_client: KubeClient, node_client: KubeClient
) -> None:
    for node in ("node-a", "node-b"):
        await _ensure_node(admin_client, node)
    # Another owner's condition on the same Node must survive the agent's patches.
    kubelet = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}
    await admin_client.patch(
        NODES,
        "node-a",
        {"status": {"conditions": [kubelet]}},
        type="strategic",
        subresource="status",
    )
    rolled_back = Condition(False, "RolledBack", "NodeAgentConfig fleet (hash abc123) rolled back")
    await node_client.patch(
        NODES,
        "node-a",
        condition_patch(rolled_back, 1_700_000_000.0),
        type="strategic",
        subresource="status",
    )
    active = Condition(True, "Active", "NodeAgentConfig fleet (hash def456) active")
    raw = await node_client.patch(
        NODES,
        "node-a",
        condition_patch(active, 1_700_000_100.0),
        type="strategic",
        subresource="status",
    )
    conditions = _conditions(raw)
    ours = conditions[CONDITION_TYPE]
    assert (ours["status"], ours["reason"]) == ("True", "Active")
    assert "def456" in ours["message"]
    assert conditions["Ready"]["reason"] == "KubeletReady"
    with pytest.raises(errors.Forbidden):
        await node_client.patch(
            NODES,
            "node-b",
            condition_patch(active, 1_700_000_100.0),
            type="strategic",
            subresource="status",
        )
