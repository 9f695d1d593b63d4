"""Configuration of the plugin manager (the ``[plugins]`` table of the agent's TOML file)."""

from __future__ import annotations

import os
from typing import Annotated

import msgspec

from nodeagent.core.errors import ConfigError
from nodeagent.core.rules import (
    AtLeastOne,
    NonNegative,
    check_constraints,
    check_seconds,
    check_uid,
    count,
)

__all__ = ["KUBELET_PLUGINS_DIR", "PluginSettings", "default_allowed_uids"]

_MAX_GRPC_MESSAGE = 2**31 - 1  # a gRPC length prefix is 32 bits
# Where the upstream plugin helper (k8s.io/dynamic-resource-allocation kubeletplugin) puts a
# driver's service socket by default: /var/lib/kubelet/plugins/<driver>/dra.sock.
KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"


def default_allowed_uids() -> list[int]:
    """`plugins.allowed_uids` unset: root and the agent's own user."""
    return sorted({0, os.getuid()})


class PluginSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Sockets anywhere below this directory are plugins (the kubelet's plugins_registry).
    registry_dir: str = "/var/lib/nodeagent/plugins_registry"
    # Directories a plugin's service endpoint may be in (after resolving symbolic links), each
    # with its whole tree. None: the registry directory's parent (so <root>/plugins_registry and
    # <root>/plugins/<driver>/dra.sock, the upstream layout) and /var/lib/kubelet/plugins.
    # ["/"] admits any absolute path, as the kubelet does.
    endpoint_dirs: list[str] | None = None
    # UIDs a plugin process may run as (SO_PEERCRED). None = root and the agent's own user.
    allowed_uids: list[int] | None = None
    # Seconds between scans of registry_dir (why poll, not inotify: docs/plugins/index.md).
    scan_interval: float = 1.0
    # The connection monitor (the kubelet's values): seconds between GetInfo probes of each
    # registered plugin, the probe's dial and GetInfo timeouts, and the consecutive failed
    # probes after which a plugin is deregistered.
    probe_interval: float = 10.0
    probe_dial_timeout: float = 20.0
    probe_get_info_timeout: float = 10.0
    probe_failures: AtLeastOne = 2
    # Largest plugin message accepted, in bytes.
    max_message_bytes: Annotated[
        int,
        count(ge=1024, le=_MAX_GRPC_MESSAGE, rule=f"must be between 1024 and {_MAX_GRPC_MESSAGE}"),
    ] = 4 * 1024 * 1024
    # Timeouts of the registration protocol (kubelet values: 10 s dial, 1 s GetInfo, 5 s notify).
    dial_timeout: float = 10.0
    get_info_timeout: float = 1.0
    notify_timeout: float = 5.0
    # Registration retry backoff: initial delay doubling up to the cap (kubelet: 0.5 s .. 2m2s).
    registration_backoff_initial: float = 0.5
    registration_backoff_max: float = 122.0
    # Stream restart backoff: the first retry at once, then jittered, doubling from initial to
    # max; reset only once a stream has stayed open for stream_healthy_after seconds.
    stream_backoff_initial: float = 1.0
    stream_backoff_max: float = 180.0
    stream_healthy_after: float = 30.0
    # A plugin's messages are taken at most once per this many seconds, the newest winning (a
    # flooding plugin's stale messages are skipped). 0: as fast as they can be processed.
    stream_min_interval: NonNegative = 0.1
    # Seconds a deregistered plugin's last data is kept (marked registered=False) before it is
    # forgotten (Katalyst's 5 min endpoint grace).
    deregistered_data_grace: float = 300.0
    # Seconds a plugin socket may stay unreachable (registration failing, probes failing, its
    # stream down and backing off) before `plugins` turns not ready.
    unreachable_bound: float = 120.0
    # Reporter plugins are also polled (unary GetReportContent, all at once) every this many
    # seconds, each call bounded by the timeout (Katalyst: 5 s, 10 s): a plugin that only answers
    # the unary call, or whose stream ended, still reports; a failed poll keeps the last report.
    report_poll_interval: float = 5.0
    report_poll_timeout: float = 10.0

    def validate(self) -> None:
        """Raise ConfigError naming the first field that breaks a rule."""
        if not self.registry_dir:
            raise ConfigError("plugins.registry_dir", self.registry_dir, "must not be empty")
        if self.endpoint_dirs is not None:
            if not self.endpoint_dirs:
                raise ConfigError(
                    "plugins.endpoint_dirs", self.endpoint_dirs, "must not be empty (unset it)"
                )
            for directory in self.endpoint_dirs:
                if not os.path.isabs(directory):
                    raise ConfigError(
                        "plugins.endpoint_dirs", directory, "must be an absolute path"
                    )
        if self.allowed_uids is not None:
            for uid in self.allowed_uids:
                check_uid("plugins.allowed_uids", uid)
        for name in (
            "scan_interval",
            "probe_interval",
            "probe_dial_timeout",
            "probe_get_info_timeout",
            "dial_timeout",
            "get_info_timeout",
            "notify_timeout",
            "registration_backoff_initial",
            "registration_backoff_max",
            "stream_backoff_initial",
            "stream_backoff_max",
            "stream_healthy_after",
            "deregistered_data_grace",
            "unreachable_bound",
            "report_poll_interval",
            "report_poll_timeout",
        ):
            check_seconds(f"plugins.{name}", getattr(self, name))
        check_constraints(self, "plugins")
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

    def resolved_allowed_uids(self) -> list[int]:
        """The UIDs a plugin process may run as: the configured ones, else root and the agent's
        own user."""
        return list(self.allowed_uids) if self.allowed_uids is not None else default_allowed_uids()

    def resolved_endpoint_dirs(self) -> list[str]:
        """The directories an endpoint may resolve into (absolute, symbolic links resolved)."""
        dirs = self.endpoint_dirs
        if dirs is None:
            registry = os.path.abspath(self.registry_dir)
            dirs = [os.path.dirname(registry) or registry, KUBELET_PLUGINS_DIR]
        return [os.path.realpath(d) for d in dirs]
