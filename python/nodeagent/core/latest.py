"""A "latest value" channel: the newest value wins, readers wait for a newer version.

Plugin handlers publish their plugins' data through one, the publisher and the SDK read theirs from
one: a leaf, so neither side imports the other."""

from __future__ import annotations

from typing import Generic, TypeVar

from nodeagent.core.wake import Pulse

T = TypeVar("T")

__all__ = ["LatestValue"]


class LatestValue(Generic[T]):
    """Holds one value and a version; a slow reader skips intermediate values instead of queuing
    them, which is right for state snapshots (only the newest matters)."""

    def __init__(self, initial: T) -> None:
        self._value = initial
        self._version = 0
        self._changed = Pulse()

    @property
    def value(self) -> T:
        return self._value

    @property
    def version(self) -> int:
        return self._version

    def set(self, value: T) -> None:
        self._value = value
        self._version += 1
        self._changed.fire()

    async def wait_newer(self, version: int) -> tuple[int, T]:
        """Wait until the version is greater than `version`; return (version, value)."""
        while self._version <= version:
            await self._changed.wait()
        return self._version, self._value
