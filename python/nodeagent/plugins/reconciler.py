"""The reconciler: turns the difference between desired and actual state into operations."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import trio

from nodeagent.plugins.executor import OperationExecutor
from nodeagent.plugins.state import Caches, SocketIdentity, plan

__all__ = ["Reconciler"]


class Reconciler:
    """Starts register/unregister operations until the actual state matches the desired one.

    Owns only its wake-up event. Each pass (`reconcile`) asks `state.plan` for the difference:
    it unregisters first (a socket recreated at the same path is unregistered, then registered
    again), and registers a desired socket only when no operation on it is under way, it has no
    actual entry left to unregister, a rule did not reject this generation of it, and its backoff
    has expired. It also forgets the record of a socket that is gone and settled. The loop runs
    a pass, then sleeps until `wake()` (the watcher, an operation or the monitor changed
    something) or until the earliest backoff expires, at most `scan_interval` (the kubelet
    reconciles every second, whatever happened).
    """

    def __init__(
        self,
        caches: Caches,
        executor: OperationExecutor,
        seen: Callable[[], Mapping[str, SocketIdentity]],
        scan_interval: float | Callable[[], float],
        *,
        changed: Callable[[], None],
    ) -> None:
        self._caches = caches
        self._executor = executor
        self._seen = seen  # the sockets the registry scan found
        self._scan_interval = scan_interval if callable(scan_interval) else lambda: scan_interval
        self._changed = changed
        self._wake = trio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, nursery: trio.Nursery) -> None:
        """Reconcile until cancelled; operations run as tasks in `nursery`."""
        while True:
            next_due = self.reconcile(nursery)
            # Sleep until something changes or a backoff expires (at most a scan interval).
            delay = min(self._scan_interval(), max(next_due - trio.current_time(), 0.0))
            with trio.move_on_after(delay):
                await self._wake.wait()
            self._wake = trio.Event()

    def reconcile(self, nursery: trio.Nursery) -> float:
        """Start the operations the plan asks for; return when a backed-off one is due."""
        now = trio.current_time()
        next_due = float("inf")
        executor = self._executor
        work = plan(self._caches.desired, self._caches.actual)
        for registered in work.unregister:
            if not executor.busy(registered.socket):
                executor.start_unregister(nursery, registered)
        for wanted in work.register:
            socket = wanted.socket
            if executor.busy(socket) or self._caches.actual.get(socket) is not None:
                continue  # its unregister must finish first
            record = self._caches.records.get(socket)
            if record is not None and record.rejected_generation == wanted.generation:
                continue
            retry_at = executor.retry_at(socket)
            if retry_at is not None and retry_at > now:
                next_due = min(next_due, retry_at)
                continue
            executor.start_register(nursery, wanted)
        self._prune()
        return next_due

    def _prune(self) -> None:
        seen = self._seen()
        records = self._caches.records
        for socket in list(records):
            gone = socket not in seen and self._caches.desired.get(socket) is None
            settled = not self._executor.busy(socket) and self._caches.actual.get(socket) is None
            if gone and settled:
                del records[socket]
                self._executor.forget(socket)
                self._changed()
