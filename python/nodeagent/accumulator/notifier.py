"""Coalescing, level-triggered change notification.

Producers call `poke()` (never blocks). The consumer awaits `wait()`. A change arriving when
the last notification is at least `interval` old is offered at once; otherwise it is offered
when `interval` has passed, together with everything that arrived meanwhile. The offer is a
flag, not a message: a busy consumer finds one pending notification for all that happened,
and intake never waits for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from nodeagent.accumulator import metrics
from nodeagent.core.wake import Wake


class ChangeNotifier:
    def __init__(self, interval: float, ready: Callable[[], bool]) -> None:
        self.interval = interval
        self._ready = ready  # bootstrap done, no relist half-applied, and something pending
        self._poked = Wake()
        self._offered = Wake()
        self._last_offer = -math.inf

    def poke(self) -> None:
        self._poked.set()

    def clear(self) -> None:
        """The consumer took everything: withdraw a pending offer."""
        self._offered.clear()

    async def wait(self) -> None:
        await self._offered.wait()

    async def run(self) -> None:
        while True:
            await self._poked.wait()
            if not self._ready():
                continue
            due = self._last_offer + self.interval
            if trio.current_time() < due:
                # Changes arriving while we wait are folded into this offer.
                await trio.sleep_until(due)
                if not self._ready():
                    continue
            self._last_offer = trio.current_time()
            if not self._offered.is_set():
                metrics.NOTIFICATIONS.inc()
                self._offered.set()
