"""A clean restart during a trial is not a crash (issue 21, section 1), end to end against the
real kube-apiserver: SIGTERM during a config's trial, then a start on the same state dir, runs the
same config, not marked bad, on trial for the rest of its time, and promotes it when the trial
ends; a SIGKILL during the next config's trial still rolls back (to the promoted one)."""

from __future__ import annotations

import signal
from typing import Any

import trio

from tests.process.conftest import StartAgent
from tests.process.test_dynconfig import (
    _condition,
    _dyn,
    _prepare,
    _put_config,
    _scan_interval,
    _start,
    _until_condition,
)
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.wait import until

apiserver = apiserver_fixture(scope="module", nodes=("node-r",))

NODE = "node-r"
TRIAL = "dynconfig.trial_duration=20"


def test_sigterm_during_a_trial_resumes_it_and_sigkill_still_rolls_back(
    apiserver: ApiServer, start_agent: StartAgent
) -> None:
    trio.run(_prepare, apiserver, NODE)
    first = _start(start_agent, apiserver, NODE, "--set", TRIAL)
    _put_config(apiserver, "conf", NODE, {"plugins": {"scan_interval": 0.33}})
    until(lambda: _scan_interval(first) == 0.33, "the remote config applied (on trial)")
    on_trial = _dyn(first)
    assert on_trial["trial"] is not None and on_trial["last_known_good"]["hash"] == "local"
    first.signal(signal.SIGTERM)  # a DaemonSet rollout, a drain, systemctl restart
    assert first.wait(timeout=15) == 0

    second = _start(
        start_agent, apiserver, NODE, "--set", TRIAL, "--state-dir", str(first.state_dir)
    )
    dyn = _dyn(second)
    assert dyn["boot"]["source"] == "resumed", dyn["boot"]
    assert dyn["active"]["hash"] == on_trial["active"]["hash"]
    assert _scan_interval(second) == 0.33  # the same config, from the first moment
    assert dyn["bad"] == [] and dyn["trial"] is not None
    assert dyn["trial"]["restarts"] == 1
    assert 0 < dyn["trial"]["remaining"] <= 20
    condition = _condition(apiserver, NODE) or {}
    assert condition.get("reason") != "RolledBack", condition

    def promotion() -> dict[str, Any] | None:
        doc = _dyn(second)
        return doc if doc["trial"] is None else None

    promoted = until(promotion, "promoted when the trial ends", timeout=40)
    assert promoted["last_known_good"]["hash"] == on_trial["active"]["hash"]
    assert promoted["active"]["hash"] == on_trial["active"]["hash"]
    assert promoted["bad"] == []
    _until_condition(apiserver, NODE, "Active", "the Active condition")

    # The next config's trial ends with a SIGKILL: rolled back to the promoted config.
    _put_config(apiserver, "conf", NODE, {"plugins": {"scan_interval": 0.34}})
    until(lambda: _scan_interval(second) == 0.34, "the next config applied (on trial)")
    second.signal(signal.SIGKILL)
    second.wait(timeout=15)
    third = _start(
        start_agent, apiserver, NODE, "--set", TRIAL, "--state-dir", str(first.state_dir)
    )
    dyn = _dyn(third)
    assert dyn["boot"]["source"] == "rollback", dyn["boot"]
    assert _scan_interval(third) == 0.33
    assert [b["kind"] for b in dyn["bad"]] == ["crash"]
    condition = _until_condition(apiserver, NODE, "RolledBack", "the RolledBack condition")
    assert "died during its trial" in condition["message"]
    third.signal(signal.SIGTERM)
    assert third.wait(timeout=15) == 0
