"""Prometheus metrics of the plugin manager."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

REGISTRATIONS = Counter(
    "nodeagent_plugin_registrations_total",
    "Plugin registration attempts by plugin type and outcome (success, failed, rejected).",
    ["type", "outcome"],
)
DEREGISTRATIONS = Counter(
    "nodeagent_plugin_deregistrations_total",
    "Plugins deregistered (socket removed or recreated, probe failures, replaced).",
    ["type"],
)
STREAM_RESTARTS = Counter(
    "nodeagent_plugin_stream_restarts_total",
    "List-and-watch streams reopened after an error.",
    ["type"],
)
MESSAGES = Counter(
    "nodeagent_plugin_messages_total",
    "Valid messages received from plugin streams.",
    ["type"],
)
MESSAGES_SKIPPED = Counter(
    "nodeagent_plugin_messages_skipped_total",
    "Plugin messages never processed because a newer one from the same stream superseded them.",
    ["type"],
)
DATA_EXPIRED = Counter(
    "nodeagent_plugin_data_expired_total",
    "Deregistered plugins whose last data was forgotten after deregistered_data_grace.",
    ["type"],
)
ERRORS = Counter(
    "nodeagent_plugin_errors_total",
    "Plugin errors by kind (dial, get_info, unknown_type, validation, register, notify, probe, "
    "peer_rejected, endpoint_rejected, stream, stream_internal, message_too_large, "
    "message_malformed, message_invalid, deregister, scan, report_poll).",
    ["kind"],
)
REGISTERED = Gauge(
    "nodeagent_plugins_registered",
    "Plugins currently registered, by plugin type.",
    ["type"],
)
STALE_SOCKETS = Gauge(
    "nodeagent_plugin_stale_sockets",
    "Plugin sockets in the registry that refuse connections: nobody listens on them (a plugin "
    "that died without removing its socket); not counted against readiness.",
)
