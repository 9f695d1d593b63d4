"""The resources component: readiness through its states, the observer forwarder across
restarts, and the /v1/resourceslices view."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import trio
import trio.testing

from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.kube.client import WriteEvent
from nodeagent.plugins.latest import LatestValue
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.service.resources import ResourcesComponent, slice_summary


class ObservedClient:
    """Only what the forwarder touches at construction: observer registration."""

    def __init__(self) -> None:
        self.observers: list[Callable[[WriteEvent], None]] = []

    def add_write_observer(self, fn: Callable[[WriteEvent], None]) -> None:
        self.observers.append(fn)


def component(client: Any = None) -> ResourcesComponent:
    inventories: LatestValue[Mapping[str, Any]] = LatestValue({})
    return ResourcesComponent(
        node_name="node-a",
        inventories=inventories,
        settings=ResourcesSettings(),
        accumulator_settings=AccumulatorSettings(),
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


def test_one_forwarder_per_client_whatever_the_restarts() -> None:
    client = ObservedClient()
    comp = component(client)
    assert len(client.observers) == 1
    assert comp.view()["sync"] == {
        "observed_complete": False,
        "synced": False,
        "pending_pools": 0,
        "blocked": None,
        "failing_pools": [],
        "not_ready_reason": "starting",
    }
    seen: list[WriteEvent] = []
    watch = comp._watch_client
    assert watch is not None
    watch.add_write_observer(lambda e: seen.append(("old", e)))  # type: ignore[arg-type]
    watch.add_write_observer(seen.append)  # a restarted accumulator replaces the old one
    event = WriteEvent(None, "create", None, "s", b"{}")  # type: ignore[arg-type]
    client.observers[0](event)
    assert seen == [event]
    assert len(client.observers) == 1


def test_slice_summary_counts_slices_and_devices() -> None:
    view = {
        "drivers": {
            "b.example.com": {"registered": False, "last_error": "bad", "pools": {}},
            "a.example.com": {
                "registered": True,
                "last_error": "",
                "pools": {"p": [{"devices": [{}, {}]}, {"devices": [{}]}], "q": [{}]},
            },
        }
    }
    assert slice_summary(view) == [
        {
            "driver": "a.example.com",
            "pool": "p",
            "slices": 2,
            "devices": 3,
            "registered": True,
            "last_error": "",
        },
        {
            "driver": "a.example.com",
            "pool": "q",
            "slices": 1,
            "devices": 0,
            "registered": True,
            "last_error": "",
        },
    ]


async def test_readiness_counts_without_building_the_slices(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from nodeagent.plugins.handler import PluginData
    from tests.unit.resources.test_publisher import inventory

    inventories: LatestValue[Mapping[str, Any]] = LatestValue({})
    comp = ResourcesComponent(
        node_name="node-a",
        inventories=inventories,
        settings=ResourcesSettings(),
        accumulator_settings=AccumulatorSettings(),
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
