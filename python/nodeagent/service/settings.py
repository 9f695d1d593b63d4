"""Settings of the process itself: the `[agent]` and `[ops]` sections of the config file."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

import msgspec

from nodeagent.core.errors import ConfigError
from nodeagent.core.k8s import is_dns_subdomain
from nodeagent.core.rules import MIN_SECONDS, check_constraints, check_seconds, count

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]


def _positive(
    field: str, value: float, *, minimum: float = MIN_SECONDS, maximum: float | None = None
) -> None:
    check_seconds(field, value, minimum=minimum, maximum=maximum)


class AgentSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`[agent]`: identity, paths, logging and the supervision policy."""

    # "" = resolved at load time from $NODE_NAME, else the lowercased hostname.
    node_name: str = ""
    # "" = /var/lib/nodeagent as root, else $XDG_STATE_HOME/nodeagent or ~/.local/state/nodeagent.
    state_dir: str = ""
    # Where dynamic configuration keeps its state while <state_dir>/checkpoints cannot be written
    # (read-only, full): a directory that lives until a reboot, like /run/nodeagent.
    # "" = $RUNTIME_DIRECTORY (systemd's RuntimeDirectory=), else none.
    runtime_dir: str = ""
    log_level: LogLevel = "info"
    log_format: LogFormat = "text"
    shutdown_timeout: float = 10.0
    heartbeat_interval: float = 1.0
    healthz_stale_after: float = 10.0
    restart_backoff_initial: float = 0.5
    restart_backoff_max: float = 60.0
    # A component that ran this long before failing starts its backoff again from the beginning.
    restart_backoff_reset_after: float = 120.0
    # Seconds between apiserver reachability probes (GET /version, /readyz) in cluster mode.
    cluster_probe_interval: float = 30.0
    # Seconds the apiserver may stay unreachable, once connected, before `kube` turns not ready
    # (longer than a brief control-plane restart, which must not flip readiness).
    apiserver_unreachable_bound: float = 120.0
    # Run as usual but send every write with dryRun=All and persist nothing (no checkpoint
    # either): /v1/writes and `nodeagent status` show what the agent would have written.
    # Static: a change takes a restart (`nodeagent run --dry-run` sets it).
    dry_run: bool = False

    def validate(self) -> None:
        # The rule the kubelet applies to --hostname-override.
        if not is_dns_subdomain(self.node_name):
            raise ConfigError(
                "agent.node_name",
                self.node_name,
                "must be a DNS-1123 subdomain (lowercase alphanumerics, '-', '.'; <= 253 chars)",
            )
        if not self.state_dir.startswith("/"):
            raise ConfigError("agent.state_dir", self.state_dir, "must be an absolute path")
        if self.runtime_dir and not self.runtime_dir.startswith("/"):
            raise ConfigError("agent.runtime_dir", self.runtime_dir, "must be an absolute path")
        _positive("agent.shutdown_timeout", self.shutdown_timeout, maximum=600)
        # The main loop's tick: faster than 100 Hz is a busy loop, not a heartbeat.
        _positive("agent.heartbeat_interval", self.heartbeat_interval, minimum=0.01, maximum=60)
        _positive("agent.healthz_stale_after", self.healthz_stale_after)
        _positive("agent.apiserver_unreachable_bound", self.apiserver_unreachable_bound)
        if self.healthz_stale_after <= self.heartbeat_interval:
            raise ConfigError(
                "agent.healthz_stale_after",
                self.healthz_stale_after,
                f"must be greater than agent.heartbeat_interval ({self.heartbeat_interval:g})",
            )
        _positive("agent.restart_backoff_initial", self.restart_backoff_initial)
        _positive("agent.restart_backoff_max", self.restart_backoff_max)
        if self.restart_backoff_max < self.restart_backoff_initial:
            raise ConfigError(
                "agent.restart_backoff_max",
                self.restart_backoff_max,
                f"must be >= agent.restart_backoff_initial ({self.restart_backoff_initial:g})",
            )
        _positive("agent.restart_backoff_reset_after", self.restart_backoff_reset_after)
        _positive("agent.cluster_probe_interval", self.cluster_probe_interval, maximum=3600)


def parse_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port`` into a literal IP and a port (ValueError if not)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError("must be HOST:PORT with a literal IP address (e.g. 127.0.0.1:9464)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            "must be HOST:PORT with a literal IP address (e.g. 127.0.0.1:9464)"
        ) from None
    port = int(port_text)
    if port > 65535:
        raise ValueError("port must be in 0..65535")
    return host, port


class OpsSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`[ops]`: the local HTTP endpoint (/healthz, /readyz, /metrics, /v1/...)."""

    enabled: bool = True
    # Loopback by default: the endpoint has no authentication. Port 0 picks a free port (tests).
    address: str = "127.0.0.1:9464"
    # "" = off. A second listener serving only /healthz, /readyz and /metrics, so a DaemonSet can
    # keep the debug views on loopback and expose only what probes and scrapers need.
    public_address: str = ""
    # Time to write the response (and let the close linger).
    request_timeout: float = 5.0
    # The whole request head must arrive within head_timeout, and no read may wait longer than
    # read_timeout (slowloris clients and idle connections are closed with 408).
    head_timeout: float = 3.0
    read_timeout: float = 1.0
    max_header_bytes: Annotated[int, count(ge=1024, le=1024 * 1024)] = 8192
    # Ordinary connection slots per listener; idle ones are evicted (oldest first) when full.
    max_connections: Annotated[int, count(ge=1, le=10000)] = 64
    # Further slots per listener kept for /healthz and /readyz when every ordinary one is busy.
    probe_connections: Annotated[int, count(ge=1, le=1000)] = 8

    def validate(self) -> None:
        for name, address in (("address", self.address), ("public_address", self.public_address)):
            if name == "public_address" and not address:
                continue
            try:
                parse_address(address)
            except ValueError as exc:
                raise ConfigError(f"ops.{name}", address, str(exc)) from None
        _positive("ops.request_timeout", self.request_timeout, maximum=300)
        _positive("ops.head_timeout", self.head_timeout, maximum=300)
        _positive("ops.read_timeout", self.read_timeout, maximum=300)
        if self.read_timeout > self.head_timeout:
            raise ConfigError(
                "ops.read_timeout",
                self.read_timeout,
                f"must be <= ops.head_timeout ({self.head_timeout:g})",
            )
        check_constraints(self, "ops")
