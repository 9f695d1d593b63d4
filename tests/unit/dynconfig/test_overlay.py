"""The remote overlay: only dynamic fields may be set (a static-only or unknown field is refused,
named), the result goes through the service's own build_config (a bad value is refused exactly as
in the file, naming field, value and rule), and the config hash is stable."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.config.loader import Environment, Override, apply_overrides
from nodeagent.core.errors import ConfigError
from nodeagent.dynconfig.overlay import DYNAMIC_FIELDS, STATIC_ONLY, config_hash, overlay_raw
from nodeagent.service.config import build_config

ENV = Environment(uid=1000, env={}, hostname="node-a", home="/home/agent")
LOCAL: dict[str, Any] = {
    "agent": {"log_level": "info", "state_dir": "/var/lib/nodeagent-test"},
    "plugins": {"scan_interval": 1.0, "probe_interval": 10.0},
    "ops": {"address": "127.0.0.1:9999"},
}


def test_dynamic_fields_are_laid_over_the_file_and_validated_by_build_config() -> None:
    remote = {
        "agent": {"log_level": "debug"},
        "plugins": {"scan_interval": 2},
        "reporter": {"grace": 30},
    }
    merged = overlay_raw(LOCAL, remote)
    config = build_config(merged, environment=ENV)
    assert config.agent.log_level == "debug"
    assert config.plugins.scan_interval == 2.0
    assert config.plugins.probe_interval == 10.0  # the file's value where the remote says nothing
    assert config.reporter.grace == 30.0
    assert config.agent.state_dir == "/var/lib/nodeagent-test"
    assert LOCAL["agent"]["log_level"] == "info" and "reporter" not in LOCAL  # input untouched


def test_the_remote_overlay_wins_over_flags_when_applied_after_them() -> None:
    flags = [Override("plugins.scan_interval", 3.0)]
    merged = overlay_raw(apply_overrides(LOCAL, flags), {"plugins": {"scan_interval": 4}})
    assert build_config(merged, environment=ENV).plugins.scan_interval == 4.0


@pytest.mark.parametrize(
    ("remote", "field"),
    [
        ({"agent": {"node_name": "node-b"}}, "agent.node_name"),
        ({"agent": {"state_dir": "/tmp/x"}}, "agent.state_dir"),
        ({"ops": {"address": "0.0.0.0:80"}}, "ops.address"),
        ({"kube": {"kubeconfig": "/root/.kube/config"}}, "kube.kubeconfig"),
        ({"kube": "anything"}, "kube"),
        ({"plugins": {"registry_dir": "/tmp/reg"}}, "plugins.registry_dir"),
        ({"dynconfig": {"trial_duration": 1}}, "dynconfig.trial_duration"),
    ],
)
def test_a_static_only_field_is_refused_with_the_field_named(
    remote: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        overlay_raw(LOCAL, remote)
    assert err.value.field == field
    assert "static-only" in err.value.rule and "restart" in err.value.rule


@pytest.mark.parametrize(
    ("remote", "field"),
    [
        ({"plugins": {"scan_intervall": 2}}, "plugins.scan_intervall"),
        ({"nosuchtable": {"x": 1}}, "nosuchtable.x"),
        ({"plugins": {"dial_timeout": 2}}, "plugins.dial_timeout"),  # known but not dynamic
    ],
)
def test_an_unknown_or_non_dynamic_field_is_refused_naming_it_and_the_dynamic_set(
    remote: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        overlay_raw(LOCAL, remote)
    assert err.value.field == field
    assert "not a dynamic field" in err.value.rule and "plugins.scan_interval" in err.value.rule


def test_a_table_that_is_not_a_table_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        overlay_raw(LOCAL, {"plugins": 5})
    assert (err.value.field, err.value.value, err.value.rule) == (
        "plugins",
        5,
        "must be a table of fields",
    )


@pytest.mark.parametrize(
    ("remote", "field", "value", "rule"),
    [
        (
            {"plugins": {"scan_interval": "fast"}},
            "plugins.scan_interval",
            "fast",
            "expected float, got str",
        ),
        (
            {"plugins": {"scan_interval": 0}},
            "plugins.scan_interval",
            0,
            "must be a finite number > 0",
        ),
        (
            {"agent": {"log_level": "loud"}},
            "agent.log_level",
            "loud",
            "allowed: debug, info, warning, error",
        ),
        ({"reporter": {"grace": -1}}, "reporter.grace", -1, "must be a finite number >= 0"),
        (
            {"resources": {"min_sync_interval": -0.5}},
            "resources.min_sync_interval",
            -0.5,
            "must be a finite number >= 0",
        ),
    ],
)
def test_a_bad_value_is_refused_by_build_config_naming_field_value_and_rule(
    remote: dict[str, Any], field: str, value: Any, rule: str
) -> None:
    with pytest.raises(ConfigError) as err:
        build_config(overlay_raw(LOCAL, remote), environment=ENV)
    assert (err.value.field, err.value.value) == (field, value)
    assert rule in err.value.rule


def test_the_hash_is_stable_under_key_order_and_differs_by_content() -> None:
    a = {"plugins": {"scan_interval": 2, "probe_interval": 5}, "agent": {"log_level": "debug"}}
    b = {"agent": {"log_level": "debug"}, "plugins": {"probe_interval": 5, "scan_interval": 2}}
    assert config_hash(a) == config_hash(b)
    assert len(config_hash(a)) == 16 and all(c in "0123456789abcdef" for c in config_hash(a))
    assert config_hash(a) != config_hash({**a, "agent": {"log_level": "info"}})
    assert config_hash({}) == config_hash({})


def test_the_dynamic_and_static_sets_are_disjoint() -> None:
    for path in DYNAMIC_FIELDS:
        assert path not in STATIC_ONLY and path.partition(".")[0] not in STATIC_ONLY, path
