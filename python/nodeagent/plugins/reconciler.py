"""The reconciler: turns the difference between desired and actual state into operations."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import trio

from nodeagent.core.wake import Wake
from nodeagent.plugins.executor import OperationExecutor
from nodeagent.plugins.state import Caches, SocketIdentity, operations

__all__ = ["Reconciler"]


class Reconciler:
    """Starts register/unregister operations until the actual state matches the desired one.

    Owns only its wake-up event. Each pass (`reconcile`) asks `state.operations` what to start:
    it unregisters first (a socket recreated at the same path is unregistered, then registered
    again), and registers a desired socket only when no operation on it is under way, it has no
    actual entry left to unregister, a rule did not reject this generation of it, and this
    generation's backoff has expired. It also forgets the record of a socket that is gone and
    settled. The loop runs a pass, then sleeps until `wake()` (the watcher, an operation or the
    monitor changed something) or until the earliest backoff expires, at most `scan_interval`
    (the kubelet reconciles every second, whatever happened).
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
        self._wake = Wake()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, nursery: trio.Nursery) -> None:
        """Reconcile until cancelled; operations run as tasks in `nursery`."""
        while True:
            next_due = self.reconcile(nursery)
            # Sleep until something changes or a backoff expires (at most a scan interval).
            delay = min(self._scan_interval(), max(next_due - trio.current_time(), 0.0))
            await self._wake.wait_for(delay)

    def reconcile(self, nursery: trio.Nursery) -> float:
        """Start the operations the plan asks for; return when a backed-off one is due."""
        executor = self._executor
        work = operations(self._caches, executor.busy, trio.current_time())
        for registered in work.unregister:
            executor.start_unregister(nursery, registered)
        for wanted in work.register:
            executor.start_register(nursery, wanted)
        self._prune()
        return work.next_due

    def _prune(self) -> None:
        seen = self._seen()
        records = self._caches.records
        for socket in list(records):
            gone = socket not in seen and self._caches.desired.get(socket) is None
            settled = not self._executor.busy(socket) and self._caches.actual.get(socket) is None
            if gone and settled:
                del records[socket]  # its backoff with it
                self._changed()
