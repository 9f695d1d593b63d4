"""The kubelet plugin manager's caches and reconciler plan: desired vs actual state of the world.

The registry watcher writes the desired state (every plugin socket that exists, with a
generation that changes whenever the socket is recreated); registration writes the actual state.
`plan` compares them: actual plugins whose socket left the desired state, or whose generation
differs (socket recreated), are unregistered; desired sockets without a matching actual entry are
registered. Beside the two caches, `PluginRecord` keeps what an operator sees about each socket
(its `PluginState`, last error, probe failures); `Caches` holds the three for the manager's pieces.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = [
    "ActualPlugin",
    "ActualState",
    "Caches",
    "DesiredPlugin",
    "DesiredState",
    "Plan",
    "PluginRecord",
    "PluginState",
    "SocketIdentity",
    "plan",
]

_generations = itertools.count(1)


@dataclass(frozen=True)
class SocketIdentity:
    """What changes when a socket file is recreated at the same path."""

    device: int
    inode: int
    ctime_ns: int


@dataclass(frozen=True)
class DesiredPlugin:
    socket: str
    identity: SocketIdentity
    generation: int


@dataclass(frozen=True)
class ActualPlugin:
    socket: str
    generation: int
    plugin_type: str
    name: str
    endpoint: str
    versions: tuple[str, ...]


_Entry = TypeVar("_Entry", DesiredPlugin, ActualPlugin)


class _BySocket(Generic[_Entry]):
    """Entries keyed by socket path, listed in path order."""

    def __init__(self) -> None:
        self._plugins: dict[str, _Entry] = {}

    def remove(self, socket: str) -> None:
        self._plugins.pop(socket, None)

    def clear(self) -> None:
        self._plugins.clear()

    def get(self, socket: str) -> _Entry | None:
        return self._plugins.get(socket)

    def plugins(self) -> list[_Entry]:
        return [self._plugins[socket] for socket in sorted(self._plugins)]


class DesiredState(_BySocket[DesiredPlugin]):
    """The kubelet's DSW: every plugin socket that should be registered."""

    def add_or_update(self, socket: str, identity: SocketIdentity) -> DesiredPlugin:
        """Record a socket; a new generation whenever its identity changed (or it was absent)."""
        current = self._plugins.get(socket)
        if current is not None and current.identity == identity:
            return current
        return self.force_new_generation(socket, identity)

    def force_new_generation(self, socket: str, identity: SocketIdentity) -> DesiredPlugin:
        entry = DesiredPlugin(socket, identity, next(_generations))
        self._plugins[socket] = entry
        return entry


class ActualState(_BySocket[ActualPlugin]):
    """The kubelet's ASW: every plugin registered (or being registered) with its handler."""

    def add(self, plugin: ActualPlugin) -> None:
        self._plugins[plugin.socket] = plugin


@dataclass
class Plan:
    unregister: list[ActualPlugin] = field(default_factory=list)
    register: list[DesiredPlugin] = field(default_factory=list)


def plan(desired: DesiredState, actual: ActualState) -> Plan:
    result = Plan()
    for registered in actual.plugins():
        wanted = desired.get(registered.socket)
        if wanted is None or wanted.generation != registered.generation:
            result.unregister.append(registered)
    for wanted in desired.plugins():
        current = actual.get(wanted.socket)
        if current is None or current.generation != wanted.generation:
            result.register.append(wanted)
    return result


class PluginState(enum.StrEnum):
    """Where a plugin socket is in its life; the value is what /v1/plugins and `nodeagent
    status` show."""

    REGISTERING = "registering"  # found, registration under way or waiting for its backoff
    REGISTERED = "registered"
    FAILED = "failed"  # registration failed (retried with backoff) or deregistered by probes
    REJECTED = "rejected"  # a security rule refused it: not retried until the socket is recreated
    DEREGISTERED = "deregistered"  # its socket is gone, its last data still kept by the handler


@dataclass
class PluginRecord:
    """What the ops endpoint shows about one plugin socket, and the per-socket facts the
    pieces share (its resolved endpoint, the generation a rule rejected, probe failures)."""

    socket: str
    generation: int
    state: PluginState = PluginState.REGISTERING
    name: str = ""
    plugin_type: str = ""
    endpoint: str = ""
    # The endpoint with symbolic links resolved, once checked: never scanned as a plugin.
    endpoint_real: str = ""
    versions: tuple[str, ...] = ()
    last_error: str = ""
    rejected_generation: int = 0
    probe_failures: int = 0
    registered_type: str = ""  # the gauge label this socket currently counts under


@dataclass
class Caches:
    """The desired and actual states and the per-socket records, shared by the watcher,
    reconciler, operation executor and monitor (one event loop: no locking)."""

    desired: DesiredState = field(default_factory=DesiredState)
    actual: ActualState = field(default_factory=ActualState)
    records: dict[str, PluginRecord] = field(default_factory=dict)

    def clear(self) -> None:
        self.desired.clear()
        self.actual.clear()
        self.records.clear()
