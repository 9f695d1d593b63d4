"""Connection slots of one ops listener, so that health probes never queue behind other clients.

A listener has `max_connections` ordinary slots and `probe_connections` reserved ones. A
connection is *idle* while it has not sent its whole request head, or after its response while
the close lingers; idle connections hold a slot without doing anything useful, so when every
ordinary slot is taken the oldest idle connection is closed (evicted) to make room. Only when no
connection is idle (all are being answered) does a newcomer get a reserved slot, which serves
`/healthz` and `/readyz` only; with those full too, it is refused (503). A probe therefore gets
an answer whatever other clients hold: idle ones are evicted, busy ones finish within
`ops.request_timeout`, and the reserve stays for probes.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

import trio
from prometheus_client import Counter, Gauge

from nodeagent.log import get_logger

log = get_logger(__name__)

Slot = Literal["ordinary", "reserved"]

OPS_CONNECTIONS = Counter(
    "nodeagent_ops_connections_total",
    "Connections to the ops endpoint by listener (main, public) and outcome: accepted (given a "
    "slot), refused (every slot busy: 503), evicted (idle, closed to make room), timed_out (the "
    "request head did not arrive in time: 408).",
    ["listener", "outcome"],
)
OPS_CONNECTIONS_OPEN = Gauge(
    "nodeagent_ops_connections_open",
    "Connections holding a slot of the ops endpoint, by listener and slot (ordinary, reserved).",
    ["listener", "slot"],
)
OPS_BAD_REQUESTS = Counter(
    "nodeagent_ops_bad_requests_total",
    "Requests refused before routing, by listener and reason (malformed, head_too_large, "
    "too_many_headers, version, target, eof, method, not_probe).",
    ["listener", "reason"],
)

# At most one "under pressure" log line per this many seconds per listener (a flood must not
# become a log flood); each line says how many connections were evicted and refused since the last.
PRESSURE_LOG_INTERVAL = 10.0


@dataclass(eq=False)
class Connection:
    """One accepted connection: its slot and the scope that eviction cancels."""

    id: int
    slot: Slot = "ordinary"
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    evicted: bool = False


class ConnectionSlots:
    def __init__(self, listener: str, max_connections: int, probe_connections: int) -> None:
        self.listener = listener
        self.limits: dict[Slot, int] = {
            "ordinary": max_connections,
            "reserved": probe_connections,
        }
        self.open: dict[Slot, int] = {"ordinary": 0, "reserved": 0}
        # Idle connections, the one idle longest first.
        self._idle: OrderedDict[int, Connection] = OrderedDict()
        self._ids = itertools.count()
        self._last_log: float | None = None
        self._since_log: dict[str, int] = {"evicted": 0, "refused": 0}
        for slot in self.limits:
            OPS_CONNECTIONS_OPEN.labels(listener=listener, slot=slot).set(0)

    def admit(self) -> Connection | None:
        """A slot for a new connection (evicting the oldest idle one if needed), or None."""
        conn = Connection(next(self._ids))
        slot = self._free_slot()
        if slot is None:
            self._pressure("refused")
            return None
        conn.slot = slot
        self._take(slot, +1)
        self._idle[conn.id] = conn
        OPS_CONNECTIONS.labels(listener=self.listener, outcome="accepted").inc()
        return conn

    def _free_slot(self) -> Slot | None:
        if self.open["ordinary"] < self.limits["ordinary"]:
            return "ordinary"
        if self._idle:
            _, victim = self._idle.popitem(last=False)
            victim.evicted = True
            victim.scope.cancel()
            self._take(victim.slot, -1)
            self._pressure("evicted")
            return victim.slot
        if self.open["reserved"] < self.limits["reserved"]:
            return "reserved"
        return None

    def busy(self, conn: Connection) -> None:
        """The head arrived: the connection is being answered and cannot be evicted."""
        self._idle.pop(conn.id, None)

    def idle(self, conn: Connection) -> None:
        """The response is written; only the lingering close is left."""
        if not conn.evicted:
            self._idle[conn.id] = conn

    def release(self, conn: Connection) -> None:
        if conn.evicted:
            return  # its slot was handed over when it was evicted
        self._idle.pop(conn.id, None)
        self._take(conn.slot, -1)

    def _take(self, slot: Slot, delta: int) -> None:
        self.open[slot] += delta
        OPS_CONNECTIONS_OPEN.labels(listener=self.listener, slot=slot).set(self.open[slot])

    def _pressure(self, outcome: str) -> None:
        OPS_CONNECTIONS.labels(listener=self.listener, outcome=outcome).inc()
        self._since_log[outcome] += 1
        now = trio.current_time()
        if self._last_log is not None and now - self._last_log < PRESSURE_LOG_INTERVAL:
            return
        log.warning(
            "ops endpoint under pressure: every connection slot taken",
            listener=self.listener,
            evicted=self._since_log["evicted"],
            refused=self._since_log["refused"],
            max_connections=self.limits["ordinary"],
            probe_connections=self.limits["reserved"],
        )
        self._last_log = now
        self._since_log = dict.fromkeys(self._since_log, 0)
