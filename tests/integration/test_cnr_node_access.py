"""deploy/kubernetes/cnr-node-access.yaml on the real kube-apiserver: with the node's own
credentials (system:node:<n>, group system:nodes) the agent writes the CustomNodeResource named
<n> every way it may (create, merge patch, server-side apply, update; object and status), is
refused on another node's with the admission policy's message, and nobody else is restricted."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.kube import KubeClient, errors
from tests.integration.conftest import client_for
from tests.support.apiserver import ApiServer
from tests.support.crds import (
    CNR,
    CNR_POLICY_NAME,
    PROBE_INTERVAL,
    WAIT_SECONDS,
    cnr,
    install_cnr_crd,
    install_cnr_node_access,
)
from tests.support.resources import CLUSTERROLEBINDINGS, CLUSTERROLES

pytestmark = pytest.mark.releases

MANAGER = "nodeagent"
STATUS = {"topologyPolicy": "None", "resources": {"allocatable": {"cpu": "2"}}}


@pytest.fixture
async def node_b_client(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with client_for(apiserver, "node-b") as client:
        yield client


@pytest.fixture
async def access(admin_client: KubeClient, node_client: KubeClient) -> AsyncIterator[KubeClient]:
    """The CRD and the node access manifest in force; yields the admin client. The CNRs the test
    made are deleted afterwards (the policy and RBAC stay: they concern only node users' CNRs)."""
    await install_cnr_crd(admin_client)
    await install_cnr_node_access(admin_client, node_client, "node-a")
    yield admin_client
    for name in ("node-a", "node-b", "not-a-node"):
        with contextlib.suppress(errors.NotFound):
            await admin_client.delete(CNR, name)


def _decode(data: bytes) -> Any:
    return msgspec.json.decode(data)


def _writes(client: KubeClient, name: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Every way the agent may write CNR ``name`` once it exists, by label."""

    async def update() -> Any:
        current = _decode(await client.get(CNR, name))
        current["metadata"].setdefault("labels", {})["put"] = "yes"
        return await client.update(CNR, current)

    return {
        "merge patch": lambda: client.patch(CNR, name, {"metadata": {"labels": {"merge": "1"}}}),
        "merge patch status": lambda: client.patch(
            CNR, name, {"status": STATUS}, subresource="status"
        ),
        "apply": lambda: client.apply(
            CNR,
            cnr(name, metadata={"labels": {"ssa": "1"}}),
            field_manager=MANAGER,
        ),
        "apply status": lambda: client.apply(
            CNR, cnr(name, status=STATUS), field_manager=MANAGER, subresource="status"
        ),
        "update": update,
    }


def _assert_refused(exc: errors.ApiError, user: str, target: str) -> None:
    assert exc.code == 403, exc
    assert CNR_POLICY_NAME in exc.message
    own = user.removeprefix("system:node:")
    assert f"{user} may write only the CustomNodeResource named {own}, not {target}" in (
        exc.message
    )


async def test_the_harness_serves_validating_admission_policy_v1(admin_client: KubeClient) -> None:
    vap = await admin_client.discover(
        "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"
    )
    assert vap.plural == "validatingadmissionpolicies"
    await admin_client.discover(
        "admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"
    )


async def test_a_node_writes_its_own_cnr(access: KubeClient, node_client: KubeClient) -> None:
    created = _decode(await node_client.create(CNR, cnr("node-a", spec={"taints": []})))
    assert created["metadata"]["name"] == "node-a"
    for how, write in _writes(node_client, "node-a").items():
        try:
            await write()
        except errors.ApiError as exc:
            pytest.fail(f"{how} of its own CNR refused: {exc}")
    stored = _decode(await access.get(CNR, "node-a"))
    assert stored["metadata"]["labels"] == {"merge": "1", "ssa": "1", "put": "yes"}
    assert stored["status"] == STATUS


async def test_a_node_creates_its_own_cnr_by_server_side_apply(
    access: KubeClient, node_client: KubeClient
) -> None:
    await node_client.apply(CNR, cnr("node-a", spec={"taints": []}), field_manager=MANAGER)
    assert _decode(await access.get(CNR, "node-a"))["spec"] == {"taints": []}


async def test_a_node_is_refused_on_another_nodes_cnr(
    access: KubeClient, node_client: KubeClient, node_b_client: KubeClient
) -> None:
    with pytest.raises(errors.Forbidden) as refused:
        await node_client.create(CNR, cnr("node-b"))
    _assert_refused(refused.value, "system:node:node-a", "node-b")
    with pytest.raises(errors.Forbidden) as refused:
        await node_client.apply(CNR, cnr("node-b"), field_manager=MANAGER)
    _assert_refused(refused.value, "system:node:node-a", "node-b")
    with pytest.raises(errors.Forbidden) as refused:  # a generated name is not its own either
        await node_client.create(CNR, cnr("", metadata={"generateName": "node-a"}))
    assert "may write only the CustomNodeResource named node-a, not node-a" in refused.value.message

    before = _decode(await access.create(CNR, cnr("node-b", spec={"taints": []})))
    for how, write in _writes(node_client, "node-b").items():
        try:
            await write()
        except errors.Forbidden as exc:
            _assert_refused(exc, "system:node:node-a", "node-b")
        else:
            pytest.fail(f"{how} of node-b's CNR by node-a was allowed")
    after = _decode(await access.get(CNR, "node-b"))
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    # node-b itself may: the policy names each node's own object, not one fixed node.
    for write in _writes(node_b_client, "node-b").values():
        await write()


async def test_the_admin_is_not_restricted(access: KubeClient, node_client: KubeClient) -> None:
    await node_client.create(CNR, cnr("node-a"))
    await access.create(CNR, cnr("not-a-node"))
    for name in ("node-a", "not-a-node"):
        for write in _writes(access, name).values():
            await write()
    await access.delete(CNR, "not-a-node")


async def test_the_policy_also_guards_delete(access: KubeClient, node_client: KubeClient) -> None:
    """RBAC does not let nodes delete CNRs; should another role grant it, the policy still keeps a
    node to its own object."""
    await node_client.create(CNR, cnr("node-a"))
    await access.create(CNR, cnr("node-b"))
    rules = [
        {
            "apiGroups": [CNR.group],
            "resources": [CNR.plural],
            "verbs": ["delete"],
        }
    ]
    role = {"metadata": {"name": "test-cnr-delete"}, "rules": rules}
    binding = {
        "metadata": {"name": "test-cnr-delete"},
        "roleRef": {
            "apiGroup": CLUSTERROLES.group,
            "kind": "ClusterRole",
            "name": "test-cnr-delete",
        },
        "subjects": [
            {"apiGroup": CLUSTERROLES.group, "kind": "User", "name": "system:node:node-a"}
        ],
    }
    await access.create(CLUSTERROLES, role)
    await access.create(CLUSTERROLEBINDINGS, binding)
    try:
        refused = await _policy_refusal_of_delete(node_client, "node-b")
        _assert_refused(refused, "system:node:node-a", "node-b")
        await access.get(CNR, "node-b")  # still there (NotFound otherwise)
        assert await node_client.delete(CNR, "node-a") is None
    finally:
        await access.delete(CLUSTERROLEBINDINGS, "test-cnr-delete")
        await access.delete(CLUSTERROLES, "test-cnr-delete")


async def _policy_refusal_of_delete(node_client: KubeClient, name: str) -> errors.ApiError:
    """The policy's refusal of a dry-run delete, once the RBAC grant just made is in force (the
    authorizer reads roles through an informer: until then RBAC refuses, with its own message)."""
    with trio.fail_after(WAIT_SECONDS):
        while True:
            try:
                await node_client.request(
                    "DELETE",
                    CNR.path(None, name),
                    params={"dryRun": "All"},
                    verb="delete",
                    resource=CNR.plural,
                )
            except errors.Forbidden as exc:
                if CNR_POLICY_NAME in exc.message:
                    return exc
            else:
                pytest.fail(f"node-a deleted {name}")
            await trio.sleep(PROBE_INTERVAL)
