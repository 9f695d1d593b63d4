"""The resources component: readiness through its states, write observers across restarts,
and the /v1/resourceslices view."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio
import trio.testing

from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.core.latest import LatestValue
from nodeagent.kube import EventRecorder
from nodeagent.resources.component import ResourcesComponent, slice_summary
from nodeagent.resources.settings import ResourcesSettings
from tests.support.fake_http_apiserver import FakeCluster, mock_client


def component(client: Any = None) -> ResourcesComponent:
    inventories: LatestValue[Mapping[str, Any]] = LatestValue({})
    return ResourcesComponent(
        node_name="node-a",
        inventories=inventories,
        settings=LatestValue(ResourcesSettings()),
        accumulator_settings=AccumulatorSettings(),
        events=EventRecorder("node-a"),
        client=client,
    )


async def test_standalone_is_ready_and_shows_an_empty_view(
    autojump_clock: trio.testing.MockClock,
) -> None:
    comp = component()
    assert comp.readiness() == (False, "starting")
    async with trio.open_nursery() as nursery:
        await nursery.start(comp.run)
        assert comp.readiness() == (
            True,
            "standalone: 0 drivers, 0 pools, 0 slices desired, not written",
        )
        assert comp.view() == {"node": "node-a", "mode": "standalone", "drivers": {}}
        nursery.cancel_scope.cancel()


async def test_each_run_observes_writes_only_while_it_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with mock_client(FakeCluster()) as client:
        comp = component(client)
        assert comp.view()["sync"] == {
            "observed_complete": False,
            "synced": False,
            "pending_pools": 0,
            "blocked": None,
            "failing_pools": [],
            "not_ready_reason": "starting",
            "dropped_fields": [],
            "invalid_pools": [],
        }
        for _ in range(2):  # a restarted component builds a new accumulator
            async with trio.open_nursery() as nursery:
                await nursery.start(comp.run)
                acc = comp.accumulator
                assert acc is not None and client._observers == [acc._on_write]
                nursery.cancel_scope.cancel()
            assert client._observers == []  # restarts do not pile up observers


def test_slice_summary_counts_slices_and_devices() -> None:
    view = {
        "drivers": {
            "b.example.com": {"registered": False, "last_error": "bad", "pools": {}},
            "a.example.com": {
                "registered": True,
                "last_error": "",
                "pools": {"p": [{"devices": [{}, {}]}, {"devices": [{}]}], "q": [{}]},
            },
        },
        "sync": {
            "dropped_fields": [
                {
                    "driver": "a.example.com",
                    "pool": "p",
                    "field": "devices.taints",
                    "feature_gate": "DRADeviceTaints",
                },
                {"driver": "a.example.com", "pool": "p", "field": "x", "feature_gate": ""},
            ],
            "failing_pools": [{"driver": "a.example.com", "pool": "q", "error": "refused: 422"}],
        },
    }
    assert slice_summary(view) == [
        {
            "driver": "a.example.com",
            "pool": "p",
            "slices": 2,
            "devices": 3,
            "registered": True,
            "last_error": "",
            "dropped_fields": ["devices.taints (DRADeviceTaints)", "x"],
        },
        {
            "driver": "a.example.com",
            "pool": "q",
            "slices": 1,
            "devices": 0,
            "registered": True,
            "last_error": "refused: 422",
            "dropped_fields": [],
        },
    ]


async def test_readiness_counts_without_building_the_slices(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from nodeagent.core.plugindata import PluginData
    from tests.unit.resources.test_publisher import inventory

    inventories: LatestValue[Mapping[str, Any]] = LatestValue({})
    comp = ResourcesComponent(
        node_name="node-a",
        inventories=inventories,
        settings=LatestValue(ResourcesSettings()),
        accumulator_settings=AccumulatorSettings(),
        events=EventRecorder("node-a"),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(comp.run)
        data = PluginData(
            name="gpu.example.com",
            plugin_type="DRAPlugin",
            endpoint="/x.sock",
            message=inventory(200),
            received_at=0.0,
            registered=True,
        )
        inventories.set({"gpu.example.com": data})
        await trio.testing.wait_all_tasks_blocked()
        pub = comp.publisher
        assert pub is not None

        def built() -> dict[str, Any]:
            raise AssertionError("readiness built the desired slices")

        pub.desired_view = built  # type: ignore[method-assign]
        assert comp.readiness() == (
            True,
            "standalone: 1 drivers, 1 pools, 2 slices desired, not written",
        )
        nursery.cancel_scope.cancel()


def test_status_names_the_dropped_fields_and_a_refused_pool() -> None:
    from nodeagent.service.cli_view import render

    rows = [
        {
            "driver": "gpu.example.com",
            "pool": "node-a",
            "slices": 2,
            "devices": 4,
            "registered": True,
            "last_error": "",
            "dropped_fields": ["devices.taints (DRADeviceTaints)", "sharedCounters (X)"],
        },
        {
            "driver": "nic.example.com",
            "pool": "node-a",
            "slices": 1,
            "devices": 1,
            "registered": True,
            "last_error": "the API server refuses pool node-a (422 Invalid): Too long",
            "dropped_fields": [],
        },
    ]
    status = {"version": "0", "node": "n", "mode": "cluster", "resourceslices": rows}
    text = render(status, [])
    assert (
        "  pool node-a of gpu.example.com: the cluster drops devices.taints (DRADeviceTaints), "
        "sharedCounters (X)"
    ) in text.splitlines()
    assert "the API server refuses pool node-a (422 Invalid): Too long" in text
    assert "nic.example.com: the cluster drops" not in text
