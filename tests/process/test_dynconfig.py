"""`nodeagent run` with node credentials against the real kube-apiserver, taking its config from
a NodeAgentConfig: selected by name, applied without a restart (visible in /v1/config and in the
log level), the NodeAgentConfigOK condition and Events written with the node's own credentials,
a config the agent refuses kept out (old one running), and a process killed during a trial
rolled back at the next start."""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from nodeagent.kube import CORE_EVENTS, NODES, KubeClient, errors
from tests.integration.conftest import client_for
from tests.process.conftest import AgentProcess, StartAgent
from tests.process.test_reload import status_text
from tests.support.apiserver import ApiServer, apiserver_fixture
from tests.support.crds import REPO_ROOT, apply_manifest
from tests.support.nodeagentconfig import (
    NAC,
    install_nodeagentconfig_crd,
    loosen_nodeagentconfig_crd,
    nodeagentconfig,
)
from tests.support.wait import until

apiserver = apiserver_fixture(scope="module", nodes=("node-a", "node-b", "node-c", "node-d"))

ACCESS = REPO_ROOT / "deploy" / "kubernetes" / "nodeagentconfig-node-access.yaml"


async def _prepare(apiserver: ApiServer, node: str) -> None:
    """The Node, the CRD and the node access manifest, in force for ``node``'s credentials."""
    async with client_for(apiserver, "admin") as admin:
        with contextlib.suppress(errors.AlreadyExists):
            await admin.create(NODES, {"metadata": {"name": node, "labels": {"pool": "web"}}})
        await install_nodeagentconfig_crd(admin)
        await apply_manifest(admin, ACCESS)
    async with client_for(apiserver, node) as client:
        with trio.fail_after(30):
            while True:
                try:
                    await client.list(NAC)
                    return
                except errors.Forbidden:
                    await trio.sleep(0.2)  # RBAC caches catch up with the binding


def _admin(apiserver: ApiServer, fn: Any) -> Any:
    async def go() -> Any:
        async with client_for(apiserver, "admin") as admin:
            return await fn(admin)

    return trio.run(go)


def _doc(agent: AgentProcess, path: str) -> Any:
    status, body = agent.get(path)
    assert status == 200, body
    return json.loads(body)


def _dyn(agent: AgentProcess) -> dict[str, Any]:
    doc: dict[str, Any] = _doc(agent, "/v1/status")["dynconfig"]
    return doc


def _condition(apiserver: ApiServer, node: str) -> dict[str, str] | None:
    async def get(admin: KubeClient) -> dict[str, str] | None:
        obj = msgspec.json.decode(await admin.get(NODES, node))
        for c in obj.get("status", {}).get("conditions", []):
            if c["type"] == "NodeAgentConfigOK":
                return dict(c)
        return None

    result: dict[str, str] | None = _admin(apiserver, get)
    return result


def _events(apiserver: ApiServer, node: str) -> list[dict[str, Any]]:
    async def get(admin: KubeClient) -> list[dict[str, Any]]:
        listed = await admin.list(CORE_EVENTS, "default")
        items = [msgspec.json.decode(item) for item in listed.items]
        return [e for e in items if e["involvedObject"].get("name") == node]

    result: list[dict[str, Any]] = _admin(apiserver, get)
    return result


def _until_condition(apiserver: ApiServer, node: str, reason: str, what: str) -> dict[str, str]:
    def check() -> dict[str, str] | None:
        condition = _condition(apiserver, node)
        return condition if condition is not None and condition["reason"] == reason else None

    return until(check, what)


def _put_config(apiserver: ApiServer, name: str, node: str, config: dict[str, Any]) -> None:
    async def put(admin: KubeClient) -> None:
        body = nodeagentconfig(name, spec={"nodeNames": [node], "config": config})
        try:
            await admin.create(NAC, body)
        except errors.AlreadyExists:
            await admin.patch(NAC, name, {"spec": {"config": config}})

    _admin(apiserver, put)


def _start(
    start_agent: StartAgent,
    apiserver: ApiServer,
    node: str,
    *extra: str,
    config: str | None = None,
    env: dict[str, str] | None = None,
    launcher: str = "nodeagent",
) -> AgentProcess:
    agent = start_agent(
        "--kubeconfig",
        str(apiserver.kubeconfig(node)),
        "--node-name",
        node,
        "--set",
        "dynconfig.health_interval=0.5",
        *extra,
        config=config,
        env=env,
        launcher=launcher,
    )
    agent.wait_ready()
    return agent


def _scan_interval(agent: AgentProcess) -> float:
    value: float = _doc(agent, "/v1/config")["effective"]["plugins"]["scan_interval"]
    return value


def _loosen_crd(apiserver: ApiServer) -> None:
    """An older or looser CRD than the agent's: only its own validation stands before the node."""
    _admin(apiserver, loosen_nodeagentconfig_crd)


def test_select_apply_condition_events_and_refused_config_kept(
    apiserver: ApiServer, start_agent: StartAgent
) -> None:
    trio.run(_prepare, apiserver, "node-a")
    # A CRD looser than the agent's (older, or edited), loosened before the agent watches so
    # its watch serves the new schema: only the agent's own validation keeps a static field out.
    _loosen_crd(apiserver)
    probe = {"kube": {"kubeconfig": "/etc/other"}}

    def stored_unpruned() -> bool:
        _put_config(apiserver, "probe", "no-such-node", probe)
        obj = _admin(apiserver, lambda admin: admin.get(NAC, "probe"))
        return "kube" in msgspec.json.decode(obj)["spec"]["config"]

    until(stored_unpruned, "the looser CRD in force")
    _admin(apiserver, lambda admin: admin.delete(NAC, "probe"))
    agent = _start(start_agent, apiserver, "node-a")
    until(lambda: _dyn(agent)["crd_missing"] is None, "the CRD found")
    until(
        lambda: (_condition(apiserver, "node-a") or {}).get("reason") == "Local",
        "the Local condition",
    )
    default_scan = _scan_interval(agent)
    assert default_scan != 0.25

    _put_config(
        apiserver,
        "fleet",
        "node-a",
        {"plugins": {"scan_interval": 0.25}, "agent": {"log_level": "debug"}},
    )
    until(lambda: _scan_interval(agent) == 0.25, "the remote scan_interval applied")
    dyn = _dyn(agent)
    assert dyn["active"]["name"] == "fleet"
    assert dyn["assigned"]["hash"] == dyn["active"]["hash"]
    assert dyn["trial"]["name"] == "fleet"
    assert dyn["selection"].startswith("naming this node")
    assert _doc(agent, "/v1/config")["effective"]["agent"]["log_level"] == "debug"
    condition = _until_condition(
        apiserver, "node-a", "OnTrial", "the OnTrial condition written with node-a's credentials"
    )
    assert dyn["active"]["hash"] in condition["message"]
    out = status_text(agent)
    assert f"Config: active fleet ({dyn['active']['hash']})" in out, out
    assert "last-known-good local (local)" in out
    events = until(
        lambda: [e for e in _events(apiserver, "node-a") if e["reason"] == "ConfigApplied"],
        "the ConfigApplied Event",
    )
    assert "fleet" in events[0]["message"]

    # The agent, not the server, refuses a static field (the CRD was loosened before the start).
    bad = {"plugins": {"scan_interval": 0.5}, "kube": {"kubeconfig": "/etc/other"}}
    _put_config(apiserver, "fleet", "node-a", bad)
    condition = _until_condition(
        apiserver, "node-a", "ConfigInvalid", "the ConfigInvalid condition"
    )
    assert "kube" in condition["message"]
    assert _scan_interval(agent) == 0.25  # the old config keeps running
    dyn = _dyn(agent)
    assert dyn["active"]["name"] == "fleet" and dyn["assigned"]["hash"] != dyn["active"]["hash"]
    assert any("invalid" in d for d in dyn["differ"])
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0


def test_killed_during_trial_rolls_back_at_restart(
    apiserver: ApiServer, start_agent: StartAgent
) -> None:
    trio.run(_prepare, apiserver, "node-b")
    first = _start(start_agent, apiserver, "node-b")
    default_scan = _scan_interval(first)
    _put_config(apiserver, "node-b-conf", "node-b", {"plugins": {"scan_interval": 0.3}})
    until(lambda: _scan_interval(first) == 0.3, "the remote config applied (on trial)")
    assert _dyn(first)["trial"] is not None
    first.signal(signal.SIGKILL)
    first.wait(timeout=15)

    second = _start(start_agent, apiserver, "node-b", "--state-dir", str(first.state_dir))
    dyn = _dyn(second)
    assert dyn["boot"]["source"] == "rollback", dyn
    assert _scan_interval(second) == default_scan
    condition = _until_condition(apiserver, "node-b", "RolledBack", "the RolledBack condition")
    assert "died during its trial" in condition["message"]
    # The same object is not retried: it stays assigned, not active.
    until(lambda: (_dyn(second)["assigned"] or {}).get("name") == "node-b-conf", "assigned")
    assert _dyn(second)["active"]["name"] == "local"
    assert _scan_interval(second) == default_scan
    second.signal(signal.SIGTERM)
    assert second.wait(timeout=15) == 0


@pytest.mark.parametrize("max_interval", ["1.0", "0.05"])
def test_apply_latency_and_writes_per_change(
    apiserver: ApiServer, start_agent: StartAgent, capsys: Any, max_interval: str
) -> None:
    """Back to back changes: with the default accumulator.max_interval (1 s) they are coalesced
    to one per second (each applied about 1 s after the previous); 0.05 shows the latency of an
    isolated change. The agent writes one object per change: its Node's condition."""
    trio.run(_prepare, apiserver, "node-c")
    with contextlib.suppress(errors.NotFound):  # left by the previous run: start from none
        _admin(apiserver, lambda admin: admin.delete(NAC, "node-c-conf"))
    agent = _start(
        start_agent, apiserver, "node-c", "--set", f"accumulator.max_interval={max_interval}"
    )
    until(lambda: _dyn(agent)["crd_missing"] is None, "the CRD found")

    def settled() -> bool:
        # Start-up is over: selected (no object), and the condition written is the current one.
        dyn = _dyn(agent)
        written = _condition(apiserver, "node-c") or {}
        return bool(
            dyn["selection"] != "not selected yet"
            and written.get("message") == dyn["condition"]["message"]
        )

    until(settled, "the start-up condition")
    latencies = []
    writes = []
    events = []
    changes = 20 if max_interval == "1.0" else 50
    for i in range(changes):
        value = 0.2 + i / 100
        before = _dyn(agent)["condition_writes"]
        events_before = _dyn(agent)["events_posted"]
        _put_config(apiserver, "node-c-conf", "node-c", {"plugins": {"scan_interval": value}})
        # From the apiserver's answer (the change is stored) to the agent running it, polled
        # finely: `until`'s 0.2 s step would be the resolution otherwise.
        t0 = time.monotonic()
        while _scan_interval(agent) != value:
            assert time.monotonic() - t0 < 30, "the change not applied within 30 s"
            time.sleep(0.005)
        latencies.append(time.monotonic() - t0)

        def written(b: int = before) -> bool:
            return bool(_dyn(agent)["condition_writes"] > b)

        until(written, "condition written")

        def posted(b: int = events_before) -> bool:
            return bool(_dyn(agent)["events_posted"] > b)

        until(posted, "ConfigApplied posted")
        writes.append(_dyn(agent)["condition_writes"] - before)
        events.append(_dyn(agent)["events_posted"] - events_before)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = statistics.quantiles(latencies, n=100, method="inclusive")[98]
    with capsys.disabled():
        print(
            f"\nmax_interval={max_interval}: dynconfig apply latency over {changes} changes "
            f"p50={p50 * 1000:.0f}ms p99={p99 * 1000:.0f}ms max={latencies[-1] * 1000:.0f}ms"
        )
        print(f"dynconfig condition writes per change: {writes}; Events per change: {events}")
    # Each change: one condition patch (OnTrial) and one ConfigApplied Event, nothing else.
    assert writes == [1] * changes and events == [1] * changes
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0


def test_sighup_under_a_remote_config_keeps_the_overlay(
    apiserver: ApiServer, start_agent: StartAgent, tmp_path: Path
) -> None:
    trio.run(_prepare, apiserver, "node-c")
    agent = _start(
        start_agent, apiserver, "node-c", config="[resources]\nmin_sync_interval = 1.0\n"
    )
    file = tmp_path / "config-0.toml"  # what start_agent wrote for its first agent
    assert file.exists()
    _put_config(apiserver, "node-c-conf", "node-c", {"plugins": {"scan_interval": 0.45}})
    until(lambda: _scan_interval(agent) == 0.45, "the remote config applied")

    def reload(text: str, expect: str) -> dict[str, Any]:
        before = _doc(agent, "/v1/status")["config_reload"]
        file.write_text(text)
        agent.signal(signal.SIGHUP)

        def done() -> dict[str, Any] | None:
            last: dict[str, Any] | None = _doc(agent, "/v1/status")["config_reload"]
            return last if last is not None and last != before else None

        last = until(done, "the reload")
        assert last["result"] == expect, last
        return last

    reload("[resources]\nmin_sync_interval = 2.5\n", "applied")
    config = _doc(agent, "/v1/config")["effective"]
    assert config["resources"]["min_sync_interval"] == 2.5
    assert config["plugins"]["scan_interval"] == 0.45  # the overlay stays over the new file
    assert _dyn(agent)["active"]["name"] == "node-c-conf"
    reload("[resources]\nmin_sync_interval = -1\n", "invalid")
    config = _doc(agent, "/v1/config")["effective"]
    assert (config["resources"]["min_sync_interval"], config["plugins"]["scan_interval"]) == (
        2.5,
        0.45,
    )
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0


def test_remote_config_making_a_component_unhealthy_is_rolled_back_at_run_time(
    apiserver: ApiServer, start_agent: StartAgent
) -> None:
    trio.run(_prepare, apiserver, "node-d")
    # Test-only launcher: a component is not ready while plugins.scan_interval is 0.77 (the
    # real health signals: test_dynconfig_rollback_unpublished_pool.py).
    agent = _start(
        start_agent,
        apiserver,
        "node-d",
        "--set",
        "dynconfig.unready_bound=1.0",
        env={"NODEAGENT_TEST_UNREADY_WHEN": "plugins.scan_interval=0.77"},
        launcher="tests.support.unready_agent",
    )
    until(lambda: _dyn(agent)["crd_missing"] is None, "the CRD found")
    good = {"plugins": {"scan_interval": 0.4}}
    _put_config(apiserver, "node-d-conf", "node-d", good)
    until(lambda: _scan_interval(agent) == 0.4, "the first config applied")
    # Its trial is cut short by a second config; the rollback goes to the last-known-good.
    lkg = _doc(agent, "/v1/config")["dynamic"]["last_known_good"]
    assert lkg["hash"] == "local"
    _put_config(apiserver, "node-d-conf", "node-d", {"plugins": {"scan_interval": 0.77}})
    condition = _until_condition(apiserver, "node-d", "RolledBack", "the RolledBack condition")
    assert "debug-unready not ready" in condition["message"], condition
    assert _scan_interval(agent) == 1.0  # back on the local config, at run time
    doc = _doc(agent, "/v1/config")
    dynamic = doc["dynamic"]
    assert dynamic["active"]["hash"] == "local" and dynamic["reason"] == "RolledBack"
    assert dynamic["assigned"]["name"] == "node-d-conf"
    assert any("unhealthy" in line for line in dynamic["differ"]), dynamic["differ"]
    events = until(
        lambda: [e for e in _events(apiserver, "node-d") if e["reason"] == "ConfigRolledBack"],
        "the ConfigRolledBack Event",
    )
    assert "debug-unready" in events[0]["message"]
    metrics = agent.get("/metrics")[1]
    assert "nodeagent_config_rollbacks_total 1.0" in metrics
    assert agent.proc.poll() is None  # rolled back without a restart
    # The bad object is not retried while it stays the same: still the local config.
    assert _dyn(agent)["active"]["hash"] == "local"
    # A fixed object (a new generation) is applied again.
    _put_config(apiserver, "node-d-conf", "node-d", good)
    until(lambda: _scan_interval(agent) == 0.4, "the fixed config applied")
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
