"""The static configuration file: one TOML document composed of each package's settings, and
the builder of the effective config (file, flags, then a remote overlay) dynamic config applies.

The composition root owns the composed schema, so the packages below it only know their own
table and `nodeagent.config` stays a leaf (reading TOML, overrides, error translation).
Loading is: the TOML file, then `--set` overrides, then defaults that depend on the environment,
then each table's own `validate()`; every failure is a `ConfigError` naming the field.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from nodeagent.accumulator import AccumulatorSettings
from nodeagent.config.loader import (
    REGISTRY_SUBDIR,
    Environment,
    Override,
    apply_overrides,
    default_node_name,
    default_state_dir,
    read_config_file,
    translate_validation_error,
    validate_section,
)
from nodeagent.dynconfig.overlay import config_hash, overlay_raw
from nodeagent.dynconfig.settings import DynconfigSettings
from nodeagent.kube import KubeSettings
from nodeagent.plugins import PluginSettings
from nodeagent.reporter.settings import ReporterSettings
from nodeagent.resources.settings import ResourcesSettings
from nodeagent.service.settings import AgentSettings, OpsSettings

__all__ = ["Config", "ConfigBuilder", "build_config", "computed_defaults", "load_config"]


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    agent: AgentSettings = msgspec.field(default_factory=AgentSettings)
    ops: OpsSettings = msgspec.field(default_factory=OpsSettings)
    plugins: PluginSettings = msgspec.field(default_factory=PluginSettings)
    kube: KubeSettings = msgspec.field(default_factory=KubeSettings)
    accumulator: AccumulatorSettings = msgspec.field(default_factory=AccumulatorSettings)
    resources: ResourcesSettings = msgspec.field(default_factory=ResourcesSettings)
    reporter: ReporterSettings = msgspec.field(default_factory=ReporterSettings)
    dynconfig: DynconfigSettings = msgspec.field(default_factory=DynconfigSettings)


def _resolve(config: Config, raw: Mapping[str, Any], environment: Environment) -> Config:
    agent = config.agent
    node_name = agent.node_name or default_node_name(environment)
    # A relative state_dir is refused by AgentSettings.validate (it would depend on the working
    # directory the agent happened to start in).
    state_dir = agent.state_dir or default_state_dir(environment)
    # systemd lists its RuntimeDirectory= entries colon-separated: the first is ours.
    runtime_dir = agent.runtime_dir or environment.env.get("RUNTIME_DIRECTORY", "").split(":")[0]
    agent = msgspec.structs.replace(
        agent, node_name=node_name, state_dir=state_dir, runtime_dir=runtime_dir
    )

    plugins = config.plugins
    raw_plugins = raw.get("plugins")
    # Only an explicit registry_dir is kept: otherwise it lives under the (possibly per-user)
    # state dir, so a non-root agent works without any configuration.
    explicit = isinstance(raw_plugins, dict) and "registry_dir" in raw_plugins
    registry_dir = plugins.registry_dir if explicit else REGISTRY_SUBDIR
    if registry_dir:  # "" stays "": PluginSettings.validate refuses it (it is not state_dir)
        # No-op for absolute paths.
        registry_dir = os.path.normpath(os.path.join(state_dir, registry_dir))
    plugins = msgspec.structs.replace(plugins, registry_dir=registry_dir)
    return msgspec.structs.replace(config, agent=agent, plugins=plugins)


def build_config(
    raw: dict[str, Any],
    overrides: Sequence[Override] = (),
    environment: Environment | None = None,
) -> Config:
    merged = apply_overrides(raw, overrides)
    try:
        config = msgspec.convert(merged, Config)
    except msgspec.ValidationError as exc:
        raise translate_validation_error(exc, merged, Config) from None
    config = _resolve(config, merged, environment or Environment.current())
    for table in msgspec.structs.fields(Config):
        validate_section(table.name, getattr(config, table.name))
    return config


def computed_defaults(config: Config) -> dict[str, tuple[Any, str]]:
    """The settings left unset whose value the agent computes, with that value and how it is
    computed (what `check-config` shows for them)."""
    plugins = config.plugins
    return {
        "plugins.endpoint_dirs": (
            plugins.resolved_endpoint_dirs(),
            "registry_dir's parent and the kubelet's plugin directory",
        ),
        "plugins.allowed_uids": (plugins.resolved_allowed_uids(), "root and the agent's user"),
    }


def load_config(
    path: str | None,
    overrides: Sequence[Override] = (),
    environment: Environment | None = None,
) -> tuple[Config, str | None]:
    """The effective configuration and the file it came from (None: defaults only)."""
    raw, source = read_config_file(path)
    return build_config(raw, overrides, environment), source


class ConfigBuilder:
    """Effective config = defaults, the file, the flags, then a remote overlay (None: none).

    The file is read once and again only on `reread()` (SIGHUP), so a remote change never
    picks up an edit of the file that was not asked for."""

    def __init__(self, path: str | None, overrides: Sequence[Override] = ()) -> None:
        self.path = path
        self.overrides = list(overrides)
        self.raw = self._read()

    def _read(self) -> dict[str, Any]:
        raw, _ = read_config_file(self.path)
        return apply_overrides(raw, self.overrides)

    def reread(self) -> Callable[[], None]:
        """Re-read the file (ConfigError: the previous file stays in use); returns the undo
        that puts the previous file back (a reload refused or rolled back after its trial)."""
        raw = self._read()
        build_config(raw)
        previous, self.raw = self.raw, raw

        def undo() -> None:
            self.raw = previous

        return undo

    @property
    def file_hash(self) -> str:
        """The identity of the file and flags in use (shown in status, remembered when bad)."""
        return config_hash(self.raw)

    def __call__(self, remote: Mapping[str, Any] | None) -> Config:
        if not remote:
            return build_config(self.raw)
        return build_config(overlay_raw(self.raw, remote))
