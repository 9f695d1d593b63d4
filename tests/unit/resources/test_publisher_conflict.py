"""A 409 Conflict means the pool's observed state is stale: the retry waits for the watch to show
a newer state (or `CONFLICT_STALE_WAIT`) instead of re-sending the same stale write every few
milliseconds. Found by the fault matrix (tests/faults, "reset mid-response": a write whose answer
was lost, then 8 conflicting writes in 0.7 s while the watch reconnected)."""

from __future__ import annotations

import copy
from typing import Any

import trio

from nodeagent.kube.errors import Conflict
from nodeagent.resources.publisher import CONFLICT_STALE_WAIT
from tests.support.fake_resourceslices import FakeCluster
from tests.unit.resources.test_publisher import Plugins, inventory, running, settle, slices


def updates(cluster: FakeCluster) -> int:
    return [c[0] for c in cluster.writes()].count("update")


async def test_a_conflict_waits_for_a_newer_observed_state(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins) as pub:  # retry backoff from 5 ms
        plugins.send(inventory(3))
        await settle()
        cluster.faults = [Conflict(409, "Conflict", "stale") for _ in range(3)]
        plugins.send(inventory(3, memory="1Gi"))
        await settle()
        assert updates(cluster) == 1
        # Nothing newer observed: no second write for the whole wait (5 ms backoff alone
        # would have made ~7 more by now).
        await trio.sleep(CONFLICT_STALE_WAIT * 0.9)
        assert updates(cluster) == 1
        assert list(pub.failing()) == [("gpu.example.com", "node-a")]
        # The watch shows someone else's newer version: retried at once, before the wait ends.
        (obj,) = slices(cluster)
        cluster.put_external(copy.deepcopy(obj))
        await settle()
        assert updates(cluster) == 2
        cluster.faults.clear()
        (obj,) = slices(cluster)
        cluster.put_external(copy.deepcopy(obj))
        await settle()
        assert updates(cluster) == 3
        assert pub.failing() == {}
        (obj,) = slices(cluster)
        assert obj["spec"]["devices"][0]["capacity"]["memory"]["value"] == "1Gi"


async def test_a_stale_state_is_retried_after_the_wait(autojump_clock: Any) -> None:
    cluster, plugins = FakeCluster(), Plugins()
    async with running(cluster, plugins):
        plugins.send(inventory(3))
        await settle()
        cluster.faults = [Conflict(409, "Conflict", "stale")]
        plugins.send(inventory(3, memory="1Gi"))
        await settle()
        await trio.sleep(CONFLICT_STALE_WAIT * 1.1)
        # One retry once the wait is over, and it succeeds: the conflict was not about state.
        assert updates(cluster) == 2
        (obj,) = slices(cluster)
        assert obj["spec"]["devices"][0]["capacity"]["memory"]["value"] == "1Gi"
