"""Prometheus metrics of the Kubernetes client."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

API_REQUESTS = Counter(
    "nodeagent_api_requests_total",
    "Kubernetes API requests by verb, resource and HTTP status code ('error' if no answer).",
    ["verb", "resource", "code"],
)
API_LATENCY = Histogram(
    "nodeagent_api_request_duration_seconds",
    "Kubernetes API request latency (one attempt, until the response headers for watches).",
    ["verb", "resource"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
RATE_LIMIT_WAIT = Histogram(
    "nodeagent_api_rate_limiter_wait_seconds",
    "Time requests waited for the client-side token bucket.",
    buckets=(0.0, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
API_RETRIES = Counter(
    "nodeagent_api_retries_total",
    "Kubernetes API request attempts retried, by verb, resource and reason.",
    ["verb", "resource", "reason"],
)
WATCH_RESTARTS = Counter(
    "nodeagent_watch_restarts_total",
    "Watch connections restarted, by resource and reason "
    "(closed, inactivity, broken, gone, forbidden, error, http_error, connect, decode_error, "
    "too_large).",
    ["resource", "reason"],
)
WATCH_EVENTS = Counter(
    "nodeagent_watch_events_total",
    "Watch events (bookmarks included) received, by resource.",
    ["resource"],
)
WATCH_DECODE_ERRORS = Counter(
    "nodeagent_watch_decode_errors_total",
    "Watch bodies (streaming lists included) that held bytes the client could not decode (a "
    "gzip member cut short, not gzip, an encoding it did not ask for); each one relists.",
    ["resource"],
)
BODIES_TOO_LARGE = Counter(
    "nodeagent_api_bodies_too_large_total",
    "Kubernetes API bodies refused while decoding because they grew past a limit, by resource "
    "and limit: response (a whole response past kube.max_response_bytes: the request fails, not "
    "retried) or event (one watch event past kube.max_event_bytes: the watch relists).",
    ["resource", "limit"],
)
WATCH_RELISTS = Counter(
    "nodeagent_watch_relists_total",
    "Full lists made by watches (the first one and every relist after 410), by resource.",
    ["resource"],
)
WRITE_OBSERVER_ERRORS = Counter(
    "nodeagent_api_write_observer_errors_total",
    "Write observers that raised (the client logged and went on).",
)
AUTH_REFRESHES = Counter(
    "nodeagent_api_credential_refreshes_total",
    "Credentials reloaded, by source (token_file, exec, client_cert).",
    ["source"],
)
WATCH_STREAMING_LISTS = Counter(
    "nodeagent_watch_streaming_lists_total",
    "Streaming lists (watch with sendInitialEvents) by resource and result: complete (the "
    "initial-events-end bookmark came), failed (retried), unsupported (the server refused it; "
    "with kube.streaming_list = auto the watch lists with LIST from then on).",
    ["resource", "result"],
)
