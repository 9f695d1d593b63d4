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
ERRORS = Counter(
    "nodeagent_plugin_errors_total",
    "Plugin errors by kind (dial, get_info, unknown_type, validation, register, notify, probe, "
    "peer_rejected, endpoint_rejected, stream, message_too_large, message_malformed, "
    "message_invalid, deregister, scan).",
    ["kind"],
)
REGISTERED = Gauge(
    "nodeagent_plugins_registered",
    "Plugins currently registered, by plugin type.",
    ["type"],
)
