"""The connection monitor: GetInfo probes of registered and dropped plugin sockets."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import trio

from nodeagent.core.latest import LatestValue
from nodeagent.log import get_logger
from nodeagent.plugins import metrics
from nodeagent.plugins.executor import OperationExecutor
from nodeagent.plugins.settings import PluginSettings
from nodeagent.plugins.state import (
    ActualPlugin,
    Caches,
    PluginState,
    ProbeVerdict,
    SocketIdentity,
)
from nodeagent.rpc.errors import RpcError, connection_refused

if TYPE_CHECKING:
    from nodeagent.rpc.bridge import GrpcBridge

__all__ = ["ConnectionMonitor"]

log = get_logger(__name__)


class ConnectionMonitor:
    """Probes plugins with GetInfo (the kubelet's 2025 connection monitor) and edits the
    desired state on what it finds.

    Owns nothing but its loop; the consecutive failures it counts live on each socket's
    `PluginRecord`. Every `probe_interval` it probes, concurrently, each registered plugin and
    each socket the scan found but the desired state lacks (one dropped for failing probes),
    skipping sockets with an operation under way. A probe dials within `probe_dial_timeout`, then
    asks GetInfo within `probe_get_info_timeout` (longer than registration's: a slow answer is
    not a dead plugin). After `probe_failures` consecutive failures a plugin is removed from the
    desired state, so the reconciler deregisters it in the ordinary way (consumers apply their
    own graces); a dropped socket that answers again gets a new generation and registers afresh.
    A socket whose last failure was a refused connection (nobody listens: the plugin died and
    left it) is dropped as `STALE`, and so is a dropped one that starts refusing: a plugin that
    left, not one unreachable.
    A probe may last its two timeouts (30 s by default): its result is applied only to the
    registration it probed (`Caches.probe_result`), never to a plugin that replaced it at the
    same path meanwhile (a container restarted during the probe).
    """

    def __init__(
        self,
        settings: PluginSettings | LatestValue[PluginSettings],
        bridge: GrpcBridge,
        caches: Caches,
        executor: OperationExecutor,
        seen: Callable[[], Mapping[str, SocketIdentity]],
        *,
        kick: Callable[[], None],
    ) -> None:
        self._live = settings if isinstance(settings, LatestValue) else LatestValue(settings)
        self._bridge = bridge
        self._caches = caches
        self._executor = executor
        self._seen = seen  # the sockets the registry scan found
        self._kick = kick

    @property
    def _settings(self) -> PluginSettings:
        return self._live.value  # the newest: probe_interval is live

    async def run(self) -> None:
        while True:
            # A new probe_interval (a reload) ends a wait begun with the old one.
            with trio.move_on_after(self._settings.probe_interval):
                await self._live.wait_newer(self._live.version)
            await self.probe_all()

    async def probe_all(self) -> None:
        """One round of probes; returns when every probe has ended."""
        async with trio.open_nursery() as nursery:
            for registered in self._caches.actual.plugins():
                if not self._executor.busy(registered.socket):
                    nursery.start_soon(self._probe_registered, registered)
            for path, identity in self._seen().items():
                if self._caches.desired.get(path) is None and not self._executor.busy(path):
                    nursery.start_soon(self._probe_dropped, path, identity)

    async def _probe(self, socket: str) -> None:
        """Dial, then GetInfo, each with its own (kubelet monitor) timeout."""
        # Here, not at the top: an idle node with no plugins never loads protobuf or grpclib.
        from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc
        from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg

        async with self._bridge.channel(
            socket, max_message_bytes=self._settings.max_message_bytes
        ) as channel:
            await self._bridge.connect(channel, within=self._settings.probe_dial_timeout)
            stub = channel.stub(reg_grpc.RegistrationStub)
            await self._bridge.unary(
                stub.GetInfo, reg.InfoRequest(), timeout=self._settings.probe_get_info_timeout
            )

    async def _probe_registered(self, registered: ActualPlugin) -> None:
        error: RpcError | None = None
        try:
            await self._probe(registered.socket)
        except RpcError as exc:
            error = exc
        # Read only now: the socket may have been recreated and registered again meanwhile.
        limit = self._settings.probe_failures
        refused = error is not None and connection_refused(error)
        verdict = self._caches.probe_result(registered, error is None, limit, refused=refused)
        if verdict is ProbeVerdict.STALE:
            if error is not None:
                log.info(
                    "probe of a replaced registration failed; ignored",
                    socket=registered.socket,
                    name=registered.name,
                    error=str(error),
                )
            return
        if error is None:
            return
        metrics.ERRORS.labels(kind="probe").inc()
        record = self._caches.records[registered.socket]
        log.warning(
            "plugin probe failed",
            socket=registered.socket,
            name=registered.name,
            failures=record.probe_failures,
            error=str(error),
        )
        if verdict is ProbeVerdict.DROPPED:
            if refused:
                log.warning(
                    "plugin deregistered: stale socket (nobody listening); "
                    "remove it or restart the plugin",
                    socket=registered.socket,
                    name=registered.name,
                )
            self._kick()

    async def _probe_dropped(self, socket: str, identity: SocketIdentity) -> None:
        """A socket dropped for failing probes comes back once it answers again."""
        try:
            await self._probe(socket)
        except RpcError as exc:
            if connection_refused(exc):
                self._refused(socket, identity)
            return
        if self._seen().get(socket) == identity and self._caches.desired.get(socket) is None:
            log.info("unresponsive plugin answers again", socket=socket)
            self._caches.desired.force_new_generation(socket, identity)
            self._kick()

    def _refused(self, socket: str, identity: SocketIdentity) -> None:
        """A socket dropped for failing probes now refuses connections: its plugin, hung until
        then, is gone (killed) and left the socket."""
        record = self._caches.records.get(socket)
        if record is None or record.state is not PluginState.FAILED:
            return  # already stale, or being registered again
        if self._seen().get(socket) != identity or self._caches.desired.get(socket) is not None:
            return  # recreated meanwhile: the record is not this socket's any more
        self._caches.socket_refused(record, record.last_error)
        log.warning(
            "plugin socket stale (nobody listening); remove it or restart the plugin",
            socket=socket,
            name=record.name,
        )
        self._kick()
