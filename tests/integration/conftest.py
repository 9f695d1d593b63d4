"""Fixtures for tests against the real kube-apiserver of `tests.support.apiserver`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from nodeagent.kube import KubeClient, load_kubeconfig
from tests.support.apiserver import ApiServer, start_apiserver


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    """One kube-apiserver + etcd for the whole session (etcd data survives restarts)."""
    srv = start_apiserver(tmp_path_factory.mktemp("apiserver"))
    try:
        yield srv
    finally:
        srv.close()


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
