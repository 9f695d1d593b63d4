"""The main loop's heartbeat: liveness for /healthz, loop lag, and the systemd watchdog ping.

Pinging the watchdog from this tick (and not from a thread) is the point: when the Trio loop is
stuck, the ping stops and systemd restarts the agent.
"""

from __future__ import annotations

import trio

from nodeagent.service.metrics import LOOP_LAG
from nodeagent.service.sdnotify import SystemdNotifier


class Heartbeat:
    def __init__(
        self,
        interval: float,
        notifier: SystemdNotifier,
        *,
        stale_after: float,
    ) -> None:
        self.interval = interval
        self.stale_after = stale_after
        self.notifier = notifier
        self.last_tick: float | None = None
        self.last_lag = 0.0
        self.ticks = 0
        self.watchdog_pings = 0

    def liveness(self) -> tuple[bool, float | None]:
        """(alive, seconds since the last tick)."""
        if self.last_tick is None:
            return False, None
        age = trio.current_time() - self.last_tick
        return age <= self.stale_after, age

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        watchdog = self.notifier.watchdog_interval
        now = trio.current_time()
        self._tick(now)
        next_tick = now + self.interval
        next_ping = now if watchdog is not None else None
        task_status.started()
        while True:
            wake = next_tick if next_ping is None else min(next_tick, next_ping)
            await trio.sleep_until(wake)
            now = trio.current_time()
            lag = max(0.0, now - wake)
            self.last_lag = lag
            LOOP_LAG.set(lag)
            self._tick(now)
            if next_ping is not None and watchdog is not None and now >= next_ping:
                self.notifier.watchdog()
                self.watchdog_pings += 1
                next_ping = now + watchdog
            if now >= next_tick:
                next_tick = now + self.interval

    def _tick(self, now: float) -> None:
        self.last_tick = now
        self.ticks += 1
