"""READY=1 does not wait for the apiserver (issue 21 s6): the reporter and dynamic-config
components looked their kinds up before they reported started, and the supervisor starts
components one after another, so against an apiserver that accepts connections and never
answers READY came after minutes, past systemd's default start timeout (90 s: killed and
restarted in a loop for as long as the control plane is away). The transport here hangs (a
listener that accepts and never answers), it does not fail at once."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process.conftest import StartAgent


@pytest.fixture
def silent_apiserver() -> Iterator[int]:
    """A TCP port that accepts every connection and never sends a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    listener.close()


def _kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "silent",
                        "cluster": {
                            "server": f"https://127.0.0.1:{port}",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "node", "user": {"token": "unused"}}],
                "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "node"}}],
                "current-context": "silent",
            }
        )
    )
    return path


def test_ready_comes_before_the_apiserver_answers(
    start_agent: StartAgent, tmp_path: Path, silent_apiserver: int
) -> None:
    started = time.monotonic()
    agent = start_agent(
        "--kubeconfig",
        str(_kubeconfig(tmp_path / "kubeconfig.json", silent_apiserver)),
        "--node-name",
        "node-s",
    )
    agent.wait_ready()  # within START_TIMEOUT (30 s)
    took = time.monotonic() - started
    assert took < 25, took
    status = json.loads(agent.get("/v1/status")[1])
    assert not status["ready"]  # the apiserver does not answer: said, not hidden
    names = {c["name"]: c for c in status["components"]}
    assert names["dynconfig"]["phase"] == "running" and names["reporter"]["phase"] == "running"
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
