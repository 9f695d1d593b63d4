"""The reconciler: which operations it starts from the plan, and when it looks again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import trio

from nodeagent.plugins.executor import OperationExecutor
from nodeagent.plugins.reconciler import Reconciler
from nodeagent.plugins.state import (
    ActualPlugin,
    Caches,
    DesiredPlugin,
    PluginState,
    SocketIdentity,
)
from tests.support.fake_plugins import PLUGIN_TYPE, FakeExecutor, Kicks, identity, record


class Rig:
    def __init__(self) -> None:
        self.caches, self.kicks, self.executor = Caches(), Kicks(), FakeExecutor()
        self.seen: dict[str, SocketIdentity] = {}
        self.reconciler = Reconciler(
            self.caches,
            cast(OperationExecutor, self.executor),
            self._seen,
            1.0,
            changed=self.kicks.changed,
        )

    def _seen(self) -> Mapping[str, SocketIdentity]:
        return self.seen

    def want(self, socket: str, n: int) -> DesiredPlugin:
        self.seen[socket] = identity(n)
        return self.caches.desired.add_or_update(socket, identity(n))

    def have(self, wanted: DesiredPlugin) -> ActualPlugin:
        entry = ActualPlugin(wanted.socket, wanted.generation, PLUGIN_TYPE, "p", "", ())
        self.caches.actual.add(entry)
        return entry


async def test_a_new_socket_is_registered_once() -> None:
    rig = Rig()
    wanted = rig.want("/r/a.sock", 1)
    async with trio.open_nursery() as nursery:
        assert rig.reconciler.reconcile(nursery) == float("inf")
        rig.reconciler.reconcile(nursery)  # busy now: not started twice
    assert rig.executor.registers == [wanted]


async def test_a_recreated_socket_is_unregistered_before_it_registers_again() -> None:
    rig = Rig()
    old = rig.have(rig.want("/r/a.sock", 1))
    renewed = rig.want("/r/a.sock", 2)
    async with trio.open_nursery() as nursery:
        rig.reconciler.reconcile(nursery)
        assert rig.executor.unregisters == [old] and rig.executor.registers == []
        # The unregister ends: the actual entry is gone, the socket free.
        rig.caches.actual.remove("/r/a.sock")
        rig.executor.busy_sockets.clear()
        rig.reconciler.reconcile(nursery)
    assert rig.executor.registers == [renewed]


async def test_a_rejected_generation_waits_for_the_socket_to_be_recreated() -> None:
    rig = Rig()
    wanted = rig.want("/r/a.sock", 1)
    record(rig.caches, "/r/a.sock", wanted.generation, rejected_generation=wanted.generation)
    async with trio.open_nursery() as nursery:
        rig.reconciler.reconcile(nursery)
        assert rig.executor.registers == []
        renewed = rig.want("/r/a.sock", 2)
        rig.reconciler.reconcile(nursery)
    assert rig.executor.registers == [renewed]


async def test_a_backed_off_socket_waits_and_its_due_time_is_returned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig()
    wanted = rig.want("/r/a.sock", 1)
    due = trio.current_time() + 3.0
    record(rig.caches, "/r/a.sock", wanted.generation, retry_at=due)
    async with trio.open_nursery() as nursery:
        assert rig.reconciler.reconcile(nursery) == due
        assert rig.executor.registers == []
        await trio.sleep(3.0)
        rig.reconciler.reconcile(nursery)
    assert len(rig.executor.registers) == 1


async def test_the_backoff_of_an_old_generation_does_not_hold_a_recreated_socket() -> None:
    rig = Rig()
    old = rig.want("/r/a.sock", 1)
    record(rig.caches, "/r/a.sock", old.generation, retry_at=trio.current_time() + 120.0)
    renewed = rig.want("/r/a.sock", 2)
    async with trio.open_nursery() as nursery:
        assert rig.reconciler.reconcile(nursery) == float("inf")
    assert rig.executor.registers == [renewed]


async def test_the_record_of_a_socket_gone_and_settled_is_forgotten() -> None:
    rig = Rig()
    record(rig.caches, "/r/gone.sock", 1, state=PluginState.FAILED)
    record(rig.caches, "/r/busy.sock", 2)
    rig.executor.busy_sockets.add("/r/busy.sock")
    async with trio.open_nursery() as nursery:
        rig.reconciler.reconcile(nursery)
    assert list(rig.caches.records) == ["/r/busy.sock"]
    assert rig.kicks.changes == 1


async def test_the_loop_runs_a_pass_when_woken_and_at_least_every_scan_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rig = Rig()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rig.reconciler.run, nursery)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        rig.want("/r/a.sock", 1)
        rig.reconciler.wake()
        await trio.testing.wait_all_tasks_blocked()
        assert len(rig.executor.registers) == 1 and trio.current_time() == start
        # Without a wake-up, the next pass comes within a scan interval.
        rig.executor.busy_sockets.clear()
        rig.caches.desired.force_new_generation("/r/a.sock", identity(1))
        await trio.sleep(1.0)
        await trio.testing.wait_all_tasks_blocked()
        assert len(rig.executor.registers) == 2
        nursery.cancel_scope.cancel()
