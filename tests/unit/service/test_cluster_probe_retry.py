"""A failed apiserver probe is retried after 1 s, doubling up to the probe interval, so the agent
is ready again within seconds of the apiserver coming back (found by the fault matrix:
"apiserver restart mid-watch" left the kube component not ready for a whole 30 s interval)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
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

    async def probe(client: Any, known: str | None) -> str:
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
    async with cluster.connected(), trio.open_nursery() as nursery:
        await nursery.start(cluster.run)
        await trio.sleep(14.5)
        assert cluster.readiness() == (True, "connected (apiserver v1.35.4)")
        # Retries after 1, 2, 4, ... s, each up to half shorter (jitter: a fleet whose
        # apiserver restarted does not probe in step, issue 24 s5), until it answers; then one
        # probe per interval.
        *failed, ok = calls
        assert failed[-1] < down_until <= ok
        gaps = [b - a for a, b in itertools.pairwise(calls)]
        for i, gap in enumerate(gaps):
            assert 2**i / 2 <= gap <= 2**i, (i, gaps)
        await trio.sleep(30)
        assert calls[-2] == ok and calls[-1] - ok == pytest.approx(30)
        nursery.cancel_scope.cancel()


class RecordingClient(FakeClient):
    """Answers the probe's requests and records their paths; fails while `down`."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.down = False

    async def request(self, method: str, path: str, **_: Any) -> bytes:
        self.paths.append(path)
        if self.down:
            raise OSError("connection refused")
        return b'{"gitVersion": "v1.35.4"}' if path == "/version" else b"ok"


async def test_version_is_asked_when_connecting_and_every_tenth_probe_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # An idle agent's requests were mostly these probes: /readyz says whether the apiserver
    # answers; its version is asked again only on (re)connecting and every 5 min.
    client = RecordingClient()
    cluster = ClusterComponent(
        KubeSettings(),
        load_client=lambda s: client,  # type: ignore[arg-type,return-value]  # a fake KubeClient
        probe_interval=30,
    )
    async with cluster.connected(), trio.open_nursery() as nursery:
        await nursery.start(cluster.run)
        await trio.sleep(30 * 10 + 1)  # probes 0..10
        assert client.paths.count("/readyz") == 11 and client.paths.count("/version") == 2
        assert client.paths[:3] == ["/version", "/readyz", "/readyz"]
        assert client.paths[-2:] == ["/version", "/readyz"]  # the 10th probe after connecting
        assert cluster.readiness() == (True, "connected (apiserver v1.35.4)")
        client.down = True
        # Past the failed probe at 330 (its retry is 5-10 s later).
        await trio.sleep(30.5)
        # Unreachable, within agent.apiserver_unreachable_bound: reported, still ready.
        ready, reason = cluster.readiness()
        assert ready and reason.startswith("apiserver unreachable for "), reason
        client.down, client.paths = False, []
        # Retried 5-10 s after 330 (connected before: from PROBE_RETRY_CONNECTED, jittered):
        # reconnecting asks the version again.
        await trio.sleep(9)
        assert client.paths == ["/version", "/readyz"]
        assert cluster.readiness() == (True, "connected (apiserver v1.35.4)")
        nursery.cancel_scope.cancel()
