"""Dynamic configuration on a state directory that turns read-only (issue 29: what the soak's seed
11 found, items 1-3 of that brief), end to end against the real kube-apiserver with real
`nodeagent run` processes. The agent runs in a mount namespace of its own, where the test makes
`<state_dir>/checkpoints` a read-only bind mount over itself and removes it again (root ignores
permission bits; tests/process/test_state_dir.py does the same from the start). The runtime
directory comes as systemd gives it, `$RUNTIME_DIRECTORY`.

- a new config while read-only is deferred (`TrialDeferred`), not run unrecorded, and its trial
  starts once the directory is writable again, the stale checkpoint problem gone with it;
- a SIGTERM during a good config's trial with the directory read-only is resumed at the next
  start, not rolled back as "the agent died during its trial";
- a SIGKILL during a trial with the directory read-only is still blamed at the next start.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import trio

from tests.process.conftest import AgentProcess, StartAgent
from tests.process.test_dynconfig import (
    _condition,
    _doc,
    _dyn,
    _events,
    _prepare,
    _put_config,
    _scan_interval,
    _until_condition,
)
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.wait import NotYet, until

apiserver = apiserver_fixture(scope="module", nodes=("node-ro",))

NODE = "node-ro"
# Long enough that no trial ends during the test: it is stopped, resumed and killed during one.
TRIAL = "dynconfig.trial_duration=300"
# The agent's own mount namespace: the mounts below are its alone and end with it.
PRIVATE_MOUNTS = ["unshare", "-m", "--propagation", "private", "sh", "-c", 'exec "$@"', "sh"]


def _mount(agent: AgentProcess, *args: str) -> None:
    command = ["nsenter", "-t", str(agent.proc.pid), "-m", *args]
    subprocess.run(command, check=True, timeout=30)


def _read_only(agent: AgentProcess, path: Path) -> None:
    _mount(agent, "mount", "--bind", "-o", "ro", str(path), str(path))


def _writable(agent: AgentProcess, path: Path) -> None:
    _mount(agent, "umount", str(path))


def _start(
    start_agent: StartAgent, apiserver: ApiServer, state_dir: Path, run_dir: Path
) -> AgentProcess:
    agent = start_agent(
        "--kubeconfig",
        str(apiserver.kubeconfig(NODE)),
        "--node-name",
        NODE,
        "--state-dir",
        str(state_dir),
        "--set",
        "dynconfig.health_interval=0.5",
        "--set",
        TRIAL,
        env={"RUNTIME_DIRECTORY": str(run_dir)},
        wrapper=PRIVATE_MOUNTS,
    )
    agent.wait_ready()
    return agent


def _problems(agent: AgentProcess) -> list[str]:
    problems: list[str] = _doc(agent, "/v1/status")["checkpoint_problems"]
    return problems


def test_a_read_only_state_dir_defers_trials_and_a_clean_stop_is_not_a_crash(
    apiserver: ApiServer, start_agent: StartAgent, tmp_path: Path
) -> None:
    trio.run(_prepare, apiserver, NODE)
    state_dir, run_dir = tmp_path / "state", tmp_path / "run"
    checkpoints, kept = state_dir / "checkpoints", run_dir / "dynconfig_state"
    first = _start(start_agent, apiserver, state_dir, run_dir)
    _put_config(apiserver, "conf", NODE, {"plugins": {"scan_interval": 0.33}})
    until(lambda: _scan_interval(first) == 0.33, "the first config applied (on trial)")

    # Read-only: the next config is not run unrecorded (a crash on it would not be blamed).
    _read_only(first, checkpoints)
    _put_config(apiserver, "conf", NODE, {"plugins": {"scan_interval": 0.34}})
    deferred = _until_condition(apiserver, NODE, "TrialDeferred", "the trial deferred")
    assert "Read-only file system" in deferred["message"], deferred
    assert _scan_interval(first) == 0.33
    assert any("dynconfig_state" in p for p in _problems(first))
    until(
        lambda: [e for e in _events(apiserver, NODE) if e["reason"] == "ConfigTrialDeferred"],
        "the ConfigTrialDeferred Event",
    )

    # Writable again, no config change: the deferred trial starts, the problem is gone.
    _writable(first, checkpoints)
    until(lambda: _scan_interval(first) == 0.34, "the deferred config applied", timeout=90)
    until(lambda: _problems(first) == [] or NotYet(_problems(first)), "no checkpoint problem")
    _until_condition(apiserver, NODE, "OnTrial", "the OnTrial condition")
    on_trial = _dyn(first)
    assert on_trial["trial"] is not None and on_trial["bad"] == []

    # Read-only again, then a clean stop during the trial: recorded in the runtime directory.
    _read_only(first, checkpoints)
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=20) == 0, first.stderr_text
    assert kept.exists()

    second = _start(start_agent, apiserver, state_dir, run_dir)
    dyn = _dyn(second)
    assert dyn["boot"]["source"] == "resumed", dyn["boot"]
    assert "runtime directory" in dyn["boot"]["reason"], dyn["boot"]
    assert dyn["active"]["hash"] == on_trial["active"]["hash"] and dyn["bad"] == []
    assert _scan_interval(second) == 0.34
    assert not kept.exists()  # writable in this namespace: moved into the checkpoint
    condition = _condition(apiserver, NODE) or {}
    assert condition.get("reason") != "RolledBack", condition

    # A crash during the trial with the directory read-only is still the config's.
    _read_only(second, checkpoints)
    second.signal(signal.SIGKILL)
    second.wait(timeout=20)
    third = _start(start_agent, apiserver, state_dir, run_dir)
    dyn = _dyn(third)
    assert dyn["boot"]["source"] == "rollback", dyn["boot"]
    assert [b["kind"] for b in dyn["bad"]] == ["crash"], dyn["bad"]
    assert dyn["active"]["hash"] == dyn["last_known_good"]["hash"] == "local"
    assert _scan_interval(third) != 0.34

    def rolled_back() -> dict[str, Any] | NotYet:
        c = _condition(apiserver, NODE) or {}
        done = c.get("reason") == "RolledBack" and "died during its trial" in c.get("message", "")
        return c if done else NotYet(c)

    until(rolled_back, "the RolledBack condition naming the crash")
    third.signal(signal.SIGTERM)
    assert third.wait(timeout=20) == 0, third.stderr_text
