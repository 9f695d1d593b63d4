"""deploy/kubernetes/nodeagent.yaml on the real kube-apiserver, the DaemonSet path: the agent's
service account, with the token a pod on node <n> gets, writes the CustomNodeResource <n> (object
and status) and is refused on any other, with the admission policy's message; a token not bound
to a pod on a node is refused outright."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import msgspec
import pytest

from nodeagent.kube import NODES, ClusterConfig, KubeClient, errors
from tests.deploy.manifests import create_pod, delete_pod, pod_token
from tests.support.apiserver import ApiServer
from tests.support.crds import (
    CNR,
    REPO_ROOT,
    apply_manifest,
    cnr,
    install_cnr_crd,
    until_cnr_access_enforced,
)

pytestmark = pytest.mark.releases

NODEAGENT_YAML = REPO_ROOT / "deploy" / "kubernetes" / "nodeagent.yaml"
POLICY = "nodeagent-cnr-own-node-sa"
NODE = "ds-node-1"  # not a harness identity: only the token names it
OTHER = "ds-node-2"
POD = "nodeagent-ds-test"
MANAGER = "nodeagent"
STATUS = {"topologyPolicy": "None"}


def _client(apiserver: ApiServer, token: str) -> KubeClient:
    config = ClusterConfig(server=apiserver.url, ca_file=str(apiserver.ca_file), token=token)
    return KubeClient(config, qps=500.0, burst=1000)


@pytest.fixture
async def agent(apiserver: ApiServer, admin_client: KubeClient) -> AsyncIterator[KubeClient]:
    """nodeagent.yaml applied (all of it: the DaemonSet is inert without a controller-manager) and
    in force, the CRD installed, and a client with the token of an agent pod on Node ds-node-1."""
    await install_cnr_crd(admin_client)
    await apply_manifest(admin_client, NODEAGENT_YAML)
    await admin_client.apply(
        NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}, field_manager="t"
    )
    created = await create_pod(admin_client, POD, NODE)
    try:
        async with _client(apiserver, await pod_token(admin_client, created)) as client:
            await until_cnr_access_enforced(client, NODE, POLICY)
            yield client
    finally:
        await delete_pod(admin_client, POD)
        await admin_client.delete(NODES, NODE)
        for name in (NODE, OTHER):
            with contextlib.suppress(errors.NotFound):
                await admin_client.delete(CNR, name)


async def test_the_agent_writes_only_its_nodes_cnr(
    admin_client: KubeClient, agent: KubeClient
) -> None:
    await agent.create(CNR, cnr(NODE))
    await agent.patch(CNR, NODE, {"metadata": {"labels": {"a": "1"}}})
    await agent.patch(CNR, NODE, {"status": STATUS}, subresource="status")
    await agent.apply(CNR, cnr(NODE, status=STATUS), field_manager=MANAGER, subresource="status")
    stored = msgspec.json.decode(await admin_client.get(CNR, NODE))
    assert stored["metadata"]["labels"] == {"a": "1"}
    assert stored["status"] == STATUS

    with pytest.raises(errors.Forbidden) as refused:
        await agent.apply(CNR, cnr(OTHER), field_manager=MANAGER)
    assert POLICY in refused.value.message
    expected = f"nodeagent on node {NODE} may write only the CustomNodeResource named {NODE}"
    assert f"{expected}, not {OTHER}" in refused.value.message
    await admin_client.create(CNR, cnr(OTHER))
    with pytest.raises(errors.Forbidden, match=POLICY):
        await agent.patch(CNR, OTHER, {"status": STATUS}, subresource="status")


async def test_a_token_not_bound_to_a_node_is_refused(
    apiserver: ApiServer, admin_client: KubeClient, agent: KubeClient
) -> None:
    # `agent`: RBAC and the policy are in force, so a refusal here is the policy's.
    async with _client(apiserver, await pod_token(admin_client, None)) as unbound:
        with pytest.raises(errors.Forbidden) as refused:
            await unbound.create(CNR, cnr(NODE))
    assert POLICY in refused.value.message
    assert "only with a token bound to a pod on a node" in refused.value.message
