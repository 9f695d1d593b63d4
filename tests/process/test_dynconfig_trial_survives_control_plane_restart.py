"""A brief control-plane restart during a trial does not roll a good config back (issue 21
section 4): `nodeagent run` with node credentials against the real kube-apiserver, publishing a
real plugin's changing pool, a NodeAgentConfig on trial with a 2 s `dynconfig.unready_bound`;
kube-apiserver is killed for 20 s (watches broken, writes and the apiserver probe failing) and
started again. Every component stays ready throughout (each failure is named in its reason,
within its 120 s bound), the trial ends with the config promoted, nothing is rolled back."""

from __future__ import annotations

import json
import time

import trio

from tests.process.conftest import StartAgent
from tests.process.test_dynconfig import _condition, _dyn, _prepare, _put_config, _start
from tests.process.test_dynconfig_rollback_unpublished_pool import _metric, _published
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.churning_plugin import churning_plugin
from tests.support.wait import until

NODE = "node-i"
apiserver = apiserver_fixture(scope="module", nodes=(NODE,))
OUTAGE = 20.0


def test_a_control_plane_restart_during_a_trial_does_not_roll_the_config_back(
    apiserver: ApiServer, start_agent: StartAgent
) -> None:
    trio.run(_prepare, apiserver, NODE)
    with churning_plugin(NODE) as registry:
        agent = _start(
            start_agent,
            apiserver,
            NODE,
            "--registry-dir",
            registry,
            "--set",
            "dynconfig.unready_bound=2",
            "--set",
            "dynconfig.trial_duration=45",
            "--set",
            "agent.cluster_probe_interval=2",  # the outage is seen by the apiserver probe
        )
        until(lambda: _dyn(agent)["crd_missing"] is None, "the CRD found")
        until(lambda: _published(agent), "the churning pool published")
        until(lambda: agent.get("/readyz")[0] == 200, "ready")
        _put_config(apiserver, "node-i-conf", NODE, {"plugins": {"scan_interval": 0.4}})

        def on_trial() -> bool:
            c = _condition(apiserver, NODE)
            return c is not None and c["reason"] == "OnTrial"

        until(on_trial, "the config on trial")

        apiserver.kill_apiserver()
        answers: list[tuple[int, str]] = []
        try:
            deadline = time.monotonic() + OUTAGE
            while time.monotonic() < deadline:  # observing the agent through the outage
                answers.append(agent.get("/readyz?verbose"))
                time.sleep(0.5)
        finally:
            apiserver.start_apiserver()
        not_ready = [body for code, body in answers if code != 200]
        assert not not_ready, not_ready[0]
        # The outage was seen and named, within its bound.
        assert any("apiserver unreachable for" in body for _, body in answers), answers[-1]

        def promoted() -> dict[str, str] | None:
            c = _condition(apiserver, NODE)
            return c if c is not None and c["reason"] == "Active" else None

        condition = until(promoted, "the trial survived and the config promoted", timeout=90)
        assert "node-i-conf" in condition["message"], condition
        assert _metric(agent, "nodeagent_config_rollbacks_total") == 0
        config = json.loads(agent.get("/v1/config")[1])
        assert config["effective"]["plugins"]["scan_interval"] == 0.4
        assert config["dynamic"]["last_known_good"]["name"] == "node-i-conf"
        agent.signal(15)
        assert agent.wait(timeout=15) == 0
