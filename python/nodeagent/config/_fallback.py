"""PLACEHOLDER sections used only until `nodeagent.plugins.settings` / `nodeagent.kube.settings`
land. Delete this module once both exist (the schema imports the real ones first)."""

from __future__ import annotations

import msgspec

from nodeagent.config.errors import ConfigError


class PluginSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    registry_dir: str = "/var/lib/nodeagent/plugins_registry"
    allowed_uids: list[int] | None = None
    scan_interval: float = 1.0
    probe_interval: float = 10.0
    probe_failures: int = 2
    max_message_bytes: int = 4 * 1024 * 1024

    def validate(self) -> None:
        if self.scan_interval <= 0:
            raise ConfigError("scan_interval", self.scan_interval, "must be > 0")


class KubeSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    kubeconfig: str | None = None
    context: str | None = None
    qps: float = 20.0
    burst: int = 40

    def validate(self) -> None:
        if self.qps <= 0:
            raise ConfigError("qps", self.qps, "must be > 0")
