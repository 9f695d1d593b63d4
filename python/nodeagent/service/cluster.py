"""The cluster connection as a supervised component.

Standalone when no kubeconfig is configured and the agent is not in a pod: the component stays
idle and says so in /readyz. Otherwise it keeps probing the apiserver's `/readyz` so readiness
shows whether the cluster is reachable; `/version` only when (re)connecting and every
VERSION_REFRESH_PROBES probes (an upgraded apiserver is shown), as most of an idle agent's
requests were these probes.

The process has one client: built by `preflight`, opened by the agent for its whole life
(`connected`), shared by every component that talks to the cluster. Write observers (the
accumulator's read-your-writes) only see writes made through that same client, and a
component restart must not close a client another component is using.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import msgspec
import trio

from nodeagent.core.backoff import Backoff
from nodeagent.core.errors import ConfigError
from nodeagent.core.health import Lapses, describe, overdue
from nodeagent.kube.client import KubeClient
from nodeagent.kube.settings import KubeSettings, load_client
from nodeagent.log import get_logger
from nodeagent.service.component import Readiness

log = get_logger(__name__)

STANDALONE_REASON = "standalone: no cluster configured"

# After a failed probe the next comes after 1 s, doubling up to the probe interval: an apiserver
# back from a restart makes the agent ready again within seconds, not a whole interval (30 s)
# later (found by the fault matrix: "apiserver restart mid-watch").
PROBE_RETRY_INITIAL = 1.0
# /version is asked again every this many probes while connected (10 probes of 30 s: every 5 min).
VERSION_REFRESH_PROBES = 10

LoadClient = Callable[[KubeSettings], KubeClient | None]
Probe = Callable[[KubeClient, str | None], Awaitable[str]]


class _Version(msgspec.Struct):
    git_version: str = msgspec.field(default="unknown", name="gitVersion")


async def probe_apiserver(client: KubeClient, known_version: str | None = None) -> str:
    """GET /readyz, and first /version unless `known_version` is given (both readable by any
    authenticated identity, node identities included); returns the server's gitVersion."""
    version = known_version
    if version is None:
        body = await client.request("GET", "/version", verb="get", resource="version")
        version = msgspec.json.decode(body, type=_Version).git_version
    await client.request("GET", "/readyz", verb="get", resource="readyz")
    return version


class ClusterComponent:
    name = "kube"

    def __init__(
        self,
        settings: KubeSettings,
        *,
        load_client: LoadClient = load_client,
        probe: Probe = probe_apiserver,
        probe_interval: float = 30.0,
        unreachable_bound: float = 120.0,
    ) -> None:
        self.settings = settings
        self._load_client = load_client
        self._probe = probe
        self.probe_interval = probe_interval
        self.mode: str = "unknown"
        self.client: KubeClient | None = None
        self._preflighted = False
        self.server_version: str | None = None
        self._ready: Readiness = (False, "connecting")
        self._probes_since_version = 0
        # Once connected, an apiserver unreachable for up to this long (a control-plane
        # restart) keeps `kube` ready; never connected, it is not ready at once.
        self.unreachable_bound = unreachable_bound
        self._unreachable = Lapses[str](self.name, "apiserver_unreachable")
        self._connected_once = False

    def preflight(self) -> None:
        """Build (not connect) the client once, so an unusable kubeconfig is a start-up
        configuration error rather than a component restarting forever. Raises ConfigError."""
        try:
            client = self._load_client(self.settings)
        except ConfigError as exc:
            field = exc.field if exc.field.startswith("kube.") else f"kube.{exc.field}"
            raise ConfigError(field, exc.value, exc.rule) from exc
        self.client = client
        self.mode = "standalone" if client is None else "cluster"
        self._preflighted = True

    @asynccontextmanager
    async def connected(self) -> AsyncIterator[KubeClient | None]:
        """The process's client (None: standalone), open for the duration of the block."""
        if not self._preflighted:
            self.preflight()
        if self.client is None:
            yield None
            return
        async with self.client as client:
            yield client

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if not self._preflighted:
            self.preflight()
        client = self.client
        if client is None:
            self.mode = "standalone"
            self._ready = (True, STANDALONE_REASON)
            log.info("no cluster configured: running standalone")
            task_status.started()
            await trio.sleep_forever()
        self._ready = (False, "connecting to the apiserver")
        task_status.started()
        retry = Backoff(min(PROBE_RETRY_INITIAL, self.probe_interval), self.probe_interval)
        while True:
            if await self._check(client):
                retry.reset()
                await trio.sleep(self.probe_interval)
            else:
                await trio.sleep(retry.next())

    async def _check(self, client: KubeClient) -> bool:
        known = self.server_version if self._ready[0] else None
        if self._probes_since_version >= VERSION_REFRESH_PROBES:
            known = None
        try:
            version = await self._probe(client, known)
        except Exception as exc:
            self._ready = (False, f"apiserver unreachable: {exc}")
            self._unreachable.observe({"apiserver": str(exc)}, trio.current_time())
            log.warning("apiserver probe failed", error=str(exc))
            return False
        self._unreachable.clear()
        self._connected_once = True
        self._probes_since_version = 1 if known is None else self._probes_since_version + 1
        if version != self.server_version:
            log.info("connected to the apiserver", version=version)
        self.server_version = version
        self._ready = (True, f"connected (apiserver {version})")
        return True

    def readiness(self) -> Readiness:
        ready, reason = self._ready
        if ready or not self._connected_once:
            return ready, reason
        now = trio.current_time()
        error = reason.removeprefix("apiserver unreachable: ")
        lapses = self._unreachable.observe({"apiserver": error}, now)
        if overdue(lapses, now, self.unreachable_bound) is not None:
            return False, reason
        # A control-plane restart: the agent keeps working from what it holds.
        return True, describe("apiserver unreachable", lapses[0], now, self.unreachable_bound)
