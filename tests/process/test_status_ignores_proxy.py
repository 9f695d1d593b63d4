"""`nodeagent status` reaches the agent's ops endpoint directly, whatever proxy the environment
sets (`http_proxy` is common on nodes): the endpoint is the node's own, a proxy can at best relay
it back and at worst (here: a closed port) makes a running agent look unreachable (exit 3)."""

from __future__ import annotations

import os
import socket
import subprocess

from tests.process.conftest import StartAgent, nodeagent_command


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_status_does_not_go_through_a_proxy(start_agent: StartAgent) -> None:
    agent = start_agent()
    agent.wait_ready()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    proxy = f"http://127.0.0.1:{_closed_port()}"
    for variable in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        env[variable] = proxy
    done = subprocess.run(
        nodeagent_command("status", "--ops-address", agent.ops_address),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr  # ready or not: reached, not unreachable (3)
    assert "cannot reach" not in done.stderr
