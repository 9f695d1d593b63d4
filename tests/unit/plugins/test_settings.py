from __future__ import annotations

import msgspec
import pytest

from nodeagent.core.errors import ConfigError
from nodeagent.plugins.settings import PluginSettings


def test_defaults_are_valid() -> None:
    settings = PluginSettings()
    settings.validate()
    assert settings.registry_dir == "/var/lib/nodeagent/plugins_registry"
    assert settings.allowed_uids is None
    assert settings.max_message_bytes == 4 * 1024 * 1024
    # The kubelet connection monitor's values, apart from registration's 1 s GetInfo.
    assert (settings.probe_interval, settings.probe_dial_timeout) == (10.0, 20.0)
    assert (settings.probe_get_info_timeout, settings.get_info_timeout) == (10.0, 1.0)
    assert settings.stream_backoff_max == 180.0
    assert settings.deregistered_data_grace == 300.0


def test_default_endpoint_dirs_admit_the_upstream_layout() -> None:
    settings = PluginSettings(registry_dir="/var/lib/kubelet/plugins_registry")
    assert settings.resolved_endpoint_dirs() == ["/var/lib/kubelet", "/var/lib/kubelet/plugins"]
    ours = PluginSettings()  # <root>/plugins_registry -> <root>/plugins/<driver>/dra.sock
    assert ours.resolved_endpoint_dirs()[0] == "/var/lib/nodeagent"
    explicit = PluginSettings(endpoint_dirs=["/run/plugins"])
    assert explicit.resolved_endpoint_dirs() == ["/run/plugins"]


def test_toml_keys_are_snake_case_and_unknown_keys_are_refused() -> None:
    settings = msgspec.toml.decode(
        b'registry_dir = "/r"\nallowed_uids = [0, 1000]\nscan_interval = 0.5\n', type=PluginSettings
    )
    assert settings.allowed_uids == [0, 1000]
    with pytest.raises(msgspec.ValidationError, match="scan_intervl"):
        msgspec.toml.decode(b"scan_intervl = 1.0\n", type=PluginSettings)


@pytest.mark.parametrize(
    ("changes", "field", "rule"),
    [
        ({"registry_dir": ""}, "plugins.registry_dir", "must not be empty"),
        ({"allowed_uids": [0, -1]}, "plugins.allowed_uids", ">= 0"),
        ({"scan_interval": 0.0}, "plugins.scan_interval", "> 0"),
        ({"probe_interval": float("nan")}, "plugins.probe_interval", "finite"),
        ({"get_info_timeout": -1.0}, "plugins.get_info_timeout", "> 0"),
        ({"probe_failures": 0}, "plugins.probe_failures", ">= 1"),
        ({"probe_get_info_timeout": 0.0}, "plugins.probe_get_info_timeout", "> 0"),
        ({"probe_dial_timeout": float("inf")}, "plugins.probe_dial_timeout", "finite"),
        ({"stream_healthy_after": -1.0}, "plugins.stream_healthy_after", "> 0"),
        ({"stream_min_interval": -0.1}, "plugins.stream_min_interval", ">= 0"),
        ({"deregistered_data_grace": 0.0}, "plugins.deregistered_data_grace", "> 0"),
        ({"report_poll_interval": 0.0}, "plugins.report_poll_interval", "> 0"),
        ({"report_poll_timeout": float("inf")}, "plugins.report_poll_timeout", "finite"),
        ({"endpoint_dirs": []}, "plugins.endpoint_dirs", "must not be empty"),
        ({"endpoint_dirs": ["/ok", "relative"]}, "plugins.endpoint_dirs", "absolute path"),
        ({"max_message_bytes": 10}, "plugins.max_message_bytes", "between 1024"),
        ({"max_message_bytes": 2**31}, "plugins.max_message_bytes", "between 1024"),
        (
            {"registration_backoff_initial": 5.0, "registration_backoff_max": 1.0},
            "plugins.registration_backoff_max",
            ">= registration_backoff_initial",
        ),
        (
            {"stream_backoff_initial": 5.0, "stream_backoff_max": 1.0},
            "plugins.stream_backoff_max",
            ">= stream_backoff_initial",
        ),
    ],
)
def test_invalid_values_name_field_value_and_rule(
    changes: dict[str, object], field: str, rule: str
) -> None:
    settings = msgspec.structs.replace(PluginSettings(), **changes)
    with pytest.raises(ConfigError) as caught:
        settings.validate()
    assert caught.value.field == field
    assert rule in caught.value.rule
