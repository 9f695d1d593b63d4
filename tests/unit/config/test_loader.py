from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from nodeagent.config.loader import (
    Environment,
    Override,
    apply_overrides,
    parse_set,
    parse_set_value,
)
from nodeagent.config.render import to_json, to_toml
from nodeagent.core.errors import ConfigError
from nodeagent.service.config import Config, build_config, load_config

ROOT = Environment(uid=0, env={}, hostname="Worker-1.example", home="/root")
USER = Environment(uid=1000, env={}, hostname="laptop", home="/home/u")


def build(raw: dict[str, Any], *overrides: Override, env: Environment = USER) -> Config:
    return build_config(raw, overrides, env)


def error_of(raw: dict[str, Any], *overrides: Override) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build(raw, *overrides)
    return info.value


# -- defaults -------------------------------------------------------------------------------


def test_root_defaults_live_under_var_lib() -> None:
    config = build({}, env=ROOT)
    assert config.agent.state_dir == "/var/lib/nodeagent"
    assert config.plugins.registry_dir == "/var/lib/nodeagent/plugins_registry"
    assert config.agent.node_name == "worker-1.example"


def test_non_root_defaults_use_xdg_state_home() -> None:
    env = Environment(uid=1000, env={"XDG_STATE_HOME": "/x/state"}, hostname="h", home="/home/u")
    config = build({}, env=env)
    assert config.agent.state_dir == "/x/state/nodeagent"
    assert config.plugins.registry_dir == "/x/state/nodeagent/plugins_registry"


def test_non_root_defaults_without_xdg_use_home() -> None:
    assert build({}).agent.state_dir == "/home/u/.local/state/nodeagent"


def test_relative_xdg_state_home_is_ignored() -> None:
    env = Environment(uid=1000, env={"XDG_STATE_HOME": "rel"}, hostname="h", home="/home/u")
    assert build({}, env=env).agent.state_dir == "/home/u/.local/state/nodeagent"


def test_node_name_env_wins_over_hostname() -> None:
    env = Environment(uid=0, env={"NODE_NAME": "node-7"}, hostname="other", home="/root")
    assert build({}, env=env).agent.node_name == "node-7"


def test_registry_dir_follows_a_configured_state_dir() -> None:
    config = build({"agent": {"state_dir": "/srv/na"}})
    assert config.plugins.registry_dir == "/srv/na/plugins_registry"


def test_explicit_registry_dir_is_kept_and_relative_is_under_state_dir() -> None:
    assert build({"plugins": {"registry_dir": "/r"}}).plugins.registry_dir == "/r"
    config = build({"agent": {"state_dir": "/s"}, "plugins": {"registry_dir": "regs/a"}})
    assert config.plugins.registry_dir == "/s/regs/a"


# -- decoding errors name the field, the value and the rule -------------------------------


@pytest.mark.parametrize(
    ("raw", "field", "value", "rule"),
    [
        (
            {"agent": {"shutdown_timeout": "soon"}},
            "agent.shutdown_timeout",
            "soon",
            "expected float",
        ),
        ({"agent": {"log_level": "loud"}}, "agent.log_level", "loud", "allowed: debug, info"),
        ({"agent": {"log_format": "xml"}}, "agent.log_format", "xml", "allowed: text, json"),
        ({"agent": {"nodename": "x"}}, "agent.nodename", "x", "unknown field (known: node_name"),
        ({"ops": {"address": 9464}}, "ops.address", 9464, "expected str, got int"),
        ({"ops": {"max_connections": 1.5}}, "ops.max_connections", 1.5, "expected int"),
        ({"plugins": {"scan_interval": "1s"}}, "plugins.scan_interval", "1s", "expected float"),
        ({"plugins": {"allowed_uids": [0, "me"]}}, "plugins.allowed_uids[1]", "me", "expected int"),
        ({"plugins": {"registry": "/x"}}, "plugins.registry", "/x", "unknown field"),
        ({"kube": {"qps": "fast"}}, "kube.qps", "fast", "expected float"),
        ({"kube": {"kubeconfig": 3}}, "kube.kubeconfig", 3, "expected str"),
        ({"kube": {"kube_config": "/k"}}, "kube.kube_config", "/k", "unknown field"),
        (
            {"resources": {"startup_grace": "30s"}},
            "resources.startup_grace",
            "30s",
            "expected float",
        ),
        ({"resources": {"grace": 1.0}}, "resources.grace", 1.0, "unknown field"),
        (
            {"agnet": {}},
            "agnet",
            {},
            "unknown field (known: agent, ops, plugins, kube, accumulator, resources, reporter, "
            "dynconfig)",
        ),
        ({"agent": 3}, "agent", 3, "expected object, got int"),
    ],
)
def test_decode_errors_name_field_value_and_rule(
    raw: dict[str, Any], field: str, value: object, rule: str
) -> None:
    err = error_of(raw)
    assert err.field == field
    assert err.value == value
    assert rule in err.rule
    assert str(err).startswith(f"{field}: {value!r}: ")


@pytest.mark.parametrize(
    ("raw", "field", "rule"),
    [
        ({"agent": {"node_name": "Bad_Name"}}, "agent.node_name", "DNS-1123"),
        ({"agent": {"node_name": "node-a\n"}}, "agent.node_name", "DNS-1123"),
        ({"agent": {"state_dir": "/s", "shutdown_timeout": 0}}, "agent.shutdown_timeout", "> 0"),
        ({"agent": {"shutdown_timeout": float("nan")}}, "agent.shutdown_timeout", "finite"),
        ({"agent": {"healthz_stale_after": 0.5}}, "agent.healthz_stale_after", "greater than"),
        (
            {"agent": {"restart_backoff_initial": 5.0, "restart_backoff_max": 1.0}},
            "agent.restart_backoff_max",
            ">= agent.restart_backoff_initial",
        ),
        ({"ops": {"address": "localhost:80"}}, "ops.address", "literal IP"),
        ({"ops": {"address": "127.0.0.1:99999"}}, "ops.address", "0..65535"),
        ({"ops": {"address": "127.0.0.1"}}, "ops.address", "HOST:PORT"),
        ({"ops": {"max_header_bytes": 10}}, "ops.max_header_bytes", "1024.."),
        ({"plugins": {"scan_interval": -1.0}}, "plugins.scan_interval", ""),
        ({"kube": {"qps": -1.0}}, "kube.qps", ""),
        ({"accumulator": {"max_interval": 0}}, "accumulator.max_interval", "> 0"),
        ({"resources": {"startup_grace": -1.0}}, "resources.startup_grace", ">= 0"),
        ({"resources": {"disconnect_grace": float("inf")}}, "resources.disconnect_grace", "finite"),
        ({"resources": {"retry_backoff_initial": 0}}, "resources.retry_backoff_initial", "> 0"),
        (
            {"resources": {"retry_backoff_initial": 2.0, "retry_backoff_max": 1.0}},
            "resources.retry_backoff_max",
            ">= resources.retry_backoff_initial",
        ),
    ],
)
def test_validation_rules_name_the_section_field(
    raw: dict[str, Any], field: str, rule: str
) -> None:
    err = error_of(raw)
    assert err.field == field
    assert rule in err.rule


def test_ipv6_ops_address_is_accepted() -> None:
    assert build({"ops": {"address": "[::1]:9464"}}).ops.address == "[::1]:9464"


# -- files ------------------------------------------------------------------------------------


def test_absent_default_file_means_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("nodeagent.config.loader.DEFAULT_CONFIG_PATH", str(tmp_path / "none.toml"))
    config, source = load_config(None, environment=USER)
    assert source is None
    assert config.ops.address == "127.0.0.1:9464"


def test_explicit_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / "missing.toml"), environment=USER)
    assert info.value.field == "--config"
    assert "does not exist" in info.value.rule


def test_invalid_toml_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[agent\nnode_name = ")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), environment=USER)
    assert info.value.field == "--config"
    assert "invalid TOML" in info.value.rule


def test_file_values_are_used(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[agent]\nlog_level = "debug"\n[plugins]\nscan_interval = 2.5\n')
    config, source = load_config(str(path), environment=USER)
    assert source == str(path)
    assert config.agent.log_level == "debug"
    assert config.plugins.scan_interval == 2.5


# -- overrides --------------------------------------------------------------------------------


def test_flags_override_file_values() -> None:
    raw = {"agent": {"log_level": "debug", "node_name": "from-file"}, "ops": {"enabled": False}}
    config = build(
        raw,
        Override("agent.log_level", "error"),
        Override("ops.address", "127.0.0.1:1234"),
        Override("kube.kubeconfig", "/etc/kubeconfig"),
    )
    assert config.agent.log_level == "error"
    assert config.agent.node_name == "from-file"
    assert config.ops.address == "127.0.0.1:1234"
    assert config.ops.enabled is False
    assert config.kube.kubeconfig == "/etc/kubeconfig"


def test_overrides_do_not_mutate_the_raw_document() -> None:
    raw: dict[str, Any] = {"agent": {"log_level": "debug"}}
    apply_overrides(raw, [Override("agent.log_level", "info")])
    assert raw == {"agent": {"log_level": "debug"}}


def test_override_errors_name_the_field() -> None:
    err = error_of({}, Override("plugins.scan_interval", "soon"))
    assert (err.field, err.value) == ("plugins.scan_interval", "soon")


def test_override_through_a_scalar_is_an_error() -> None:
    err = error_of({"agent": 1}, Override("agent.log_level", "info"))
    assert err.field == "agent"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", 2),
        ("2.5", 2.5),
        ("true", True),
        ("[0, 1000]", [0, 1000]),
        ('"quoted"', "quoted"),
        ("prod-context", "prod-context"),
        ("/var/lib/x", "/var/lib/x"),
    ],
)
def test_set_values_are_toml_literals_or_strings(text: str, value: object) -> None:
    assert parse_set_value(text) == value


def test_set_applies_any_field() -> None:
    config = build({}, parse_set("plugins.allowed_uids=[0, 1000]"), parse_set("ops.enabled=false"))
    assert config.plugins.allowed_uids == [0, 1000]
    assert config.ops.enabled is False


@pytest.mark.parametrize("text", ["noequals", "=1", "Agent.x=1", "agent=1", "agent..x=1"])
def test_malformed_set_is_rejected(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_set(text)
    assert info.value.field == "--set"


# -- rendering ---------------------------------------------------------------------------------


def test_toml_rendering_round_trips() -> None:
    config = build({"plugins": {"allowed_uids": [0, 7]}, "agent": {"node_name": "n1"}})
    again = build(msgspec.toml.decode(to_toml(config).encode()))
    assert again == config
    assert msgspec.json.decode(to_json(config).encode())["agent"]["node_name"] == "n1"
