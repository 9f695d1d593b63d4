"""The kubelet plugin manager's caches and reconciler plan: desired vs actual state of the world.

The registry watcher writes the desired state (every plugin socket that exists, with a
generation that changes whenever the socket is recreated); registration writes the actual state.
`plan` compares them: actual plugins whose socket left the desired state, or whose generation
differs (socket recreated), are unregistered; desired sockets without a matching actual entry are
registered. Beside the two caches, `PluginRecord` keeps what an operator sees about each socket
(its `PluginState`, last error, probe failures); `Caches` holds the three for the manager's pieces.

The decisions the manager's async pieces take are made here, synchronously, so that a model can
drive them through any interleaving: `DesiredState.follow_scan` (the watcher), `operations` (the
reconciler), `Caches.registration_started` / `registration_succeeded` / `registration_failed`
and `retry_at` (the executor), `Caches.probe_result` (the monitor). Everything that happens to a
socket is tied to a generation: a probe's result, a registration's backoff and a rule's
rejection belong to the generation they were taken for and lapse when the socket is recreated.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from nodeagent.core.backoff import Backoff

__all__ = [
    "ActualPlugin",
    "ActualState",
    "Caches",
    "DesiredPlugin",
    "DesiredState",
    "Operations",
    "Plan",
    "PluginRecord",
    "PluginState",
    "ProbeVerdict",
    "SocketIdentity",
    "operations",
    "plan",
    "stale_socket",
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

    def follow_scan(
        self, previous: Mapping[str, SocketIdentity], found: Mapping[str, SocketIdentity]
    ) -> bool:
        """Apply a scan that found `found` where the last one found `previous`: a new or
        recreated socket is (re)added with a new generation, a vanished one removed. A socket
        unchanged since the last scan is left alone, so one the monitor dropped stays dropped
        until it answers again. True if anything changed."""
        changed = False
        for path, identity in found.items():
            if previous.get(path) != identity:
                self.add_or_update(path, identity)
                changed = True
        for path in previous.keys() - found.keys():
            self.remove(path)
            changed = True
        return changed


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


@dataclass
class Operations:
    """What a reconciler pass starts, and when a backed-off registration is due (inf: none)."""

    unregister: list[ActualPlugin] = field(default_factory=list)
    register: list[DesiredPlugin] = field(default_factory=list)
    next_due: float = float("inf")


def operations(caches: Caches, busy: Callable[[str], bool], now: float) -> Operations:
    """The operations to start now: every unregister `plan` asks for on a socket without one
    under way (a recreated socket is unregistered first), and every register of a socket with
    no operation under way, no actual entry left to unregister, a generation no rule rejected
    and whose own backoff (this generation's, `Caches.retry_at`) has expired."""
    work = plan(caches.desired, caches.actual)
    result = Operations()
    result.unregister = [r for r in work.unregister if not busy(r.socket)]
    for wanted in work.register:
        socket = wanted.socket
        if busy(socket) or caches.actual.get(socket) is not None:
            continue  # its unregister must finish first
        record = caches.records.get(socket)
        if record is not None and record.rejected_generation == wanted.generation:
            continue
        retry_at = caches.retry_at(wanted)
        if retry_at is not None and retry_at > now:
            result.next_due = min(result.next_due, retry_at)
            continue
        result.register.append(wanted)
    return result


class ProbeVerdict(enum.Enum):
    """What a probe's result did (`Caches.probe_result`)."""

    STALE = "stale"  # the probed registration is no longer in force: ignored
    ANSWERED = "answered"  # the failure count starts again
    FAILED = "failed"  # counted, below the limit
    DROPPED = "dropped"  # the limit reached: out of the desired state, to be deregistered


class PluginState(enum.StrEnum):
    """Where a plugin socket is in its life; the value is what /v1/plugins and `nodeagent
    status` show."""

    REGISTERING = "registering"  # found, registration under way or waiting for its backoff
    REGISTERED = "registered"
    FAILED = "failed"  # registration failed (retried with backoff) or deregistered by probes
    REJECTED = "rejected"  # a security rule refused it: not retried until the socket is recreated
    # Its socket refuses connections: nobody listens (a plugin killed without removing it, as
    # after an OOM kill). A plugin that left, not one unreachable: its registration is retried
    # with backoff (a socket bound but not yet listening refuses too), a registered one is
    # deregistered by its probes; a plugin binding the path again makes a new socket file.
    STALE = "stale"
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
    # This generation's failed registrations in a row and when it may be tried again: a record
    # is this generation's (a new one starts afresh), so a recreated socket has no backoff.
    registration_failures: int = 0
    retry_at: float | None = None


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

    # -- registration (the executor) ---------------------------------------------------------

    def registration_started(self, wanted: DesiredPlugin) -> PluginRecord:
        """The record a registration of `wanted` works on: the socket's, or a fresh one for a
        new generation (its backoff, failures and rejection start afresh). The resolved endpoint
        is kept, so it stays out of the scan while the socket re-registers."""
        record = self.records.get(wanted.socket)
        if record is None or record.generation != wanted.generation:
            endpoint_real = record.endpoint_real if record is not None else ""
            record = self.records[wanted.socket] = PluginRecord(
                wanted.socket, wanted.generation, endpoint_real=endpoint_real
            )
        # A stale socket's retry (a connect refused at once) is no registration under way: it
        # stays shown stale, never "registering" after an error (counted as unreachable).
        if record.state is not PluginState.STALE:
            record.state = PluginState.REGISTERING
        return record

    def registration_succeeded(self, record: PluginRecord) -> None:
        record.state = PluginState.REGISTERED
        record.last_error = ""
        record.probe_failures = 0
        record.registration_failures = 0
        record.retry_at = None

    def registration_failed(
        self,
        record: PluginRecord,
        error: str,
        now: float,
        backoff: Backoff,
        *,
        refused: bool = False,
    ) -> float:
        """Count a failed registration of `record`'s generation; the delay before its next
        attempt (`backoff`'s, by this generation's failures in a row). `refused`: its socket
        refused the connection, so it is `STALE`."""
        record.state = PluginState.FAILED
        record.last_error = error
        if refused:
            self.socket_refused(record)
        record.registration_failures += 1
        delay = backoff.delay(record.registration_failures)
        record.retry_at = now + delay
        return delay

    def registration_rejected(self, record: PluginRecord, error: str) -> None:
        """A rule refused `record`'s generation: not retried until the socket is recreated."""
        record.state = PluginState.REJECTED
        record.last_error = error
        record.rejected_generation = record.generation

    def retry_at(self, wanted: DesiredPlugin) -> float | None:
        """When `wanted` may be registered again after failures (None: no backoff). Only its own
        generation's failures count: a plugin replaced at the same path starts afresh."""
        record = self.records.get(wanted.socket)
        if record is None or record.generation != wanted.generation:
            return None
        return record.retry_at

    # -- probes (the monitor) ----------------------------------------------------------------

    def in_force(self, registered: ActualPlugin) -> PluginRecord | None:
        """The record of `registered` if it is still the socket's registration: the same
        generation registered, wanted and recorded. None once the socket was recreated,
        deregistered or dropped since (a probe of it says nothing about what is there now)."""
        socket, generation = registered.socket, registered.generation
        actual = self.actual.get(socket)
        wanted = self.desired.get(socket)
        record = self.records.get(socket)
        if actual is None or actual.generation != generation:
            return None
        if wanted is None or wanted.generation != generation:
            return None
        if record is None or record.generation != generation:
            return None
        return record

    def probe_result(
        self, probed: ActualPlugin, ok: bool, limit: int, *, refused: bool = False
    ) -> ProbeVerdict:
        """Apply the result of a probe of `probed` (taken before the probe, which may have
        lasted long): only to the registration it probed. After `limit` failures in a row the
        socket leaves the desired state, so the reconciler deregisters it; `STALE` if the last
        failure was a refused connection (`refused`: nobody listens any more)."""
        record = self.in_force(probed)
        if record is None:
            return ProbeVerdict.STALE
        if ok:
            record.probe_failures = 0
            return ProbeVerdict.ANSWERED
        record.probe_failures += 1
        if record.probe_failures < limit:
            return ProbeVerdict.FAILED
        record.state = PluginState.FAILED
        record.last_error = f"deregistered after {record.probe_failures} failed probes"
        if refused:
            self.socket_refused(record, record.last_error)
        self.desired.remove(probed.socket)
        return ProbeVerdict.DROPPED

    # -- readiness (the manager) -------------------------------------------------------------

    def unreachable(self) -> dict[str, str]:
        """Sockets whose plugin the agent cannot reach now by the records alone, by socket,
        with why: registration failing or probes failing (the manager adds streams down). Not a
        `STALE` socket: nobody listens on it, its plugin left (a file the agent does not own
        and cannot mend must not keep the agent not ready, nor roll a config on trial back)."""
        out: dict[str, str] = {}
        for r in self.records.values():
            who = r.name or r.socket
            if r.state is PluginState.FAILED or (
                r.state is PluginState.REGISTERING and r.last_error
            ):
                out[r.socket] = f"{who}: {r.last_error or 'registration failing'}"
            elif r.state is PluginState.REGISTERED and r.probe_failures:
                out[r.socket] = f"{who}: {r.probe_failures} probes failed in a row"
        return out

    def stale_sockets(self) -> list[str]:
        """The sockets shown `STALE` (nobody listens on them), sorted."""
        return sorted(r.socket for r in self.records.values() if r.state is PluginState.STALE)

    def socket_refused(self, record: PluginRecord, what: str = "") -> None:
        """`record`'s socket refused a connection: nobody listens on it, the plugin left it
        behind. Not deleted (the agent does not own it); shown `STALE` with its path."""
        record.state = PluginState.STALE
        reason = stale_socket(record.socket)
        record.last_error = f"{what}: {reason}" if what else reason


def stale_socket(socket: str) -> str:
    """What an operator reads about a socket nobody listens on, and what to do about it."""
    return (
        f"socket {socket} refuses connections: a stale socket (nobody listening): "
        "remove it or restart the plugin"
    )
