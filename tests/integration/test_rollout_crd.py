"""spec.rollout and status.rollout of the shipped NodeAgentConfig CRD on the real kube-apiserver:
good policies are stored as written (the defaults are the code's, not filled in by the server),
bad ones are refused with a 422 naming the field (the CEL rules: canary count XOR percent, waves
strictly increasing ending at 100, maxUnavailable >= 1 or a percent, one failure limit), and a
status the planner wrote goes through the status subresource and decodes back unchanged."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from nodeagent.kube import KubeClient, errors
from nodeagent.rollout.api import Phase, RolloutStatus, decode_spec, decode_status
from nodeagent.rollout.plan import Node, Revision, plan
from tests.support.nodeagentconfig import NAC, install_nodeagentconfig_crd, nodeagentconfig

pytestmark = pytest.mark.releases


@pytest.fixture
async def name(admin_client: KubeClient) -> AsyncIterator[str]:
    await install_nodeagentconfig_crd(admin_client)
    made = f"rollout-{uuid.uuid4().hex[:8]}"
    yield made
    with contextlib.suppress(errors.NotFound):
        await admin_client.delete(NAC, made)


GOOD: list[dict[str, Any]] = [
    {},
    {"canary": {"count": 0}, "waves": [100]},
    {
        "canary": {"percent": 5, "selector": {"matchLabels": {"pool": "canary"}}},
        "waves": [10, 50, 100],
        "maxUnavailable": "10%",
        "pauseSeconds": 300,
        "failurePolicy": {"maxFailurePercent": 2, "revert": True},
    },
    {"maxUnavailable": 3, "failurePolicy": {"maxFailures": 4}, "paused": True, "abort": False},
]


@pytest.mark.parametrize("rollout", GOOD)
async def test_a_good_rollout_is_stored_as_written(
    admin_client: KubeClient, name: str, rollout: dict[str, Any]
) -> None:
    created = msgspec.json.decode(
        await admin_client.create(NAC, nodeagentconfig(name, spec={"rollout": rollout}))
    )
    assert created["spec"]["rollout"] == rollout
    assert msgspec.to_builtins(decode_spec(rollout)) == msgspec.to_builtins(
        decode_spec(created["spec"]["rollout"])
    )


BAD: list[tuple[dict[str, Any], str]] = [
    ({"canary": {"count": 1, "percent": 10}}, "spec.rollout.canary"),
    ({"canary": {"count": -1}}, "spec.rollout.canary.count"),
    ({"canary": {"percent": 101}}, "spec.rollout.canary.percent"),
    ({"waves": [50, 25, 100]}, "spec.rollout.waves"),
    ({"waves": [50, 50, 100]}, "spec.rollout.waves"),
    ({"waves": [25, 50]}, "spec.rollout.waves"),
    ({"waves": []}, "spec.rollout.waves"),
    ({"waves": [0, 100]}, "spec.rollout.waves[0]"),
    ({"maxUnavailable": 0}, "spec.rollout.maxUnavailable"),
    ({"maxUnavailable": "0%"}, "spec.rollout.maxUnavailable"),
    ({"maxUnavailable": "ten"}, "spec.rollout.maxUnavailable"),
    ({"pauseSeconds": -1}, "spec.rollout.pauseSeconds"),
    (
        {"failurePolicy": {"maxFailures": 1, "maxFailurePercent": 5}},
        "spec.rollout.failurePolicy",
    ),
    ({"failurePolicy": {"maxFailures": 0}}, "spec.rollout.failurePolicy.maxFailures"),
    ({"paused": "yes"}, "spec.rollout.paused"),
]


@pytest.mark.parametrize(("rollout", "field"), BAD)
async def test_a_bad_rollout_is_refused_naming_the_field(
    admin_client: KubeClient, name: str, rollout: dict[str, Any], field: str
) -> None:
    with pytest.raises(errors.Invalid) as invalid:
        await admin_client.create(NAC, nodeagentconfig(name, spec={"rollout": rollout}))
    assert invalid.value.code == 422
    fields = [c.field for c in invalid.value.causes]
    assert field in fields, " ".join(f"{c.field}: {c.message}" for c in invalid.value.causes)


async def test_a_planned_status_goes_through_the_status_subresource(
    admin_client: KubeClient, name: str
) -> None:
    created = msgspec.json.decode(
        await admin_client.create(NAC, nodeagentconfig(name, spec={"rollout": {}}))
    )
    meta = created["metadata"]
    spec = decode_spec(created["spec"]["rollout"])
    nodes = [Node(f"node-{i}", False) for i in range(10)]
    planned = plan(spec, Revision(meta["uid"], meta["generation"], "abc123"), nodes, None, 0.0)
    body = {"status": {"rollout": msgspec.to_builtins(planned.status)}}
    await admin_client.patch(NAC, name, body, subresource="status")
    served = msgspec.json.decode(await admin_client.get(NAC, name))
    assert decode_status(served["status"]["rollout"]) == planned.status
    assert planned.status.phase == Phase.PROGRESSING and planned.status.admitted == 1
    # The main resource ignores status: an agent cannot admit itself by writing it there.
    await admin_client.patch(NAC, name, {"status": {"rollout": {"admittedThrough": "all"}}})
    served = msgspec.json.decode(await admin_client.get(NAC, name))
    assert decode_status(served["status"]["rollout"]) == planned.status
    assert isinstance(planned.status, RolloutStatus)
