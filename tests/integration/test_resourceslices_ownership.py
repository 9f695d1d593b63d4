"""Whose slices the publisher writes, against the real kube-apiserver with node-a's credentials: the
Node re-created under its name (slices re-owned once, no write loop), waiting for a Node that
does not exist yet, others' metadata kept by updates, a pool holding a foreign slice refused and
recovered, and no writes while the slice list is Forbidden (an identity that may create slices
but not list them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.accumulator import AccumulatorSettings
from nodeagent.core.latest import LatestValue
from nodeagent.kube import (
    CORE_EVENTS,
    NODES,
    RESOURCESLICES,
    ClusterConfig,
    EventRecorder,
    KubeClient,
    errors,
    load_kubeconfig,
)
from nodeagent.kube.models import Node
from nodeagent.resources import metrics
from nodeagent.resources.component import ResourcesComponent
from nodeagent.resources.settings import ResourcesSettings
from tests.integration.test_resourceslices import (
    DRIVER,
    NODE,
    Plugins,
    admin,
    inventory,
    node_slices,
    publisher,
    settle,
)
from tests.support.api_requests import api_writes
from tests.support.apiserver import ApiServer
from tests.support.resources import CLUSTERROLEBINDINGS, CLUSTERROLES, SERVICEACCOUNTS
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration
__all__ = ["admin"]  # fixture, re-used

NODE_OBJ = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}


async def node_uid(admin: KubeClient) -> str:
    return (await admin.get(NODES, NODE, into=Node)).metadata.uid


async def recreate_node(admin: KubeClient) -> str:
    old = await node_uid(admin)
    await admin.delete(NODES, NODE)
    await admin.create(NODES, NODE_OBJ)
    new = await node_uid(admin)
    assert new != old
    return new


def owners(items: list[dict[str, Any]]) -> list[str]:
    return [r["uid"] for o in items for r in o["metadata"]["ownerReferences"]]


async def test_a_recreated_node_gets_the_slices_reowned_without_a_loop(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    plugins = Plugins()
    plugins.send(inventory(200))
    async with publisher(apiserver, plugins) as pub:

        async def two() -> bool:
            return len(await node_slices(admin)) == 2

        await wait_until(two, "published")
        await settle(pub)
        names = sorted(o["metadata"]["name"] for o in await node_slices(admin))
        written = api_writes()
        uid = await recreate_node(admin)

        async def reowned() -> bool:
            return owners(await node_slices(admin)) == [uid, uid]

        await wait_until(reowned, "slices owned by the new Node")
        await settle(pub)
        # The same slices, re-owned in place: two updates, then nothing more.
        assert sorted(o["metadata"]["name"] for o in await node_slices(admin)) == names
        assert api_writes() == written + 2
        await trio.sleep(1.0)  # any loop would write within this second
        await settle(pub)
        assert api_writes() == written + 2
        assert {o["spec"]["pool"]["generation"] for o in await node_slices(admin)} == {1}


async def test_publishing_waits_for_the_node(apiserver: ApiServer, admin: KubeClient) -> None:
    await admin.delete(NODES, NODE)
    try:
        plugins = Plugins()
        plugins.send(inventory(3))
        written = api_writes()
        failed = metrics.SYNCS.labels("failed")._value.get()
        # A backoff (if any) would hold the pool until 60 s after its first failed sync, long
        # after the Node is created: "as soon as" below is told from it with a bound a loaded
        # machine meets (the 1 s bound of a 1 s backoff was not).
        async with publisher(
            apiserver, plugins, startup_grace=0.0, retry_backoff_initial=60.0
        ) as pub:
            await trio.sleep(2.0)
            await settle(pub)
            assert api_writes() == written
            # Waiting is not failing: no backoff grows meanwhile.
            assert metrics.SYNCS.labels("failed")._value.get() == failed
            assert pub.blocked() == f"waiting for Node {NODE}"
            await admin.create(NODES, NODE_OBJ)
            uid = await node_uid(admin)

            async def published() -> bool:
                return owners(await node_slices(admin)) == [uid]

            with trio.fail_after(20.0):
                await wait_until(published, "published as soon as the Node exists")
            assert pub.blocked() is None
            await settle(pub)
            assert api_writes() == written + 1
    finally:
        with suppress(errors.AlreadyExists):
            await admin.create(NODES, NODE_OBJ)


async def test_updates_keep_others_labels_annotations_and_finalizers(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    plugins = Plugins()
    plugins.send(inventory(3))
    async with publisher(apiserver, plugins) as pub:

        async def one() -> dict[str, Any] | None:
            items = await node_slices(admin)
            return items[0] if len(items) == 1 else None

        obj = await wait_until(one, "published")
        meta = obj["metadata"]
        meta["labels"]["team"] = "gpu"
        meta["annotations"] = {"example.com/note": "keep me"}
        meta["finalizers"] = ["example.com/hold"]
        await admin.update(RESOURCESLICES, obj)
        try:
            plugins.send(inventory(3, memory="2Gi"))

            async def updated() -> dict[str, Any] | None:
                got = await one()
                memory = got["spec"]["devices"][0]["capacity"]["memory"] if got else {}
                return got if memory == {"value": "2Gi"} else None

            obj = await wait_until(updated, "updated by the publisher")
            await settle(pub)
            meta = obj["metadata"]
            assert meta["labels"] == {"app.kubernetes.io/managed-by": "nodeagent", "team": "gpu"}
            assert meta["annotations"] == {"example.com/note": "keep me"}
            assert meta["finalizers"] == ["example.com/hold"]
        finally:
            (obj,) = await node_slices(admin)
            obj["metadata"].pop("finalizers", None)
            await admin.update(RESOURCESLICES, obj)


async def test_a_pool_with_a_foreign_slice_is_refused_until_it_goes(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    foreign = await admin.create(
        RESOURCESLICES,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"generateName": "someone-else-"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "theirs"}],
            },
        },
    )
    name = msgspec.json.decode(foreign)["metadata"]["name"]
    refused = metrics.SYNCS.labels("refused")._value.get()
    plugins = Plugins()
    plugins.send(inventory(3))
    written = api_writes()
    async with publisher(apiserver, plugins, startup_grace=0.0) as pub:

        async def reported() -> bool:
            return metrics.SYNCS.labels("refused")._value.get() > refused

        await wait_until(reported, "the pool refused")
        await settle(pub)
        assert api_writes() == written
        ((key, error),) = pub.failing().items()
        assert key == (DRIVER, NODE) and name in error
        assert metrics.REFUSED_POOLS._value.get() == 1

        async def event() -> bool:
            body = await admin.request(
                "GET",
                CORE_EVENTS.path("default"),
                params={"fieldSelector": "reason=ResourceSlicePoolConflict"},
            )
            return any(name in e["message"] for e in msgspec.json.decode(body)["items"])

        await wait_until(event, "a Warning Event on the Node")
        await admin.delete(RESOURCESLICES, name)

        async def ours() -> bool:
            items = await node_slices(admin)
            return (
                len(items) == 1
                and items[0]["metadata"]["labels"].get("app.kubernetes.io/managed-by")
                == "nodeagent"
            )

        await wait_until(ours, "the pool published once the foreign slice is gone")
        await settle(pub)
        assert pub.failing() == {}
        assert metrics.REFUSED_POOLS._value.get() == 0


BLIND_RULES = [
    # Slices may be written, never listed or watched.
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["create", "update", "delete", "get"],
    },
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


@asynccontextmanager
async def blind_client(apiserver: ApiServer, admin: KubeClient) -> AsyncIterator[KubeClient]:
    """A ServiceAccount's token whose role may create slices but not list them."""
    sa = "nodeagent-blind"
    objects: list[tuple[Any, str, str | None, dict[str, Any]]] = [
        (
            SERVICEACCOUNTS,
            sa,
            "default",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}},
        ),
        (
            CLUSTERROLES,
            sa,
            None,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": sa},
                "rules": BLIND_RULES,
            },
        ),
        (
            CLUSTERROLEBINDINGS,
            sa,
            None,
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": sa},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": sa,
                },
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "default"}],
            },
        ),
    ]
    for resource, _, namespace, body in objects:
        with suppress(errors.AlreadyExists):
            await admin.create(resource, body, namespace)
    answer = await admin.request(
        "POST",
        SERVICEACCOUNTS.path("default", sa) + "/token",
        body=msgspec.json.encode(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        ),
        content_type="application/json",
    )
    token = msgspec.json.decode(answer)["status"]["token"]
    admin_config = load_kubeconfig(str(apiserver.kubeconfig("admin")))
    config = ClusterConfig(
        server=admin_config.server,
        ca_data=admin_config.ca_data,
        ca_file=admin_config.ca_file,
        token=token,
    )
    async with KubeClient(config) as client:
        yield client


async def test_nothing_is_written_while_the_slice_list_is_forbidden(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    plugins = Plugins()
    plugins.send(inventory(3))
    written = api_writes()
    async with (
        blind_client(apiserver, admin) as client,
        trio.open_nursery() as nursery,
    ):
        # The agent's own wiring: the component builds the accumulator and the publisher.
        events = EventRecorder(NODE, client=client)
        comp = ResourcesComponent(
            node_name=NODE,
            inventories=plugins.latest,
            settings=LatestValue(ResourcesSettings(startup_grace=0.0)),
            # Short local-write TTL and list retries: what used to multiply the pool.
            accumulator_settings=AccumulatorSettings(local_write_ttl=0.5, forbidden_retry=0.2),
            client=client,
            events=events,
        )
        nursery.start_soon(events.run)
        await nursery.start(comp.run)
        acc, pub = comp.accumulator, comp.publisher
        assert acc is not None and pub is not None

        async def forbidden() -> bool:
            return "forbidden" in (acc.not_ready_reason() or "")

        await wait_until(forbidden, "the Forbidden list")
        await trio.sleep(3.0)  # several list retries and write TTLs: nothing may be written
        assert api_writes() == written
        assert await node_slices(admin) == []
        ready, reason = comp.readiness()
        assert not ready
        assert reason.startswith(
            "nothing is written: the observed state is not known (resourceslices: list forbidden"
        )
        nursery.cancel_scope.cancel()
