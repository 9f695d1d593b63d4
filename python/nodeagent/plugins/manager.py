"""The plugin manager: the kubelet's plugin manager, composed of its pieces.

`watcher.RegistryWatcher` keeps the desired state of the world (every plugin socket),
`executor.OperationExecutor` registers and unregisters (keeping the actual state),
`reconciler.Reconciler` turns the difference into operations, and `monitor.ConnectionMonitor`
deregisters plugins that stop answering GetInfo probes. `PluginManager` builds them over one
shared `state.Caches`, runs them with the handlers, and serves status and readiness.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio

from nodeagent.core.health import Lapses, describe, overdue
from nodeagent.core.latest import LatestValue
from nodeagent.core.plugindata import PluginData
from nodeagent.log import get_logger
from nodeagent.plugins import metrics
from nodeagent.plugins.dra import DRA_PLUGIN_TYPE, DraHandler
from nodeagent.plugins.executor import OperationExecutor
from nodeagent.plugins.handler import PluginHandler, PluginValidationError
from nodeagent.plugins.monitor import ConnectionMonitor
from nodeagent.plugins.reconciler import Reconciler
from nodeagent.plugins.reporter_plugin import ReporterHandler
from nodeagent.plugins.security import UidCheck, allowed_uids_check
from nodeagent.plugins.settings import PluginSettings
from nodeagent.plugins.state import Caches, PluginState, SocketIdentity
from nodeagent.plugins.streaming import StreamingHandler
from nodeagent.plugins.versions import dra_api
from nodeagent.plugins.watcher import RegistryWatcher

if TYPE_CHECKING:
    from nodeagent.rpc.bridge import GrpcBridge

__all__ = ["PluginManager"]

log = get_logger(__name__)


class PluginManager:
    """Discovers kubelet-protocol plugins in the registry directory, registers them with the
    handler of their type, and keeps their latest data flowing to the consumers.

    Owns the plugin handlers (by type; `channel(type)` is a type's latest-value channel of every
    plugin's last message), one `Caches` (desired state, actual state, a `PluginRecord` per
    socket) and the four pieces that share it, each a task in `run`'s nursery beside the
    handlers: the watcher scans every `scan_interval`, the reconciler starts operations when
    woken or a backoff expires, the executor runs each (one per socket), the monitor probes every
    `probe_interval`. All of them run on one Trio loop, so the caches need no locks. A change of
    registration state wakes the reconciler and bumps `changes`, which callers wait on.
    `status()` is /v1/plugins (one entry per socket, plus plugins gone whose data a handler
    still keeps, as `deregistered`); `readiness()` says whether the registry can be scanned.
    `run` may be called again after it ends (a supervisor restart): it forgets every
    registration, so every socket registers afresh, while handlers keep the last data.
    """

    name = "plugins"  # a supervised component as it is (core.component.Component)

    def __init__(
        self,
        settings: PluginSettings | LatestValue[PluginSettings],
        bridge: GrpcBridge,
        handlers: Sequence[PluginHandler] | None = None,
        *,
        uid_check: UidCheck | None = None,
    ) -> None:
        # A LatestValue makes the intervals live: each wait reads the newest settings.
        self.live = settings if isinstance(settings, LatestValue) else LatestValue(settings)
        settings = self.live.value
        # Sockets unreachable, bounded by plugins.unreachable_bound.
        self._unreachable: Lapses[str] = Lapses("plugins", "unreachable_plugins")
        uid_allowed = uid_check or allowed_uids_check(settings.allowed_uids)
        if handlers is None:
            handlers = [
                DraHandler(bridge, settings, uid_check=uid_allowed),
                ReporterHandler(bridge, settings, uid_check=uid_allowed),
            ]
        self._handlers: dict[str, PluginHandler] = {h.plugin_type: h for h in handlers}
        for handler in handlers:
            if isinstance(handler, StreamingHandler):
                handler.live_settings = self.live  # stream_min_interval applies to open streams
        # Bumped whenever registration state changes, so callers can wait for one.
        self.changes: LatestValue[None] = LatestValue(None)
        self._caches = Caches()
        self._watcher = RegistryWatcher(
            settings.registry_dir,
            lambda: self.live.value.scan_interval,
            self._caches,
            kick=self._kick,
            changed=self._changed,
        )
        self._executor = OperationExecutor(
            settings,
            bridge,
            self._handlers,
            uid_allowed,
            self._caches,
            self._watcher,
            kick=self._kick,
        )
        self._reconciler = Reconciler(
            self._caches,
            self._executor,
            self._seen,
            lambda: self.live.value.scan_interval,
            changed=self._changed,
        )
        self._monitor = ConnectionMonitor(
            self.live, bridge, self._caches, self._executor, self._seen, kick=self._kick
        )

    # -- public API --------------------------------------------------------------------------

    def channel(self, plugin_type: str) -> LatestValue[Mapping[str, PluginData]]:
        """The latest-value channel of a plugin type: every plugin's last message by name."""
        return self._handlers[plugin_type].latest

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; started() once the registry dir exists and the first scan ran.

        Raises ConfigError (plugins.registry_dir) when the directory cannot be created.
        """
        self._reset()
        self._watcher.prepare_root()
        async with trio.open_nursery() as nursery:
            for handler in self._handlers.values():
                await nursery.start(handler.run)
            self._watcher.scan()
            nursery.start_soon(self._watcher.run)
            nursery.start_soon(self._reconciler.run, nursery)
            nursery.start_soon(self._monitor.run)
            nursery.start_soon(self._follow_settings, self.live.version)
            log.info("plugin manager started", registry_dir=self._watcher.root)
            task_status.started()

    def status(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        shown: set[tuple[str, str]] = set()
        for record in sorted(self._caches.records.values(), key=lambda r: r.socket):
            item: dict[str, Any] = {
                "name": record.name,
                "type": record.plugin_type,
                "socket": record.socket,
                "endpoint": record.endpoint,
                "versions": list(record.versions),
                "state": record.state.value,
                "last_error": record.last_error,
            }
            item.update(self._stream_status(record.plugin_type, record.name, record.socket))
            shown.add((record.plugin_type, record.name))
            out.append(item)
        # Plugins gone from the registry whose last data is still kept.
        for plugin_type, handler in sorted(self._handlers.items()):
            for name in handler.plugin_names():
                if (plugin_type, name) in shown:
                    continue
                stream = handler.plugin_status(name) or {}
                out.append(
                    {
                        "name": name,
                        "type": plugin_type,
                        "socket": stream.pop("owner_socket", ""),
                        "endpoint": "",
                        "versions": [],
                        "state": PluginState.DEREGISTERED.value,
                        "last_error": "",
                        **stream,
                    }
                )
        return out

    def readiness(self) -> tuple[bool, str]:
        if not self._watcher.scanned:
            return False, "plugin registry not scanned yet"
        if self._watcher.scan_error:
            return False, f"plugin registry scan failing: {self._watcher.scan_error}"
        unreachable = self._unreachable_now()
        now = trio.current_time()
        lapses = self._unreachable.observe(unreachable, now)
        bound = self.live.value.unreachable_bound
        worst = overdue(lapses, now, bound)
        if worst is not None:
            return False, describe("a plugin unreachable", worst, now, bound, len(lapses) - 1)
        states = [r.state for r in self._caches.records.values()]
        registered = states.count(PluginState.REGISTERED)
        stale = self._caches.stale_sockets()
        failing = len(states) - registered - len(stale)
        # Drivers that publish their own slices: registered, yet nothing is published for them.
        own = sum(
            1
            for r in self._caches.records.values()
            if r.state is PluginState.REGISTERED and _self_publishing(r.plugin_type, r.versions)
        )
        publishing = f" ({own} self-publishing)" if own else ""
        failing_now = (
            "; " + describe("a plugin unreachable", lapses[0], now, bound, len(lapses) - 1)
            if lapses
            else ""
        )
        return True, (
            f"{registered} plugins registered{publishing}, {failing} not registered{failing_now}"
            f"{_describe_stale(stale)}"
        )

    def _unreachable_now(self) -> dict[str, str]:
        """Plugin sockets the agent cannot reach now, by socket, with why: registration
        failing, probes failing (`Caches.unreachable`, never a `STALE` socket), or the plugin's
        stream down (backing off)."""
        out = self._caches.unreachable()
        for r in self._caches.records.values():
            if r.state is PluginState.REGISTERED and r.socket not in out:
                # Without the last message: this runs at every heartbeat.
                stream = self._stream_status(r.plugin_type, r.name, r.socket, message=False)
                if stream.get("stream_state") == "backoff":
                    who = r.name or r.socket
                    out[r.socket] = f"{who}: stream down: {stream.get('stream_error') or '?'}"
        return out

    # -- composition -------------------------------------------------------------------------

    def _reset(self) -> None:
        """Forget registrations from an earlier run (a supervisor restarting the manager): their
        streams died with it, so every socket registers afresh. Handlers keep the last data,
        marked deregistered until the plugin registers again (one gone meanwhile stays so)."""
        self._executor.reset()
        self._watcher.reset()
        self._caches.clear()

    async def _follow_settings(self, version: int) -> None:
        # A sleep taken with the old interval must not delay the new one (60 s -> 1 s).
        while True:
            version, _ = await self.live.wait_newer(version)
            self._watcher.retime()
            self._reconciler.wake()

    def _kick(self) -> None:
        self._reconciler.wake()
        self._changed()

    def _changed(self) -> None:
        metrics.STALE_SOCKETS.set(len(self._caches.stale_sockets()))
        self.changes.set(None)

    def _seen(self) -> Mapping[str, SocketIdentity]:
        return self._watcher.seen  # looked up each time: every scan replaces the mapping

    # -- status helpers ----------------------------------------------------------------------

    def _stream_status(
        self, plugin_type: str, name: str, socket: str, *, message: bool = True
    ) -> dict[str, Any]:
        handler = self._handlers.get(plugin_type)
        stream = (
            handler.plugin_status(name, message=message) if handler is not None and name else None
        )
        if stream is None:
            return {
                "stream_state": "none",
                "stream_error": "",
                "stream_restarts": 0,
                "messages_received": 0,
                "messages_rejected": 0,
                "last_message_time": None,
                "last_message": None,
            }
        owner = stream.pop("owner_socket")
        if owner != socket:
            stream["stream_state"] = f"replaced by {owner}"
        return stream


def _describe_stale(sockets: Sequence[str], shown: int = 3) -> str:
    """The readiness reason's part about sockets nobody listens on: their paths and the fix."""
    if not sockets:
        return ""
    paths = ", ".join(sockets[:shown])
    if len(sockets) > shown:
        paths += f" and {len(sockets) - shown} more"
    return (
        f"; {len(sockets)} stale sockets refuse connections (nobody listening: remove them or "
        f"restart their plugins): {paths}"
    )


def _self_publishing(plugin_type: str, versions: Sequence[str]) -> bool:
    """A modern DRA driver (it lists the kubelet's DRAPlugin services) publishing its own slices."""
    if plugin_type != DRA_PLUGIN_TYPE:
        return False
    try:
        return dra_api(versions) == "kubelet-v1"
    except PluginValidationError:
        return False
