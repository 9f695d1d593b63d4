"""The health stream's pacing: a change goes at once, a heartbeat waits for the resend time."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from nodeagent.sdk import DeviceHealth, Health, KubeletPlugin, PreparedDevice
from nodeagent.sdk.kubelet import KubeletDriver, _health_key


async def _never(claim: object) -> list[PreparedDevice]:
    raise AssertionError("not called")


def driver(tmp_path: Path, timeout: int = 0) -> KubeletDriver:
    options = KubeletPlugin(prepare=_never, cdi_dir=str(tmp_path / "cdi"), health_timeout=timeout)
    return KubeletDriver("gpu.example.com", options, str(tmp_path), None)


async def test_a_change_is_sent_at_once_a_heartbeat_by_the_resend_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    d = driver(tmp_path)
    d.set_health([DeviceHealth("p", "gpu-0", Health.HEALTHY, updated=1.0)])
    sent = _health_key(d.health.value)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:

        async def heartbeat_then_fault() -> None:
            await trio.sleep(1)
            d.set_health([DeviceHealth("p", "gpu-0", Health.HEALTHY, updated=2.0)])  # same
            await trio.sleep(1)
            d.set_health([DeviceHealth("p", "gpu-0", Health.UNHEALTHY, "ECC", updated=3.0)])

        nursery.start_soon(heartbeat_then_fault)
        _, statuses = await d.next_health(d.health.version, sent)
    assert trio.current_time() - start == 2  # not at the heartbeat, at the change
    assert [(h.health, h.message) for h in statuses] == [(Health.UNHEALTHY, "ECC")]
    # Nothing changes: the list goes again a third of the kubelet's default timeout (30 s) later,
    # with the newest report's time.
    start = trio.current_time()
    d.set_health([DeviceHealth("p", "gpu-0", Health.UNHEALTHY, "ECC", updated=4.0)])
    _, statuses = await d.next_health(d.health.version - 1, _health_key(statuses))
    assert trio.current_time() - start == 10
    assert [h.updated for h in statuses] == [4.0]


async def test_the_resend_follows_the_drivers_own_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    d = driver(tmp_path, timeout=90)
    start = trio.current_time()
    await d.next_health(d.health.version, _health_key(()))
    assert trio.current_time() - start == 30
