"""`nodeagent run --kubeconfig` against the real kube-apiserver of the test harness."""

from __future__ import annotations

import json
import signal
import time
from contextlib import suppress

import trio

from nodeagent.kube import NODES, errors
from tests.integration.conftest import client_for
from tests.process.conftest import AgentProcess, StartAgent
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.wait import NotYet, until

# Its own apiserver: this module stops and restarts it.
apiserver = apiserver_fixture(scope="module")


def wait_readyz(agent: AgentProcess, expect_code: int, text: str, timeout: float = 30) -> str:
    """Poll the real process's /readyz until it answers `expect_code` with `text` in the body."""
    deadline = time.monotonic() + timeout
    last = (0, "")
    while time.monotonic() < deadline:
        last = agent.get("/readyz?verbose")
        if last[0] == expect_code and text in last[1]:
            return last[1]
        time.sleep(0.2)
    raise AssertionError(f"/readyz never gave {expect_code} with {text!r}; last: {last}")


async def create_node(apiserver: ApiServer, name: str) -> None:
    async with client_for(apiserver, "admin") as client:
        with suppress(errors.AlreadyExists):
            await client.create(
                NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
            )


def test_connects_with_node_credentials_and_tracks_apiserver_outage(
    apiserver: ApiServer, start_agent: StartAgent
) -> None:
    agent = start_agent(
        "--kubeconfig",
        str(apiserver.kubeconfig("node-a")),
        "--node-name",
        "node-a",
        "--set",
        "agent.cluster_probe_interval=0.5",
        "--set",
        "kube.max_attempts=1",
        "--set",
        "kube.request_timeout=2",
        "--set",
        "agent.apiserver_unreachable_bound=45",
    )
    agent.wait_ready()
    # Connected, but nothing can be published for a Node that does not exist yet.
    wait_readyz(agent, 503, "[-]resources not ready: nothing is written: waiting for Node node-a")
    trio.run(create_node, apiserver, "node-a")
    body = wait_readyz(agent, 200, "[+]kube ok: connected (apiserver v")
    assert "[+]plugins ok" in body
    status = json.loads(agent.get("/v1/status")[1])
    assert (status["mode"], status["node"]) == ("cluster", "node-a")

    apiserver.stop_apiserver()
    try:
        # A control-plane restart is reported but does not flip readiness within the bound
        # (stop_apiserver waits out the server's graceful shutdown, its watches ended)...
        body = wait_readyz(agent, 200, "[+]kube ok: apiserver unreachable for ")
        assert "(bound 45s)" in body, body
        # ...past it, the kube component is not ready. The lapse runs from when the watches
        # stopped showing the apiserver (its streams closed as it exited: a server shutting
        # down gracefully still serves them), no longer from its /readyz failing meanwhile.
        wait_readyz(agent, 503, "[-]kube not ready: apiserver unreachable", timeout=60)
        assert agent.get("/healthz")[0] == 200  # liveness is not cluster health
    finally:
        apiserver.start_apiserver()
    wait_readyz(agent, 200, "[+]kube ok: connected")

    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0


def test_a_refused_identity_still_sends_ready_and_says_why(
    apiserver: ApiServer, start_agent: StartAgent, tmp_path
) -> None:
    # Regression: a 401 on the CNR kind's discovery was retried inside the reporter's start, so
    # READY=1 never came and systemd's start timeout would have killed the agent.
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "wrong.json", {"token": "not-a-token"})
    agent = start_agent("--kubeconfig", str(kubeconfig), "--node-name", "node-a")
    agent.wait_ready()

    def says_why() -> str | NotYet:
        # Until the apiserver's 401 reaches it, the reporter says it has no answer yet (a
        # loaded CPython 3.15 run saw that first): the wait is for the reason naming the 401.
        code, body = agent.get("/readyz?verbose")
        looking = "[-]reporter not ready: looking for the CustomNodeResource" in body
        refused = "401" in body or "Unauthorized" in body
        return body if code == 503 and looking and refused else NotYet((code, body))

    until(says_why, "/readyz to name the refused identity (401) in the reporter's reason")
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
