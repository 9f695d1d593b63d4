"""The shipped NodeAgentConfig CRD (deploy/crds/) on the real kube-apiserver: it installs and is
established, stores a valid object (defaults filled), refuses schema-invalid ones with a 422 naming
the field, closes spec.config to unknown fields, and the objects it serves decode and select as the
agent expects."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from nodeagent.dynconfig.source import NodeAgentConfig, decode_object, select_target
from nodeagent.kube import KubeClient, errors
from tests.support.nodeagentconfig import NAC, install_nodeagentconfig_crd, nodeagentconfig

pytestmark = pytest.mark.releases

CONFIG: dict[str, Any] = {
    "agent": {"log_level": "debug"},
    "plugins": {"scan_interval": 2, "probe_interval": 5.5},
    "resources": {"min_sync_interval": 0.5, "disconnect_grace": 10},
    "reporter": {"cnr_min_write_interval": 2, "grace": 60},
}


@pytest.fixture
async def names(admin_client: KubeClient) -> AsyncIterator[list[str]]:
    """Names of this test's own objects (a random prefix), all deleted afterwards."""
    await install_nodeagentconfig_crd(admin_client)
    prefix = f"nac-{uuid.uuid4().hex[:8]}"
    made = [f"{prefix}-{i}" for i in range(5)]
    yield made
    for name in made:
        with contextlib.suppress(errors.NotFound):
            await admin_client.delete(NAC, name)


def _causes(exc: errors.ApiError) -> str:
    return " ".join(f"{c.field}: {c.message}" for c in exc.causes) or exc.message


async def test_crd_installs_and_is_idempotent(admin_client: KubeClient) -> None:
    await install_nodeagentconfig_crd(admin_client)
    await install_nodeagentconfig_crd(admin_client)
    assert await admin_client.discover(NAC.api_version, NAC.kind) == NAC


async def test_a_valid_config_is_stored_with_defaults(
    admin_client: KubeClient, names: list[str]
) -> None:
    spec = {"nodeSelector": {"matchLabels": {"pool": "web"}}, "config": CONFIG}
    created = msgspec.json.decode(
        await admin_client.create(NAC, nodeagentconfig(names[0], spec=spec))
    )
    assert created["spec"] == {**spec, "priority": 0, "paused": False}
    view = decode_object(created)
    assert (view.name, view.spec.config, view.spec.priority) == (names[0], CONFIG, 0)
    assert view.metadata.uid and view.metadata.generation == 1 and view.metadata.resource_version


async def test_served_objects_select_by_name_then_priority_then_global_and_tie(
    admin_client: KubeClient, names: list[str]
) -> None:
    specs: list[dict[str, Any]] = [
        {"nodeSelector": {"matchLabels": {"pool": "web"}}, "priority": 1},
        {
            "nodeSelector": {
                "matchExpressions": [{"key": "pool", "operator": "In", "values": ["web"]}]
            },
            "priority": 7,
        },
        {},
        {"nodeNames": ["node-x"]},
    ]
    for name, spec in zip(names[:4], specs, strict=True):
        await admin_client.create(NAC, nodeagentconfig(name, spec=spec))
    web = {"pool": "web"}
    served = await _served(admin_client, names)
    assert _target(served, "node-x", web) == names[3]
    assert _target(served, "node-y", web) == names[1]
    assert _target(served, "node-y", {}) == names[2]
    # A second global object ties with the first: no target, both named; pausing one ends it.
    await admin_client.create(NAC, nodeagentconfig(names[4], spec={}))
    tie = select_target(await _served(admin_client, names), "node-y", {})
    assert (tie.target, tie.tie) == (None, sorted([names[2], names[4]]))
    await admin_client.patch(NAC, names[4], {"spec": {"paused": True}})
    assert _target(await _served(admin_client, names), "node-y", {}) == names[2]


async def _served(client: KubeClient, names: list[str]) -> list[NodeAgentConfig]:
    listed = await client.list(NAC, into=dict)
    return [decode_object(item) for item in listed.items if item["metadata"]["name"] in names]


def _target(objects: list[NodeAgentConfig], node: str, labels: dict[str, str]) -> str | None:
    chosen = select_target(objects, node, labels).target
    return chosen.name if chosen else None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"config": {"plugins": {"scan_interval": "fast"}}}, "spec.config.plugins.scan_interval"),
        ({"config": {"plugins": {"scan_interval": 0}}}, "spec.config.plugins.scan_interval"),
        ({"config": {"reporter": {"grace": -1}}}, "spec.config.reporter.grace"),
        ({"config": {"agent": {"log_level": "loud"}}}, "spec.config.agent.log_level"),
        ({"config": {"plugins": {"probe_interval": 0}}}, "spec.config.plugins.probe_interval"),
        ({"config": {"resources": "fast"}}, "spec.config.resources"),
        ({"priority": "high"}, "spec.priority"),
        ({"paused": "yes"}, "spec.paused"),
        ({"nodeNames": "node-a"}, "spec.nodeNames"),
        ({"nodeNames": ["a"], "nodeSelector": {"matchLabels": {"x": "y"}}}, "spec"),
        (
            {"nodeSelector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}},
            "spec.nodeSelector.matchExpressions[0].operator",
        ),
        (
            {"nodeSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}},
            "spec.nodeSelector.matchExpressions[0]",
        ),
    ],
)
async def test_a_schema_invalid_config_is_refused_naming_the_field(
    admin_client: KubeClient, names: list[str], spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(errors.Invalid) as invalid:
        await admin_client.create(NAC, nodeagentconfig(names[0], spec=spec))
    assert invalid.value.code == 422
    assert field in [c.field for c in invalid.value.causes], _causes(invalid.value)


async def test_an_unknown_config_field_is_refused_strictly_and_pruned_otherwise(
    admin_client: KubeClient, names: list[str]
) -> None:
    body = nodeagentconfig(names[0], spec={"config": {"agent": {"node_name": "other"}}})
    with pytest.raises(errors.ApiError) as strict:
        await admin_client.request(
            "POST",
            NAC.path(),
            params={"fieldValidation": "Strict"},
            body=msgspec.json.encode(body),
            content_type="application/json",
            verb="create",
            resource=NAC.plural,
            idempotent=False,
        )
    assert "node_name" in strict.value.message, strict.value.message
    created = msgspec.json.decode(await admin_client.create(NAC, body))
    assert created["spec"]["config"] == {"agent": {}}
