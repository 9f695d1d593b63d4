"""The ResourceSlice publisher against the real kube-apiserver, with node-a's credentials under
the Node authorizer and NodeRestriction: publishing, in-place updates, restart without writes,
self-healing after foreign changes, disconnect grace, and least privilege."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from types import MappingProxyType
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from nodeagent.accumulator import Accumulator
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.kube import NODES, RESOURCESLICES, KubeClient, errors
from nodeagent.kube.metrics import WATCH_EVENTS
from nodeagent.kube.models import Node
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources.publisher import Publisher, publisher_queries
from nodeagent.resources.settings import ResourcesSettings
from tests.integration.conftest import client_for
from tests.support.apiserver import ApiServer
from tests.support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.releases]

NODE = "node-a"
DRIVER = "gpu.example.com"
# Deadline of every positive wait on the apiserver here and in the modules that import it: they
# take well under a second, the margin is for a loaded 2-core CI machine.
TIMEOUT = 30.0


def inventory(n: int, memory: str = "1024Mi") -> device_pb2.Inventory:
    return device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name=NODE,
                devices=[
                    device_pb2.Device(
                        name=f"gpu-{i}",
                        attributes={
                            "index": device_pb2.DeviceAttribute(int=i),
                            "model": device_pb2.DeviceAttribute(string="x100"),
                        },
                        capacity={"memory": device_pb2.DeviceCapacity(value=memory)},
                    )
                    for i in range(n)
                ],
            )
        ]
    )


class Plugins:
    def __init__(self) -> None:
        self.latest: LatestValue[Mapping[str, Any]] = LatestValue(MappingProxyType({}))

    def send(self, message: Any, registered: bool = True) -> None:
        data = PluginData(
            name=DRIVER,
            plugin_type="DRAPlugin",
            endpoint="/x.sock",
            message=message,
            received_at=time.time(),
            registered=registered,
        )
        self.latest.set(MappingProxyType({DRIVER: data}))


@pytest.fixture
async def admin(apiserver: ApiServer) -> AsyncIterator[KubeClient]:
    async with client_for(apiserver, "admin") as client:
        with suppress(errors.AlreadyExists):
            await client.create(
                NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
            )
        await client.delete_collection(RESOURCESLICES, field_selector=f"spec.nodeName={NODE}")
        yield client
        await client.delete_collection(RESOURCESLICES, field_selector=f"spec.nodeName={NODE}")


@asynccontextmanager
async def publisher(
    apiserver: ApiServer, plugins: Plugins, **settings: Any
) -> AsyncIterator[Publisher]:
    settings.setdefault("startup_grace", 0.5)
    async with client_for(apiserver, NODE) as client, trio.open_nursery() as nursery:
        acc = Accumulator(client, publisher_queries(NODE))
        pub = Publisher(
            node_name=NODE,
            inventories=plugins.latest,
            settings=ResourcesSettings(**settings),
            client=client,
            slices=acc,
        )
        await nursery.start(acc.run)
        await nursery.start(pub.run)
        yield pub
        nursery.cancel_scope.cancel()


async def node_slices(admin: KubeClient) -> list[dict[str, Any]]:
    body = await admin.request(
        "GET",
        RESOURCESLICES.path(None),
        params={"fieldSelector": f"spec.nodeName={NODE}"},
    )
    items: list[dict[str, Any]] = msgspec.json.decode(body)["items"]
    return sorted(items, key=lambda o: o["metadata"]["name"])


async def quiet(pub: Publisher) -> None:
    """Until the publisher has read the cluster and has nothing queued."""
    with trio.fail_after(TIMEOUT):
        await pub.wait_idle()


async def settle(pub: Publisher) -> None:
    """Until the publisher has taken in every input already given and has nothing queued."""
    with trio.fail_after(TIMEOUT):
        # Its own word for the inventories: all tasks blocked is not "taken in" when an
        # inventory is converted in a worker thread (resources.thread_threshold).
        await pub.wait_inventories()
    # Timers already due (the start-up grace) have run, queueing what they found.
    await trio.testing.wait_all_tasks_blocked(0.05)
    await quiet(pub)


def versions(items: list[dict[str, Any]]) -> dict[str, str]:
    """Each slice's resourceVersion by name."""
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in items}


async def test_publish_update_and_restart_without_writes(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    node = await admin.get(NODES, NODE, into=Node)
    plugins = Plugins()
    plugins.send(inventory(200))
    async with publisher(apiserver, plugins) as pub:

        async def two() -> list[dict[str, Any]] | None:
            items = await node_slices(admin)
            return items if len(items) == 2 else None

        items = await wait_until(two, "two slices")
        for o in items:
            assert o["metadata"]["generateName"] == f"{NODE}-{DRIVER}-"
            assert o["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": NODE,
                    "uid": node.metadata.uid,
                    "controller": True,
                }
            ]
            assert o["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}
            assert o["spec"]["devices"][0]["capacity"] == {"memory": {"value": "1Gi"}}
        assert sorted(len(o["spec"]["devices"]) for o in items) == [72, 128]
        await quiet(pub)
        assert pub.writes == 2

        # One device changes: one slice updated in place, no generation bump.
        changed = inventory(200)
        changed.pools[0].devices[199].capacity["memory"].value = "2Gi"
        plugins.send(changed)

        async def updated() -> bool:
            items = await node_slices(admin)
            return any(
                d["name"] == "gpu-199" and d["capacity"]["memory"]["value"] == "2Gi"
                for o in items
                for d in o["spec"]["devices"]
            )

        await wait_until(updated, "gpu-199 updated")
        await quiet(pub)
        assert pub.writes == 3
        assert {o["spec"]["pool"]["generation"] for o in await node_slices(admin)} == {1}
        before = {
            o["metadata"]["name"]: o["metadata"]["resourceVersion"]
            for o in await node_slices(admin)
        }

    # A restart with the same plugin inventory makes no write at all.
    async with publisher(apiserver, plugins, startup_grace=2.0) as pub2:
        started = trio.current_time()
        await quiet(pub2)
        # The grace itself must pass (nothing may be deleted after it either).
        await trio.sleep_until(started + 2.0)
        await trio.testing.wait_all_tasks_blocked(0.05)
        await quiet(pub2)
        assert pub2.writes == 0
    after = {
        o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in await node_slices(admin)
    }
    assert after == before


async def test_foreign_changes_are_repaired(apiserver: ApiServer, admin: KubeClient) -> None:
    plugins = Plugins()
    plugins.send(inventory(3))
    async with publisher(apiserver, plugins) as pub:

        async def one() -> dict[str, Any] | None:
            items = await node_slices(admin)
            return items[0] if len(items) == 1 else None

        obj = await wait_until(one, "one slice")
        # Someone edits our slice: it is put back.
        obj["spec"]["devices"] = obj["spec"]["devices"][:1]
        await admin.update(RESOURCESLICES, obj)

        async def repaired() -> bool:
            items = await node_slices(admin)
            return len(items) == 1 and len(items[0]["spec"]["devices"]) == 3

        await wait_until(repaired, "slice repaired")
        # Someone deletes it: it is created again.
        (obj,) = await node_slices(admin)
        await admin.delete(RESOURCESLICES, obj["metadata"]["name"])

        async def recreated() -> bool:
            items = await node_slices(admin)
            return len(items) == 1 and items[0]["metadata"]["name"] != obj["metadata"]["name"]

        await wait_until(recreated, "slice recreated")
        await quiet(pub)


async def test_disconnected_plugin_slices_go_after_the_grace(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    plugins = Plugins()
    plugins.send(inventory(3))
    async with publisher(apiserver, plugins, disconnect_grace=1.0):

        async def published() -> bool:
            return len(await node_slices(admin)) == 1

        await wait_until(published, "published")
        t0 = trio.current_time()
        plugins.send(inventory(3), registered=False)

        async def gone() -> bool:
            return not await node_slices(admin)

        await wait_until(gone, "deleted")
        assert trio.current_time() - t0 >= 1.0


async def test_node_credentials_are_limited_to_their_own_node(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "x-"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "node-b",
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
        },
    }
    async with client_for(apiserver, NODE) as node_a:
        with pytest.raises(errors.Forbidden):
            await node_a.create(RESOURCESLICES, body)
        with pytest.raises(errors.Forbidden):
            await node_a.request("GET", RESOURCESLICES.path(None))  # no node field selector


async def test_fields_the_server_drops_cause_no_update_loop(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    """Device taints are behind a feature gate (off by default in 1.35): the server silently
    drops them. The publisher plans against what was stored instead of rewriting forever."""
    inv = inventory(2)
    inv.pools[0].devices[0].taints.append(
        device_pb2.DeviceTaint(key="example.com/unhealthy", effect="NoSchedule")
    )
    plugins = Plugins()
    plugins.send(inv)

    def events() -> float:
        return WATCH_EVENTS.labels("resourceslices")._value.get()

    watched = events()
    async with publisher(apiserver, plugins) as pub:

        async def one() -> bool:
            return len(await node_slices(admin)) == 1

        await wait_until(one, "published")
        await quiet(pub)
        # The watch echo of the create arrives after our own read-your-writes copy: wait for
        # it, then for it to be planned against.
        (stored,) = await node_slices(admin)

        async def echoed() -> bool:
            return events() > watched

        await wait_until(echoed, "the watch echo of the create")
        await trio.testing.wait_all_tasks_blocked(0.05)
        await quiet(pub)
        assert (
            stored["metadata"]["resourceVersion"]
            == (await node_slices(admin))[0]["metadata"]["resourceVersion"]
        )
        assert pub.writes == 1
