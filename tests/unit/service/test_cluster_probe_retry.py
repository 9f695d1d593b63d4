"""A failed apiserver probe is retried after 1 s, doubling up to the probe interval, so the agent
is ready again within seconds of the apiserver coming back (found by the fault matrix:
"apiserver restart mid-watch" left the kube component not ready for a whole 30 s interval)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from nodeagent.kube.settings import KubeSettings
from nodeagent.service.cluster import ClusterComponent
from tests.unit.service.test_cluster_and_status import FakeClient


async def test_a_failed_probe_is_retried_with_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[float] = []
    down_until = 5.0  # the apiserver answers again 5 s after the start

    async def probe(client: Any) -> str:
        calls.append(trio.current_time())
        if trio.current_time() < down_until:
            raise OSError("connection refused")
        return "v1.35.4"

    cluster = ClusterComponent(
        KubeSettings(),
        load_client=lambda s: FakeClient(),  # type: ignore[arg-type,return-value]  # a fake KubeClient
        probe=probe,
        probe_interval=30,
    )
    start = trio.current_time()
    async with cluster.connected(), trio.open_nursery() as nursery:
        await nursery.start(cluster.run)
        await trio.sleep(8)
        assert cluster.readiness() == (True, "connected (apiserver v1.35.4)")
        # Retries after 1, 2 and 4 s: ready 7 s after the start, then one probe per interval.
        assert [round(t - start) for t in calls] == [0, 1, 3, 7]
        await trio.sleep(30)
        assert [round(t - start) for t in calls] == [0, 1, 3, 7, 37]
        nursery.cancel_scope.cancel()
