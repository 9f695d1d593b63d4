"""The operation executor: register and unregister operations, one at a time per socket."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import trio

from nodeagent.core.backoff import Backoff
from nodeagent.log import get_logger
from nodeagent.plugins import metrics
from nodeagent.plugins.handler import PluginEndpoint, PluginHandler, PluginValidationError
from nodeagent.plugins.security import (
    EndpointMissing,
    EndpointRejected,
    UidCheck,
    peer_credentials,
    resolve_endpoint,
)
from nodeagent.plugins.settings import PluginSettings
from nodeagent.plugins.state import (
    ActualPlugin,
    Caches,
    DesiredPlugin,
    PluginRecord,
    PluginState,
)
from nodeagent.plugins.watcher import RegistryWatcher
from nodeagent.rpc.errors import RpcError

if TYPE_CHECKING:
    from nodeagent.rpc.bridge import GrpcBridge, GrpcChannel

__all__ = ["OperationExecutor"]

log = get_logger(__name__)


class _Failed(Exception):
    """Registration failed; retried with backoff. `kind` labels the error metric."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Rejected(_Failed):
    """A security rule refused the plugin; not retried until its socket is recreated."""


class _Refused(_Failed):
    """The registration socket refused the connection: nobody listens on it (stale)."""


class OperationExecutor:
    """Runs the reconciler's register and unregister operations (the kubelet's operation
    executor and generator, with its per-socket goroutine map and exponential backoff).

    Owns which sockets have an operation under way (`busy`: at most one per socket).
    `start_register` runs the kubelet's register steps as a task:
    check the socket (inside the registry, served by an allowed UID), GetInfo, find the handler
    by type, check the endpoint (allowed directory, allowed UID), `validate`, add to the actual
    state BEFORE `register` (so a delete meanwhile becomes a deregistration), `register`, and
    NotifyRegistrationStatus either way. A failure is recorded on the socket's `PluginRecord`
    and delays the next attempt (backoff from `registration_backoff_initial` up to
    `registration_backoff_max`); unlike the kubelet, a failed Register step is retried too, and
    the backoff belongs to the socket's generation, not its path: a plugin replaced by a new
    socket at the same path starts afresh. A registration socket that refuses the connection
    (nobody listens: a plugin killed left it) is `STALE`: retried alike, reported once per
    generation, not held against readiness. A security rejection is not retried until the
    socket is recreated (`rejected_generation`).
    `start_unregister` removes the plugin from the actual state, then calls the handler's
    `deregister` (whose failure is only logged). Each operation ends by calling `kick`, so the
    reconciler looks again.
    """

    def __init__(
        self,
        settings: PluginSettings,
        bridge: GrpcBridge,
        handlers: Mapping[str, PluginHandler],
        uid_allowed: UidCheck,
        caches: Caches,
        watcher: RegistryWatcher,
        *,
        kick: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._bridge = bridge
        self._handlers = handlers
        self._uid_allowed = uid_allowed
        self._caches = caches
        self._watcher = watcher
        self._kick = kick
        self._endpoint_dirs = settings.resolved_endpoint_dirs()
        self._busy: set[str] = set()
        # The kubelet's per-operation exponential backoff, without jitter; the failures it
        # counts are each generation's own (`PluginRecord.registration_failures`).
        self._backoff = Backoff(
            settings.registration_backoff_initial, settings.registration_backoff_max
        )

    def busy(self, socket: str) -> bool:
        """Whether an operation on `socket` is under way."""
        return socket in self._busy

    def reset(self) -> None:
        """Forget every operation and registration count (the manager restarts: the tasks that
        ran them died with the previous run; the backoffs go with the records)."""
        for record in self._caches.records.values():
            if record.registered_type:
                metrics.REGISTERED.labels(type=record.registered_type).dec()
        self._busy = set()

    def start_register(self, nursery: trio.Nursery, wanted: DesiredPlugin) -> None:
        self._busy.add(wanted.socket)
        nursery.start_soon(self._register, wanted)

    def start_unregister(self, nursery: trio.Nursery, registered: ActualPlugin) -> None:
        self._busy.add(registered.socket)
        nursery.start_soon(self._unregister, registered)

    # -- register ----------------------------------------------------------------------------

    async def _register(self, wanted: DesiredPlugin) -> None:
        socket = wanted.socket
        record = self._caches.registration_started(wanted)
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
            self._register_failed(record, exc)
        finally:
            self._busy.discard(socket)
            self._kick()

    def _register_failed(self, record: PluginRecord, exc: _Failed) -> None:
        # Only known types become label values: a plugin must not mint metric series.
        plugin_type = record.plugin_type if record.plugin_type in self._handlers else "unknown"
        metrics.ERRORS.labels(kind=exc.kind).inc()
        if isinstance(exc, _Rejected):
            self._caches.registration_rejected(record, str(exc))
            metrics.REGISTRATIONS.labels(type=plugin_type, outcome=record.state.value).inc()
            log.error("plugin rejected", socket=record.socket, name=record.name, reason=str(exc))
            return
        refused = isinstance(exc, _Refused)
        was_stale = record.state is PluginState.STALE
        delay = self._caches.registration_failed(
            record, str(exc), trio.current_time(), self._backoff, refused=refused
        )
        metrics.REGISTRATIONS.labels(type=plugin_type, outcome="failed").inc()
        if refused:
            # Once per generation: its retries find the same dead socket until it is recreated.
            if not was_stale:
                log.warning(
                    "stale plugin socket: nobody listening; remove it or restart the plugin",
                    socket=record.socket,
                    retry_in=delay,
                )
            return
        log.warning(
            "plugin registration failed",
            socket=record.socket,
            name=record.name,
            error=str(exc),
            retry_in=delay,
        )

    async def _register_steps(self, wanted: DesiredPlugin, record: PluginRecord) -> None:
        socket = wanted.socket
        async with self._bridge.channel(
            socket, max_message_bytes=self._settings.max_message_bytes
        ) as channel:
            try:
                self._check_path(socket)
                await self._check_peer(socket, registration=True)
            except _Rejected as exc:
                await self._notify(channel, record, False, str(exc))
                raise
            # Here, not at the top: an idle node with no plugins never loads protobuf or grpclib.
            from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
            from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg

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
                    record.endpoint_real = endpoint
                    self._watcher.drop_endpoint(endpoint)
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
            self._caches.actual.add(
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
                self._caches.actual.remove(socket)
                reason = f"RegisterPlugin error -- plugin registration failed with err: {exc}"
                await self._notify(channel, record, False, reason)
                raise _Failed("register", reason) from None
            self._registered(record)
            await self._notify(channel, record, True, "")

    def _registered(self, record: PluginRecord) -> None:
        self._caches.registration_succeeded(record)
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
        return self._resolve([self._watcher.real_root], path)

    def _check_endpoint(self, path: str) -> str:
        """A service endpoint: any absolute path to a socket in the allowed directories. One
        that does not exist yet is retried (a plugin may create it after its registration)."""
        return self._resolve(self._endpoint_dirs, path)

    @staticmethod
    def _resolve(allowed_dirs: Sequence[str], path: str) -> str:
        try:
            return resolve_endpoint(allowed_dirs, path)
        except EndpointRejected as exc:
            raise _Rejected("endpoint_rejected", str(exc)) from None
        except EndpointMissing as exc:
            raise _Failed("dial", str(exc)) from None

    async def _check_peer(self, path: str, *, registration: bool = False) -> None:
        try:
            creds = await peer_credentials(path, self._settings.dial_timeout)
        except (OSError, trio.TooSlowError) as exc:
            message = f"cannot connect to {path}: {exc or 'timeout'}"
            # A refusing endpoint of a plugin that answers is that plugin failing, not stale.
            if registration and isinstance(exc, ConnectionRefusedError):
                raise _Refused("dial", message) from None
            raise _Failed("dial", message) from None
        if not self._uid_allowed(creds.uid):
            raise _Rejected(
                "peer_rejected",
                f"socket {path} is served by pid {creds.pid} uid {creds.uid}, "
                "which is not an allowed plugin UID",
            )

    async def _notify(
        self, channel: GrpcChannel, record: PluginRecord, ok: bool, error: str
    ) -> None:
        """Tell the plugin the outcome. Its failure does not change the outcome."""
        from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
        from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg

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

    # -- unregister --------------------------------------------------------------------------

    async def _unregister(self, registered: ActualPlugin) -> None:
        socket = registered.socket
        try:
            self._caches.actual.remove(socket)
            handler = self._handlers[registered.plugin_type]
            await self._deregister(handler, registered)
            metrics.DEREGISTRATIONS.labels(type=registered.plugin_type).inc()
            log.info("plugin deregistered", socket=socket, name=registered.name)
        finally:
            record = self._caches.records.get(socket)
            if record is not None and record.registered_type:
                metrics.REGISTERED.labels(type=record.registered_type).dec()
                record.registered_type = ""
                if record.state is PluginState.REGISTERED:
                    record.state = PluginState.REGISTERING
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
