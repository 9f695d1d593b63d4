"""The static configuration file: one TOML document composed of each package's settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from nodeagent.service.settings import AgentSettings, OpsSettings

if TYPE_CHECKING:
    from nodeagent.config._fallback import KubeSettings, PluginSettings
else:
    try:
        from nodeagent.plugins.settings import PluginSettings
    except ImportError:  # PLACEHOLDER until the plugins package lands
        from nodeagent.config._fallback import PluginSettings
    try:
        from nodeagent.kube.settings import KubeSettings
    except ImportError:  # PLACEHOLDER until the kube package lands
        from nodeagent.config._fallback import KubeSettings

__all__ = ["AgentSettings", "Config", "KubeSettings", "OpsSettings", "PluginSettings"]


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    agent: AgentSettings = msgspec.field(default_factory=AgentSettings)
    ops: OpsSettings = msgspec.field(default_factory=OpsSettings)
    plugins: PluginSettings = msgspec.field(default_factory=PluginSettings)
    kube: KubeSettings = msgspec.field(default_factory=KubeSettings)
