"""Fixtures for tests against the real kube-apiserver of `tests.support.apiserver`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from nodeagent.kube import KubeClient, load_kubeconfig
from tests.support.apiserver import ApiServer, apiserver_fixture

# One kube-apiserver + etcd for the whole session (etcd data survives restarts).
apiserver = apiserver_fixture(scope="session")


def client_for(apiserver: ApiServer, identity: str, **kwargs: object) -> KubeClient:
    """A client from the harness's kubeconfig for ``identity`` (not entered yet)."""
    config = load_kubeconfig(str(apiserver.kubeconfig(identity)))
    kwargs.setdefault("qps", 500.0)
    kwargs.setdefault("burst", 1000)
    return KubeClient(config, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def admin_client(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with client_for(apiserver, "admin") as client:
        yield client


@pytest.fixture
async def node_client(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    """Authenticated as node-a (client certificate, Node authorizer + NodeRestriction)."""
    async with client_for(apiserver, "node-a") as client:
        yield client


def core_event(name: str, ns: str, message: str) -> dict[str, Any]:
    """A core/v1 Event (a kind without a watch cache: old revisions give 410 after compaction)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"kind": "ConfigMap", "name": "x", "namespace": ns},
        "reason": "Test",
        "message": message,
        "type": "Normal",
    }
