"""The `nodeagent check-config` and `nodeagent run` front doors (no agent is started here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodeagent.cli import main


def test_check_config_prints_effective_config_as_toml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[agent]\nstate_dir = "/srv/na"\nnode_name = "n1"\n')
    assert main(["check-config", str(path), "--set", "plugins.scan_interval=3"]) == 0
    out = capsys.readouterr().out
    assert 'state_dir = "/srv/na"' in out
    assert 'registry_dir = "/srv/na/plugins_registry"' in out
    assert "scan_interval = 3.0" in out


def test_check_config_json_and_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.toml"
    path.write_text("")
    rc = main(
        [
            "check-config",
            str(path),
            "--format",
            "json",
            "--node-name",
            "n2",
            "--state-dir",
            str(tmp_path),
            "--registry-dir",
            "/r",
            "--ops-address",
            "127.0.0.1:1",
            "--log-level",
            "debug",
            "--log-format",
            "json",
            "--kubeconfig",
            "/k",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["agent"]["node_name"] == "n2"
    assert doc["agent"]["state_dir"] == str(tmp_path)
    assert doc["agent"]["log_level"] == "debug"
    assert doc["agent"]["log_format"] == "json"
    assert doc["plugins"]["registry_dir"] == "/r"
    assert doc["ops"]["address"] == "127.0.0.1:1"
    assert doc["kube"]["kubeconfig"] == "/k"


def test_check_config_invalid_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[plugins]\nscan_interval = 'fast'\n")
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "plugins.scan_interval: 'fast': expected float, got str" in err


def test_run_with_invalid_flag_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--config", "/dev/null", "--log-level", "loud"]) == 2
    assert "agent.log_level: 'loud'" in capsys.readouterr().err


def test_run_with_missing_explicit_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "--config" in capsys.readouterr().err


def test_malformed_set_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "/dev/null", "--set", "oops"]) == 2
    assert "--set: 'oops'" in capsys.readouterr().err


def test_status_against_nothing_listening_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--ops-address", "127.0.0.1:9", "--timeout", "2"]) == 3
    assert "cannot reach" in capsys.readouterr().err


def test_check_config_shows_computed_defaults_as_computed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A default computed from other settings is printed with its value and said to be computed
    (issue 29 item 18: it read `# endpoint_dirs is unset`); the output still round-trips, the
    setting unset."""
    path = tmp_path / "c.toml"
    path.write_text('[agent]\nstate_dir = "/srv/na"\nnode_name = "n1"\n')
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "is unset" not in out.replace("# kubeconfig is unset", "").replace(
        "# context is unset", ""
    )
    uids = json.dumps(sorted({0, os.getuid()}))
    assert (
        '# endpoint_dirs = ["/srv/na", "/var/lib/kubelet/plugins"]  # computed (unset): '
        "registry_dir's parent and the kubelet's plugin directory\n"
    ) in out
    assert f"# allowed_uids = {uids}  # computed (unset): root and the agent's user\n" in out
    assert main(["check-config", str(path), "--set", "plugins.allowed_uids=[5]"]) == 0
    out = capsys.readouterr().out
    assert "allowed_uids = [5]\n" in out and "root and the agent's user" not in out
