"""A modern DRA driver beside the agent (issue 19 item 5): a driver no one here wrote, built on
the current upstream helper `k8s.io/dynamic-resource-allocation/kubeletplugin` v0.37 used
unchanged (tests/harness/draplugin-v037), which publishes its own ResourceSlices with node-a's
credentials and registers in the agent's registry listing `v1.DRAPlugin` / `v1beta1.DRAPlugin`
(and the helper's DRAResourceHealth services), against `nodeagent run` and the real
kube-apiserver, with a native SDK plugin whose pool the agent publishes at the same time.

What is asserted:
- the agent registers it as self-publishing (`/v1/plugins`, `nodeagent status`), and the driver
  is only ever told "registered" (the helper records the last status it is sent, and drivers on
  it poll that status at start-up and exit when it does not say registered: this one does too);
- its slices are never written by the agent: same resourceVersion across the agent's syncs, an
  agent restart and the driver's own updates, no `managed-by` label, only the helper in their
  managed fields; and the agent's own pool of the same name (another driver) is not refused;
- a driver killed outright is deregistered, and its slices stay (the decision in
  docs/plugins/index.md): at the moment the agent deletes the killed native plugin's slices
  after the disconnect grace, the driver's are untouched; a restarted driver finds them and writes
  nothing.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.process.conftest import AgentProcess, StartAgent, nodeagent_command
from tests.process.test_process_resourceslices import DRIVER as NATIVE
from tests.process.test_process_resourceslices import (  # noqa: F401 - node: a fixture
    NODE,
    PLUGIN,
    metric_sum,
    node,
    node_slices,
)
from tests.support.apiserver import ApiServer
from tests.support.draplugin import (
    DraPlugin,
    KubeletDirs,
    instance,
    kubelet_dirs,
    named_resources,
)
from tests.support.draplugin_v037 import SERVICES, ModernDraPlugin, Notification, device
from tests.support.wait import until

MODERN = "gpu.modern.example.com"
MANAGED_BY = "app.kubernetes.io/managed-by"
# The helper's pool is named after the node by default, like the agent's pool of the native
# plugin: two pools of one name, of two drivers, side by side.
DEVICES = [
    device(f"gpu-{i}", {"model": {"string": "H100"}, "index": {"int": i}}, {"memory": "80Gi"})
    for i in range(3)
]
MORE_DEVICES = [*DEVICES, device("gpu-3", {"model": {"string": "H100"}, "index": {"int": 3}})]


@pytest.fixture
def dirs() -> Iterator[KubeletDirs]:
    made = kubelet_dirs(prefix="na-v037-")
    yield made
    made.remove()


@pytest.fixture
def native_plugin(dirs: KubeletDirs) -> Iterator[subprocess.Popen[bytes]]:
    """The native SDK plugin of tests/process/test_process_resourceslices.py (three GPUs in
    pool node-a), in the same registry."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PLUGIN, str(dirs.registry)],
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def start_agent_for(
    start_agent: StartAgent, apiserver: ApiServer, dirs: KubeletDirs, disconnect_grace: float = 1
) -> AgentProcess:
    agent = start_agent(
        "--kubeconfig",
        str(apiserver.kubeconfig(NODE)),
        "--node-name",
        NODE,
        "--registry-dir",
        str(dirs.registry),
        "--set",
        "resources.startup_grace=1",
        "--set",
        f"resources.disconnect_grace={disconnect_grace}",
        # A killed plugin is noticed by the probes: every 0.5 s, deregistered after 2 failures.
        "--set",
        "plugins.probe_interval=0.5",
    )
    agent.wait_ready()
    return agent


def start_driver(
    dirs: KubeletDirs, apiserver: ApiServer, workdir: Path, *extra_args: str
) -> ModernDraPlugin:
    workdir.mkdir(exist_ok=True)
    return ModernDraPlugin.start(
        MODERN,
        dirs,
        apiserver.kubeconfig(NODE),
        NODE,
        DEVICES,
        workdir=workdir,
        extra_args=extra_args,
    )


def plugin_row(agent: AgentProcess, name: str) -> dict[str, Any] | None:
    rows: list[dict[str, Any]] = json.loads(agent.get("/v1/plugins")[1])
    return next((r for r in rows if r["name"] == name), None)


def deregistered(agent: AgentProcess, name: str) -> bool:
    row = plugin_row(agent, name)
    return row is not None and row["state"] != "registered"


def registered_sockets(agent: AgentProcess, name: str) -> list[str]:
    rows: list[dict[str, Any]] = json.loads(agent.get("/v1/plugins")[1])
    return [r["socket"] for r in rows if r["name"] == name and r["state"] == "registered"]


def registered_row(agent: AgentProcess, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        row = plugin_row(agent, name)
        return row if row is not None and row["state"] == "registered" else None

    return until(check, f"{name} to be registered")


def slices_of(apiserver: ApiServer, driver: str) -> list[dict[str, Any]]:
    return [s for s in node_slices(apiserver) if s["spec"]["driver"] == driver]


def device_names(slices: list[dict[str, Any]]) -> list[str]:
    return sorted(d["name"] for s in slices for d in s["spec"]["devices"])


def versions(slices: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """name -> (uid, resourceVersion): any write shows as a change."""
    return {
        s["metadata"]["name"]: (s["metadata"]["uid"], s["metadata"]["resourceVersion"])
        for s in slices
    }


def wait_devices(apiserver: ApiServer, driver: str, names: list[str]) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        found = slices_of(apiserver, driver)
        return found if device_names(found) == names else None

    return until(check, f"{driver}'s slices with {names}")


def assert_the_drivers_own(slices: list[dict[str, Any]]) -> None:
    """Written by the helper only: no label of the agent, no field manager but the driver's."""
    for s in slices:
        assert MANAGED_BY not in (s["metadata"].get("labels") or {}), s["metadata"]
        managers = {f["manager"] for f in s["metadata"].get("managedFields") or []}
        assert managers == {"draplugin-v037"}, s["metadata"]


def idle(agent: AgentProcess) -> dict[str, Any] | None:
    """/v1/resourceslices once the observed state is read and no pool waits for a sync."""
    doc: dict[str, Any] = json.loads(agent.get("/v1/resourceslices")[1])
    sync = doc["sync"]
    return doc if sync["synced"] and sync["pending_pools"] == 0 else None


def settled_on(agent: AgentProcess, driver: str) -> dict[str, Any] | None:
    """idle(), with `driver` registered and its pool published by the agent."""
    doc = idle(agent)
    state = doc["drivers"].get(driver) if doc is not None else None
    return doc if state is not None and state["registered"] and state["pools"] else None


def settled(agent: AgentProcess) -> dict[str, Any] | None:
    return settled_on(agent, NATIVE)


def only_registered(driver: ModernDraPlugin) -> list[Notification]:
    notified = driver.notifications()
    assert notified and all(n == Notification(True, "") for n in notified), notified
    assert driver.recorded() == [Notification(True, "")], driver.recorded()
    return notified


@pytest.mark.usefixtures("node")
def test_a_v037_driver_registers_as_self_publishing_and_its_slices_are_left_alone(
    apiserver: ApiServer,
    start_agent: StartAgent,
    dirs: KubeletDirs,
    native_plugin: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    first = start_agent_for(start_agent, apiserver, dirs)
    driver = start_driver(dirs, apiserver, tmp_path)
    try:
        assert driver.wait_notified() == Notification(True, "")
        row = registered_row(first, MODERN)
        assert (row["type"], row["api"], row["stream_state"]) == (
            "DRAPlugin",
            "kubelet-v1",
            "self-publishing",
        )
        assert tuple(row["versions"]) == SERVICES
        assert row["socket"] == str(driver.registration_socket)
        assert row["endpoint"] == str(driver.endpoint)
        assert (row["stream_restarts"], row["stream_error"], row["messages_received"]) == (0, "", 0)

        modern = wait_devices(apiserver, MODERN, ["gpu-0", "gpu-1", "gpu-2"])
        assert [s["spec"]["pool"]["name"] for s in modern] == [NODE]
        assert_the_drivers_own(modern)
        native = wait_devices(apiserver, NATIVE, ["gpu-0", "gpu-1", "gpu-2"])
        assert [s["metadata"]["labels"][MANAGED_BY] for s in native] == ["nodeagent"]
        before = versions(modern)

        # The agent's syncs (the first one, and the one every observed pool gets when the
        # start-up grace ends) and the driver's own update of its pool: nothing of the agent's
        # happens to the driver's slices, and its own pool of the same name is not refused.
        doc = until(lambda: settled(first), "the agent's pool to settle")
        assert doc["sync"]["failing_pools"] == []
        assert MODERN not in doc["drivers"]
        assert versions(slices_of(apiserver, MODERN)) == before
        driver.update(MORE_DEVICES)
        modern = wait_devices(apiserver, MODERN, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
        assert_the_drivers_own(modern)
        updated = versions(modern)
        until(lambda: settled(first), "the agent to settle after the driver's update")

        status = json.loads(first.get("/v1/status")[1])
        assert status["plugins"] == 2
        (plugins,) = [c for c in status["components"] if c["name"] == "plugins"]
        assert plugins["reason"] == "2 plugins registered (1 self-publishing), 0 not registered"
        assert [(p["driver"], p["pool"]) for p in status["resourceslices"]] == [(NATIVE, NODE)]
        out = subprocess.run(
            nodeagent_command("status", "--ops-address", first.ops_address),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith(MODERN))
        assert line.split()[1:4] == ["DRAPlugin", "registered", "self-publishing"]

        # A restarted agent lists the node's slices again and registers the driver again.
        first.signal(signal.SIGTERM)
        assert first.wait(timeout=15) == 0
        # Nothing said about the driver's slices either: not misread, not taken for a conflict.
        for text in ("not understood", "refused", "ResourceSlicePoolConflict", *updated):
            assert text not in first.stderr_text, first.stderr_text[-4000:]
        second = start_agent_for(start_agent, apiserver, dirs)
        assert driver.wait_notified(2) == Notification(True, "")
        registered_row(second, MODERN)
        until(lambda: settled(second), "the restarted agent to settle")
        until(
            lambda: metric_sum(second, "nodeagent_resourceslice_syncs_total", 'result="unchanged"'),
            "the restarted agent to plan its pool",
        )
        assert metric_sum(second, "nodeagent_resourceslice_writes_total") == 0
        assert versions(slices_of(apiserver, MODERN)) == updated
        only_registered(driver)
        assert driver.proc.poll() is None, driver.log()[-4000:]

        second.signal(signal.SIGTERM)
        assert second.wait(timeout=15) == 0
        # Stopped cleanly, the helper removes its sockets and leaves its slices.
        assert driver.stop() == 0
        assert not driver.registration_socket.exists() and not driver.endpoint.exists()
        assert versions(slices_of(apiserver, MODERN)) == updated
    finally:
        driver.close()


@pytest.mark.usefixtures("node")
def test_a_killed_v037_driver_is_deregistered_and_its_slices_are_kept(
    apiserver: ApiServer,
    start_agent: StartAgent,
    dirs: KubeletDirs,
    native_plugin: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    agent = start_agent_for(start_agent, apiserver, dirs)
    driver = start_driver(dirs, apiserver, tmp_path)
    try:
        assert driver.wait_notified() == Notification(True, "")
        registered_row(agent, MODERN)
        registered_row(agent, NATIVE)
        modern = versions(wait_devices(apiserver, MODERN, ["gpu-0", "gpu-1", "gpu-2"]))
        wait_devices(apiserver, NATIVE, ["gpu-0", "gpu-1", "gpu-2"])
        until(lambda: settled(agent), "the agent's pool to settle")

        # Both killed outright: their socket files stay, only the agent's probes notice.
        driver.kill()
        native_plugin.kill()
        native_plugin.wait(10)
        for name in (MODERN, NATIVE):
            until(functools.partial(deregistered, agent, name), f"{name} to be deregistered")
        row = plugin_row(agent, MODERN)
        assert row is not None and "failed probes" in row["last_error"], row
        # The disconnect grace deletes the native plugin's slices, written by the agent; the
        # same moment finds the self-publishing driver's slices as they were.
        until(lambda: not slices_of(apiserver, NATIVE), "the native plugin's slices to go")
        assert versions(slices_of(apiserver, MODERN)) == modern

        # Back again: the helper finds its slices unchanged and writes nothing.
        # (-v=5: the helper's controller logs the outcome of each pool's comparison.)
        again = start_driver(dirs, apiserver, tmp_path / "again", "-v=5")
        try:
            assert again.wait_notified() == Notification(True, "")
            registered_row(agent, MODERN)
            until(lambda: "Completed comparison" in again.log(), "the helper's first pool sync")
            line = next(ln for ln in again.log().splitlines() if "Completed comparison" in ln)
            assert (
                "numObsolete=0 numMatchedSlices=1 numChangedMatchedSlices=0 numNewSlices=0"
            ) in line, line
            assert versions(slices_of(apiserver, MODERN)) == modern
            assert again.stop() == 0
        finally:
            again.close()
    finally:
        driver.close()
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0


def events_about(apiserver: ApiServer, reason: str) -> list[dict[str, Any]]:
    status, doc = apiserver.request("GET", f"/api/v1/events?fieldSelector=reason%3D{reason}")
    assert status == 200, doc
    items: list[dict[str, Any]] = doc["items"]
    return items


@pytest.mark.usefixtures("node")
def test_a_driver_upgraded_from_the_v030_helper_to_v037_is_handed_over_without_a_conflict(
    apiserver: ApiServer,
    start_agent: StartAgent,
    dirs: KubeletDirs,
    tmp_path: Path,
) -> None:
    # The same driver, first on the 1.30 helper (the agent publishes its inventory), then, as a
    # DaemonSet update replaces the pod, on the v0.37 helper (it publishes itself): the same
    # name, the same registration socket, the same pool. The disconnect grace is the default
    # one: the new pod is up long before it ends.
    agent = start_agent_for(start_agent, apiserver, dirs, disconnect_grace=30)
    old = DraPlugin.start(
        MODERN,
        dirs,
        [named_resources(instance("gpu.0", {"index": {"int": 0}}))],
        workdir=tmp_path,
    )
    try:
        (written,) = until(lambda: slices_of(apiserver, MODERN) or None, "the agent's slice")
        assert written["metadata"]["labels"][MANAGED_BY] == "nodeagent"
        until(lambda: settled_on(agent, MODERN), "the agent's pool to settle")
        assert old.stop() == 0
    finally:
        old.close()
    new = start_driver(dirs, apiserver, tmp_path / "new")
    try:
        assert new.wait_notified() == Notification(True, "")
        row = registered_row(agent, MODERN)
        assert row["stream_state"] == "self-publishing"
        # The helper replaces the agent's slice with its own; the agent neither fights it nor
        # takes it for a conflict.
        modern = wait_devices(apiserver, MODERN, ["gpu-0", "gpu-1", "gpu-2"])
        assert_the_drivers_own(modern)
        kept = versions(modern)
        doc = until(lambda: idle(agent), "the agent to settle")
        assert doc["sync"]["failing_pools"] == [], doc["sync"]
        assert events_about(apiserver, "ResourceSlicePoolConflict") == []
        assert versions(slices_of(apiserver, MODERN)) == kept
        only_registered(new)
    finally:
        new.close()
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
    assert "refused" not in agent.stderr_text, agent.stderr_text[-4000:]


@pytest.mark.usefixtures("node")
def test_two_instances_of_a_v037_driver_in_a_rolling_update_are_both_told_registered(
    apiserver: ApiServer, start_agent: StartAgent, dirs: KubeletDirs, tmp_path: Path
) -> None:
    # The helper's rolling updates (kubelet 1.33+): the new pod starts before the old one stops,
    # each with sockets of its own, one name. A seed plugin would need a higher version; a
    # self-publishing one registers beside the other, and neither is told "not registered".
    agent = start_agent_for(start_agent, apiserver, dirs)
    kubeconfig = apiserver.kubeconfig(NODE)
    old = ModernDraPlugin.start(
        MODERN, dirs, kubeconfig, NODE, DEVICES, rolling_update_uid="pod-a", workdir=tmp_path
    )
    new: ModernDraPlugin | None = None
    try:
        assert old.wait_notified() == Notification(True, "")
        new = ModernDraPlugin.start(
            MODERN, dirs, kubeconfig, NODE, DEVICES, rolling_update_uid="pod-b", workdir=tmp_path
        )
        assert new.wait_notified() == Notification(True, "")
        assert new.registration_socket != old.registration_socket
        rows = {
            r["socket"]: r for r in json.loads(agent.get("/v1/plugins")[1]) if r["name"] == MODERN
        }
        assert set(rows) == {str(old.registration_socket), str(new.registration_socket)}
        assert {r["state"] for r in rows.values()} == {"registered"}
        assert rows[str(new.registration_socket)]["endpoint"] == str(new.endpoint)
        # The old pod goes: the new one still serves the name, told nothing else.
        assert old.stop() == 0
        until(
            lambda: registered_sockets(agent, MODERN) == [str(new.registration_socket)],
            "only the new instance to be registered",
        )
        assert registered_row(agent, MODERN)["stream_state"] == "self-publishing"
        only_registered(old)
        only_registered(new)
        modern = wait_devices(apiserver, MODERN, ["gpu-0", "gpu-1", "gpu-2"])
        assert_the_drivers_own(modern)
        assert new.stop() == 0
    finally:
        old.close()
        if new is not None:
            new.close()
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=15) == 0
