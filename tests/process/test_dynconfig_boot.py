"""`nodeagent run` started without a reachable apiserver (its kubeconfig points at a closed port)
boots from the dynconfig checkpoint: a last-known-good confirmed within
`dynconfig.checkpoint_grace` runs (and says so), an older one is ignored for defaults and file
(and says why). The checkpoint is written as a previous run would have, with its confirmation
time set in the past, so the grace is tested without waiting for it."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nodeagent.checkpoint import CheckpointStore
from nodeagent.dynconfig.overlay import config_hash
from nodeagent.dynconfig.state import CHECKPOINT_NAME, Assignment, Known, State
from tests.process.conftest import AgentProcess, StartAgent
from tests.support.wait import until

REMOTE = {"plugins": {"scan_interval": 0.37}, "agent": {"log_level": "debug"}}


def _free_port() -> int:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _closed_port_kubeconfig(path: Path) -> Path:
    port = _free_port()
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "gone",
                        "cluster": {
                            "server": f"https://127.0.0.1:{port}",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "node", "user": {"token": "unused"}}],
                "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "node"}}],
                "current-context": "gone",
            }
        )
    )
    return path


def _write_checkpoint(state_dir: Path, confirmed_age: float) -> str:
    hash_ = config_hash(REMOTE)
    now = time.time()
    state = State(
        assigned=Assignment(name="fleet", uid="uid-1", generation=1, config=REMOTE, hash=hash_),
        assigned_at=now - confirmed_age,
        lkg=Known(hash=hash_, name="fleet", config=REMOTE),
        lkg_at=now - confirmed_age,
        confirmed_at=now - confirmed_age,
    )
    CheckpointStore(state_dir / "checkpoints").write(CHECKPOINT_NAME, msgspec.json.encode(state))
    return hash_


def _config(agent: AgentProcess) -> dict[str, Any] | None:
    try:
        status, body = agent.get("/v1/config")
    except OSError:
        return None  # not listening yet
    assert status == 200, body
    doc: dict[str, Any] = json.loads(body)
    return doc


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "expired"])
def test_boot_without_the_apiserver_from_the_checkpoint(
    start_agent: StartAgent, tmp_path: Path, fresh: bool
) -> None:
    # state-0 is the state dir start_agent gives its first agent.
    hash_ = _write_checkpoint(tmp_path / "state-0", 600.0 if fresh else 3 * 3600.0)
    agent = start_agent(
        "--kubeconfig",
        str(_closed_port_kubeconfig(tmp_path / "kubeconfig.json")),
        "--node-name",
        "node-x",
    )
    # READY=1 although the apiserver never answers: under systemd (Type=notify) a node booted
    # before its control plane would otherwise be killed by the start timeout.
    agent.wait_ready()
    doc = until(lambda: _config(agent), "the ops endpoint", timeout=30)
    effective, dynamic = doc["effective"], doc["dynamic"]
    if fresh:
        assert effective["plugins"]["scan_interval"] == 0.37
        assert effective["agent"]["log_level"] == "debug"
        assert dynamic["boot"]["source"] == "checkpoint"
        assert dynamic["active"] == {**dynamic["active"], "name": "fleet", "hash": hash_}
        assert dynamic["active"]["source"] == "checkpoint"
        assert dynamic["reason"] == "Checkpoint" and hash_ in dynamic["message"]
    else:
        assert effective["plugins"]["scan_interval"] == 1.0  # the default
        assert effective["agent"]["log_level"] == "info"
        assert dynamic["boot"]["source"] == "defaults"
        assert "checkpoint expired" in dynamic["boot"]["reason"]
        assert "grace 7200s" in dynamic["boot"]["reason"]
        assert dynamic["active"]["hash"] == "local"
        assert dynamic["reason"] == "Local" and "expired" in dynamic["message"]
    # Not ready (no apiserver), but alive, and the apiserver's absence is what it says.
    status = json.loads(agent.get("/v1/status")[1])
    assert not status["ready"]
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
    assert "dynconfig boot" in agent.stderr_text
    assert ("source=checkpoint" if fresh else "source=defaults") in agent.stderr_text
