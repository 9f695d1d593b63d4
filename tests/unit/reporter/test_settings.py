"""The `[reporter]` table: defaults (Katalyst's values) and validation naming the field."""

from __future__ import annotations

import pytest

from nodeagent.core.errors import ConfigError
from nodeagent.reporter.settings import ReporterSettings


def test_defaults_are_valid_and_katalysts() -> None:
    settings = ReporterSettings()
    settings.validate()
    assert (settings.sync_interval, settings.grace) == (5.0, 300.0)
    assert settings.system_reporter
    assert not settings.cpu_flags and not settings.cpu_model


@pytest.mark.parametrize(
    ("changes", "field", "rule"),
    [
        ({"sync_interval": 0.0}, "reporter.sync_interval", "> 0"),
        ({"sync_interval": float("nan")}, "reporter.sync_interval", "finite"),
        ({"grace": -1.0}, "reporter.grace", ">= 0"),
        ({"grace": float("inf")}, "reporter.grace", "finite"),
    ],
)
def test_bad_values_name_the_field(changes: dict[str, float], field: str, rule: str) -> None:
    with pytest.raises(ConfigError, match=rule) as info:
        ReporterSettings(**changes).validate()  # type: ignore[arg-type]
    assert info.value.field == field


def test_a_grace_of_zero_drops_a_stopped_plugin_at_once() -> None:
    ReporterSettings(grace=0.0).validate()
