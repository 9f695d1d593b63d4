"""The publisher against the in-memory cluster: writes, idempotence, lifecycle graces, retries,
coalescing, ownership and dropped fields. Virtual time (autojump_clock) stands in for the
graces and backoffs; `wait_all_tasks_blocked` is the synchronisation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import MappingProxyType
from typing import Any

import pytest
import trio
import trio.testing

from nodeagent.core.errors import ConfigError
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.kube.errors import Conflict
from nodeagent.protos.nodeagent.device.v1alpha1 import device_pb2
from nodeagent.resources import metrics
from nodeagent.resources.publisher import Publisher
from nodeagent.resources.settings import ResourcesSettings
from tests.support.fake_resourceslices import FakeCluster

DRIVER = "gpu.example.com"


def inventory(
    n: int, *, memory: str = "80Gi", pools: tuple[str, ...] = ("node-a",), taints: bool = False
) -> device_pb2.Inventory:
    return device_pb2.Inventory(
        pools=[
            device_pb2.Pool(
                name=p,
                devices=[
                    device_pb2.Device(
                        name=f"gpu-{i}",
                        attributes={"index": device_pb2.DeviceAttribute(int=i)},
                        capacity={"memory": device_pb2.DeviceCapacity(value=memory)},
                        taints=[device_pb2.DeviceTaint(key="example.com/t", effect="NoSchedule")]
                        if taints
                        else [],
                    )
                    for i in range(n)
                ],
            )
            for p in pools
        ]
    )


class Plugins:
    def __init__(self) -> None:
        self.latest: LatestValue[Mapping[str, Any]] = LatestValue(MappingProxyType({}))
        self.data: dict[str, PluginData] = {}

    def send(self, message: Any, name: str = DRIVER, registered: bool = True) -> None:
        self.data[name] = PluginData(
            name=name,
            plugin_type="DRAPlugin",
            endpoint="/x.sock",
            message=message,
            received_at=0.0,
            registered=registered,
        )
        self.latest.set(MappingProxyType(dict(self.data)))

    def disconnect(self, name: str = DRIVER) -> None:
        self.send(self.data[name].message, name, registered=False)


@asynccontextmanager
async def running(
    cluster: FakeCluster | None, plugins: Plugins, **settings: Any
) -> AsyncIterator[Publisher]:
    settings.setdefault("startup_grace", 30.0)
    # Most tests look at one sync at a time; the rate limit has its own test.
    settings.setdefault("min_sync_interval", 0.0)
    pub = Publisher(
        node_name="node-a",
        inventories=plugins.latest,
        settings=ResourcesSettings(**settings),
        client=cluster,
        slices=cluster.source if cluster else None,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(pub.run)
        await trio.testing.wait_all_tasks_blocked()
        yield pub
        nursery.cancel_scope.cancel()


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


def slices(cluster: FakeCluster) -> list[dict[str, Any]]:
    return sorted(cluster.objects.values(), key=lambda o: o["metadata"]["name"])


async def test_first_publish_creates_owned_slices(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(200))
        await settle()
        objs = slices(cluster)
        assert [c[0] for c in cluster.writes()] == ["create", "create"]
        assert [len(o["spec"]["devices"]) for o in objs] == [128, 72]
        for o in objs:
            assert o["metadata"]["name"].startswith(f"node-a-{DRIVER}-")
            assert o["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": "node-a",
                    "uid": "node-uid-1",
                    "controller": True,
                }
            ]
            assert o["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "nodeagent"}
            assert o["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 2}
            assert o["spec"]["nodeName"] == "node-a" and o["spec"]["driver"] == DRIVER
        # The same inventory again (a new message): nothing to write.
        plugins.send(inventory(200))
        await settle()
        assert len(cluster.writes()) == 2


async def test_one_changed_device_is_one_update_without_a_bump(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(200))
        await settle()
        inv = inventory(200)
        inv.pools[0].devices[150].capacity["memory"].value = "40Gi"
        plugins.send(inv)
        await settle()
        assert [c[0] for c in cluster.writes()[2:]] == ["update"]
        assert {o["spec"]["pool"]["generation"] for o in slices(cluster)} == {1}
        # A new pool layout (a third slice) bumps the generation everywhere.
        plugins.send(inventory(300))
        await settle()
        assert [o["spec"]["pool"]["generation"] for o in slices(cluster)] == [2, 2, 2]
        assert {o["spec"]["pool"]["resourceSliceCount"] for o in slices(cluster)} == {3}


async def test_restart_with_unchanged_plugins_writes_nothing(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(200))
        await settle()
    before = len(cluster.writes())
    plugins2 = Plugins()
    async with running(cluster, plugins2):
        await trio.sleep(5)  # the plugin takes 5 s to re-register
        plugins2.send(inventory(200))
        await settle()
        await trio.sleep(60)  # well past the start-up grace
        assert len(cluster.writes()) == before


async def test_slices_of_plugins_that_never_return_go_after_the_startup_grace(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(10))
        await settle()
    async with running(cluster, Plugins(), startup_grace=20.0):
        await trio.sleep(19)
        assert len(cluster.objects) == 1
        await trio.sleep(2)
        await settle()
        assert cluster.objects == {}
        assert cluster.writes()[-1][0] == "delete"


async def test_disconnected_plugin_keeps_its_slices_for_the_grace(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, startup_grace=0.0, disconnect_grace=30.0):
        plugins.send(inventory(10))
        await settle()
        plugins.disconnect()
        await trio.sleep(20)
        plugins.send(inventory(10))  # back within the grace: nothing happens
        await trio.sleep(60)
        assert [c[0] for c in cluster.writes()] == ["create"]
        plugins.disconnect()
        await trio.sleep(29)
        assert len(cluster.objects) == 1
        await trio.sleep(2)
        await settle()
        assert cluster.objects == {}


async def test_invalid_inventory_keeps_the_last_valid_one(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(3))
        await settle()
        before = metrics.INVENTORIES_REJECTED.labels(DRIVER)._value.get()
        bad = inventory(3)
        bad.pools[0].devices[1].name = "Not_A_Label"
        plugins.send(bad)
        await settle()
        assert metrics.INVENTORIES_REJECTED.labels(DRIVER)._value.get() == before + 1
        # The same bad inventory again: counted, but one Event (deduplicated).
        bad2 = inventory(3)
        bad2.pools[0].devices[1].name = "Not_A_Label"
        plugins.send(bad2)
        await settle()
        assert metrics.INVENTORIES_REJECTED.labels(DRIVER)._value.get() == before + 2
        assert [e["reason"] for e in cluster.events] == ["ResourceInventoryRejected"]
        assert "device 'Not_A_Label': name must be a DNS label" in cluster.events[0]["message"]
        assert len(cluster.writes()) == 1
        (obj,) = slices(cluster)
        assert [d["name"] for d in obj["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]


async def test_conflicts_are_retried_with_backoff(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, retry_backoff_initial=1.0):
        plugins.send(inventory(3))
        await settle()
        cluster.faults = [Conflict(409, "Conflict", "x") for _ in range(3)]
        plugins.send(inventory(3, memory="1Gi"))
        await settle()
        # Attempts at 0 s, 1 s, 3 s and 7 s (1, 2, 4 s of backoff).
        await trio.sleep(6.5)
        assert len(cluster.faults) == 0
        assert [c[0] for c in cluster.writes()].count("update") == 3
        await trio.sleep(1)
        (obj,) = slices(cluster)
        assert obj["spec"]["devices"][0]["capacity"]["memory"]["value"] == "1Gi"
        assert [c[0] for c in cluster.writes()].count("update") == 4


async def test_failing_pool_is_reported_once_and_cleared_on_success(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, retry_backoff_initial=1.0) as pub:
        plugins.send(inventory(3))
        await settle()
        assert pub.failing() == {}
        cluster.faults = [Conflict(409, "Conflict", "stale") for _ in range(2)]
        plugins.send(inventory(3, memory="1Gi"))
        await settle()
        assert pub.failing() == {(DRIVER, "node-a"): "409 Conflict: stale"}
        await trio.sleep(1.5)  # the first retry fails too: still one Warning Event
        assert pub.failing() == {(DRIVER, "node-a"): "409 Conflict: stale"}
        warnings = [e for e in cluster.events if e["reason"] == "ResourceSliceSyncFailed"]
        assert len(warnings) == 1
        assert "pool node-a of driver gpu.example.com" in warnings[0]["message"]
        await trio.sleep(3)  # the second retry succeeds
        assert pub.failing() == {}
        (obj,) = slices(cluster)
        assert obj["spec"]["devices"][0]["capacity"]["memory"]["value"] == "1Gi"


async def test_a_storm_is_written_at_most_once_per_interval(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins, min_sync_interval=1.0):
        plugins.send(inventory(3))
        await settle()
        assert len(cluster.writes()) == 1  # an isolated change is written at once
        # 100 updates/s for 3 s, each followed by a pause long enough for a sync to run.
        for i in range(300):
            plugins.send(inventory(3, memory=f"{i + 1}Gi"))
            await trio.sleep(0.01)
        await trio.sleep(1.0)
        await settle()
        updates = [c for c in cluster.writes() if c[0] == "update"]
        assert 2 <= len(updates) <= 4  # one per second of storm, not one per update
        (obj,) = slices(cluster)
        assert obj["spec"]["devices"][0]["capacity"]["memory"]["value"] == "300Gi"


async def test_a_flapping_plugin_is_coalesced_and_the_latest_wins(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        for i in range(50):
            plugins.send(inventory(3, memory=f"{i + 1}Gi"))
        await settle()
        assert len(cluster.writes()) <= 2
        (obj,) = slices(cluster)
        assert obj["spec"]["devices"][0]["capacity"]["memory"]["value"] == "50Gi"


async def test_other_drivers_slices_are_left_alone(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    foreign = cluster.put_external(
        {
            "metadata": {"name": "other-driver-slice"},
            "spec": {
                "driver": "other.example.com",
                "nodeName": "node-a",
                "pool": {"name": "node-a", "generation": 7, "resourceSliceCount": 1},
                "devices": [{"name": "x"}],
            },
        }
    )
    async with running(cluster, plugins, startup_grace=0.0):
        plugins.send(inventory(3))
        await trio.sleep(60)
        assert cluster.objects["other-driver-slice"] == foreign
        assert [c[0] for c in cluster.writes()] == ["create"]


async def test_dropped_fields_do_not_cause_an_update_loop(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(drop_taints=True), Plugins()
    dropped = metrics.FIELDS_DROPPED.labels(DRIVER, "devices.taints")
    before = dropped._value.get()
    async with running(cluster, plugins) as pub:
        plugins.send(inventory(3, taints=True))
        await trio.sleep(10)
        assert [c[0] for c in cluster.writes()] == ["create"]
        assert dropped._value.get() == before + 1
        assert pub.dropped() == {(DRIVER, "node-a"): {"devices.taints": "DRADeviceTaints"}}


async def test_a_pool_removed_from_the_inventory_is_deleted(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(2, pools=("a", "b")))
        await settle()
        assert len(cluster.objects) == 2
        plugins.send(inventory(2, pools=("a",)))
        await settle()
        assert [o["spec"]["pool"]["name"] for o in slices(cluster)] == ["a"]


async def test_nothing_is_written_before_the_observed_state_is_complete(
    autojump_clock: Any,
) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    cluster.bootstrapped = False
    async with running(cluster, plugins):
        plugins.send(inventory(3))
        await trio.sleep(10)
        assert cluster.writes() == []
        cluster.bootstrapped = True
        cluster.put_external({"metadata": {"name": "unrelated"}, "spec": {"driver": "x"}})
        await settle()
        assert [c[0] for c in cluster.writes()] == ["create"]


async def test_standalone_shows_the_desired_slices(autojump_clock: Any) -> None:
    plugins = Plugins()
    async with running(None, plugins) as pub:
        plugins.send(inventory(130))
        await settle()
        view = pub.desired_view()
        assert view[DRIVER]["registered"] is True
        assert [len(s["devices"]) for s in view[DRIVER]["pools"]["node-a"]] == [128, 2]
        assert pub.standalone


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("disconnect_grace", -1.0),
        ("startup_grace", float("nan")),
        ("retry_backoff_initial", 0.0),
        ("retry_backoff_max", 0.001),
    ],
)
def test_invalid_settings_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ConfigError) as exc:
        ResourcesSettings(**{field: value}).validate()  # type: ignore[arg-type]
    assert exc.value.field == f"resources.{field}"


def test_client_and_slices_go_together() -> None:
    with pytest.raises(ValueError, match="go together"):
        Publisher(node_name="n", inventories=Plugins().latest, client=FakeCluster())


async def test_seed_plugins_publish_with_slices_dropped_per_attribute(autojump_clock: Any) -> None:
    from nodeagent.protos.dra.v1alpha3 import api_pb2
    from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2

    def attr(name: str, **value: Any) -> v1alpha2.NamedResourcesAttribute:
        return v1alpha2.NamedResourcesAttribute(
            name=name, attributeValue=v1alpha2.NamedResourcesAttributeValue(**value)
        )

    msg = api_pb2.NodeListAndWatchResourcesResponse(
        resources=[
            v1alpha2.ResourceModel(
                namedResources=v1alpha2.NamedResourcesResources(
                    instances=[
                        v1alpha2.NamedResourcesInstance(
                            name="gpu-0",
                            attributes=[
                                attr("index", int=0),
                                attr("numa", intSlice=v1alpha2.NamedResourcesIntSlice(ints=[0])),
                            ],
                        )
                    ]
                )
            )
        ]
    )
    cluster, plugins = FakeCluster(), Plugins()
    before = metrics.ATTRIBUTES_REJECTED.labels("seed.example.com")._value.get()
    async with running(cluster, plugins):
        plugins.send(msg, name="seed.example.com")
        await settle()
        (obj,) = slices(cluster)
        assert obj["spec"]["pool"]["name"] == "node-a"  # the seed's one pool: the node
        assert obj["spec"]["devices"] == [{"name": "gpu-0", "attributes": {"index": {"int": 0}}}]
        assert metrics.ATTRIBUTES_REJECTED.labels("seed.example.com")._value.get() == before + 1
        (event,) = cluster.events
        assert event["namespace"] == "default" and event["type"] == "Warning"
        assert event["reason"] == "ResourceAttributeNotPublished"
        assert event["involvedObject"] == {"kind": "Node", "name": "node-a", "uid": "node-a"}
        assert "'gpu-0': attribute 'numa': int slices" in event["message"]


async def test_an_unparsable_observed_slice_hides_nothing_else(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(3))
        await settle()
        # Ours by its label, but nested deeper than the planner accepts.
        deep = b'{"x":' * 200 + b"1" + b"}" * 200
        cluster.put_raw(
            "zz-bad",
            b'{"metadata":{"name":"zz-bad","resourceVersion":"1","labels":'
            b'{"app.kubernetes.io/managed-by":"nodeagent"}},"spec":{"driver":"gpu.example.com",'
            b'"pool":{"name":"node-a"},"devices":[{"name":"d","attributes":' + deep + b"}]}}",
        )
        plugins.send(inventory(3, memory="1Gi"))
        await settle()
        assert [c[0] for c in cluster.writes()] == ["create", "update"]
