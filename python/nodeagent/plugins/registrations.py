"""The registration table of one plugin type: who serves each plugin name, and until when the
last data of a name whose registrations all left is kept.

Several live registrations may share a name (a rolling update starts the new plugin before the
old one stops). As in the kubelet, the newest registration serves; when it goes, the newest
remaining one serves again, so the older plugin is never orphaned. A name whose last
registration left is forgotten `grace` seconds later (its last data, its status), as Katalyst
drops a stopped endpoint's data after 5 minutes; registering again before then keeps it.

The table knows registrations only: what serving means (a stream, publication) is the handler's
(`plugins.streaming.StreamingHandler`), which keeps its per-name state in a `NameEntry` subclass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, NoReturn, TypeVar

import trio

from nodeagent.core.wake import Deadlines

if TYPE_CHECKING:
    from nodeagent.plugins.handler import PluginEndpoint

__all__ = ["NameEntry", "RegistrationTable"]


@dataclass
class NameEntry:
    """What the table keeps about one plugin name; it outlives registrations."""

    plugin: PluginEndpoint  # the serving registration, or the last one that served
    # Live registrations of the name, oldest first; the last one serves.
    registrations: list[PluginEndpoint] = field(default_factory=list)
    # Bumped whenever a registration starts serving. A plugin recreated at the same path
    # registers with the same fields (a PluginEndpoint equal by value), so what was asked of
    # the serving plugin (a reporter poll) is matched to its answer by this, not by value.
    serial: int = 0
    gone_at: float | None = None  # (Trio clock) when the last registration left

    @property
    def registered(self) -> bool:
        return bool(self.registrations)

    def serve(self, plugin: PluginEndpoint) -> None:
        """`plugin` (one of the live registrations) serves the name from now on."""
        self.plugin = plugin
        self.serial += 1


E = TypeVar("E", bound=NameEntry)


class RegistrationTable(Generic[E]):
    """Plugin names to their `NameEntry` (of type E, made by `new_entry`), with a lock per name
    (validate, register and deregister for one name run strictly in sequence) and the expiry of
    names whose registrations all left."""

    def __init__(self, new_entry: Callable[[PluginEndpoint], E], grace: float) -> None:
        self._new_entry = new_entry
        self._grace = grace
        self.entries: dict[str, E] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._expiries: Deadlines[str] = Deadlines()

    def lock(self, name: str) -> trio.Lock:
        return self._locks.setdefault(name, trio.Lock())

    def add(self, plugin: PluginEndpoint) -> E:
        """Record `plugin` as the newest live registration of its name (replacing an earlier one
        on the same socket); a name that had left is no longer due to be forgotten."""
        entry = self.entries.get(plugin.name)
        if entry is None:
            entry = self.entries[plugin.name] = self._new_entry(plugin)
        entry.registrations = [r for r in entry.registrations if r.socket != plugin.socket]
        entry.registrations.append(plugin)
        entry.gone_at = None
        self._expiries.discard(plugin.name)
        return entry

    def remove(self, plugin: PluginEndpoint) -> tuple[E, bool] | None:
        """Drop `plugin`'s registration (by socket); returns its name's entry and whether it was
        the one serving, or None when the name is unknown."""
        entry = self.entries.get(plugin.name)
        if entry is None:
            return None
        serving = entry.registered and entry.registrations[-1].socket == plugin.socket
        entry.registrations = [r for r in entry.registrations if r.socket != plugin.socket]
        return entry, serving

    def left(self, entry: E, now: float) -> None:
        """The name's last registration left at `now` (Trio clock): forgotten `grace` after."""
        entry.gone_at = now
        self._expiries.set(entry.plugin.name, now + self._grace)

    def drop(self, name: str) -> None:
        """Forget `name` (its entry, and its lock unless a task holds or waits for it)."""
        del self.entries[name]
        self._expiries.discard(name)
        lock = self._locks.get(name)
        if lock is not None and not lock.locked() and not lock.statistics().tasks_waiting:
            del self._locks[name]

    async def expire(self, forget: Callable[[str], None]) -> NoReturn:
        """Call `forget(name)` for each name `grace` after its last registration left (unless
        it registered again), forever."""
        while True:
            for name in await self._expiries.wait_due():
                entry = self.entries.get(name)
                if entry is not None and entry.gone_at is not None:
                    forget(name)
