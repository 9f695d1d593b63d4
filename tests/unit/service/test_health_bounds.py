"""Health that real faults reach, bounded (issue 21 section 4): each component's readiness names a
failing part of its job at once, but turns not ready only once it has failed for longer than its
bound (a brief control-plane restart must not flip readiness); what does not heal with time
(a refused pool, a Forbidden list, a first sync never done) is not ready at once. Readiness is
driven through stand-ins for the publisher, the CNR writer and the plugin records under Trio's
clock; the same signals end to end: tests/process/test_dynconfig_rollback_unpublished_pool.py
and tests/process/test_cluster.py."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client import REGISTRY

from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.core.errors import ConfigError
from nodeagent.core.latest import LatestValue
from nodeagent.kube import EventRecorder
from nodeagent.plugins.manager import PluginManager
from nodeagent.plugins.settings import PluginSettings
from nodeagent.plugins.state import PluginRecord, PluginState
from nodeagent.reporter.component import ReporterComponent
from nodeagent.reporter.settings import ReporterSettings
from nodeagent.resources.component import ResourcesComponent
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.service.settings import AgentSettings

POOL = ("gpu.example.com", "node-a")


def failing_seconds(component: str, signal: str) -> float:
    labels = {"component": component, "signal": signal}
    return REGISTRY.get_sample_value("nodeagent_health_failing_seconds", labels) or 0.0


@dataclass
class Pub:
    """The part of the publisher readiness reads."""

    failing_: dict[tuple[str, str], str] = field(default_factory=dict)
    refused_: set[tuple[str, str]] = field(default_factory=set)
    waiting_: dict[tuple[str, str], float] = field(default_factory=dict)
    blocked_: str | None = None
    standalone = False
    synced = True

    def counts(self) -> tuple[int, int, int]:
        return 1, 1, 1

    def rejected(self) -> list[str]:
        return []

    def blocked(self) -> str | None:
        return self.blocked_

    def failing(self) -> dict[tuple[str, str], str]:
        return dict(self.failing_)

    def refused(self) -> set[tuple[str, str]]:
        return set(self.refused_)

    def invalid(self) -> set[tuple[str, str]]:
        return set()

    def waiting(self) -> dict[tuple[str, str], float]:
        return dict(self.waiting_)

    def pending(self) -> int:
        return len(self.waiting_)


@dataclass
class Acc:
    unready: str | None = None
    bootstrapped = True

    def unready_reason(self) -> str | None:
        return self.unready

    def not_ready_reason(self) -> str | None:
        return self.unready

    def problems(self) -> dict[str, str]:
        return {}


def resources(bound: float = 120.0) -> tuple[ResourcesComponent, Pub, Acc]:
    inventories: LatestValue[Mapping[str, Any]] = LatestValue({})
    comp = ResourcesComponent(
        node_name="node-a",
        inventories=inventories,
        settings=LatestValue(ResourcesSettings(publish_failure_bound=bound)),
        accumulator_settings=AccumulatorSettings(),
        client=object(),  # type: ignore[arg-type]  # never used: run() is not called
        events=EventRecorder("node-a"),
    )
    pub, acc = Pub(), Acc()
    comp.publisher, comp.accumulator = pub, acc  # type: ignore[assignment]
    return comp, pub, acc


async def test_a_pool_whose_writes_fail_is_not_ready_only_past_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    comp, pub, _ = resources()
    pub.failing_[POOL] = "503 ServiceUnavailable: etcd leader changed"
    ready, why = comp.readiness()
    assert ready, why
    assert why.endswith(
        "; writing pool node-a of driver gpu.example.com fails (retrying): "
        "503 ServiceUnavailable: etcd leader changed"
    )
    await trio.sleep(120)
    assert comp.readiness()[0]
    assert failing_seconds("resources", "unpublished_pools") == 120
    await trio.sleep(1)
    assert comp.readiness() == (
        False,
        "pool node-a of driver gpu.example.com not published for 121s (bound 120s): "
        "writing it fails: 503 ServiceUnavailable: etcd leader changed",
    )
    # Published at last: ready, and the lapse is over.
    pub.failing_.clear()
    assert comp.readiness()[0]
    assert failing_seconds("resources", "unpublished_pools") == 0


async def test_a_pool_whose_changes_are_held_back_is_not_ready_past_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # resources.min_sync_interval of an hour: a pool queued, its last sync long ago.
    comp, pub, _ = resources(bound=30)
    pub.waiting_[POOL] = trio.current_time()
    assert comp.readiness()[0]
    await trio.sleep(20)
    # A sync ran meanwhile (a churning pool under a short interval): the lapse starts again.
    pub.waiting_[POOL] = trio.current_time()
    await trio.sleep(29)
    assert comp.readiness()[0]
    await trio.sleep(2)
    ready, why = comp.readiness()
    assert not ready
    assert why == (
        "pool node-a of driver gpu.example.com not published for 31s (bound 30s): "
        "its changes are not written yet (held back or retried later)"
    )


async def test_what_does_not_heal_with_time_is_not_ready_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    comp, pub, acc = resources()
    pub.failing_[POOL] = "pool node-a holds slices not managed by nodeagent (x)"
    pub.refused_.add(POOL)
    assert comp.readiness() == (False, "pool node-a holds slices not managed by nodeagent (x)")
    pub.failing_.clear()
    pub.refused_.clear()
    # Writes held back while the slices' watch relists: ready within the watch's bound...
    pub.blocked_ = "the observed state is not known (resourceslices: relisting)"
    ready, why = comp.readiness()
    assert ready and why.endswith("; writes held back: " + pub.blocked_), why
    # ...not past it (the accumulator says so), nor when the list is Forbidden.
    acc.unready = "resourceslices: relist failed 9x (not known for 121s, bound 120s)"
    assert comp.readiness() == (False, f"nothing is written: {pub.blocked_}")
    pub.blocked_, acc.unready = "waiting for Node node-a", None
    assert comp.readiness() == (False, "nothing is written: waiting for Node node-a")


@dataclass
class Writer:
    error: str | None = None
    synced: bool = True
    synced_at: float | None = 0.0
    standalone = False
    merged = None


async def test_cnr_writes_failing_are_not_ready_only_past_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    comp = ReporterComponent(
        node_name="node-a",
        plugins=LatestValue({}),
        settings=LatestValue(ReporterSettings(cnr_failure_bound=60)),
        accumulator_settings=AccumulatorSettings(),
        state_dir=None,
        client=object(),  # type: ignore[arg-type]  # never used: run() is not called
        events=EventRecorder("node-a"),
        in_tree=[],
    )
    writer = Writer()
    comp.writer, comp.accumulator = writer, Acc()  # type: ignore[assignment]
    assert comp.readiness() == (True, "0 CNR fields in sync")
    await trio.sleep(10)
    writer.error, writer.synced = "ConnectError: connection refused", False
    ready, why = comp.readiness()
    assert ready and why == (
        "0 CNR fields not in sync; writing the CNR fails for 0s (bound 60s): "
        "ConnectError: connection refused"
    ), why
    await trio.sleep(60)
    assert comp.readiness()[0]
    await trio.sleep(1)
    assert comp.readiness() == (
        False,
        "writing the CNR fails for 61s (bound 60s): ConnectError: connection refused",
    )
    # Never in sync in this run: at once.
    writer.synced_at = None
    assert comp.readiness() == (False, "writing the CNR fails: ConnectError: connection refused")


async def test_an_unreachable_plugin_is_not_ready_only_past_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    manager = PluginManager(
        PluginSettings(registry_dir="/nonexistent", unreachable_bound=40),
        object(),  # type: ignore[arg-type]  # the bridge: no plugin is dialled here
    )
    manager._watcher.scanned = True
    record = PluginRecord(
        socket="/r/gpu.sock", generation=1, state=PluginState.REGISTERED, name="gpu"
    )
    manager._caches.records[record.socket] = record
    assert manager.readiness() == (True, "1 plugins registered, 0 not registered")
    record.probe_failures = 1
    ready, why = manager.readiness()
    assert ready and why.endswith(
        "; a plugin unreachable for 0s (bound 40s): gpu: 1 probes failed in a row"
    ), why
    await trio.sleep(20)
    # Deregistered by its probes, its registration then failing: the same socket, still lapsing.
    record.state, record.last_error = PluginState.FAILED, "deregistered after 2 failed probes"
    assert manager.readiness()[0]
    await trio.sleep(21)
    assert manager.readiness() == (
        False,
        "a plugin unreachable for 41s (bound 40s): gpu: deregistered after 2 failed probes",
    )
    record.state, record.last_error, record.probe_failures = PluginState.REGISTERED, "", 0
    assert manager.readiness()[0]


async def test_a_stale_plugin_socket_is_never_held_against_readiness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Issue 29 item 1: a socket nobody listens on (its plugin killed) is a plugin that left.
    manager = PluginManager(
        PluginSettings(registry_dir="/nonexistent", unreachable_bound=40),
        object(),  # type: ignore[arg-type]  # the bridge: no plugin is dialled here
    )
    manager._watcher.scanned = True
    record = PluginRecord(
        socket="/r/gpu.sock", generation=1, state=PluginState.REGISTERED, name="gpu"
    )
    manager._caches.records[record.socket] = record
    manager._caches.socket_refused(record, "deregistered after 2 failed probes")
    stale = (
        "1 stale sockets refuse connections (nobody listening: remove them or restart their "
        "plugins): /r/gpu.sock"
    )
    for _ in range(30):  # 10 s apart: the status loop's heartbeat, well past the bound
        assert manager.readiness() == (True, f"0 plugins registered, 0 not registered; {stale}")
        await trio.sleep(10)
    assert failing_seconds("plugins", "unreachable_plugins") == 0.0


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda v: ResourcesSettings(publish_failure_bound=v), "resources.publish_failure_bound"),
        (lambda v: ReporterSettings(cnr_failure_bound=v), "reporter.cnr_failure_bound"),
        (
            lambda v: PluginSettings(registry_dir="/r", unreachable_bound=v),
            "plugins.unreachable_bound",
        ),
        (
            lambda v: AgentSettings(node_name="n", state_dir="/s", apiserver_unreachable_bound=v),
            "agent.apiserver_unreachable_bound",
        ),
    ],
)
@pytest.mark.parametrize("value", [0.0, -5.0, math.inf, math.nan])
def test_bounds_are_finite_and_positive(build: Any, field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build(value).validate()


async def test_node_status_writes_failing_are_not_ready_only_past_the_bound(
    tmp_path: Any, autojump_clock: trio.testing.MockClock
) -> None:
    from tests.unit.accumulator.test_accumulator import synced
    from tests.unit.dynconfig.test_component import running

    async with running(tmp_path, refuse=True) as rig:
        await synced(await rig.client.sink("nodes"), {"metadata": {"name": "node-a", "uid": "n"}})
        await trio.sleep(0.5)  # the first write refused
        assert rig.component.condition.error is not None
        # Readiness is asked every heartbeat (the status loop); here every 10 s.
        for _ in range(12):
            ready, why = rig.component.readiness()
            assert ready, why
            await trio.sleep(10)
        ready, why = rig.component.readiness()
        assert (
            ready and "writing the NodeAgentConfigOK condition fails for 120s (bound 120s)" in why
        )
        await trio.sleep(1)
        ready, why = rig.component.readiness()
        assert not ready and why.startswith(
            "writing the NodeAgentConfigOK condition fails for 121s (bound 120s): "
        ), why
        assert "nodes/status is forbidden" in why
        rig.client.refuse = False
        await trio.sleep(70)  # the next attempt (backoff up to 60 s) writes it
        assert rig.component.readiness()[0]


async def test_a_plugin_whose_stream_is_down_is_not_ready_only_past_the_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Handler:
        state = "open"

        def plugin_status(self, name: str, *, message: bool = True) -> dict[str, Any]:
            error = "StreamTerminatedError: connection lost" if self.state == "backoff" else ""
            return {
                "owner_socket": "/r/gpu.sock",
                "stream_state": self.state,
                "stream_error": error,
            }

    manager = PluginManager(
        PluginSettings(registry_dir="/nonexistent", unreachable_bound=40),
        object(),  # type: ignore[arg-type]  # the bridge: no plugin is dialled here
    )
    manager._watcher.scanned = True
    handler = Handler()
    manager._handlers = {"DRAPlugin": handler}  # type: ignore[dict-item]
    record = PluginRecord(
        socket="/r/gpu.sock",
        generation=1,
        state=PluginState.REGISTERED,
        name="gpu",
        plugin_type="DRAPlugin",
    )
    manager._caches.records[record.socket] = record
    assert manager.readiness() == (True, "1 plugins registered, 0 not registered")
    handler.state = "backoff"  # the stream broke; reopened with backoff
    assert manager.readiness()[0]
    await trio.sleep(41)
    assert manager.readiness() == (
        False,
        "a plugin unreachable for 41s (bound 40s): gpu: stream down: "
        "StreamTerminatedError: connection lost",
    )
    handler.state = "open"
    assert manager.readiness()[0]
