"""Wake-ups and deadlines: the three shapes the agent's loops wait in, each in one place (as
trio keeps one home per primitive in ``trio/_sync.py``).

- `Wake`: a level-triggered flag. Any number of `set()` calls before the waiter looks are one
  wake-up; `wait()` consumes it. For a loop that re-reads the newest state when woken ("dirty",
  "poked").
- `Pulse`: an edge-triggered broadcast. `wait()` returns at the next `fire()` after it was
  called, in every waiter; a fire nobody waits for is lost. For "something changed: look
  again" announcements to any number of readers. A versioned value is `LatestValue`
  (`core/latest.py`), built on it.
- `Deadlines`: keyed deadlines on the Trio clock. `wait_due()` sleeps until the earliest one
  (re-planned when one is set earlier) and returns the keys that are due. For expiry loops.

A one-shot `trio.Event` (done, stopped) stays a `trio.Event`: it is never re-armed.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

import trio

K = TypeVar("K", bound=Hashable)

__all__ = ["Deadlines", "Pulse", "Wake"]


class Wake:
    """A level-triggered wake flag: set until a waiter consumes it."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def clear(self) -> None:
        """Withdraws a wake-up not consumed yet."""
        if self._event.is_set():
            self._event = trio.Event()

    async def wait(self) -> None:
        """Until the flag is set (at once if it is); clears it."""
        await self._event.wait()
        self.clear()

    async def wait_until(self, deadline: float) -> bool:
        """`wait()` until a Trio-clock `deadline`; returns whether woken (the flag consumed)
        rather than timed out."""
        with trio.move_on_at(deadline):
            await self.wait()
            return True
        return False

    async def wait_for(self, seconds: float) -> bool:
        """`wait_until(now + seconds)`."""
        return await self.wait_until(trio.current_time() + seconds)


class Pulse:
    """An edge-triggered broadcast: every waiter returns at the next `fire()`."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def wait(self) -> None:
        """Until the next `fire()` (never at once)."""
        await self._event.wait()


class Deadlines(Generic[K]):
    """Keys with a deadline each (Trio clock). Setting a key replaces its deadline; a waiter in
    `wait_due` re-plans its sleep when a deadline changes. Sized for a handful of keys (the
    earliest is found by a scan): plugins, reports."""

    def __init__(self) -> None:
        self._at: dict[K, float] = {}
        self._changed = Wake()

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def __iter__(self) -> Iterator[K]:
        return iter(self._at)

    def get(self, key: K) -> float | None:
        return self._at.get(key)

    def set(self, key: K, deadline: float) -> None:
        self._at[key] = deadline
        self._changed.set()

    def set_after(self, key: K, delay: float) -> None:
        self.set(key, trio.current_time() + delay)

    def discard(self, key: K) -> None:
        # No wake-up: a waiter that wakes at the old deadline finds nothing due and sleeps on.
        self._at.pop(key, None)

    def clear(self) -> None:
        self._at.clear()

    def next(self) -> float:
        """The earliest deadline (inf: none)."""
        return min(self._at.values(), default=math.inf)

    def pop_due(self, now: float | None = None) -> list[K]:
        """Removes and returns the keys due at `now` (default: the Trio clock), earliest
        first."""
        if now is None:
            now = trio.current_time()
        due = sorted((at, i, k) for i, (k, at) in enumerate(self._at.items()) if at <= now)
        for _, _, key in due:
            del self._at[key]
        return [k for _, _, k in due]

    async def wait_due(self) -> list[K]:
        """Until at least one key is due; removes and returns the due keys, earliest first."""
        while True:
            # Cleared before looking: a set() from here on wakes the sleep below.
            self._changed.clear()
            due = self.pop_due()
            if due:
                return due
            await self._changed.wait_until(self.next())
