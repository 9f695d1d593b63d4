"""`nodeagent run` as a real process: readiness, endpoints, signals, watchdog, fatal errors."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.process.conftest import StartAgent, nodeagent_command


def test_run_notifies_ready_serves_endpoints_and_stops_on_sigterm(
    start_agent: StartAgent,
) -> None:
    agent = start_agent("--log-format", "json", config="[agent]\nshutdown_timeout = 5.0\n")
    ready = agent.wait_ready()
    assert ready["STATUS"].startswith("standalone; ready")
    assert ready["MAINPID"] == str(agent.proc.pid)

    assert agent.get("/healthz") == (200, "ok\n")
    assert agent.get("/readyz") == (200, "ok\n")
    status, body = agent.get("/readyz?verbose")
    assert status == 200
    assert "[+]kube ok: standalone: no cluster configured" in body
    assert "[+]plugins ok:" in body
    status, body = agent.get("/metrics")
    assert status == 200
    assert 'nodeagent_build_info{mode="standalone"' in body
    assert 'nodeagent_component_ready{component="plugins"} 1.0' in body
    assert "nodeagent_loop_lag_seconds" in body
    doc = json.loads(agent.get("/v1/status")[1])
    assert doc["mode"] == "standalone" and doc["ready"] is True
    assert doc["registry_dir"] == str(agent.state_dir / "plugins_registry")
    assert (agent.state_dir / "plugins_registry").is_dir()
    assert json.loads(agent.get("/v1/plugins")[1]) == []

    started = time.monotonic()
    agent.signal(signal.SIGTERM)
    assert agent.notify.wait_for("STOPPING", timeout=5)["STATUS"] == "stopping: SIGTERM"
    assert agent.wait(timeout=5) == 0
    assert time.monotonic() - started < 5
    # JSON logs, one object per line.
    lines = [json.loads(line) for line in agent.stderr_text.splitlines()]
    assert any(line["msg"] == "stopped" for line in lines)


def test_status_command_prints_the_table(start_agent: StartAgent) -> None:
    agent = start_agent()
    agent.wait_ready()
    out = subprocess.run(
        nodeagent_command("status", "--ops-address", agent.ops_address),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "(standalone)" in out.stdout and ": READY" in out.stdout
    assert "kube       yes    running  0         standalone: no cluster configured" in out.stdout
    assert "no plugins (registry:" in out.stdout
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=10) == 0


def test_invalid_config_file_exits_2_naming_the_field(start_agent: StartAgent) -> None:
    agent = start_agent(config="[plugins]\nscan_interval = 'often'\n")
    assert agent.wait(timeout=30) == 2
    assert "plugins.scan_interval: 'often': expected float, got str" in agent.stderr_text
    assert agent.notify.messages == []


def test_unusable_kubeconfig_exits_2(start_agent: StartAgent, tmp_path: Path) -> None:
    agent = start_agent("--kubeconfig", str(tmp_path / "missing-kubeconfig"))
    assert agent.wait(timeout=30) == 2
    assert f"invalid configuration: kube.kubeconfig: '{tmp_path}/missing-kubeconfig'" in (
        agent.stderr_text
    )


def test_cannot_bind_ops_port_is_fatal(start_agent: StartAgent) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = start_agent("--ops-address", f"127.0.0.1:{port}")
        assert agent.wait(timeout=30) == 1
    assert f"cannot listen on ops.address 127.0.0.1:{port}" in agent.stderr_text
    assert all("READY" not in fields for _, fields in agent.notify.messages)


def test_watchdog_stops_while_the_loop_is_blocked(start_agent: StartAgent, tmp_path: Path) -> None:
    block = tmp_path / "block-loop"
    # WATCHDOG_USEC = 0.4 s: a ping every 0.2 s.
    agent = start_agent(
        env={"NODEAGENT_TEST_BLOCK_LOOP_FILE": str(block)},
        watchdog_usec=400_000,
        launcher="tests.support.hooked_agent",
    )
    agent.wait_ready()
    healthy = agent.notify.collect(1.0)
    assert sum("WATCHDOG" in f for _, f in healthy) >= 3

    block.touch()
    marker = tmp_path / "block-loop.blocked"  # the agent's sign that its loop is now stuck
    deadline = time.monotonic() + 10
    while not marker.exists():  # a real process: poll, bounded
        assert time.monotonic() < deadline, "the loop never blocked"
        time.sleep(0.02)
    agent.notify.drain()  # pings sent before the loop blocked
    blocked = agent.notify.collect(1.5)  # 7 watchdog periods
    assert [f for _, f in blocked if "WATCHDOG" in f] == []

    block.unlink()
    agent.notify.wait_for("WATCHDOG", timeout=30, new=True)  # the pings come back
    assert not marker.exists()
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=10) == 0
    assert "debug hook: blocking the main loop" in agent.stderr_text


def test_second_sigint_exits_at_once(start_agent: StartAgent) -> None:
    agent = start_agent(
        "--set",
        "agent.shutdown_timeout=60",
        env={"NODEAGENT_TEST_HANG_SHUTDOWN": "1"},
        launcher="tests.support.hooked_agent",
    )
    agent.wait_ready()
    agent.signal(signal.SIGINT)
    agent.notify.wait_for("STOPPING", timeout=30)  # the bound below starts after it
    started = time.monotonic()
    agent.signal(signal.SIGINT)
    assert agent.wait(timeout=5) == 128 + signal.SIGINT
    assert time.monotonic() - started < 5
    assert "second SIGINT: exiting immediately" in agent.stderr_text


def test_shutdown_is_bounded_by_the_deadline(start_agent: StartAgent) -> None:
    agent = start_agent(
        "--set",
        "agent.shutdown_timeout=1",
        env={"NODEAGENT_TEST_HANG_SHUTDOWN": "1"},
        launcher="tests.support.hooked_agent",
    )
    agent.wait_ready()
    started = time.monotonic()
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=10) == 1
    assert 0.9 < time.monotonic() - started < 3.5
    assert "shutdown hooks cut short by the deadline" in agent.stderr_text
