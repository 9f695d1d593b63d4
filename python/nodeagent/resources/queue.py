"""A work queue keyed by pool: deduplicated, rate-limited per key, with per-key exponential
backoff after failures.

Keys, not work items, are queued: a sync reads the newest desired and observed state when it
runs, so any number of changes to a pool while it waits coalesce into one sync, and the latest
inventory wins. A key runs at most once per `min_interval`: an isolated change runs at once, but
a flapping plugin's storm is held back and coalesced instead of being written state by state
(a sync takes a few milliseconds, so without the interval the worker would keep up with ~100
updates/s and write nearly every one).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import trio

from nodeagent.core.backoff import Backoff
from nodeagent.core.wake import Pulse, Wake

K = TypeVar("K", bound=Hashable)

__all__ = ["WorkQueue"]


class WorkQueue(Generic[K]):
    def __init__(
        self,
        backoff_initial: float,
        backoff_max: float,
        min_interval: float | Callable[[], float] = 0.0,
    ) -> None:
        # The upstream workqueue's per-item rate limiter: doubling, no jitter (one agent's keys
        # do not contend with other agents).
        self._backoff = Backoff(backoff_initial, backoff_max)
        # A callable is read at each add: the interval can change while the queue runs.
        self._min_interval = min_interval if callable(min_interval) else lambda: min_interval
        self._last_start: dict[K, float] = {}  # when each key's latest run started
        self._ready_at: dict[K, float] = {}  # queued keys and when they may run
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0
        self._failures: dict[K, int] = {}
        self._processing: set[K] = set()
        self._again: set[K] = set()  # added while processing: run once more after done()
        self._wakeup = Wake()  # a key added: the next due time may be sooner
        self._idle = Pulse()  # fired when the queue becomes idle

    def __len__(self) -> int:
        return len(self._ready_at) + len(self._again)

    def add(self, key: K, delay: float = 0.0) -> None:
        """Queue `key` to run after `delay` (sooner if it is already queued sooner)."""
        if key in self._processing:
            self._again.add(key)
            return
        at = trio.current_time() + delay
        last = self._last_start.get(key)
        if last is not None:
            at = max(at, last + self._min_interval())
        if self._ready_at.get(key, math.inf) <= at:
            return
        self._ready_at[key] = at
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, key))
        self._wakeup.set()

    def waiting(self) -> dict[K, float]:
        """Keys queued (waiting or due, or added again while processing) and when each one's
        latest run started (-inf: never)."""
        keys = [*self._ready_at, *self._again]
        return {k: self._last_start.get(k, -math.inf) for k in keys}

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> K:
        """The next key whose time has come; mark it processing until `done`."""
        while True:
            while self._heap:
                at, _, key = self._heap[0]
                if self._ready_at.get(key) != at:
                    heapq.heappop(self._heap)  # superseded by an earlier add
                    continue
                now = trio.current_time()
                if at > now:
                    break
                heapq.heappop(self._heap)
                del self._ready_at[key]
                self._processing.add(key)
                # Recorded even at interval 0: the interval may be raised at run time.
                self._last_start[key] = now
                return key
            self._wakeup.clear()
            await self._wakeup.wait_until(self._heap[0][0] if self._heap else math.inf)

    def done(self, key: K, *, failed: bool = False, keep_backoff: bool = False) -> float | None:
        """The key's sync finished. A failure requeues it after its next backoff delay
        (doubling per consecutive failure; returned), also when it was added meanwhile; a
        success resets the backoff (unless `keep_backoff`: a sync that only waited), and a key
        added while it was processing runs again, once its minimum interval has passed."""
        self._processing.discard(key)
        delay = None
        again = key in self._again
        self._again.discard(key)
        if failed:
            # The retry reads the newest state anyway; running at once because something
            # (the failed sync's own partial writes, say) changed meanwhile would make the
            # backoff moot.
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
            delay = self._backoff.delay(n + 1)
            self.add(key, delay)
        else:
            if not keep_backoff:
                self._failures.pop(key, None)
            if again:
                self.add(key)
        if self._is_idle():
            self._idle.fire()
        return delay

    def _is_idle(self) -> bool:
        return not (self._ready_at or self._processing)

    async def wait_idle(self) -> None:
        """Until nothing is queued (waiting or due) and nothing is processing."""
        while not self._is_idle():
            await self._idle.wait()
