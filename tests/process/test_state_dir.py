"""The state directory on a real agent process: a read-only checkpoint directory is reported and
survived (issue 29 item 9), and one state directory serves one agent (item 10)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import msgspec

from nodeagent.checkpoint import CheckpointStore
from nodeagent.dynconfig.state import CHECKPOINT_NAME, State
from tests.process.conftest import START_TIMEOUT, StartAgent, nodeagent_command
from tests.process.test_process_resourceslices import metric_sum

NODE = "node-a"


def _read_only(path: Path) -> list[str]:
    """A wrapper running the agent with `path` a read-only bind mount (root ignores permission
    bits), in a private mount namespace that ends with the process."""
    script = f'mount --bind -o ro "{path}" "{path}" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh"]


def _status(agent: Any) -> dict[str, Any]:
    code, body = agent.get("/v1/status")
    assert code in (200, 503), body
    doc: dict[str, Any] = json.loads(body)
    return doc


def test_a_read_only_checkpoint_directory_is_reported_and_the_agent_runs_on_what_it_read(
    start_agent: StartAgent, tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    checkpoints = state_dir / "checkpoints"
    # What an agent left: its dynconfig checkpoint and the temp file of a write it was killed in.
    CheckpointStore(checkpoints, node=NODE).write(CHECKPOINT_NAME, msgspec.json.encode(State()))
    leftover = checkpoints / f".{CHECKPOINT_NAME}.abcd1234.tmp"
    leftover.write_bytes(b"half a checkpoint")

    agent = start_agent(
        "--state-dir",
        str(state_dir),
        "--node-name",
        NODE,
        wrapper=_read_only(checkpoints),
    )
    agent.wait_ready()
    doc = _status(agent)
    # It started from the checkpoint it read ("no checkpoint" without it)...
    assert doc["dynconfig"]["boot"]["reason"].startswith("checkpointed"), doc["dynconfig"]
    # ... and says what it could not do, where an operator looks: status, metric, log.
    problems = doc["checkpoint_problems"]
    assert any(str(leftover) in p and "Read-only file system" in p for p in problems), problems
    name = f'name="{CHECKPOINT_NAME}"'
    assert metric_sum(agent, "nodeagent_checkpoint_sweep_failures_total", name) == 1
    rendered = subprocess.run(
        nodeagent_command("status", "--ops-address", agent.ops_address),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert f"checkpoints: leftover temp file {leftover} not removed" in rendered.stdout
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=20) == 0, agent.stderr_text
    assert "leftover checkpoint temp file not removed" in agent.stderr_text
    assert "Traceback" not in agent.stderr_text
    assert leftover.exists()  # it was read-only: left for the next start that can remove it


def test_one_state_dir_one_agent(start_agent: StartAgent) -> None:
    first = start_agent("--node-name", NODE)
    first.wait_ready()
    state_dir = first.state_dir

    # A second agent on the same state directory refuses to start, naming the holder; exit 2
    # as for an invalid configuration (systemd's RestartPreventExitStatus=2: no restart loop).
    second = start_agent("--state-dir", str(state_dir), "--node-name", NODE)
    assert second.wait(timeout=START_TIMEOUT) == 2, second.stderr_text
    assert (
        f"nodeagent: invalid configuration: agent.state_dir: '{state_dir}': in use by nodeagent "
        f"pid {first.proc.pid} on node {NODE}, started "
    ) in second.stderr_text, second.stderr_text
    assert "stop it or give this one another --state-dir" in second.stderr_text
    second.notify.drain()
    assert not any(fields.get("READY") == "1" for _, fields in second.notify.messages)

    # A dry run persists nothing: it runs beside the real agent (a canary), as do the tools.
    dry = start_agent("--dry-run", "--state-dir", str(state_dir), "--node-name", NODE)
    dry.wait_ready()
    for command in (
        ["check-config", "--state-dir", str(state_dir)],
        ["status", "--ops-address", first.ops_address],
    ):
        out = subprocess.run(
            nodeagent_command(*command), capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, (command, out.stderr)
    dry.signal(signal.SIGTERM)
    assert dry.wait(timeout=20) == 0, dry.stderr_text

    # The lock dies with its holder, also a SIGKILLed one: the kernel releases it.
    first.signal(signal.SIGKILL)
    first.wait(timeout=20)
    third = start_agent("--state-dir", str(state_dir), "--node-name", NODE)
    third.wait_ready()
    third.signal(signal.SIGTERM)
    assert third.wait(timeout=20) == 0, third.stderr_text
