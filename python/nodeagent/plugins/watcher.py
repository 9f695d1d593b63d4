"""The registry watcher: the kubelet's plugin watcher, by periodic scan instead of fsnotify."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from nodeagent.core.errors import ConfigError
from nodeagent.core.wake import Wake
from nodeagent.log import get_logger
from nodeagent.plugins import metrics
from nodeagent.plugins.registry import ensure_registry_dir, scan_registry
from nodeagent.plugins.state import Caches, SocketIdentity

__all__ = ["RegistryWatcher"]

log = get_logger(__name__)


class RegistryWatcher:
    """Keeps the desired state of the world equal to the plugin sockets in the registry.

    Owns the registry root (created at start, recreated if it vanishes), the sockets the last
    scan found (`seen`, with their identities) and the scan's health (`scanned`, `scan_error`,
    shown by readiness). Every `scan_interval` it lists the registry: a new or recreated socket
    is added to (refreshed in) the desired state, a vanished one removed, then `kick` wakes the
    reconciler. A failed scan keeps the last good state (nothing is deregistered) and is logged
    once per distinct error. A socket that is some known plugin's service endpoint (the upstream
    layout may put it in the registry) is not a plugin: the scan leaves it out, and
    `drop_endpoint` takes out one the scan added before its plugin named it.
    """

    def __init__(
        self,
        registry_dir: str,
        scan_interval: float | Callable[[], float],
        caches: Caches,
        *,
        kick: Callable[[], None],
        changed: Callable[[], None],
    ) -> None:
        # Absolute, so every socket path derived from it passes the inside-the-registry check.
        self.root = os.path.abspath(registry_dir)
        self.real_root = os.path.realpath(self.root)
        self._scan_interval = _as_callable(scan_interval)
        self._retimed = Wake()
        self._caches = caches
        self._kick = kick  # the desired state changed: reconcile (and announce)
        self._changed = changed  # only what is shown changed: announce
        self._seen: dict[str, SocketIdentity] = {}
        self.scanned = False
        self.scan_error = ""

    @property
    def seen(self) -> Mapping[str, SocketIdentity]:
        """Every plugin socket the last scan found (dropped ones included), by path."""
        return self._seen

    def prepare_root(self) -> None:
        """Create the registry directory; ConfigError (plugins.registry_dir) if impossible."""
        try:
            ensure_registry_dir(self.root)
        except OSError as exc:
            raise ConfigError(
                "plugins.registry_dir", self.root, f"cannot create directory: {exc.strerror}"
            ) from exc
        self.real_root = os.path.realpath(self.root)

    def reset(self) -> None:
        self._seen = {}
        self.scanned = False
        self.scan_error = ""

    def retime(self) -> None:
        """The interval changed: end the current wait (scanning now) so the next uses it."""
        self._retimed.set()

    async def run(self) -> None:
        while True:
            self._retimed.clear()
            await self._retimed.wait_for(self._scan_interval())
            self.scan()

    def scan(self) -> None:
        try:
            found = scan_registry(self.root)
        except FileNotFoundError:
            # The directory itself was removed: every plugin in it is gone.
            log.warning("plugin registry directory vanished; recreating", path=self.root)
            try:
                ensure_registry_dir(self.root)
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
        changed = not self.scanned or bool(self.scan_error)  # readiness changed
        self.scanned = True
        self.scan_error = ""
        changed = self._caches.desired.follow_scan(self._seen, found) or changed
        self._seen = found
        if changed:
            self._kick()

    def drop_endpoint(self, endpoint: str) -> None:
        """A plugin named `endpoint` (resolved) as its service socket: if the scan took that
        socket for a plugin, forget it."""
        for path in list(self._seen):
            if self._is_endpoint(path, {endpoint}):
                log.info("socket is a plugin's endpoint, not a plugin", socket=path)
                del self._seen[path]
                self._caches.desired.remove(path)
                self._kick()

    def _endpoint_sockets(self) -> set[str]:
        """Resolved endpoints of the plugins known now (while their registration socket is
        there): sockets that serve a plugin, not plugins of their own."""
        return {
            r.endpoint_real
            for r in self._caches.records.values()
            if r.endpoint_real and r.endpoint_real != self._real_path(r.socket)
        }

    def _is_endpoint(self, path: str, endpoints: set[str]) -> bool:
        # A registered plugin stays one even if another plugin names its socket as endpoint.
        return self._real_path(path) in endpoints and self._caches.actual.get(path) is None

    def _real_path(self, path: str) -> str:
        # Scanned paths contain no symbolic links below the root (the scan does not follow them).
        return os.path.join(self.real_root, os.path.relpath(path, self.root))

    def _scan_failed(self, exc: OSError) -> None:
        error = f"{self.root}: {exc.strerror or exc}"
        metrics.ERRORS.labels(kind="scan").inc()
        if error != self.scan_error:  # log once per distinct failure, not once per scan
            log.warning("plugin registry scan failed", path=self.root, error=str(exc))
            self.scan_error = error
            self._changed()  # readiness changed


def _as_callable(value: float | Callable[[], float]) -> Callable[[], float]:
    if callable(value):
        return value
    return lambda: value
