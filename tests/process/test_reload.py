"""`nodeagent run` reloads its config file on SIGHUP (systemctl reload): dynamic fields apply
without a restart, on trial; an invalid file or a changed static field keeps the running config,
says why in /v1/status and counts the reload by result; a reloaded file that makes the agent
unhealthy during its trial is rolled back to the file it replaced and not retried until the file
changes (standalone: no apiserver, so the outcome is in the log, metrics and status)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from tests.process.conftest import AgentProcess, StartAgent, nodeagent_command
from tests.support.wait import until


def _doc(agent: AgentProcess, path: str) -> Any:
    status, body = agent.get(path)
    assert status == 200, body
    return json.loads(body)


def _reload(agent: AgentProcess, file: Path, text: str, expect: str) -> dict[str, Any]:
    before = _doc(agent, "/v1/status")["config_reload"]
    file.write_text(text)
    agent.signal(signal.SIGHUP)

    def done() -> dict[str, Any] | None:
        last: dict[str, Any] | None = _doc(agent, "/v1/status")["config_reload"]
        return last if last is not None and last != before else None

    last = until(done, f"reload ({expect})", timeout=30)
    assert last["result"] == expect, last
    return last


def test_sighup_applies_dynamic_fields_and_keeps_the_running_config_on_a_bad_file(
    start_agent: StartAgent, tmp_path: Path, registry: str
) -> None:
    base = f'[plugins]\nregistry_dir = "{registry}"\n'
    agent = start_agent(config=base + 'scan_interval = 3600.0\n[agent]\nlog_level = "info"\n')
    agent.wait_ready()
    file = tmp_path / "config-0.toml"
    assert _doc(agent, "/v1/status")["config_reload"] is None

    last = _reload(
        agent, file, base + 'scan_interval = 0.2\n[agent]\nlog_level = "warning"\n', "applied"
    )
    assert last["message"] == "changed: agent.log_level, plugins.scan_interval; on trial for 600s"
    config = _doc(agent, "/v1/config")["effective"]
    assert config["plugins"]["scan_interval"] == 0.2
    assert config["agent"]["log_level"] == "warning"
    # Behaviour: a socket created now is found at the new interval, not in an hour.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(f"{registry}/p.sock")
        sock.listen(8)
        until(lambda: _doc(agent, "/v1/plugins"), "the new socket in /v1/plugins", timeout=30)

    last = _reload(agent, file, base + "scan_interval = 'often'\n", "invalid")
    assert "plugins.scan_interval: 'often': expected float, got str" in last["message"]
    assert _doc(agent, "/v1/config")["effective"] == config
    assert agent.get("/healthz") == (200, "ok\n")

    last = _reload(
        agent,
        file,
        base + 'scan_interval = 1.0\n[agent]\nlog_level = "warning"\nnode_name = "other"\n',
        "refused",
    )
    assert last["message"] == "static: agent.node_name is static: restart the agent to change it"
    assert (
        _doc(agent, "/v1/config")["effective"] == config
    )  # scan_interval 1.0 was not applied either

    metrics = agent.get("/metrics")[1]
    for result in ("applied", "invalid", "refused"):
        assert f'nodeagent_config_reloads_total{{result="{result}"}} 1.0' in metrics

    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    # The level in force is warning: info lines (the shutdown's) are gone, errors stay.
    assert "config reload failed" in agent.stderr_text
    assert "shutting down" not in agent.stderr_text
    assert "configuration loaded" in agent.stderr_text  # logged at info before the reload


def status_text(agent: AgentProcess) -> str:
    """What `nodeagent status` prints for the running agent."""
    out = subprocess.run(
        nodeagent_command("status", "--ops-address", agent.ops_address),
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout


def _metric(agent: AgentProcess, line: str) -> float:
    for text in agent.get("/metrics")[1].splitlines():
        if text.startswith(line + " "):
            return float(text.split()[-1])
    return 0.0


TRIAL = 10.0  # dynconfig.trial_duration of the trial test's files, in seconds


def test_sighup_good_file_survives_its_trial_and_a_bad_one_is_rolled_back(
    start_agent: StartAgent, tmp_path: Path, registry: str
) -> None:
    base = f'[plugins]\nregistry_dir = "{registry}"\n'
    # Long enough that the good file is still on trial when /v1/config and `nodeagent status`
    # (a Python process starting, seconds on a loaded machine) look at it after the reload.
    trial = (
        f"\n[dynconfig]\ntrial_duration = {TRIAL:g}\nhealth_interval = 0.2\nunready_bound = 0.5\n"
    )
    # Test-only launcher: a component is not ready while plugins.scan_interval is 0.66 (a "bad"
    # value); the real health signals are driven in test_dynconfig_rollback_unpublished_pool.
    agent = start_agent(
        config=base + "scan_interval = 3.0\n" + trial,
        env={"NODEAGENT_TEST_UNREADY_WHEN": "plugins.scan_interval=0.66"},
        launcher="tests.support.unready_agent",
    )
    agent.wait_ready()
    file = tmp_path / "config-0.toml"
    first_hash = _doc(agent, "/v1/config")["dynamic"]["file"]["hash"]

    # A good file: applied on trial, then survives it (the trial ends, no rollback).
    last = _reload(agent, file, base + "scan_interval = 0.2\n" + trial, "applied")
    assert last["message"] == f"changed: plugins.scan_interval; on trial for {TRIAL:g}s"
    dynamic = _doc(agent, "/v1/config")["dynamic"]
    assert dynamic["file"]["on_trial"] and dynamic["reason"] == "OnTrial"
    good_hash = dynamic["file"]["hash"]
    assert good_hash != first_hash
    out = status_text(agent)
    assert f"config file {good_hash}, on trial" in out, out
    until(
        lambda: not _doc(agent, "/v1/config")["dynamic"]["file"]["on_trial"],
        "the good file's trial survived",
        timeout=TRIAL + 30,
    )
    doc = _doc(agent, "/v1/config")
    assert doc["effective"]["plugins"]["scan_interval"] == 0.2
    assert doc["dynamic"]["trial"] is None and doc["dynamic"]["file"]["rolled_back"] is None
    assert _metric(agent, "nodeagent_config_rollbacks_total") == 0

    # A bad file: applied on trial, the component turns not ready, rolled back to the good file.
    bad_text = base + "scan_interval = 0.66\n" + trial
    _reload(agent, file, bad_text, "applied")

    def rolled_back() -> dict[str, Any] | None:
        last: dict[str, Any] = _doc(agent, "/v1/status")["config_reload"]
        return last if last["result"] == "rolled_back" else None

    last = until(rolled_back, "the bad file rolled back", timeout=30)
    assert "debug-unready not ready" in last["message"], last
    doc = _doc(agent, "/v1/config")
    assert doc["effective"]["plugins"]["scan_interval"] == 0.2
    dynamic = doc["dynamic"]
    assert dynamic["file"]["hash"] == good_hash
    assert dynamic["file"]["rolled_back"]["kind"] == "unhealthy"
    assert dynamic["reason"] == "RolledBack" and "reloaded config file" in dynamic["message"]
    assert _metric(agent, "nodeagent_config_rollbacks_total") == 1
    assert _metric(agent, 'nodeagent_config_reloads_total{result="rolled_back"}') == 1

    # The same bad content again: refused without a trial; a changed file is tried again.
    last = _reload(agent, file, bad_text, "refused")
    assert "not retried until the file changes" in last["message"]
    assert _doc(agent, "/v1/config")["effective"]["plugins"]["scan_interval"] == 0.2
    _reload(agent, file, base + "scan_interval = 0.3\n" + trial, "applied")
    assert _doc(agent, "/v1/config")["dynamic"]["file"]["rolled_back"] is None

    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    assert "reloaded config rolled back after its trial" in agent.stderr_text
