"""End to end: a seed DRA plugin (the SDK, over a real unix socket) -> the real plugin manager ->
the publisher -> the real kube-apiserver, with node credentials."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.accumulator import Accumulator
from nodeagent.kube import CORE_EVENTS, KubeClient
from nodeagent.plugins import PluginManager
from nodeagent.resources import metrics
from nodeagent.resources.publisher import Publisher, publisher_queries
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.rpc import GrpcBridge, open_grpc_bridge
from nodeagent.sdk import Device, DevicePlugin, Quantity, SemVer
from tests.integration.conftest import client_for
from tests.integration.test_resourceslices import NODE, admin, node_slices
from tests.plugins.conftest import fast_settings
from tests.support.apiserver import ApiServer
from tests.support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.releases]
__all__ = ["admin"]  # the fixture, re-used

DRIVER = "seed.example.com"


@pytest.fixture
async def bridge() -> AsyncIterator[GrpcBridge]:
    async with open_grpc_bridge() as opened:
        yield opened


def devices(memory: str) -> list[Device]:
    return [
        Device(
            name=f"gpu-{i}",
            attributes={
                "index": i,
                "healthy": True,
                "driverVersion": SemVer("1.2.3"),
                "memory": Quantity(memory),
                "numa": [0, 1],  # an int slice: not publishable, dropped with a metric
            },
        )
        for i in range(3)
    ]


async def test_seed_plugin_to_resourceslices(
    apiserver: ApiServer, admin: KubeClient, bridge: GrpcBridge, registry: str
) -> None:
    rejected = metrics.ATTRIBUTES_REJECTED.labels(DRIVER)._value.get()
    manager = PluginManager(fast_settings(registry), bridge)
    async with client_for(apiserver, NODE) as client, trio.open_nursery() as nursery:
        acc = Accumulator(client, publisher_queries(NODE))
        pub = Publisher(
            node_name=NODE,
            inventories=manager.channel("DRAPlugin"),
            settings=ResourcesSettings(startup_grace=0.5, disconnect_grace=1.0),
            client=client,
            slices=acc,
        )
        await nursery.start(manager.run)
        await nursery.start(acc.run)
        await nursery.start(pub.run)
        async with DevicePlugin.serve(
            name=DRIVER, registry_dir=registry, bridge=bridge, api="seed"
        ) as plugin:
            await plugin.publish(devices("1024Mi"))

            async def published() -> list[dict[str, Any]] | None:
                items = [o for o in await node_slices(admin) if o["spec"]["driver"] == DRIVER]
                return items or None

            (obj,) = await wait_until(published, "seed slice")
            assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
            assert obj["spec"]["devices"][0] == {
                "name": "gpu-0",
                "attributes": {
                    "index": {"int": 0},
                    "healthy": {"bool": True},
                    "driverVersion": {"version": "1.2.3"},
                },
                "capacity": {"memory": {"value": "1Gi"}},
            }
            assert metrics.ATTRIBUTES_REJECTED.labels(DRIVER)._value.get() == rejected + 3

            async def events() -> list[Any] | None:
                body = await admin.request(
                    "GET",
                    CORE_EVENTS.path("default"),
                    params={
                        "fieldSelector": "involvedObject.name=node-a,"
                        "reason=ResourceAttributeNotPublished"
                    },
                )
                items: list[Any] = msgspec.json.decode(body)["items"]
                return [e for e in items if DRIVER in e["message"]] or None

            found = await wait_until(events, "a Warning event per dropped attribute")
            assert all(e["type"] == "Warning" for e in found)

            await plugin.publish(devices("2Gi"))

            async def updated() -> bool:
                items = await published() or []
                return [
                    d["capacity"]["memory"]["value"] for o in items for d in o["spec"]["devices"]
                ] == ["2Gi"] * 3

            await wait_until(updated, "updated in place")
            (after,) = await published() or []
            assert after["metadata"]["name"] == obj["metadata"]["name"]
            assert after["spec"]["pool"]["generation"] == 1

        # The plugin is gone (socket removed): its slice goes after the disconnect grace.
        async def gone() -> bool:
            return not await published()

        await wait_until(gone, "deleted after the grace")
        nursery.cancel_scope.cancel()
