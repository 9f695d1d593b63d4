"""What the publisher writes, and only that, against the real kube-apiserver with node-a's
credentials: exact update scope, multi-slice pools, the generation bump as a watcher sees it,
zero-write cases counted in the API requests the client made, another node's slice refused and
reported, and a seed plugin written with grpcio."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import suppress
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from nodeagent.accumulator import Accumulator
from nodeagent.kube import NODES, RESOURCESLICES, KubeClient, WatchRequest, errors, run_watch
from nodeagent.kube.metrics import API_REQUESTS
from nodeagent.plugins import PluginManager
from nodeagent.resources import metrics
from nodeagent.resources.publisher import Publisher, publisher_queries
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.rpc import GrpcBridge, open_grpc_bridge
from nodeagent.sdk import Device as SdkDevice
from nodeagent.sdk import DevicePlugin
from tests.integration.conftest import client_for
from tests.integration.test_resourceslices import (
    NODE,
    TIMEOUT,
    Plugins,
    admin,
    inventory,
    node_slices,
    publisher,
    quiet,
    settle,
    versions,
)
from tests.plugins.conftest import fast_settings
from tests.plugins.support import status_item
from tests.plugins.test_grpcio_wire import PLUGIN, grpcio_modules
from tests.support.api_requests import api_writes
from tests.support.apiserver import ApiServer
from tests.support.wait import wait_until
from tests.support.watch import EventSink

pytestmark = pytest.mark.integration
__all__ = ["admin", "grpcio_modules"]  # fixtures, re-used


class SliceEvents(EventSink):
    """A raw watch sink keeping every ResourceSlice event in arrival order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, dict[str, Any]]] = []

    def on_event(self, type: str, obj: dict[str, Any]) -> None:
        if type in ("ADDED", "MODIFIED", "DELETED"):
            self.events.append((type, obj))


async def test_exact_update_scope_300_devices_and_the_generation_bump(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    plugins = Plugins()
    plugins.send(inventory(200))
    watcher = SliceEvents()
    async with trio.open_nursery() as watching:
        watching.start_soon(
            lambda: run_watch(
                admin, WatchRequest(RESOURCESLICES, field_selector=f"spec.nodeName={NODE}"), watcher
            )
        )
        with trio.fail_after(TIMEOUT):
            await watcher.listed.wait()
        async with publisher(apiserver, plugins) as pub:
            await settle(pub)
            first = await node_slices(admin)
            assert [o["spec"]["pool"]["generation"] for o in first] == [1, 1]
            seen = len(watcher.events)

            # 300 devices: 3 slices; the two existing ones change and one is created, so the
            # generation is bumped.
            plugins.send(inventory(300))
            await settle(pub)
            items = await node_slices(admin)
            assert len(items) == 3
            assert {o["metadata"]["name"] for o in first} < {o["metadata"]["name"] for o in items}
            for o in items:
                assert o["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 3}
            assert sorted(len(o["spec"]["devices"]) for o in items) == [44, 128, 128]

            async def all_watched() -> bool:
                return versions([o for _, o in watcher.events]).items() >= versions(items).items()

            await wait_until(all_watched, "the watcher saw the final slices")
            # The watcher saw generation 2 while fewer than 3 slices of it existed: a consumer
            # can tell the pool is incomplete and keep using generation 1 meanwhile.
            current: dict[str, int] = {o["metadata"]["name"]: 1 for o in first}
            at_first_bump: dict[str, int] | None = None
            for kind, obj in watcher.events[seen:]:
                name = obj["metadata"]["name"]
                if kind == "DELETED":
                    current.pop(name, None)
                else:
                    current[name] = obj["spec"]["pool"]["generation"]
                if at_first_bump is None and 2 in current.values():
                    assert obj["spec"]["pool"]["resourceSliceCount"] == 3
                    at_first_bump = dict(current)
            assert at_first_bump is not None
            assert sorted(at_first_bump.values()) == [1, 2]
            assert sorted(current.values()) == [2, 2, 2]

            # One device changes: exactly its slice gets a new resourceVersion, no bump, and
            # the client sent exactly one write.
            writes = api_writes()
            changed = inventory(300)
            changed.pools[0].devices[150].attributes["model"].string = "x200"
            plugins.send(changed)
            await settle(pub)
            after = await node_slices(admin)
            assert api_writes() - writes == 1
            moved = {n for n, rv in versions(after).items() if versions(items)[n] != rv}
            (name,) = moved
            (target,) = [o for o in after if o["metadata"]["name"] == name]
            assert any(d["name"] == "gpu-150" for d in target["spec"]["devices"])
            assert {o["spec"]["pool"]["generation"] for o in after} == {2}
        watching.cancel_scope.cancel()


async def test_zero_writes_for_resent_respelled_and_restart(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    plugins = Plugins()
    plugins.send(inventory(130, memory="1024Mi"))
    async with publisher(apiserver, plugins) as pub:
        await settle(pub)
        before = versions(await node_slices(admin))
        assert len(before) == 2
        writes = api_writes()
        unchanged = metrics.SYNCS.labels("unchanged")._value.get()

        plugins.send(inventory(130, memory="1024Mi"))  # re-sent, identical
        await settle(pub)
        plugins.send(inventory(130, memory="1073741824"))  # the same value, spelled otherwise
        await settle(pub)
        plugins.send(inventory(130, memory="1Gi"))
        await settle(pub)
        assert api_writes() == writes
        assert versions(await node_slices(admin)) == before
        # The re-sends were planned (not skipped by accident) and found nothing to write.
        assert metrics.SYNCS.labels("unchanged")._value.get() > unchanged

        # A real change is seen and written: the counter above is not blind.
        plugins.send(inventory(130, memory="2Gi"))
        await settle(pub)
        assert api_writes() == writes + 2
        before = versions(await node_slices(admin))

    # Agent restart, plugins unchanged: no request writes anything, before or after the
    # start-up grace.
    writes = api_writes()
    grace = 1.0
    async with publisher(apiserver, plugins, startup_grace=grace) as pub2:
        started = trio.current_time()
        await settle(pub2)
        await trio.sleep_until(started + grace)  # the grace must pass: it is what is tested
        await settle(pub2)
        assert api_writes() == writes
    assert versions(await node_slices(admin)) == before


async def test_another_nodes_slice_is_refused_and_reported(
    apiserver: ApiServer, admin: KubeClient
) -> None:
    """A publisher told it runs on node-b but holding node-a's credentials: the server refuses
    its writes; the failure is counted and retried with backoff, and nothing is stored. (Node-a
    may not even read node-b: its accumulator reads node-a's slices and Node, which is all the
    publisher needs to get as far as the write.)"""
    with suppress(errors.AlreadyExists):
        await admin.create(
            NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"}}
        )
    plugins = Plugins()
    plugins.send(inventory(2))
    failed = metrics.SYNCS.labels("failed")._value.get()
    refused = metrics.WRITES.labels("create", "error")._value.get()
    forbidden = API_REQUESTS.labels("create", "resourceslices", "403")._value.get()
    async with client_for(apiserver, NODE) as client, trio.open_nursery() as nursery:
        acc = Accumulator(client, publisher_queries(NODE))
        pub = Publisher(
            node_name="node-b",
            inventories=plugins.latest,
            settings=ResourcesSettings(startup_grace=0.1, retry_backoff_initial=0.05),
            client=client,
            slices=acc,
        )
        await nursery.start(acc.run)
        await nursery.start(pub.run)

        async def reported_twice() -> bool:
            return metrics.SYNCS.labels("failed")._value.get() >= failed + 2

        await wait_until(reported_twice, "the refusal reported and retried")
        assert metrics.WRITES.labels("create", "error")._value.get() >= refused + 2
        assert API_REQUESTS.labels("create", "resourceslices", "403")._value.get() >= forbidden + 2
        # Reported for the ops endpoint too, with the server's refusal, and still retried.
        (error,) = pub.failing().values()
        assert "forbidden" in error.lower()
        nursery.cancel_scope.cancel()
    body = await admin.request(
        "GET", RESOURCESLICES.path(None), params={"fieldSelector": "spec.nodeName=node-b"}
    )
    assert msgspec.json.decode(body)["items"] == []


async def test_seed_plugin_written_with_grpcio(
    apiserver: ApiServer, admin: KubeClient, grpcio_modules: str, registry: str
) -> None:
    driver = "grpcio-seed.example.com"
    bridge: GrpcBridge
    async with (
        open_grpc_bridge() as bridge,
        client_for(apiserver, NODE) as client,
        trio.open_nursery() as nursery,
    ):
        manager = PluginManager(fast_settings(registry), bridge)
        acc = Accumulator(client, publisher_queries(NODE))
        pub = Publisher(
            node_name=NODE,
            inventories=manager.channel("DRAPlugin"),
            settings=ResourcesSettings(startup_grace=0.2, disconnect_grace=0.5),
            client=client,
            slices=acc,
        )
        await nursery.start(manager.run)
        await nursery.start(acc.run)
        await nursery.start(pub.run)
        socket = os.path.join(registry, "grpcio-seed.sock")
        process = await trio.lowlevel.open_process(
            [sys.executable, str(PLUGIN), grpcio_modules, "dra", socket, driver],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
        assert process.stdin is not None
        try:
            await process.stdin.send_all(b"value 2\n")

            async def ours() -> list[dict[str, Any]]:
                return [o for o in await node_slices(admin) if o["spec"]["driver"] == driver]

            async def devices(n: int) -> bool:
                items = await ours()
                return len(items) == 1 and len(items[0]["spec"]["devices"]) == n

            await wait_until(lambda: devices(2), "the grpcio plugin's slice")
            (obj,) = await ours()
            assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
            assert obj["spec"]["devices"][1] == {
                "name": "dev-1",
                "attributes": {"index": {"int": 1}},
            }
            await process.stdin.send_all(b"value 3\n")
            await wait_until(lambda: devices(3), "updated in place")
            (after,) = await ours()
            assert after["metadata"]["name"] == obj["metadata"]["name"]
            await process.stdin.aclose()
            with trio.fail_after(TIMEOUT):
                assert await process.wait() == 0

            async def gone() -> bool:
                return not await ours()

            await wait_until(gone, "deleted after the disconnect grace")
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        nursery.cancel_scope.cancel()


async def test_native_sdk_plugin_300_devices_and_zero_write_resends(
    apiserver: ApiServer, admin: KubeClient, registry: str
) -> None:
    """A native-API plugin (the SDK over a unix socket, through the plugin manager): 300 devices
    make one pool of 3 slices; re-sending the same inventory is counted and goes no further, one
    equal up to quantity spelling is planned and writes nothing."""
    driver = "sdk-native.example.com"

    def devices(memory: str) -> list[SdkDevice]:
        return [
            SdkDevice(name=f"gpu-{i}", attributes={"index": i}, capacity={"memory": memory})
            for i in range(300)
        ]

    unchanged = metrics.SYNCS.labels("unchanged")

    async def resend(plugin: DevicePlugin, memory: str, *, identical: bool = False) -> None:
        before = unchanged._value.get()
        received = status_item(manager, driver)["messages_received"]
        await plugin.publish(devices(memory))
        if identical:
            # The same bytes again (issue 29 item 13b): the handler counts the message and
            # goes no further, so there is no plan to wait for: its count is the word.
            await wait_until(
                lambda: status_item(manager, driver)["messages_received"] > received,
                "the identical re-send counted",
            )
            return

        async def planned() -> bool:
            return unchanged._value.get() > before

        await wait_until(planned, "the re-sent inventory planned")

    async with (
        open_grpc_bridge() as bridge,
        client_for(apiserver, NODE) as client,
        trio.open_nursery() as nursery,
    ):
        manager = PluginManager(fast_settings(registry), bridge)
        acc = Accumulator(client, publisher_queries(NODE))
        pub = Publisher(
            node_name=NODE,
            inventories=manager.channel("DRAPlugin"),
            settings=ResourcesSettings(startup_grace=0.2),
            client=client,
            slices=acc,
        )
        await nursery.start(manager.run)
        await nursery.start(acc.run)
        await nursery.start(pub.run)
        async with DevicePlugin.serve(
            name=driver, registry_dir=registry, bridge=bridge, pool="gpus"
        ) as plugin:
            await plugin.publish(devices("1024Mi"))

            async def three() -> list[dict[str, Any]] | None:
                items = [o for o in await node_slices(admin) if o["spec"]["driver"] == driver]
                return items if len(items) == 3 else None

            items = await wait_until(three, "three slices")
            for o in items:
                assert o["spec"]["pool"] == {
                    "name": "gpus",
                    "generation": 1,
                    "resourceSliceCount": 3,
                }
            assert sorted(len(o["spec"]["devices"]) for o in items) == [44, 128, 128]
            assert items[0]["spec"]["devices"][0]["capacity"] == {"memory": {"value": "1Gi"}}
            await quiet(pub)
            writes = api_writes()
            await resend(plugin, "1024Mi", identical=True)
            await resend(plugin, "1Gi")
            await resend(plugin, "1073741824")
            await quiet(pub)
            assert api_writes() == writes
            assert versions(await three() or []) == versions(items)
        nursery.cancel_scope.cancel()
