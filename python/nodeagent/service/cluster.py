"""The cluster connection as a supervised component.

Standalone when no kubeconfig is configured and the agent is not in a pod: the component stays
idle and says so in /readyz. Otherwise readiness shows whether the cluster is reachable: the
process's watches show it while every one of them has had an event, a bookmark (about one a
minute) or a list within `kube.watch_inactivity_timeout` and none is failing; only otherwise
(starting, a watch stalled or failing) is the apiserver's `/readyz` probed, and `/version`
when (re)connecting and every VERSION_REFRESH_PROBES probes (an upgraded apiserver is shown).
Two thirds of an idle agent's requests were these probes (issue 24 s4).

The process has one client: built by `preflight`, opened by the agent for its whole life
(`connected`), shared by every component that talks to the cluster. Write observers (the
accumulator's read-your-writes) only see writes made through that same client, and a
component restart must not close a client another component is using. Likewise its watches
(`watches`, a `WatchHub` running as long as the client is open): the components' accumulators
watch through it, so the Node, watched by both the publisher and the dynamic configuration, is
watched once.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import msgspec
import trio

from nodeagent.accumulator import RECONNECT_GRACE, Watch, WatchHub, client_watch
from nodeagent.core.backoff import Backoff, Jitter
from nodeagent.core.component import Readiness
from nodeagent.core.errors import ConfigError
from nodeagent.core.health import Lapses, describe, overdue
from nodeagent.kube import KubeClient, KubeSettings, WatchRequest, load_client
from nodeagent.log import get_logger

log = get_logger(__name__)

STANDALONE_REASON = "standalone: no cluster configured"

# Before the first connection, a failed probe is retried after 1 s, doubling up to the probe
# interval, jittered (up to half shorter). Once connected, from PROBE_RETRY_CONNECTED: an outage
# within agent.apiserver_unreachable_bound does not flip readiness, and what notices the
# apiserver back within a second is the watches (looked at every WATCH_LOOK s meanwhile, no
# request), not the probe. Retrying from 1 s, the fleet probed the restarting apiserver 3.5
# times per agent with /readyz answering 500 (issue 24 s5: 194 requests/s at the peak with 40
# agents, 138 before the probe was skipped).
PROBE_RETRY_INITIAL = 1.0
PROBE_RETRY_CONNECTED = 10.0
WATCH_LOOK = 1.0
# /version is asked again every this many probes while connected (10 probes of 30 s: every 5 min).
VERSION_REFRESH_PROBES = 10

# Resources (group, plural) whose watches of the same request are shared by their consumers:
# this node's Node (the publisher's owner UID, the dynamic configuration's labels). Others get a
# watch each (the hub keeps no copy of their objects, e.g. large ResourceSlices).
SHARED_WATCHES = frozenset({("", "nodes")})

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
        watch: Callable[[KubeClient], Watch] | None = None,
    ) -> None:
        """``watch``: how the process's watches are run over the client (default
        `run_watch`; tests put a fake here)."""
        self.settings = settings
        self._run_watch = watch
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
        # The process's watches (None: standalone, or not preflighted yet).
        self.watches: WatchHub | None = None
        self.probes_skipped = 0
        # While the watches cannot reconnect: when the apiserver is probed (None: not lost).
        self._probe_due: float | None = None

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
        if client is not None:
            watch = self._run_watch(client) if self._run_watch else client_watch(client)
            self.watches = WatchHub(watch, share=_shared, client=client)
        self._preflighted = True

    @asynccontextmanager
    async def connected(self) -> AsyncIterator[KubeClient | None]:
        """The process's client (None: standalone), open for the duration of the block."""
        if not self._preflighted:
            self.preflight()
        if self.client is None:
            yield None
            return
        async with self.client as client, trio.open_nursery() as nursery:
            if self.watches is not None:
                await nursery.start(self.watches.run)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()

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
        first = Backoff(
            min(PROBE_RETRY_INITIAL, self.probe_interval),
            self.probe_interval,
            jitter=Jitter.below(0.5),
        )
        again = Backoff(
            min(PROBE_RETRY_CONNECTED, self.probe_interval),
            self.probe_interval,
            jitter=Jitter.below(0.5),
        )
        while True:
            if self._watches_show_reachable():
                first.reset()
                again.reset()
                self._probe_due = None
                # A watch failing or disconnected is news at once (looked at again once a
                # healthy one had time to reconnect); a stalled one is seen at the next look.
                with trio.move_on_after(self.probe_interval):
                    assert self.watches is not None
                    await self.watches.trouble()
                    await trio.sleep(2 * RECONNECT_GRACE)
            elif (due := self._lost_watches_wait()) is not None:
                # The watches are reconnecting: their attempts are what finds the apiserver
                # back; probing too, the fleet met the restarted apiserver with a request each
                # in its first second (issue 24 s5). Probed once this lasts a jittered interval.
                await self._until_retry(due - trio.current_time())
            elif await self._check(client):
                first.reset()
                again.reset()
                await trio.sleep(self.probe_interval)
            else:
                await self._until_retry((again if self._connected_once else first).next())

    def _lost_watches_wait(self) -> float | None:
        """While the watches (connected before) cannot reconnect and their probe is not due:
        the apiserver is taken for unreachable since the first stream ended, and the probe's
        due time is returned (None: probe now, or the watches are not lost)."""
        if self.watches is None or self.server_version is None:
            return None
        now = trio.current_time()
        since = self.watches.lost_since(now)
        if since is None:
            self._probe_due = None
            return None
        if self._probe_due is None:
            self._probe_due = now + self.probe_interval * random.uniform(0.5, 1.0)
        if now >= self._probe_due:
            return None
        why = "the watches cannot reconnect"
        self._ready = (False, f"apiserver unreachable: {why}")
        self._unreachable.observe({"apiserver": why}, now, began={"apiserver": since})
        return self._probe_due

    async def _until_retry(self, delay: float) -> None:
        """Waits ``delay`` s, or less if the watches show the apiserver back before."""
        deadline = trio.current_time() + delay
        while (left := deadline - trio.current_time()) > 0:
            await trio.sleep(min(WATCH_LOOK, left))
            if self._watches_show_reachable():
                return

    def _watches_show_reachable(self) -> bool:
        """Every watch has shown the apiserver answering lately: no probe needed. Never before
        a first probe (the server's version is asked then)."""
        if self.watches is None or self.server_version is None:
            return False
        now = trio.current_time()
        ok, how = self.watches.reachable(now, self.settings.watch_inactivity_timeout)
        if not ok:
            return False
        self.probes_skipped += 1
        self._unreachable.clear()
        self._ready = (True, f"connected (apiserver {self.server_version}; {how})")
        return True

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


def _shared(request: WatchRequest) -> bool:
    return (request.resource.group, request.resource.plural) in SHARED_WATCHES
