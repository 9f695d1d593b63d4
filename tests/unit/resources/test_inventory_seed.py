"""Seed inventories through the tracker: one bad device is reported on its own (metric, Event,
log) while the rest of the inventory is accepted."""

from __future__ import annotations

import hashlib
from typing import Any

from google.protobuf.message import Message

from nodeagent.core.plugindata import PluginData
from nodeagent.protos.dra.v1alpha3 import api_pb2
from nodeagent.protos.k8s.api.resource.v1alpha2 import generated_pb2 as v1alpha2
from nodeagent.resources import metrics
from nodeagent.resources.inventory import InventoryTracker
from tests.support.fake_resourceslices import FakeCluster
from tests.unit.resources.test_publisher import Plugins, running, settle, slices


def _data(driver: str, message: Message) -> PluginData:
    return PluginData(driver, "DRAPlugin", "/x.sock", message, received_at=0.0, registered=True)


def _message(*names: str) -> api_pb2.NodeListAndWatchResourcesResponse:
    instances = [v1alpha2.NamedResourcesInstance(name=n) for n in names]
    return api_pb2.NodeListAndWatchResourcesResponse(
        resources=[
            v1alpha2.ResourceModel(
                namedResources=v1alpha2.NamedResourcesResources(instances=instances)
            )
        ]
    )


def test_a_device_without_a_v1_name_is_reported_and_the_rest_accepted() -> None:
    driver = "inv-seed.example.com"
    reports: list[tuple[str, str]] = []
    tracker = InventoryTracker("node-a", report=lambda r, m: reports.append((r, m)))
    before = metrics.DEVICES_REJECTED.labels(driver)._value.get()
    changed = tracker.update({driver: _data(driver, _message("gpu.0", "Bad_Name"))}, now=0.0)
    assert changed == {driver}
    inventory = tracker.drivers[driver].inventory
    assert inventory is not None
    digest = hashlib.sha256(b"gpu.0").hexdigest()[:8]
    assert [d.name for d in inventory.pools[0].devices] == [f"gpu-0-{digest}"]
    assert tracker.drivers[driver].last_error == ""
    assert metrics.DEVICES_REJECTED.labels(driver)._value.get() == before + 1
    assert reports == [
        (
            "ResourceDeviceNotPublished",
            f"plugin {driver!r}: device 'Bad_Name': name must be a DNS subdomain "
            "(lowercase alphanumerics, '-', '.'; <= 253)",
        )
    ]


def test_an_empty_seed_inventory_is_accepted_as_no_pools() -> None:
    driver = "inv-empty.example.com"
    tracker = InventoryTracker("node-a")
    tracker.update({driver: _data(driver, _message("gpu-0"))}, now=0.0)
    tracker.update({driver: _data(driver, api_pb2.NodeListAndWatchResourcesResponse())}, now=1.0)
    inventory = tracker.drivers[driver].inventory
    assert inventory is not None and inventory.pools == []


async def test_a_seed_plugin_with_zero_resources_publishes_zero_slices(autojump_clock: Any) -> None:
    driver = "zero.example.com"
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(_message(), name=driver)
        await settle()
        assert slices(cluster) == []
        plugins.send(_message("gpu.0", "gpu.1"), name=driver)
        await settle()
        (obj,) = slices(cluster)
        assert len(obj["spec"]["devices"]) == 2
        plugins.send(_message(), name=driver)
        await settle()
        assert slices(cluster) == []
