"""Metrics of the process itself (default prometheus registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Info

COMPONENT_RESTARTS = Counter(
    "nodeagent_component_restarts_total",
    "Times a supervised component failed (or exited) and was scheduled for a restart.",
    ["component"],
)
COMPONENT_READY = Gauge(
    "nodeagent_component_ready",
    "1 if the supervised component is running and reports ready, else 0.",
    ["component"],
)
BUILD_INFO = Info(
    "nodeagent_build",
    "Build and runtime information: version, python version, mode (standalone or cluster).",
)
LOOP_LAG = Gauge(
    "nodeagent_loop_lag_seconds",
    "How late the last main-loop heartbeat tick woke up compared to its schedule.",
)
OPS_REQUESTS = Counter(
    "nodeagent_ops_requests_total",
    "Requests served by the ops HTTP endpoint, by path (unknown paths as 'other') and status.",
    ["path", "code"],
)
SD_NOTIFY_ERRORS = Counter(
    "nodeagent_sd_notify_errors_total",
    "sd_notify datagrams that could not be sent to $NOTIFY_SOCKET.",
)
CONFIG_RELOADS = Counter(
    "nodeagent_config_reloads_total",
    "Config file re-reads (SIGHUP) by result: applied, unchanged, invalid (kept the running "
    "config), refused (a static field or a component's veto).",
    ["result"],
)
