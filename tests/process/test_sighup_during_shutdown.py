"""A SIGHUP that arrives once shutdown has begun (`systemctl reload` racing a stop) reloads
nothing: a reload then could start a trial during the shutdown, for a file nobody saw run."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.process.conftest import StartAgent


def test_sighup_after_sigterm_is_ignored(start_agent: StartAgent, tmp_path: Path) -> None:
    agent = start_agent(
        "--set",
        "agent.shutdown_timeout=3",
        config="[plugins]\nscan_interval = 5.0\n",
        # A shutdown hook that holds the shutdown open until its deadline: the SIGHUP lands
        # while the agent is stopping, not after it exited.
        env={"NODEAGENT_TEST_HANG_SHUTDOWN": "1"},
        launcher="tests.support.hooked_agent",
    )
    agent.wait_ready()
    (tmp_path / "config-0.toml").write_text("[plugins]\nscan_interval = 7.0\n")
    agent.signal(signal.SIGTERM)
    agent.notify.wait_for("STOPPING", timeout=10)
    agent.signal(signal.SIGHUP)
    agent.wait(timeout=15)
    assert "SIGHUP during shutdown: ignored" in agent.stderr_text, agent.stderr_text[-3000:]
    assert "config reloaded" not in agent.stderr_text
    assert "reloaded config" not in agent.stderr_text
