"""The cluster connection as a supervised component.

Standalone when no kubeconfig is configured and the agent is not in a pod: the component stays
idle and says so in /readyz. Otherwise it builds the client and keeps probing the apiserver
(`/version`, then `/readyz`) so readiness shows whether the cluster is reachable; publishers that
need the client arrive with later issues and take it from here.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from nodeagent.config.schema import KubeSettings
from nodeagent.log import get_logger
from nodeagent.service.component import Readiness

log = get_logger(__name__)

STANDALONE_REASON = "standalone: no cluster configured"

LoadClient = Callable[[KubeSettings], Any]
Probe = Callable[[Any], Awaitable[str]]


def _default_load_client(settings: KubeSettings) -> Any:
    try:
        from nodeagent.kube.settings import load_client
    except ImportError:  # PLACEHOLDER until the kube package lands: standalone only
        if settings.kubeconfig is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            return None
        raise

    return load_client(settings)


async def _default_probe(client: Any) -> str:
    """GET /version and /readyz; returns the server's gitVersion."""
    version = await client.version()
    await client.readyz()
    return str(version.get("gitVersion", "unknown"))


class ClusterComponent:
    name = "kube"

    def __init__(
        self,
        settings: KubeSettings,
        *,
        load_client: LoadClient = _default_load_client,
        probe: Probe = _default_probe,
        probe_interval: float = 30.0,
    ) -> None:
        self.settings = settings
        self._load_client = load_client
        self._probe = probe
        self.probe_interval = probe_interval
        self.mode: str = "unknown"
        self.client: Any = None
        self.server_version: str | None = None
        self._ready: Readiness = (False, "connecting")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        client = self._load_client(self.settings)
        if client is None:
            self.mode = "standalone"
            self._ready = (True, STANDALONE_REASON)
            log.info("no cluster configured: running standalone")
            task_status.started()
            await trio.sleep_forever()
        self.mode = "cluster"
        self._ready = (False, "connecting to the apiserver")
        async with client:
            self.client = client
            try:
                task_status.started()
                while True:
                    await self._check(client)
                    await trio.sleep(self.probe_interval)
            finally:
                self.client = None

    async def _check(self, client: Any) -> None:
        try:
            version = await self._probe(client)
        except Exception as exc:
            self._ready = (False, f"apiserver unreachable: {exc}")
            log.warning("apiserver probe failed", error=str(exc))
            return
        if version != self.server_version:
            log.info("connected to the apiserver", version=version)
        self.server_version = version
        self._ready = (True, f"connected (apiserver {version})")

    def readiness(self) -> Readiness:
        return self._ready
