"""The plugin manager: registry watcher, reconciler, registration, probing, handlers.

It follows the kubelet's plugin manager: the watcher keeps a desired state of the world (every
plugin socket), registration keeps the actual state, and the reconciler turns the difference into
register/unregister operations, at most one at a time per socket, each failure delaying the next
attempt with exponential backoff. Unlike the kubelet, a failed Register step is retried too, and
a plugin that stops answering GetInfo probes is deregistered (the kubelet's connection monitor,
with its timeouts; the deregistration is an ordinary one, so consumers apply their own graces).

A plugin's service endpoint may be outside the registry directory (the upstream layout); a socket
that is some plugin's endpoint is never taken for a plugin by the registry scan.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from nodeagent.config.errors import ConfigError
from nodeagent.log import get_logger
from nodeagent.plugins import metrics
from nodeagent.plugins.backoff import ExponentialBackoff
from nodeagent.plugins.bridge import GrpcBridge, GrpcChannel, RpcError
from nodeagent.plugins.dra import DraHandler
from nodeagent.plugins.handler import (
    PluginData,
    PluginEndpoint,
    PluginHandler,
    PluginValidationError,
)
from nodeagent.plugins.latest import LatestValue
from nodeagent.plugins.registry import ensure_registry_dir, scan_registry
from nodeagent.plugins.reporter import ReporterHandler
from nodeagent.plugins.security import (
    EndpointMissing,
    EndpointRejected,
    UidCheck,
    allowed_uids_check,
    peer_credentials,
    resolve_endpoint,
)
from nodeagent.plugins.settings import PluginSettings
from nodeagent.plugins.state import (
    ActualPlugin,
    ActualState,
    DesiredPlugin,
    DesiredState,
    SocketIdentity,
    plan,
)
from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg

__all__ = ["PluginManager"]

log = get_logger(__name__)


class _Failed(Exception):
    """Registration failed; retried with backoff. `kind` labels the error metric."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Rejected(_Failed):
    """A security rule refused the plugin; not retried until its socket is recreated."""


@dataclass
class _Record:
    """What the ops endpoint shows about one plugin socket."""

    socket: str
    generation: int
    state: str = "registering"  # registering / registered / failed / rejected
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


class PluginManager:
    def __init__(
        self,
        settings: PluginSettings,
        bridge: GrpcBridge,
        handlers: Sequence[PluginHandler] | None = None,
        *,
        uid_check: UidCheck | None = None,
    ) -> None:
        self._settings = settings
        self._bridge = bridge
        self._uid_allowed = uid_check or allowed_uids_check(settings.allowed_uids)
        if handlers is None:
            handlers = [
                DraHandler(bridge, settings, uid_check=self._uid_allowed),
                ReporterHandler(bridge, settings, uid_check=self._uid_allowed),
            ]
        self._handlers: dict[str, PluginHandler] = {h.plugin_type: h for h in handlers}
        # Absolute, so every socket path derived from it passes the inside-the-registry check.
        self._root = os.path.abspath(settings.registry_dir)
        self._real_root = os.path.realpath(self._root)
        self._endpoint_dirs = settings.resolved_endpoint_dirs()
        self._desired = DesiredState()
        self._actual = ActualState()
        self._records: dict[str, _Record] = {}
        self._backoff: dict[str, ExponentialBackoff] = {}
        self._busy: set[str] = set()
        self._seen: dict[str, SocketIdentity] = {}
        self._wake = trio.Event()
        # Bumped whenever registration state changes, so callers can wait for one.
        self.changes: LatestValue[None] = LatestValue(None)
        self._scanned = False
        self._scan_error = ""

    # -- public API --------------------------------------------------------------------------

    def channel(self, plugin_type: str) -> LatestValue[Mapping[str, PluginData]]:
        """The latest-value channel of a plugin type: every plugin's last message by name."""
        return self._handlers[plugin_type].latest

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; started() once the registry dir exists and the first scan ran.

        Raises ConfigError (plugins.registry_dir) when the directory cannot be created.
        """
        self._reset()
        self._prepare_root()
        async with trio.open_nursery() as nursery:
            for handler in self._handlers.values():
                await nursery.start(handler.run)
            self._scan()
            nursery.start_soon(self._scan_loop)
            nursery.start_soon(self._reconcile_loop, nursery)
            nursery.start_soon(self._probe_loop)
            log.info("plugin manager started", registry_dir=self._root)
            task_status.started()

    def _prepare_root(self) -> None:
        try:
            ensure_registry_dir(self._root)
        except OSError as exc:
            raise ConfigError(
                "plugins.registry_dir", self._root, f"cannot create directory: {exc.strerror}"
            ) from exc
        self._real_root = os.path.realpath(self._root)

    def _reset(self) -> None:
        """Forget registrations from an earlier run (a supervisor restarting the manager): their
        streams died with it, so every socket registers afresh. Handlers keep the last data,
        marked deregistered until the plugin registers again (one gone meanwhile stays so)."""
        for record in self._records.values():
            if record.registered_type:
                metrics.REGISTERED.labels(type=record.registered_type).dec()
        self._desired = DesiredState()
        self._actual = ActualState()
        self._records = {}
        self._backoff = {}
        self._busy = set()
        self._seen = {}
        self._scanned = False
        self._scan_error = ""

    def status(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        shown: set[tuple[str, str]] = set()
        for record in sorted(self._records.values(), key=lambda r: r.socket):
            item: dict[str, Any] = {
                "name": record.name,
                "type": record.plugin_type,
                "socket": record.socket,
                "endpoint": record.endpoint,
                "versions": list(record.versions),
                "state": record.state,
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
                        "state": "deregistered",
                        "last_error": "",
                        **stream,
                    }
                )
        return out

    def readiness(self) -> tuple[bool, str]:
        if not self._scanned:
            return False, "plugin registry not scanned yet"
        if self._scan_error:
            return False, f"plugin registry scan failing: {self._scan_error}"
        states = [r.state for r in self._records.values()]
        registered = states.count("registered")
        failing = len(states) - registered
        return True, f"{registered} plugins registered, {failing} not registered"

    # -- status helpers ----------------------------------------------------------------------

    def _stream_status(self, plugin_type: str, name: str, socket: str) -> dict[str, Any]:
        handler = self._handlers.get(plugin_type)
        stream = handler.plugin_status(name) if handler is not None and name else None
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

    # -- watcher -----------------------------------------------------------------------------

    async def _scan_loop(self) -> None:
        while True:
            await trio.sleep(self._settings.scan_interval)
            self._scan()

    def _scan(self) -> None:
        try:
            found = scan_registry(self._root)
        except FileNotFoundError:
            # The directory itself was removed: every plugin in it is gone.
            log.warning("plugin registry directory vanished; recreating", path=self._root)
            try:
                ensure_registry_dir(self._root)
            except OSError as exc:
                self._scan_failed(exc)
                return
            found = {}
        except OSError as exc:
            self._scan_failed(exc)  # keep the last good state: nothing is deregistered
            return
        endpoints = self._endpoint_sockets()
        if endpoints:
            found = {p: i for p, i in found.items() if not self._is_endpoint(p, endpoints)}
        changed = not self._scanned or bool(self._scan_error)  # readiness changed
        self._scanned = True
        self._scan_error = ""
        for path, identity in found.items():
            if self._seen.get(path) != identity:
                self._desired.add_or_update(path, identity)
                changed = True
        for path in self._seen.keys() - found.keys():
            self._desired.remove(path)
            changed = True
        self._seen = found
        if changed:
            self._kick()

    def _endpoint_sockets(self) -> set[str]:
        """Resolved endpoints of the plugins known now (while their registration socket is
        there): sockets that serve a plugin, not plugins of their own."""
        return {
            r.endpoint_real
            for r in self._records.values()
            if r.endpoint_real and r.endpoint_real != self._real_path(r.socket)
        }

    def _is_endpoint(self, path: str, endpoints: set[str]) -> bool:
        # A registered plugin stays one even if another plugin names its socket as endpoint.
        return self._real_path(path) in endpoints and self._actual.get(path) is None

    def _real_path(self, path: str) -> str:
        # Scanned paths contain no symbolic links below the root (the scan does not follow them).
        return os.path.join(self._real_root, os.path.relpath(path, self._root))

    def _scan_failed(self, exc: OSError) -> None:
        error = f"{self._root}: {exc.strerror or exc}"
        metrics.ERRORS.labels(kind="scan").inc()
        if error != self._scan_error:  # log once per distinct failure, not once per scan
            log.warning("plugin registry scan failed", path=self._root, error=str(exc))
            self._scan_error = error
            self.changes.set(None)  # readiness changed

    # -- reconciler --------------------------------------------------------------------------

    def _kick(self) -> None:
        self._wake.set()
        self.changes.set(None)

    async def _reconcile_loop(self, nursery: trio.Nursery) -> None:
        while True:
            next_due = self._reconcile(nursery)
            # Sleep until something changes or a backoff expires (at most a scan interval).
            delay = min(self._settings.scan_interval, max(next_due - trio.current_time(), 0.0))
            with trio.move_on_after(delay):
                await self._wake.wait()
            self._wake = trio.Event()

    def _reconcile(self, nursery: trio.Nursery) -> float:
        """Start the operations the plan asks for; return when a backed-off one is due."""
        now = trio.current_time()
        next_due = float("inf")
        work = plan(self._desired, self._actual)
        for registered in work.unregister:
            if registered.socket not in self._busy:
                self._busy.add(registered.socket)
                nursery.start_soon(self._unregister, registered)
        for wanted in work.register:
            socket = wanted.socket
            record = self._records.get(socket)
            if socket in self._busy or self._actual.get(socket) is not None:
                continue  # its unregister must finish first
            if record is not None and record.rejected_generation == wanted.generation:
                continue
            backoff = self._backoff.get(socket)
            if backoff is not None and backoff.ready_at() > now:
                next_due = min(next_due, backoff.ready_at())
                continue
            self._busy.add(socket)
            nursery.start_soon(self._register, wanted)
        for socket in list(self._records):
            gone = socket not in self._seen and self._desired.get(socket) is None
            if gone and socket not in self._busy and self._actual.get(socket) is None:
                del self._records[socket]
                self._backoff.pop(socket, None)
                self.changes.set(None)
        return next_due

    async def _register(self, wanted: DesiredPlugin) -> None:
        socket = wanted.socket
        record = self._records.get(socket)
        if record is None or record.generation != wanted.generation:
            # The endpoint stays excluded from the scan while the socket re-registers.
            endpoint_real = record.endpoint_real if record is not None else ""
            record = self._records[socket] = _Record(
                socket, wanted.generation, endpoint_real=endpoint_real
            )
        record.state = "registering"
        try:
            try:
                await self._register_steps(wanted, record)
            except (_Failed, trio.Cancelled):
                raise
            except Exception as exc:
                # A bug or an unexpected failure must not take the manager down: retry later.
                log.exception("plugin registration crashed", socket=socket)
                raise _Failed("register", f"internal error: {exc!r}") from exc
        except _Failed as exc:
            rejected = isinstance(exc, _Rejected)
            record.state = "rejected" if rejected else "failed"
            record.last_error = str(exc)
            outcome = "rejected" if rejected else "failed"
            # Only known types become label values: a plugin must not mint metric series.
            plugin_type = record.plugin_type if record.plugin_type in self._handlers else "unknown"
            metrics.REGISTRATIONS.labels(type=plugin_type, outcome=outcome).inc()
            metrics.ERRORS.labels(kind=exc.kind).inc()
            if rejected:
                record.rejected_generation = wanted.generation
                log.error("plugin rejected", socket=socket, name=record.name, reason=str(exc))
            else:
                backoff = self._backoff.setdefault(
                    socket,
                    ExponentialBackoff(
                        self._settings.registration_backoff_initial,
                        self._settings.registration_backoff_max,
                    ),
                )
                backoff.record_failure(trio.current_time())
                log.warning(
                    "plugin registration failed",
                    socket=socket,
                    name=record.name,
                    error=str(exc),
                    retry_in=backoff.duration,
                )
        finally:
            self._busy.discard(socket)
            self._kick()

    async def _register_steps(self, wanted: DesiredPlugin, record: _Record) -> None:
        socket = wanted.socket
        async with self._bridge.channel(socket) as channel:
            try:
                self._check_path(socket)
                await self._check_peer(socket)
            except _Rejected as exc:
                await self._notify(channel, record, False, str(exc))
                raise
            stub = channel.stub(reg_grpc.RegistrationStub)
            try:
                info = await self._bridge.unary(
                    stub.GetInfo, reg.InfoRequest(), timeout=self._settings.get_info_timeout
                )
            except RpcError as exc:
                raise _Failed("get_info", f"GetInfo failed: {exc}") from None
            record.name = info.name
            record.plugin_type = info.type
            record.versions = tuple(info.supported_versions)
            handler = self._handlers.get(info.type)
            if handler is None:
                reason = (
                    f"no handler registered for plugin type: {info.type!r} at socket path: {socket}"
                )
                await self._notify(channel, record, False, reason)
                raise _Failed("unknown_type", reason)
            endpoint = info.endpoint or socket
            record.endpoint = endpoint
            try:
                if endpoint != socket:
                    endpoint = self._check_endpoint(endpoint)
                    self._endpoint_known(record, endpoint)
                    await self._check_peer(endpoint)
            except _Failed as exc:  # refused, or not there (yet): the plugin is told either way
                await self._notify(channel, record, False, str(exc))
                raise
            plugin = PluginEndpoint(
                name=info.name,
                plugin_type=info.type,
                socket=socket,
                endpoint=endpoint,
                versions=tuple(info.supported_versions),
            )
            try:
                handler.validate(plugin)
            except PluginValidationError as exc:
                reason = f"plugin validation failed with err: {exc}"
                await self._notify(channel, record, False, reason)
                raise _Failed("validation", reason) from None
            # In the actual state before Register: a delete during Register becomes a DeRegister.
            self._actual.add(
                ActualPlugin(
                    socket,
                    wanted.generation,
                    info.type,
                    info.name,
                    endpoint,
                    tuple(info.supported_versions),
                )
            )
            try:
                await handler.register(plugin)
            except Exception as exc:
                self._actual.remove(socket)
                reason = f"RegisterPlugin error -- plugin registration failed with err: {exc}"
                await self._notify(channel, record, False, reason)
                raise _Failed("register", reason) from None
            self._registered(record)
            await self._notify(channel, record, True, "")

    def _registered(self, record: _Record) -> None:
        self._backoff.pop(record.socket, None)
        record.state = "registered"
        record.last_error = ""
        record.probe_failures = 0
        record.registered_type = record.plugin_type
        metrics.REGISTRATIONS.labels(type=record.plugin_type, outcome="success").inc()
        metrics.REGISTERED.labels(type=record.plugin_type).inc()
        log.info(
            "plugin registered",
            socket=record.socket,
            name=record.name,
            type=record.plugin_type,
            endpoint=record.endpoint,
        )

    def _check_path(self, path: str) -> str:
        """A registration socket: found by the scan, it must still be a socket in the registry."""
        try:
            return resolve_endpoint([self._real_root], path)
        except EndpointRejected as exc:
            raise _Rejected("endpoint_rejected", str(exc)) from None
        except EndpointMissing as exc:
            raise _Failed("dial", str(exc)) from None

    def _check_endpoint(self, path: str) -> str:
        """A service endpoint: any absolute path to a socket in the allowed directories. One
        that does not exist yet is retried (a plugin may create it after its registration)."""
        try:
            return resolve_endpoint(self._endpoint_dirs, path)
        except EndpointRejected as exc:
            raise _Rejected("endpoint_rejected", str(exc)) from None
        except EndpointMissing as exc:
            raise _Failed("dial", str(exc)) from None

    def _endpoint_known(self, record: _Record, endpoint: str) -> None:
        """Record a plugin's resolved endpoint; if the scan took it for a plugin, drop that."""
        record.endpoint_real = endpoint
        for path in list(self._seen):
            if self._is_endpoint(path, {endpoint}):
                log.info("socket is a plugin's endpoint, not a plugin", socket=path)
                del self._seen[path]
                self._desired.remove(path)
                self._kick()

    async def _check_peer(self, path: str) -> None:
        try:
            creds = await peer_credentials(path, self._settings.dial_timeout)
        except (OSError, trio.TooSlowError) as exc:
            raise _Failed("dial", f"cannot connect to {path}: {exc or 'timeout'}") from None
        if not self._uid_allowed(creds.uid):
            raise _Rejected(
                "peer_rejected",
                f"socket {path} is served by pid {creds.pid} uid {creds.uid}, "
                "which is not an allowed plugin UID",
            )

    async def _notify(self, channel: GrpcChannel, record: _Record, ok: bool, error: str) -> None:
        """Tell the plugin the outcome. Its failure does not change the outcome."""
        stub = channel.stub(reg_grpc.RegistrationStub)
        try:
            await self._bridge.unary(
                stub.NotifyRegistrationStatus,
                reg.RegistrationStatus(plugin_registered=ok, error=error),
                timeout=self._settings.notify_timeout,
            )
        except RpcError as exc:
            metrics.ERRORS.labels(kind="notify").inc()
            log.warning(
                "NotifyRegistrationStatus failed",
                socket=record.socket,
                name=record.name,
                error=str(exc),
            )

    async def _unregister(self, registered: ActualPlugin) -> None:
        socket = registered.socket
        try:
            self._actual.remove(socket)
            handler = self._handlers[registered.plugin_type]
            await self._deregister(handler, registered)
            metrics.DEREGISTRATIONS.labels(type=registered.plugin_type).inc()
            log.info("plugin deregistered", socket=socket, name=registered.name)
        finally:
            record = self._records.get(socket)
            if record is not None and record.registered_type:
                metrics.REGISTERED.labels(type=record.registered_type).dec()
                record.registered_type = ""
                if record.state == "registered":
                    record.state = "registering"
            self._busy.discard(socket)
            self._kick()

    async def _deregister(self, handler: PluginHandler, registered: ActualPlugin) -> None:
        try:
            await handler.deregister(
                PluginEndpoint(
                    name=registered.name,
                    plugin_type=registered.plugin_type,
                    socket=registered.socket,
                    endpoint=registered.endpoint,
                    versions=registered.versions,
                )
            )
        except Exception:
            # The plugin is out of the actual state either way; a handler bug is only logged.
            metrics.ERRORS.labels(kind="deregister").inc()
            log.exception("plugin handler failed to deregister", socket=registered.socket)

    # -- connection monitor ------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        while True:
            await trio.sleep(self._settings.probe_interval)
            async with trio.open_nursery() as nursery:
                for registered in self._actual.plugins():
                    if registered.socket not in self._busy:
                        nursery.start_soon(self._probe_registered, registered)
                for path, identity in self._seen.items():
                    if self._desired.get(path) is None and path not in self._busy:
                        nursery.start_soon(self._probe_dropped, path, identity)

    async def _probe(self, socket: str) -> None:
        """The connection monitor's probe: dial, then GetInfo, each with its own (kubelet
        monitor) timeout, longer than registration's 1 s: a slow answer is not a dead plugin."""
        async with self._bridge.channel(socket) as channel:
            await self._bridge.connect(channel, within=self._settings.probe_dial_timeout)
            stub = channel.stub(reg_grpc.RegistrationStub)
            await self._bridge.unary(
                stub.GetInfo, reg.InfoRequest(), timeout=self._settings.probe_get_info_timeout
            )

    async def _probe_registered(self, registered: ActualPlugin) -> None:
        record = self._records.get(registered.socket)
        if record is None:
            return
        try:
            await self._probe(registered.socket)
        except RpcError as exc:
            record.probe_failures += 1
            metrics.ERRORS.labels(kind="probe").inc()
            log.warning(
                "plugin probe failed",
                socket=registered.socket,
                name=registered.name,
                failures=record.probe_failures,
                error=str(exc),
            )
            if record.probe_failures >= self._settings.probe_failures:
                record.state = "failed"
                record.last_error = f"deregistered after {record.probe_failures} failed probes"
                self._desired.remove(registered.socket)
                self._kick()
        else:
            record.probe_failures = 0

    async def _probe_dropped(self, socket: str, identity: SocketIdentity) -> None:
        """A socket dropped for failing probes comes back once it answers again."""
        try:
            await self._probe(socket)
        except RpcError:
            return
        if self._seen.get(socket) == identity and self._desired.get(socket) is None:
            log.info("unresponsive plugin answers again", socket=socket)
            self._desired.force_new_generation(socket, identity)
            self._kick()
