from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from nodeagent.core.errors import ConfigError
from nodeagent.kube.settings import KubeSettings
from nodeagent.service.cli_view import exit_code, render, table
from nodeagent.service.cluster import STANDALONE_REASON, ClusterComponent


class FakeClient:
    entered = 0

    async def __aenter__(self) -> FakeClient:
        self.entered += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


async def test_standalone_is_ready_and_idle(autojump_clock: trio.testing.MockClock) -> None:
    cluster = ClusterComponent(KubeSettings(), load_client=lambda s: None)
    cluster.preflight()
    assert cluster.mode == "standalone"
    async with trio.open_nursery() as nursery:
        await nursery.start(cluster.run)
        assert cluster.readiness() == (True, STANDALONE_REASON)
        nursery.cancel_scope.cancel()


async def test_cluster_readiness_follows_the_probe(autojump_clock: trio.testing.MockClock) -> None:
    outcomes: list[str | Exception] = ["v1.33.0", OSError("connection refused"), "v1.33.1"]

    async def probe(client: Any, known: str | None) -> str:
        outcome = outcomes.pop(0) if len(outcomes) > 1 else outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    client = FakeClient()
    cluster = ClusterComponent(
        KubeSettings(),
        load_client=lambda s: client,  # type: ignore[arg-type,return-value]  # a fake KubeClient
        probe=probe,
        probe_interval=10,
    )
    async with cluster.connected() as opened, trio.open_nursery() as nursery:
        assert opened is client and cluster.client is client  # type: ignore[comparison-overlap]
        await nursery.start(cluster.run)
        await trio.testing.wait_all_tasks_blocked()
        assert cluster.mode == "cluster" and client.entered == 1
        assert cluster.readiness() == (True, "connected (apiserver v1.33.0)")
        await trio.sleep(10)
        await trio.testing.wait_all_tasks_blocked()
        # Once connected, an unreachable apiserver (a control-plane restart) is reported but
        # keeps the component ready within agent.apiserver_unreachable_bound (120 s).
        assert cluster.readiness() == (
            True,
            "apiserver unreachable for 0s (bound 120s): connection refused",
        )
        await trio.sleep(10)
        await trio.testing.wait_all_tasks_blocked()
        assert cluster.readiness() == (True, "connected (apiserver v1.33.1)")
        nursery.cancel_scope.cancel()


async def test_apiserver_unreachable_longer_than_the_bound_is_not_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outcomes: list[str | Exception] = ["v1.35.0", OSError("connection refused")]

    async def probe(client: Any, known: str | None) -> str:
        outcome = outcomes.pop(0) if len(outcomes) > 1 else outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    cluster = ClusterComponent(
        KubeSettings(),
        load_client=lambda s: object(),  # type: ignore[arg-type,return-value]  # a fake client
        probe=probe,
        probe_interval=10,
        unreachable_bound=30,
    )
    cluster.preflight()
    async with trio.open_nursery() as nursery:
        await nursery.start(cluster.run)
        await trio.sleep(10.5)  # connected at 0, unreachable from the probe at 10
        ready, reason = cluster.readiness()
        assert ready and reason.startswith("apiserver unreachable for 0s (bound 30s)"), reason
        await trio.sleep(29)
        assert cluster.readiness()[0]
        await trio.sleep(2)  # 31 s unreachable
        assert cluster.readiness() == (False, "apiserver unreachable: connection refused")
        nursery.cancel_scope.cancel()


async def test_apiserver_never_reached_is_not_ready_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def probe(client: Any, known: str | None) -> str:
        raise OSError("connection refused")

    cluster = ClusterComponent(
        KubeSettings(),
        load_client=lambda s: object(),  # type: ignore[arg-type,return-value]  # a fake client
        probe=probe,
    )
    cluster.preflight()
    async with trio.open_nursery() as nursery:
        await nursery.start(cluster.run)
        await trio.sleep(0.5)
        assert cluster.readiness() == (False, "apiserver unreachable: connection refused")
        nursery.cancel_scope.cancel()


def test_preflight_names_kube_fields() -> None:
    def bad(settings: KubeSettings) -> None:
        raise ConfigError("kubeconfig", "/x", "cannot read")

    with pytest.raises(ConfigError) as info:
        ClusterComponent(KubeSettings(), load_client=bad).preflight()
    assert info.value.field == "kube.kubeconfig"


STATUS = {
    "version": "0.1.0",
    "node": "n1",
    "mode": "standalone",
    "pid": 42,
    "uptime_seconds": 3725.0,
    "ready": False,
    "registry_dir": "/r",
    "components": [
        {"name": "plugins", "ready": True, "phase": "running", "restarts": 0, "reason": "1 ok"},
        {"name": "kube", "ready": False, "phase": "backoff", "restarts": 2, "reason": "failed: x"},
    ],
}


def test_render_status_table() -> None:
    plugins = [
        {
            "name": "cpu",
            "type": "ReporterPlugin",
            "state": "registered",
            "stream_state": "streaming",
            "messages_received": 3,
            "last_message_time": 1_700_000_000.0,
            "last_error": "",
        }
    ]
    text = render(STATUS, plugins)
    lines = text.splitlines()
    assert lines[0] == "nodeagent 0.1.0 on node n1 (standalone), pid 42, up 1h2m5s: NOT READY"
    assert lines[2].split() == ["COMPONENT", "READY", "PHASE", "RESTARTS", "REASON"]
    assert lines[4].split() == ["kube", "no", "backoff", "2", "failed:", "x"]
    assert lines[7].split() == [
        "cpu",
        "ReporterPlugin",
        "registered",
        "streaming",
        "3",
        "2023-11-14T22:13:20Z",
        "-",
    ]
    assert exit_code(STATUS) == 1
    assert "no plugins (registry: /r)" in render({**STATUS, "ready": True}, [])
    assert exit_code({**STATUS, "ready": True}) == 0


def test_table_aligns_and_truncates() -> None:
    out = table(["A", "B"], [["x" * 80, None], ["y", True]], max_width=10)
    assert out.splitlines() == ["A           B", "xxxxxxxxx…  -", "y           yes"]
    assert table(["A"], [["x" * 10]], max_width=10).splitlines()[1] == "x" * 10  # fits: uncut


def test_a_failing_stream_shows_its_error() -> None:
    failing = {
        "name": "gpu",
        "type": "DRAPlugin",
        "state": "registered",
        "stream_state": "backoff",
        "stream_error": "UNAVAILABLE: connection refused",
        "last_error": "",
    }
    (row,) = render(STATUS, [failing]).splitlines()[7:8]
    assert row.endswith("UNAVAILABLE: connection refused")
    registration = {**failing, "stream_error": "", "last_error": "GetInfo timed out"}
    assert render(STATUS, [registration]).splitlines()[7].endswith("GetInfo timed out")
