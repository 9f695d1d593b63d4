"""Issue 20 item 3, the stale backoff: registration backoff belongs to one socket generation. A
plugin that crash-looped (its registrations failing, the backoff grown toward 122 s) and is
replaced by a fixed version (a new socket at the same path) registers at the next scan, not when
the old generation's backoff expires. The real `PluginManager`, plugins answering through the
fake bridge, real socket files, the virtual clock."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from nodeagent.plugins.manager import PluginManager
from nodeagent.rpc.bridge import RpcError
from tests.support.fake_plugins import FakeBridge, FakeHandler, FakeRegistration, listen, settings
from tests.support.wait import wait_until

from .test_probe_results_apply_to_their_generation import info, recreate, status

SCAN_INTERVAL = 1.0


async def test_a_replaced_socket_registers_at_the_next_scan_not_after_the_old_backoff(
    registry: Path, autojump_clock: trio.testing.MockClock
) -> None:
    bridge, handler = FakeBridge(), FakeHandler()
    path = registry / "p.sock"
    broken = bridge.plugins[str(path)] = FakeRegistration(info())
    broken.error = RpcError("UNAVAILABLE", "crash-looping")
    manager = PluginManager(
        settings(
            registry,
            scan_interval=SCAN_INTERVAL,
            registration_backoff_initial=0.5,
            registration_backoff_max=122.0,
        ),
        bridge.as_bridge(),
        [handler],
    )
    with listen(path) as broken_socket:
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            # Eight failed registrations: the next one is 64 s away (0.5 s doubling).
            await broken.wait_calls(8)
            await trio.testing.wait_all_tasks_blocked()
            assert status(manager)[0] == "failed"
            # The fixed version: a new socket at the same path.
            broken_socket.close()
            bridge.plugins[str(path)] = FakeRegistration(info())
            with recreate(path):
                replaced_at = trio.current_time()
                await wait_until(
                    lambda: status(manager)[0] == "registered",
                    "the fixed socket registered",
                    timeout=600,
                    interval=0.001,  # virtual time: the wait must not add to what it measures
                )
                waited = trio.current_time() - replaced_at
                assert waited <= SCAN_INTERVAL + 0.01, f"registered {waited:.1f} s after"
            nursery.cancel_scope.cancel()
    assert broken.get_info_calls == 8  # the old generation was not retried meanwhile
