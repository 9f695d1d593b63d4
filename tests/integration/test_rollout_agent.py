"""A real agent (`nodeagent run` with node credentials) on the real kube-apiserver taking a
NodeAgentConfig with ``spec.rollout`` (issue 31): the test plays the rollout controller, writing
``status.rollout`` through the status subresource as it would, and waits on the product's word
(the Node's NodeAgentConfigOK condition and /v1/config). The node waits (no status: for the
controller; beyond the threshold: for its wave) with the old config running, is admitted by a
status-only change (on trial, then active but not last-known-good), an abort returns it to the
previous config without marking the new one bad, lifting the abort lets it take it again, the
previous config applied again is taken at once (the node's last-known-good, whatever
status.rollout says), and Complete makes it last-known-good."""

from __future__ import annotations

import signal
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.dynconfig.overlay import config_hash
from nodeagent.kube import KubeClient, errors
from nodeagent.rollout.api import Counts, Phase, RolloutStatus
from tests.process.conftest import StartAgent, start_agent
from tests.process.test_dynconfig import _admin, _condition, _doc, _dyn, _prepare, _start
from tests.process.test_reload import status_text
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.nodeagentconfig import NAC, nodeagentconfig
from tests.support.wait import NotYet, until

pytestmark = [pytest.mark.integration]

__all__ = ["start_agent"]  # the real agent's fixture (tests/process)

NODE = "node-r"
NAME = "rolled"
apiserver = apiserver_fixture(scope="module", nodes=(NODE,))

OLD = {"plugins": {"scan_interval": 0.25}}
NEW = {"plugins": {"scan_interval": 0.75}}
# A threshold admitting only the canary selector's nodes (keys "0-..."): this node is beyond it.
CANARY_ONLY = "0-" + "f" * 64


def _scan_interval(agent: Any) -> float:
    value: float = _doc(agent, "/v1/config")["effective"]["plugins"]["scan_interval"]
    return value


def _put(apiserver: ApiServer, spec: dict[str, Any]) -> None:
    async def put(admin: KubeClient) -> None:
        try:
            await admin.create(NAC, nodeagentconfig(NAME, spec={"nodeNames": [NODE], **spec}))
        except errors.AlreadyExists:
            await admin.patch(NAC, NAME, {"spec": spec})

    _admin(apiserver, put)


def _write_status(apiserver: ApiServer, phase: Phase, through: str) -> None:
    """As the rollout controller: status.rollout for NEW, through the status subresource."""
    status = RolloutStatus(
        config_hash=config_hash(NEW),
        generation=2,
        observed_generation=2,
        phase=phase,
        admitted_through=through,
        admitted=0 if through == "none" else 1,
        counts=Counts(targeted=1),
    )
    body = {"status": {"rollout": msgspec.to_builtins(status)}}
    _admin(apiserver, lambda admin: admin.patch(NAC, NAME, body, subresource="status"))


def _reason(apiserver: ApiServer, reason: str, what: str, ending: str = "") -> dict[str, str]:
    """The Node's NodeAgentConfigOK condition, once written with ``reason`` (and a message
    ending with ``ending``)."""

    def check() -> dict[str, str] | NotYet:
        condition = _condition(apiserver, NODE)
        if condition is None or condition["reason"] != reason:
            return NotYet(condition)
        if not condition["message"].endswith(ending):
            return NotYet(condition)
        return condition

    return until(check, what, timeout=60)


def test_an_agent_waits_for_its_wave_takes_it_when_admitted_and_goes_back_on_abort(
    apiserver: ApiServer, start_agent: StartAgent
) -> None:
    trio.run(_prepare, apiserver, NODE)
    _put(apiserver, {"config": OLD})  # no rollout: taken at once
    agent = _start(start_agent, apiserver, NODE, "--set", "dynconfig.trial_duration=2")
    old, new = config_hash(OLD), config_hash(NEW)
    until(
        lambda: (_dyn(agent)["last_known_good"] or {}).get("hash") == old,
        "the old config through its trial",
        timeout=60,
    )

    # The new config with a rollout, no controller yet: nobody takes it.
    _put(apiserver, {"config": NEW, "rollout": {}})
    condition = _reason(apiserver, "WaitingForRolloutController", "waiting for the controller")
    assert condition["status"] == "True"
    assert condition["message"].startswith(f"NodeAgentConfig {NAME} (hash {new}) ")
    assert _scan_interval(agent) == 0.25
    dyn = _dyn(agent)
    assert dyn["rollout"]["waiting"] and dyn["rollout"]["reason"] == "WaitingForRolloutController"
    assert "waiting for the rollout: WaitingForRolloutController" in status_text(agent)

    # The controller admits the canary only: this node waits for its wave.
    _write_status(apiserver, Phase.PROGRESSING, CANARY_ONLY)
    _reason(apiserver, "WaitingForWave", "waiting for its wave")
    assert _scan_interval(agent) == 0.25

    # Its wave: the status alone changes, the node takes the config without a restart.
    _write_status(apiserver, Phase.PROGRESSING, "all")
    _reason(apiserver, "OnTrial", "admitted: on trial")
    assert _scan_interval(agent) == 0.75
    condition = _reason(apiserver, "Active", "through its trial")
    assert condition["message"].startswith(f"NodeAgentConfig {NAME} (hash {new}) active")
    assert "active and last-known-good" not in condition["message"]
    assert (_dyn(agent)["last_known_good"] or {}).get("hash") == old  # not Complete yet

    # Abort: back to the previous config, the new one not marked bad.
    _write_status(apiserver, Phase.ABORTED, "none")
    condition = _reason(apiserver, "RolloutAborted", "aborted")
    assert condition["status"] == "True"
    assert f"running NodeAgentConfig {NAME} (hash {old})" in condition["message"]
    assert _scan_interval(agent) == 0.25
    assert _dyn(agent)["bad"] == []

    # The abort lifted: admitted again, taken again.
    _write_status(apiserver, Phase.PROGRESSING, "all")
    _reason(apiserver, "OnTrial", "taken again")
    _reason(apiserver, "Active", "through its trial again")

    # The operator's fast undo: the previous config applied again. status.rollout still names
    # the new one (no controller has planned the revert), yet the node returns to its
    # last-known-good at once, without a trial.
    _put(apiserver, {"config": OLD})
    condition = _reason(
        apiserver, "Active", "back to last-known-good", ending="active and last-known-good"
    )
    assert condition["message"].startswith(f"NodeAgentConfig {NAME} (hash {old}) ")
    assert _scan_interval(agent) == 0.25
    dyn = _dyn(agent)
    assert dyn["active"]["hash"] == old and not dyn["rollout"]["waiting"]
    assert dyn["bad"] == [] and (dyn["last_known_good"] or {}).get("hash") == old

    # The new config once more, still admitted by the status; Complete makes it
    # last-known-good.
    _put(apiserver, {"config": NEW})
    _reason(apiserver, "OnTrial", "taken once more")
    _reason(apiserver, "Active", "through its trial once more")
    _write_status(apiserver, Phase.COMPLETE, "all")
    until(
        lambda: (_dyn(agent)["last_known_good"] or {}).get("hash") == new,
        "last-known-good once Complete",
        timeout=60,
    )
    _reason(apiserver, "Active", "the condition says so", ending="active and last-known-good")
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
