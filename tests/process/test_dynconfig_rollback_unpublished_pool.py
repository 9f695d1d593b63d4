"""A remote config that stops the agent doing its job is rolled back at run time, by the health
signals alone (issue 21 section 4): `nodeagent run` with node credentials against the real
kube-apiserver publishes a real SDK plugin's inventory, which changes every 0.3 s; a
NodeAgentConfig sets `resources.min_sync_interval` to an hour, a real setting that holds every
change after the first back. The pool stays unpublished past `resources.publish_failure_bound`,
`resources` turns not ready with that reason, the trial finds it not ready past
`dynconfig.unready_bound` and rolls the config back without a restart: the Node condition, the
Event, `/readyz`, `/v1/config` and the metrics all say so, and the pool is published again."""

from __future__ import annotations

import json
import re

import trio

from tests.process.conftest import AgentProcess, StartAgent
from tests.process.test_dynconfig import (
    _condition,
    _doc,
    _dyn,
    _events,
    _prepare,
    _put_config,
    _start,
)
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.churning_plugin import DRIVER, churning_plugin
from tests.support.wait import until

NODE = "node-h"
apiserver = apiserver_fixture(scope="module", nodes=(NODE,))


def _readyz(agent: AgentProcess) -> tuple[int, str]:
    return agent.get("/readyz?verbose")


def _published(agent: AgentProcess) -> bool:
    doc = json.loads(agent.get("/v1/resourceslices")[1])
    driver = doc["drivers"].get(DRIVER)
    return bool(driver and driver["registered"] and doc["sync"]["synced"])


def _metric(agent: AgentProcess, name: str, labels: str = "") -> float:
    text = agent.get("/metrics")[1]
    pattern = re.compile(rf"^{name}(\{{[^}}]*\}})? (\S+)$", re.M)
    return sum(float(v) for lab, v in pattern.findall(text) if labels in lab)


def test_remote_config_holding_pool_writes_back_is_rolled_back_at_run_time(
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
            "resources.publish_failure_bound=3",
            "--set",
            "dynconfig.unready_bound=2",
        )
        until(lambda: _dyn(agent)["crd_missing"] is None, "the CRD found")
        until(lambda: _published(agent), "the churning pool published")
        # Changes every 0.3 s, each one written: ready, and stays so.
        until(lambda: _readyz(agent)[0] == 200, "ready while the pool churns", timeout=30)
        writes_before = _metric(agent, "nodeagent_resourceslice_writes_total")

        _put_config(apiserver, "node-h-conf", NODE, {"resources": {"min_sync_interval": 3600}})
        until(
            lambda: (
                _doc(agent, "/v1/config")["effective"]["resources"]["min_sync_interval"] == 3600
            ),
            "the remote config applied",
        )

        def rolled_back() -> dict[str, str] | None:
            c = _condition(apiserver, NODE)
            return c if c is not None and c["reason"] == "RolledBack" else None

        condition = until(rolled_back, "the RolledBack condition", timeout=60)
        message = condition["message"]
        assert "component resources not ready" in message, message
        assert f"pool {NODE} of driver {DRIVER} not published" in message, message
        assert "bound 3s" in message, message

        # Rolled back at run time: the local config again, the process never restarted.
        effective = _doc(agent, "/v1/config")
        assert effective["effective"]["resources"]["min_sync_interval"] == 0.1
        dynamic = effective["dynamic"]
        assert dynamic["active"]["hash"] == "local" and dynamic["reason"] == "RolledBack"
        assert any("unhealthy" in line for line in dynamic["differ"]), dynamic["differ"]
        assert agent.proc.poll() is None
        events = until(
            lambda: [e for e in _events(apiserver, NODE) if e["reason"] == "ConfigRolledBack"],
            "the ConfigRolledBack Event",
        )
        assert "not published" in events[0]["message"], events[0]
        assert _metric(agent, "nodeagent_config_rollbacks_total") == 1.0

        # The job is done again: changes published, resources ready, /readyz 200.
        until(lambda: _readyz(agent)[0] == 200, "ready again after the rollback", timeout=30)
        until(
            lambda: _metric(agent, "nodeagent_resourceslice_writes_total") > writes_before + 2,
            "the pool's changes written again",
        )
        status, body = _readyz(agent)
        assert status == 200 and "[+]resources ok" in body, body
        assert _metric(agent, "nodeagent_health_failing_seconds", 'component="resources"') < 3
        agent.signal(15)
        assert agent.wait(timeout=15) == 0
