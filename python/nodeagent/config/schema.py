"""The static configuration file: one TOML document composed of each package's settings."""

from __future__ import annotations

import msgspec

from nodeagent.accumulator.settings import AccumulatorSettings
from nodeagent.kube.settings import KubeSettings
from nodeagent.plugins.settings import PluginSettings
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.service.settings import AgentSettings, OpsSettings

__all__ = [
    "AccumulatorSettings",
    "AgentSettings",
    "Config",
    "KubeSettings",
    "OpsSettings",
    "PluginSettings",
    "ResourcesSettings",
]


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    agent: AgentSettings = msgspec.field(default_factory=AgentSettings)
    ops: OpsSettings = msgspec.field(default_factory=OpsSettings)
    plugins: PluginSettings = msgspec.field(default_factory=PluginSettings)
    kube: KubeSettings = msgspec.field(default_factory=KubeSettings)
    accumulator: AccumulatorSettings = msgspec.field(default_factory=AccumulatorSettings)
    resources: ResourcesSettings = msgspec.field(default_factory=ResourcesSettings)
