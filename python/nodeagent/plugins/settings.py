"""Configuration of the plugin manager (the ``[plugins]`` table of the agent's TOML file)."""

from __future__ import annotations

import math

import msgspec

from nodeagent.config.errors import ConfigError

__all__ = ["PluginSettings"]

_MAX_GRPC_MESSAGE = 2**31 - 1  # a gRPC length prefix is 32 bits


class PluginSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Sockets anywhere below this directory are plugins (the kubelet's plugins_registry).
    registry_dir: str = "/var/lib/nodeagent/plugins_registry"
    # UIDs a plugin process may run as (SO_PEERCRED). None = root and the agent's own user.
    allowed_uids: list[int] | None = None
    # Seconds between scans of registry_dir (polling: see README, "why poll").
    scan_interval: float = 1.0
    # Seconds between GetInfo probes of each registered plugin.
    probe_interval: float = 10.0
    # Consecutive failed probes after which a plugin is deregistered.
    probe_failures: int = 2
    # Largest plugin message accepted, in bytes.
    max_message_bytes: int = 4 * 1024 * 1024
    # Timeouts of the registration protocol (kubelet values: 1 s GetInfo, 5 s notify).
    dial_timeout: float = 10.0
    get_info_timeout: float = 1.0
    notify_timeout: float = 5.0
    # Registration retry backoff: initial delay doubling up to the cap (kubelet: 0.5 s .. 2m2s).
    registration_backoff_initial: float = 0.5
    registration_backoff_max: float = 122.0
    # Stream restart backoff: jittered, doubling from initial to max.
    stream_backoff_initial: float = 1.0
    stream_backoff_max: float = 30.0

    def validate(self) -> None:
        """Raise ConfigError naming the first field that breaks a rule."""
        if not self.registry_dir:
            raise ConfigError("plugins.registry_dir", self.registry_dir, "must not be empty")
        if self.allowed_uids is not None:
            for uid in self.allowed_uids:
                if uid < 0:
                    raise ConfigError("plugins.allowed_uids", uid, "a UID must be >= 0")
        for name in (
            "scan_interval",
            "probe_interval",
            "dial_timeout",
            "get_info_timeout",
            "notify_timeout",
            "registration_backoff_initial",
            "registration_backoff_max",
            "stream_backoff_initial",
            "stream_backoff_max",
        ):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"plugins.{name}", value, "must be a finite number > 0")
        if self.probe_failures < 1:
            raise ConfigError("plugins.probe_failures", self.probe_failures, "must be >= 1")
        if not 1024 <= self.max_message_bytes <= _MAX_GRPC_MESSAGE:
            raise ConfigError(
                "plugins.max_message_bytes",
                self.max_message_bytes,
                f"must be between 1024 and {_MAX_GRPC_MESSAGE}",
            )
        if self.registration_backoff_max < self.registration_backoff_initial:
            raise ConfigError(
                "plugins.registration_backoff_max",
                self.registration_backoff_max,
                "must be >= registration_backoff_initial",
            )
        if self.stream_backoff_max < self.stream_backoff_initial:
            raise ConfigError(
                "plugins.stream_backoff_max",
                self.stream_backoff_max,
                "must be >= stream_backoff_initial",
            )
